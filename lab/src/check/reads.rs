//! Reads (`GET /read`) against the acknowledged writes, on the one monotonic clock every client
//! of this machine shares:
//!
//! * `read_after_ack`: a read sent after an ID's acknowledgement was in returns a seq at least
//!   that high (a read never trails a write it could have seen);
//! * `read_token_fresh`: a read never returns a token older than one the resource had already
//!   accepted when the read was sent. "Accepted" is witnessed by an acknowledged ID under that
//!   token (the sequencer answers only after the fence accepted the commit), so this is a sound
//!   under-approximation: every violation it reports is real.
//!
//! Reads that overlap a write in time may see it or not. O((n + m) log n): sweep reads by invoke
//! time, folding in every ack that completed strictly before, keeping the highest seq and token.
//! [`stale_reads`] counts every stale read (not only the first), by the mode that answered it: the
//! read-lease experiment's measure.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{fmt_ns, Ack, CheckInput, Violation};

pub const NAME_SEQ: &str = "read_after_ack";
pub const NAME_TOKEN: &str = "read_token_fresh";

/// One answered read from a client history (a 200 of `GET /read`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadObs {
    /// `file#id`.
    pub source: String,
    pub node: String,
    /// The mode that answered (`lease`, `quorum`, `resource`).
    pub mode: String,
    /// A `lease` read answered by `quorum` because the window was closed.
    pub fell_back: bool,
    pub token: i64,
    pub seq: i64,
    pub invoke_ns: u64,
    pub complete_ns: u64,
}

impl ReadObs {
    pub fn describe(&self) -> String {
        format!(
            "{} read {}{} (token {}, seq {}) from {} invoked {} completed {}",
            self.source,
            self.mode,
            if self.fell_back { " (fell back)" } else { "" },
            self.token,
            self.seq,
            self.node,
            fmt_ns(self.invoke_ns),
            fmt_ns(self.complete_ns)
        )
    }
}

/// A token the resource accepted (a ledger row), at `at_ns` on the clients' monotonic clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Accepted {
    pub token: i64,
    pub at_ns: u64,
    /// The ledger row (`pos`) and what it was, for counterexamples.
    pub what: String,
}

/// How far after its `committed_at` stamp a ledger row counts as accepted: the stamp is taken
/// inside the transaction, before its commit (an fsync) makes it visible.
pub const ACCEPT_GUARD_NS: u64 = 20_000_000;

/// The ledger's rows as acceptance witnesses, mapping the resource's wall clock (PostgreSQL on
/// this machine) onto the monotonic clock through one pair of readings taken together
/// (`mono0_ns`, `wall0_us`), plus [`ACCEPT_GUARD_NS`].
pub fn accepted_from_ledger(
    ledger: &[super::LedgerRow],
    mono0_ns: u64,
    wall0_us: i64,
) -> Vec<Accepted> {
    ledger
        .iter()
        .filter_map(|r| {
            let ns = (r.committed_us - wall0_us) * 1000 + mono0_ns as i64;
            (ns > 0).then(|| Accepted {
                token: r.token,
                at_ns: ns as u64 + ACCEPT_GUARD_NS,
                what: r.describe(),
            })
        })
        .collect()
}

/// How one read is stale, with the ack that shows it.
struct Stale<'a> {
    read: &'a ReadObs,
    seq_behind: Option<&'a Ack>,
    token_behind: Option<Witness<'a>>,
}

/// What shows a token was accepted before a read was sent.
#[derive(Clone, Copy)]
enum Witness<'a> {
    Ack(&'a Ack),
    Ledger(&'a Accepted),
}

impl Witness<'_> {
    fn token(&self) -> i64 {
        match self {
            Witness::Ack(a) => a.token,
            Witness::Ledger(l) => l.token,
        }
    }
    fn at_ns(&self) -> u64 {
        match self {
            Witness::Ack(a) => a.complete_ns,
            Witness::Ledger(l) => l.at_ns,
        }
    }
    fn source(&self) -> String {
        match self {
            Witness::Ack(a) => a.source.clone(),
            Witness::Ledger(l) => format!("ledger row ({})", l.what),
        }
    }
    fn describe(&self) -> String {
        match self {
            Witness::Ack(a) => format!("ack:  {}", a.describe()),
            Witness::Ledger(l) => format!("accepted: {} (at {})", l.what, fmt_ns(l.at_ns)),
        }
    }
}

