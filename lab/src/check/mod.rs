//! `baton check`: the history checker. It reads the resource's ledger (`baton.fence_log`), its
//! refusals (`baton.fence_rejections`) and any client histories written by `baton load`, and
//! checks one invariant per module, each returning its *first* counterexample:
//!
//! ```text
//! token_order.rs           per resource, in commit order (pos), the token never decreases
//! one_holder_per_token.rs  every token was written under one holder only
//! seq_increasing.rs        op='next' ranges [seq_lo, seq_hi] strictly increase: no reuse, no step back
//! realtime_order.rs        A completed before B was invoked ⇒ A.seq < B.seq and A.token ≤ B.token
//! acked_in_ledger.rs       every acknowledged (token, seq) is in exactly one ledger row of that token
//! acked_unique.rs          no seq was acknowledged to two requests
//! acting_timeline.rs       leaders acting by effect: no two tokens' write intervals interleave
//! rejections_consistent.rs every refusal is justified by its reason (stale token, holder, seq)
//! reads.rs                 GET /read: never behind an acknowledged seq or an accepted token
//! load.rs                  the thin loader: PostgreSQL + history files into [`CheckInput`]
//! ```
//!
//! The checkers work on plain in-memory structs ([`CheckInput`]), so each is unit-tested with
//! hand-made violating histories; [`load`] is the only part that touches a database.

pub mod acked_in_ledger;
pub mod acked_unique;
pub mod acting_timeline;
pub mod load;
pub mod one_holder_per_token;
pub mod reads;
pub mod realtime_order;
pub mod rejections_consistent;
pub mod seq_increasing;
pub mod token_order;

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

/// One row of `baton.fence_log`: an accepted write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LedgerRow {
    /// Commit order (the row's BIGSERIAL, taken under the resource's row lock).
    pub pos: i64,
    pub resource: String,
    pub token: i64,
    pub holder: String,
    /// `claim`, `next`, `tick`, `checkpoint`.
    pub op: String,
    pub seq_lo: Option<i64>,
    pub seq_hi: Option<i64>,
    /// `committed_at` on the resource's clock, µs since the Unix epoch.
    pub committed_us: i64,
}

/// One row of `baton.fence_rejections`: a refused write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejection {
    pub id: i64,
    pub resource: String,
    pub token: i64,
    pub max_token: i64,
    pub holder: String,
    pub max_holder: String,
    pub op: String,
    pub reason: String,
    /// µs since the Unix epoch, resource clock.
    pub at_us: i64,
}

/// One acknowledged ID from a client history (an `ok` outcome).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ack {
    /// Where it came from: `file#id`.
    pub source: String,
    pub token: i64,
    pub seq: i64,
    /// `CLOCK_MONOTONIC` ns: the request was sent no earlier than this...
    pub invoke_ns: u64,
    /// ...and its answer was in by this.
    pub complete_ns: u64,
    pub node: String,
}

/// Everything the checkers look at. `ledger` is in `pos` order.
#[derive(Clone, Debug, Default)]
pub struct CheckInput {
    pub ledger: Vec<LedgerRow>,
    pub rejections: Vec<Rejection>,
    pub acks: Vec<Ack>,
    /// Answered `GET /read`s from client histories (see [`reads`]).
    pub reads: Vec<reads::ReadObs>,
    /// Tokens the resource accepted, with when, on the clients' monotonic clock (see
    /// [`reads::accepted_from_ledger`]); more witnesses for `read_token_fresh` than the acks.
    pub accepted: Vec<reads::Accepted>,
}

/// The first counterexample of one invariant.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    /// One line: what went wrong, naming the rows or requests involved.
    pub message: String,
    /// The rows/requests around it, one per line.
    pub context: Vec<String>,
}

impl Violation {
    pub fn new(invariant: &'static str, message: String, context: Vec<String>) -> Violation {
        Violation {
            invariant,
            message,
            context,
        }
    }
}

/// A named invariant.
pub type Checker = fn(&CheckInput) -> Option<Violation>;

/// Every invariant, in the order they are reported.
pub const CHECKERS: &[(&str, Checker)] = &[
    (token_order::NAME, token_order::check),
    (one_holder_per_token::NAME, one_holder_per_token::check),
    (seq_increasing::NAME, seq_increasing::check),
    (realtime_order::NAME, realtime_order::check),
    (acked_in_ledger::NAME, acked_in_ledger::check),
    (acked_unique::NAME, acked_unique::check),
    (acting_timeline::NAME, acting_timeline::check),
    (rejections_consistent::NAME, rejections_consistent::check),
    (reads::NAME_SEQ, reads::check_seq),
    (reads::NAME_TOKEN, reads::check_token),
];

