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

/// How one read is stale, with the ack that shows it.
struct Stale<'a> {
    read: &'a ReadObs,
    seq_behind: Option<&'a Ack>,
    token_behind: Option<&'a Ack>,
}

/// Every read with what it should have seen.
fn sweep(input: &CheckInput) -> Vec<Stale<'_>> {
    let mut acks: Vec<&Ack> = input.acks.iter().collect();
    acks.sort_by_key(|a| a.complete_ns);
    let mut reads: Vec<&ReadObs> = input.reads.iter().collect();
    reads.sort_by_key(|r| r.invoke_ns);
    let (mut i, mut max_seq, mut max_token): (usize, Option<&Ack>, Option<&Ack>) = (0, None, None);
    let mut out = Vec::new();
    for r in reads {
        while i < acks.len() && acks[i].complete_ns < r.invoke_ns {
            let a = acks[i];
            if max_seq.is_none_or(|m| a.seq > m.seq) {
                max_seq = Some(a);
            }
            if max_token.is_none_or(|m| a.token > m.token) {
                max_token = Some(a);
            }
            i += 1;
        }
        let seq_behind = max_seq.filter(|a| a.seq > r.seq);
        let token_behind = max_token.filter(|a| a.token > r.token);
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

fn violation(name: &'static str, r: &ReadObs, a: &Ack, what: &str, va: i64, vr: i64) -> Violation {
    let gap_us = r.invoke_ns.saturating_sub(a.complete_ns) as f64 / 1000.0;
    Violation::new(
        name,
        format!(
            "{} was acknowledged with {what} {va} {gap_us:.1} µs before {} was sent, which read {what} {vr}",
            a.source, r.source
        ),
        vec![format!("ack:  {}", a.describe()), format!("read: {}", r.describe())],
    )
}

/// `read_after_ack`: the first read that trails an acknowledged seq.
pub fn check_seq(input: &CheckInput) -> Option<Violation> {
    sweep(input).into_iter().find_map(|s| {
        s.seq_behind
            .map(|a| violation(NAME_SEQ, s.read, a, "seq", a.seq, s.read.seq))
    })
}

/// `read_token_fresh`: the first read whose token is older than an accepted one.
pub fn check_token(input: &CheckInput) -> Option<Violation> {
    sweep(input).into_iter().find_map(|s| {
        s.token_behind
            .map(|a| violation(NAME_TOKEN, s.read, a, "token", a.token, s.read.token))
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
    fn a_read_overlapping_the_new_terms_first_ack_may_be_old() {
        // Token 7's first ack completed at 11 ms; a read sent at 10.5 ms may still see token 5.
        let mut r = read(0, "lease", 5, 4, 10, 12);
        r.invoke_ns += 500_000;
        let input = with_reads(vec![r]);
        assert_eq!(check_token(&input), None);
        assert_eq!(check_seq(&input), None);
    }
}