/// Every read with what it should have seen.
fn sweep(input: &CheckInput) -> Vec<Stale<'_>> {
    let mut acks: Vec<&Ack> = input.acks.iter().collect();
    acks.sort_by_key(|a| a.complete_ns);
    let mut witnesses: Vec<Witness> = input
        .acks
        .iter()
        .map(Witness::Ack)
        .chain(input.accepted.iter().map(Witness::Ledger))
        .collect();
    witnesses.sort_by_key(|w| w.at_ns());
    let mut reads: Vec<&ReadObs> = input.reads.iter().collect();
    reads.sort_by_key(|r| r.invoke_ns);
    let (mut i, mut j) = (0, 0);
    let (mut max_seq, mut max_token): (Option<&Ack>, Option<Witness>) = (None, None);
    let mut out = Vec::new();
    for r in reads {
        while i < acks.len() && acks[i].complete_ns < r.invoke_ns {
            let a = acks[i];
            if max_seq.is_none_or(|m| a.seq > m.seq) {
                max_seq = Some(a);
            }
            i += 1;
        }
        while j < witnesses.len() && witnesses[j].at_ns() < r.invoke_ns {
            let w = witnesses[j];
            if max_token.is_none_or(|m| w.token() > m.token()) {
                max_token = Some(w);
            }
            j += 1;
        }
        let seq_behind = max_seq.filter(|a| a.seq > r.seq);
        let token_behind = max_token.filter(|w| w.token() > r.token);
        if seq_behind.is_some() || token_behind.is_some() {
            out.push(Stale {
                read: r,
                seq_behind,
                token_behind,
            });
        }
    }
    out
}

fn violation(
    name: &'static str,
    r: &ReadObs,
    w: Witness,
    what: &str,
    va: i64,
    vr: i64,
) -> Violation {
    let gap_us = r.invoke_ns.saturating_sub(w.at_ns()) as f64 / 1000.0;
    Violation::new(
        name,
        format!(
            "{} had {what} {va} {gap_us:.1} µs before {} was sent, which read {what} {vr}",
            w.source(),
            r.source
        ),
        vec![w.describe(), format!("read: {}", r.describe())],
    )
}

/// `read_after_ack`: the first read that trails an acknowledged seq.
pub fn check_seq(input: &CheckInput) -> Option<Violation> {
    sweep(input).into_iter().find_map(|s| {
        s.seq_behind
            .map(|a| violation(NAME_SEQ, s.read, Witness::Ack(a), "seq", a.seq, s.read.seq))
    })
}

/// `read_token_fresh`: the first read whose token is older than an accepted one.
pub fn check_token(input: &CheckInput) -> Option<Violation> {
    sweep(input).into_iter().find_map(|s| {
        s.token_behind
            .map(|w| violation(NAME_TOKEN, s.read, w, "token", w.token(), s.read.token))
    })
}

/// Reads per answering mode, and how many of them were stale (either invariant).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ModeCounts {
    pub reads: usize,
    pub stale: usize,
    pub stale_seq: usize,
    pub stale_token: usize,
    pub fell_back: usize,
}