impl LedgerRow {
    /// Short form for counterexamples.
    pub fn describe(&self) -> String {
        let range = match (self.seq_lo, self.seq_hi) {
            (Some(lo), Some(hi)) => format!(" seq [{lo}, {hi}]"),
            (None, Some(hi)) => format!(" seq_hi {hi}"),
            (Some(lo), None) => format!(" seq_lo {lo}"),
            (None, None) => String::new(),
        };
        format!(
            "pos {} {} {} token {} holder {}{} at {}",
            self.pos,
            self.resource,
            self.op,
            self.token,
            self.holder,
            range,
            fmt_us(self.committed_us)
        )
    }
}

impl Ack {
    pub fn describe(&self) -> String {
        format!(
            "{} (token {}, seq {}) from {} invoked {} completed {}",
            self.source,
            self.token,
            self.seq,
            self.node,
            fmt_ns(self.invoke_ns),
            fmt_ns(self.complete_ns)
        )
    }
}

/// µs since the epoch → `seconds.micros` (UTC seconds since the epoch; exact, sortable).
pub fn fmt_us(us: i64) -> String {
    format!(
        "{}.{:06}",
        us.div_euclid(1_000_000),
        us.rem_euclid(1_000_000)
    )
}

/// Monotonic ns → `mono seconds.nanos`.
pub fn fmt_ns(ns: u64) -> String {
    format!("mono {}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// The outcome of every checker, plus the numbers of the verdict line.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub pass: bool,
    pub writes: usize,
    pub tokens: usize,
    pub acked: usize,
    pub rejections: usize,
    /// Reads per answering mode, with the stale ones counted (empty without reads).
    pub reads: std::collections::BTreeMap<String, reads::ModeCounts>,
    pub checked: Vec<&'static str>,
    pub violations: Vec<Violation>,
    pub timeline: acting_timeline::Timeline,
}

/// Runs every checker over `input`.
pub fn run(input: &CheckInput) -> Verdict {
    let mut checked = Vec::new();
    let mut violations = Vec::new();
    for (name, f) in CHECKERS {
        checked.push(*name);
        if let Some(v) = f(input) {
            violations.push(v);
        }
    }
    let tokens: BTreeSet<i64> = input.ledger.iter().map(|r| r.token).collect();
    Verdict {
        pass: violations.is_empty(),
        writes: input.ledger.len(),
        tokens: tokens.len(),
        acked: input.acks.len(),
        rejections: input.rejections.len(),
        reads: reads::stale_reads(input),
        checked,
        violations,
        timeline: acting_timeline::timeline(input),
    }
}

impl Verdict {
    /// The one-line verdict: `check: PASS (...)` or `check: FAIL <invariant>: <counterexample>`.
    pub fn line(&self) -> String {
        match self.violations.first() {
            None => format!(
                "check: PASS ({} writes, {} tokens, {} acked IDs)",
                self.writes, self.tokens, self.acked
            ),
            Some(v) => {
                let more = match self.violations.len() {
                    1 => String::new(),
                    n => format!(
                        " (+{} more: {})",
                        n - 1,
                        self.violations[1..]
                            .iter()
                            .map(|v| v.invariant)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                format!("check: FAIL {}: {}{more}", v.invariant, v.message)
            }
        }
    }

    pub fn failed(&self, invariant: &str) -> Option<&Violation> {
        self.violations.iter().find(|v| v.invariant == invariant)
    }

    /// The full human-readable report: timeline, each invariant, the verdict line last.
    pub fn render(&self) -> String {
        let mut out = self.timeline.render();
        out.push('\n');
        for (mode, c) in &self.reads {
            out.push_str(&format!(
                "  reads {mode}: {} answered, {} stale ({} behind an acked seq, {} behind an accepted token), {} fell back from lease\n",
                c.reads, c.stale, c.stale_seq, c.stale_token, c.fell_back
            ));
        }
        for name in &self.checked {
            match self.failed(name) {
                None => out.push_str(&format!("  ok    {name}\n")),
                Some(v) => {
                    out.push_str(&format!("  FAIL  {name}: {}\n", v.message));
                    for c in &v.context {
                        out.push_str(&format!("          {c}\n"));
                    }
                }
            }
        }
        out.push_str(&self.line());
        out.push('\n');
        out
    }
}

/// `baton check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Fleet directory: the ledger is read through its PostgreSQL admin URL.
    #[arg(long, default_value = "state/fleet")]
    pub dir: PathBuf,
    /// Read the ledger from this URL instead (a role that may read the baton schema's tables).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Client histories (`baton load --history`), JSON lines; repeatable.
    #[arg(long)]
    pub history: Vec<PathBuf>,
    /// Check only this resource's ledger rows (default: every resource).
    #[arg(long)]
    pub resource: Option<String>,
    /// A sharded fleet: check one shard's history alone (its resources, `name#S`, and the
    /// requests the histories sent to it). Shards lead side by side, so the fleet's ledger as
    /// a whole has K leaders acting at once by design; each shard must have one.
    #[arg(long)]
    pub shard: Option<u32>,
    /// Print the verdict as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `baton check`; returns the process exit code (0 pass, 1 violation).
pub async fn cli_main(a: CheckArgs) -> anyhow::Result<i32> {
    let url = match a.database_url {
        Some(u) => u,
        None => crate::fleet::FleetState::load(&a.dir)?.postgres.admin_url(),
    };
    let mut input = load::from_database(&url, a.resource.as_deref()).await?;
    input.acks = load::acks_from_histories(&a.history, a.shard)?;
    if let Some(s) = a.shard {
        let ours = |r: &str| baton::shard::shard_of_resource(r).0 == s;
        input.ledger.retain(|r| ours(&r.resource));
        input.rejections.retain(|r| ours(&r.resource));
    }
    input.reads = load::reads_from_histories(&a.history)?;
    // The ledger's rows witness accepted tokens too: map the resource's clock (PostgreSQL on
    // this machine) onto the monotonic clock the histories use, through readings taken now.
    let (mono_now, wall_now) = (
        baton::clock::monotonic_ns(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0),
    );
    input.accepted = reads::accepted_from_ledger(&input.ledger, mono_now, wall_now);
    let verdict = run(&input);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        print!("{}", verdict.render());
    }
    Ok(if verdict.pass { 0 } else { 1 })
}

#[cfg(test)]
pub(crate) mod testkit {
    //! Hand-made ledgers and histories for the checkers' unit tests.
    use super::*;

    /// A `next` row at `pos` committing `[lo, hi]` under `token` held by `holder`, at `pos` ms.
    pub fn next(pos: i64, token: i64, holder: &str, lo: i64, hi: i64) -> LedgerRow {
        LedgerRow {
            pos,
            resource: "sequence".into(),
            token,
            holder: holder.into(),
            op: "next".into(),
            seq_lo: Some(lo),
            seq_hi: Some(hi),
            committed_us: 1_700_000_000_000_000 + pos * 1000,
        }
    }

    /// A `claim` row.
    pub fn claim(pos: i64, token: i64, holder: &str, last: i64) -> LedgerRow {
        LedgerRow {
            op: "claim".into(),
            seq_lo: None,
            seq_hi: Some(last),
            ..next(pos, token, holder, 0, 0)
        }
    }

    /// An ack of `(token, seq)` sent at `invoke` ms and answered at `complete` ms.
    pub fn ack(id: u64, token: i64, seq: i64, invoke: u64, complete: u64) -> Ack {
        Ack {
            source: format!("h#{id}"),
            token,
            seq,
            invoke_ns: invoke * 1_000_000,
            complete_ns: complete * 1_000_000,
            node: "127.0.0.1:1".into(),
        }
    }

    /// Two leaders, a step-down between them, every ID acknowledged: passes everything.
    pub fn healthy() -> CheckInput {
        CheckInput {
            ledger: vec![
                claim(1, 5, "n1", 0),
                next(2, 5, "n1", 1, 3),
                next(3, 5, "n1", 4, 4),
                claim(4, 7, "n2", 4),
                next(5, 7, "n2", 5, 6),
                next(6, 7, "n2", 7, 9),
            ],
            rejections: vec![],
            acks: vec![
                ack(0, 5, 1, 0, 2),
                ack(1, 5, 2, 1, 2),
                ack(2, 5, 3, 1, 3),
                ack(3, 5, 4, 4, 5),
                ack(4, 7, 5, 10, 11),
                ack(5, 7, 6, 10, 12),
                ack(6, 7, 7, 13, 14),
                ack(7, 7, 9, 13, 15),
            ],
            reads: vec![],
            accepted: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::*;
    use super::*;

    #[test]
    fn healthy_history_passes_every_checker() {
        let v = run(&healthy());
        assert!(v.pass, "{}", v.render());
        assert_eq!(v.line(), "check: PASS (6 writes, 2 tokens, 8 acked IDs)");
        assert_eq!(v.checked.len(), CHECKERS.len());
    }

    #[test]
    fn verdict_names_the_first_failing_invariant_and_counts_the_rest() {
        let mut input = healthy();
        // A stale leader (token 5) commits seq 6 again after token 7 took over.
        input.ledger.push(next(7, 5, "n1", 6, 6));
        let v = run(&input);
        assert!(!v.pass);
        let line = v.line();
        assert!(line.starts_with("check: FAIL token_order: "), "{line}");
        assert!(v.failed("seq_increasing").is_some(), "{}", v.render());
        assert!(v.failed("acting_timeline").is_some(), "{}", v.render());
        assert!(line.contains("more: "), "{line}");
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["pass"], false);
        assert_eq!(json["violations"][0]["invariant"], "token_order");
    }
}