/// Every read counted by the mode that answered it (`lease`, `quorum`, `resource`).
pub fn stale_reads(input: &CheckInput) -> BTreeMap<String, ModeCounts> {
    let mut out: BTreeMap<String, ModeCounts> = BTreeMap::new();
    for r in &input.reads {
        let c = out.entry(r.mode.clone()).or_default();
        c.reads += 1;
        c.fell_back += usize::from(r.fell_back);
    }
    for s in sweep(input) {
        let c = out.entry(s.read.mode.clone()).or_default();
        c.stale += 1;
        c.stale_seq += usize::from(s.seq_behind.is_some());
        c.stale_token += usize::from(s.token_behind.is_some());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    fn read(id: u64, mode: &str, token: i64, seq: i64, invoke: u64, complete: u64) -> ReadObs {
        ReadObs {
            source: format!("r#{id}"),
            node: "127.0.0.1:1".into(),
            mode: mode.into(),
            fell_back: false,
            token,
            seq,
            invoke_ns: invoke * 1_000_000,
            complete_ns: complete * 1_000_000,
        }
    }

    fn with_reads(reads: Vec<ReadObs>) -> CheckInput {
        CheckInput { reads, ..healthy() }
    }

    #[test]
    fn fresh_reads_pass() {
        // healthy(): token 5 acks seq 1..4 by t=5 ms, token 7 acks 5..9 from t=10 ms.
        let input = with_reads(vec![
            read(0, "lease", 5, 4, 6, 7),
            read(1, "quorum", 7, 9, 16, 17),
            // Overlaps the ack of seq 9 (completed at 15): may miss it.
            read(2, "lease", 7, 7, 14, 16),
            read(3, "resource", 7, 9, 20, 21),
        ]);
        assert_eq!(check_seq(&input), None);
        assert_eq!(check_token(&input), None);
        let counts = stale_reads(&input);
        assert_eq!(counts["lease"].reads, 2);
        assert_eq!(counts["lease"].stale, 0);
    }

    #[test]
    fn a_read_behind_an_acknowledged_seq_is_caught() {
        // Sent at 16 ms, after seq 9 was acknowledged at 15 ms, yet it read seq 7.
        let input = with_reads(vec![read(0, "lease", 7, 7, 16, 17)]);
        let v = check_seq(&input).expect("stale seq caught");
        assert_eq!(v.invariant, NAME_SEQ);
        assert!(v.message.contains("seq 9"), "{}", v.message);
        assert_eq!(check_token(&input), None);
    }

    #[test]
    fn a_deposed_leaders_lease_read_is_caught() {
        // The old leader (token 5) answers from memory after token 7's IDs were acknowledged:
        // both its token and its seq are stale.
        let input = with_reads(vec![
            read(0, "quorum", 7, 9, 20, 21),
            read(1, "lease", 5, 4, 12, 13),
        ]);
        let v = check_token(&input).expect("stale token caught");
        assert_eq!(v.invariant, NAME_TOKEN);
        assert!(v.message.contains("r#1"), "{}", v.message);
        assert!(check_seq(&input).is_some());
        let counts = stale_reads(&input);
        assert_eq!(counts["lease"].stale, 1);
        assert_eq!(counts["lease"].stale_token, 1);
        assert_eq!(counts["quorum"].stale, 0);
    }

    #[test]
    fn a_read_after_the_new_terms_claim_is_stale_even_before_any_ack() {
        // Token 7's claim was accepted at 8 ms (resource clock mapped onto the monotonic one,
        // guard included); no ID of token 7 was acknowledged before 11 ms. A token-5 read sent
        // at 9 ms is stale; one sent at 7 ms is not.
        let mut input = with_reads(vec![read(0, "lease", 5, 4, 9, 10)]);
        input.accepted = vec![Accepted {
            token: 7,
            at_ns: 8_000_000,
            what: "claim".into(),
        }];
        let v = check_token(&input).expect("stale token caught from the ledger");
        assert!(v.message.contains("ledger row"), "{}", v.message);
        input.reads = vec![read(0, "lease", 5, 4, 7, 10)];
        assert_eq!(check_token(&input), None);
        // The mapping: a row committed 5 ms after the paired readings lands 5 ms + guard later.
        let mut row = claim(1, 7, "n2", 4);
        row.committed_us = 1_000_005_000;
        let acc = accepted_from_ledger(&[row], 100_000_000, 1_000_000_000);
        assert_eq!(acc[0].at_ns, 105_000_000 + ACCEPT_GUARD_NS);
    }

    #[test]
    fn a_read_overlapping_the_new_terms_first_ack_may_be_old() {
        // Token 7's first ack completed at 11 ms; a read sent at 10.5 ms may still see token 5.
        let mut r = read(0, "lease", 5, 4, 10, 12);
        r.invoke_ns += 500_000;
        let input = with_reads(vec![r]);
        assert_eq!(check_token(&input), None);
        assert_eq!(check_seq(&input), None);
    }
}
