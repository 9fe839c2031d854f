//! What a run's raw material says: leadership transitions and failover times from the ledger
//! (resource clock), elections from the nodes' actor traces (monotonic clock), the fate of a paused
//! or partitioned leader's writes, false failovers. Pure functions over plain data, unit-tested.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::faults::FaultRecord;
use super::spec::FaultKind;
use crate::check::{CheckInput, LedgerRow, Rejection};

/// Run time origin: one instant read on both clocks, so the ledger's `committed_at` (PostgreSQL's
/// `clock_timestamp()`, this machine's realtime clock) and every `CLOCK_MONOTONIC` stamp (faults,
/// traces, client history) land on one axis: seconds since the load started.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Clock0 {
    pub mono0_ns: u64,
    pub wall0_us: i64,
}

impl Clock0 {
    pub fn now() -> Clock0 {
        let mono0_ns = baton::clock::monotonic_ns();
        let wall0_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Clock0 { mono0_ns, wall0_us }
    }

    pub fn mono_s(&self, ns: u64) -> f64 {
        (ns as f64 - self.mono0_ns as f64) / 1e9
    }

    pub fn wall_s(&self, us: i64) -> f64 {
        (us - self.wall0_us) as f64 / 1e6
    }
}

/// A change of leadership in the sequencer's ledger rows (`op = 'next'`, commit order).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Transition {
    pub from_token: i64,
    pub from_holder: String,
    pub to_token: i64,
    pub to_holder: String,
    /// Run time (s) of the old leadership's last `next` row before the new one's first.
    pub last_old_s: f64,
    pub first_new_s: f64,
    /// Failover / dark time on the resource clock: first new − last old, ms.
    pub gap_ms: f64,
    /// Index of the fault this transition followed (each fault explains at most one).
    pub cause: Option<usize>,
    pub cause_kind: Option<FaultKind>,
    /// First new write − the fault's application, ms.
    pub from_fault_ms: Option<f64>,
}

/// Leadership transitions in `next` rows: a new `(token, holder)` at its first row; rows of an
/// already-seen leadership (a stale leader's write accepted with fencing off) start none.
pub fn transitions(
    ledger: &[LedgerRow],
    faults: &[FaultRecord],
    clock: &Clock0,
) -> Vec<Transition> {
    let next: Vec<&LedgerRow> = ledger.iter().filter(|r| r.op == "next").collect();
    let mut seen: HashSet<(i64, &str)> = HashSet::new();
    let mut last_us: BTreeMap<(i64, &str), i64> = BTreeMap::new();
    let mut out = Vec::new();
    let mut prev: Option<(i64, &str)> = None;
    for r in next {
        let key = (r.token, r.holder.as_str());
        if !seen.contains(&key) {
            if let Some(p) = prev {
                let last = last_us.get(&p).copied().unwrap_or(r.committed_us);
                out.push(Transition {
                    from_token: p.0,
                    from_holder: p.1.to_owned(),
                    to_token: r.token,
                    to_holder: r.holder.clone(),
                    last_old_s: clock.wall_s(last),
                    first_new_s: clock.wall_s(r.committed_us),
                    gap_ms: (r.committed_us - last) as f64 / 1000.0,
                    cause: None,
                    cause_kind: None,
                    from_fault_ms: None,
                });
            }
            seen.insert(key);
        }
        last_us.insert(key, r.committed_us);
        prev = Some(key);
    }
    attribute(&mut out, faults, clock);
    out
}

/// Each transition is caused by the latest fault applied before its first new write, if that
/// fault has not explained an earlier transition.
fn attribute(ts: &mut [Transition], faults: &[FaultRecord], clock: &Clock0) {
    let mut order: Vec<usize> = (0..faults.len()).collect();
    order.sort_by_key(|&i| faults[i].applied_at_mono_ns);
    let mut used = HashSet::new();
    for t in ts.iter_mut() {
        let Some(i) = order
            .iter()
            .copied()
            .rfind(|&i| clock.mono_s(faults[i].applied_at_mono_ns) <= t.first_new_s)
        else {
            continue;
        };
        if used.insert(i) {
            t.cause = Some(i);
            t.cause_kind = Some(faults[i].kind);
            t.from_fault_ms =
                Some((t.first_new_s - clock.mono_s(faults[i].applied_at_mono_ns)) * 1000.0);
        }
    }
}

/// Transitions nothing justified: after no fault at all, or after a pause / partition shorter
/// than the lease TTL (which the lease is there to ride out). A kill, a step-down, or a pause /
/// partition of at least the TTL is *meant* to move leadership.
pub fn false_failovers(ts: &[Transition], faults: &[FaultRecord], ttl_ms: u64) -> usize {
    ts.iter()
        .filter(|t| match t.cause.and_then(|i| faults.get(i)) {
            None => true,
            Some(f) if f.kind.forces_change() => false,
            Some(f) => {
                let len_ns = f
                    .healed_at_mono_ns
                    .map(|h| h.saturating_sub(f.applied_at_mono_ns))
                    .unwrap_or(0);
                len_ns < ttl_ms * 1_000_000
            }
        })
        .count()
}

/// One actor-trace line (`<node dir>/actor-trace.jsonl`).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TraceEvent {
    pub node: String,
    pub actor: String,
    pub event: String,
    #[serde(default)]
    pub token: Option<i64>,
    pub mono_ns: u64,
    #[serde(default)]
    pub detail: String,
}

/// Every node's trace, merged in monotonic order. Unreadable lines are skipped.
pub fn read_traces(nodes_dir: &Path) -> Vec<TraceEvent> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(nodes_dir) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("actor-trace.jsonl")) else {
            continue;
        };
        out.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<TraceEvent>(l).ok()),
        );
    }
    out.sort_by_key(|e| e.mono_ns);
    out
}

/// One won election.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Election {
    pub node: String,
    pub token: Option<i64>,
    /// Run time of `won`.
    pub won_s: f64,
    /// This node's `campaign` → `won`, ms (what `baton_campaign_duration_seconds` records):
    /// includes the time queued behind a live leader.
    pub campaign_ms: Option<f64>,
    /// Seat vacant (as the winner saw it) → `won`, ms: the election itself
    /// (`baton_election_duration_seconds`; `election_us=` in the `won` step's detail).
    #[serde(default)]
    pub election_ms: Option<f64>,
    /// Kill / step-down of the previous leader → this `won`, ms (the first win after that fault).
    pub after_fault_ms: Option<f64>,
    pub after_fault: Option<usize>,
}

/// The `election_us=N` field of a `won` step's detail.
fn election_us(detail: &str) -> Option<u64> {
    detail
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("election_us="))
        .and_then(|v| v.parse().ok())
}

/// Elections from the traces; the first win after each kill / step-down is tied to it.
pub fn elections(events: &[TraceEvent], faults: &[FaultRecord], clock: &Clock0) -> Vec<Election> {
    let mut campaign_at: BTreeMap<&str, u64> = BTreeMap::new();
    let mut out: Vec<Election> = Vec::new();
    for e in events.iter().filter(|e| e.actor == "elector") {
        match e.event.as_str() {
            "campaign" => {
                campaign_at.insert(&e.node, e.mono_ns);
            }
            "won" => {
                let c = campaign_at.remove(e.node.as_str());
                out.push(Election {
                    node: e.node.clone(),
                    token: e.token,
                    won_s: clock.mono_s(e.mono_ns),
                    campaign_ms: c.map(|c| (e.mono_ns.saturating_sub(c)) as f64 / 1e6),
                    election_ms: election_us(&e.detail).map(|us| us as f64 / 1000.0),
                    after_fault_ms: None,
                    after_fault: None,
                });
            }
            _ => {}
        }
    }
    for (i, f) in faults.iter().enumerate() {
        if !f.kind.forces_change() {
            continue;
        }
        let at = clock.mono_s(f.applied_at_mono_ns);
        if let Some(el) = out
            .iter_mut()
            // The killed node itself may win again once restarted (a backend without a queue):
            // that is a new process and a real election.
            .find(|el| el.won_s > at && el.after_fault.is_none())
        {
            el.after_fault = Some(i);
            el.after_fault_ms = Some((el.won_s - at) * 1000.0);
        }
    }
    out
}

/// Detection latency per `kill -9` of the leader: the fault's application → the first
/// survivor's elector (or placement) tracing the killed node `peer-dead` (the failure
/// detector's confirmation), ms, within 10 s. Kills no survivor traced (the lease detector,
/// or a confirmation that came too late to matter) are left out.
pub fn detections(events: &[TraceEvent], faults: &[FaultRecord]) -> Vec<f64> {
    const WITHIN_NS: u64 = 10_000_000_000;
    faults
        .iter()
        .filter(|f| f.kind == FaultKind::KillLeader)
        .filter_map(|f| {
            events
                .iter()
                .find(|e| {
                    e.event == "peer-dead"
                        && matches!(e.actor.as_str(), "elector" | "placement")
                        && e.detail == f.node
                        && e.node != f.node
                        && e.mono_ns > f.applied_at_mono_ns
                        && e.mono_ns - f.applied_at_mono_ns <= WITHIN_NS
                })
                .map(|e| (e.mono_ns - f.applied_at_mono_ns) as f64 / 1e6)
        })
        .collect()
}

/// Wins between consecutive kills / step-downs (the last round runs to the end): `{wins: rounds}`.
/// Exactly one winner per round is the healthy shape; 0 means the round ended before anyone won.
pub fn winners_per_round(
    els: &[Election],
    faults: &[FaultRecord],
    clock: &Clock0,
) -> BTreeMap<usize, usize> {
    let mut starts: Vec<f64> = faults
        .iter()
        .filter(|f| f.kind.forces_change())
        .map(|f| clock.mono_s(f.applied_at_mono_ns))
        .collect();
    starts.sort_by(|a, b| a.total_cmp(b));
    let mut out = BTreeMap::new();
    for (i, s) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(f64::INFINITY);
        let n = els
            .iter()
            .filter(|e| e.won_s > *s && e.won_s <= end)
            .count();
        *out.entry(n).or_default() += 1;
    }
    out
}

/// Wins per node (every node of the fleet listed, zero included): starvation shows as zeros.
pub fn wins_per_node(els: &[Election], nodes: &[String]) -> BTreeMap<String, usize> {
    let mut m: BTreeMap<String, usize> = nodes.iter().map(|n| (n.clone(), 0)).collect();
    for e in els {
        *m.entry(e.node.clone()).or_default() += 1;
    }
    m
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RejectionBrief {
    pub resource: String,
    pub token: i64,
    pub max_token: i64,
    pub holder: String,
    pub max_holder: String,
    pub op: String,
    pub reason: String,
    pub at_s: f64,
}

impl RejectionBrief {
    pub fn of(r: &Rejection, clock: &Clock0) -> RejectionBrief {
        RejectionBrief {
            resource: r.resource.clone(),
            token: r.token,
            max_token: r.max_token,
            holder: r.holder.clone(),
            max_holder: r.max_holder.clone(),
            op: r.op.clone(),
            reason: r.reason.clone(),
            at_s: clock.wall_s(r.at_us),
        }
    }
}

/// A stale leader's write the resource accepted (fencing off).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AcceptedStale {
    pub pos: i64,
    pub resource: String,
    pub op: String,
    pub seq_lo: Option<i64>,
    pub seq_hi: Option<i64>,
    /// The highest `seq_hi` this resource had committed before this row.
    pub prior_max: Option<i64>,
    pub backward: bool,
    pub at_s: f64,
}

/// What became of a paused / partitioned leader.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StaleEvidence {
    pub fault: usize,
    pub node: String,
    pub token: Option<i64>,
    pub applied_s: f64,
    pub healed_s: Option<f64>,
    /// The first other leadership to write after the fault: token, holder, run time.
    pub successor: Option<(i64, String, f64)>,
    /// The resource's refusals of this node's token after the fault.
    pub rejected: Vec<RejectionBrief>,
    /// This node's token's rows accepted after the successor's first write (must be 0 with fencing).
    pub accepted_after_successor: usize,
    /// The first few of them: what the stale leader got through, and whether it moved its
    /// resource backward (a `seq_hi` below the highest one that resource had already committed:
    /// reused seq, or a work-set cursor set back).
    pub accepted: Vec<AcceptedStale>,
    /// This node's first demotion step after the fault: event and run time.
    pub demotion: Option<(String, f64)>,
    /// The first `won` of another node after the fault (actor traces), run time.
    pub successor_won_s: Option<f64>,
    /// How long both believed they led: this node's demotion − the successor's `won`, ms
    /// (≤ 0: the old leader had stepped back before the new one won).
    pub belief_overlap_ms: Option<f64>,
    pub outcome: String,
}

pub fn stale_evidence(
    input: &CheckInput,
    faults: &[FaultRecord],
    events: &[TraceEvent],
    clock: &Clock0,
) -> Vec<StaleEvidence> {
    let mut out = Vec::new();
    for (i, f) in faults.iter().enumerate() {
        if !f.kind.isolates_leader() {
            continue;
        }
        let applied = clock.mono_s(f.applied_at_mono_ns);
        let healed = f.healed_at_mono_ns.map(|h| clock.mono_s(h));
        let token = f.token_before;
        let mine = |r: &LedgerRow| Some(r.token) == token && r.holder == f.node;
        // A successor must show up before the next fault (a later kill's successor is not one).
        let window_end = faults
            .iter()
            .map(|g| clock.mono_s(g.applied_at_mono_ns))
            .filter(|t| *t > applied)
            .fold(f64::INFINITY, f64::min);
        let successor = input
            .ledger
            .iter()
            .filter(|r| clock.wall_s(r.committed_us) >= applied && !mine(r))
            .filter(|r| clock.wall_s(r.committed_us) < window_end)
            .min_by_key(|r| r.pos)
            .map(|r| (r.token, r.holder.clone(), clock.wall_s(r.committed_us)));
        let rejected: Vec<RejectionBrief> = input
            .rejections
            .iter()
            .filter(|r| Some(r.token) == token && r.holder == f.node)
            .filter(|r| clock.wall_s(r.at_us) >= applied)
            .map(|r| RejectionBrief::of(r, clock))
            .collect();
        let accepted_after_successor = match &successor {
            Some((_, _, at)) => input
                .ledger
                .iter()
                .filter(|r| mine(r) && clock.wall_s(r.committed_us) > *at)
                .count(),
            None => 0,
        };
        let accepted: Vec<AcceptedStale> = match &successor {
            Some((_, _, at)) => input
                .ledger
                .iter()
                .filter(|r| mine(r) && clock.wall_s(r.committed_us) > *at)
                .take(5)
                .map(|r| {
                    let prior_max = input
                        .ledger
                        .iter()
                        .filter(|p| p.pos < r.pos && p.resource == r.resource)
                        .filter_map(|p| p.seq_hi)
                        .max();
                    let low = r.seq_lo.or(r.seq_hi);
                    AcceptedStale {
                        pos: r.pos,
                        resource: r.resource.clone(),
                        op: r.op.clone(),
                        seq_lo: r.seq_lo,
                        seq_hi: r.seq_hi,
                        prior_max,
                        // `next`: a seq at or below one already committed is reused; a tick or
                        // checkpoint starting below the committed position sets the cursor back.
                        backward: match (low, prior_max) {
                            (Some(l), Some(m)) if r.op == "next" => l <= m,
                            (Some(l), Some(m)) if r.op != "claim" => l < m,
                            _ => false,
                        },
                        at_s: clock.wall_s(r.committed_us),
                    }
                })
                .collect(),
            None => Vec::new(),
        };
        let demotion = events
            .iter()
            .filter(|e| e.node == f.node && clock.mono_s(e.mono_ns) >= applied)
            .find(|e| {
                matches!(
                    e.event.as_str(),
                    "deadline-passed" | "demoted" | "lease-lost"
                )
            })
            .map(|e| (format!("{}/{}", e.actor, e.event), clock.mono_s(e.mono_ns)));
        let successor_won_s = events
            .iter()
            .filter(|e| e.node != f.node && e.actor == "elector" && e.event == "won")
            .map(|e| clock.mono_s(e.mono_ns))
            .find(|t| *t >= applied);
        let belief_overlap_ms = match (&demotion, successor_won_s) {
            (Some((_, d)), Some(w)) => Some((d - w) * 1000.0),
            _ => None,
        };
        let resume = healed.unwrap_or(applied);
        let what = if f.kind == FaultKind::PauseLeader {
            "resume"
        } else {
            "heal"
        };
        let tok = token.map(|t| t.to_string()).unwrap_or_else(|| "?".into());
        let outcome = if accepted_after_successor > 0 {
            let back: Vec<String> = accepted
                .iter()
                .filter(|a| a.backward)
                .map(|a| {
                    format!(
                        "{} {} [{}, {}] below committed {}",
                        a.resource,
                        a.op,
                        a.seq_lo.map(|v| v.to_string()).unwrap_or_default(),
                        a.seq_hi.map(|v| v.to_string()).unwrap_or_default(),
                        a.prior_max.unwrap_or_default()
                    )
                })
                .collect();
            format!(
                "STALE WRITES ACCEPTED: {accepted_after_successor} rows under token {tok} ({}) after token {} ({}) started{}",
                f.node,
                successor.as_ref().map(|s| s.0).unwrap_or_default(),
                successor.as_ref().map(|s| s.1.as_str()).unwrap_or("?"),
                if back.is_empty() {
                    String::new()
                } else {
                    format!("; BACKWARD: {}", back.join("; "))
                }
            )
        } else if let Some(r) = rejected.first() {
            format!(
                "stale write fenced out: {} with token {tok} ({}) refused at max_token {} ({}), reason {}, {:+.0} ms after {what}; {} refused in all",
                r.op,
                f.node,
                r.max_token,
                r.max_holder,
                r.reason,
                (r.at_s - resume) * 1000.0,
                rejected.len()
            )
        } else if successor.is_none() {
            "rode it out: kept its lease, no successor wrote before the next fault, nothing refused"
                .into()
        } else if let Some((ev, at)) = &demotion {
            format!(
                "demoted itself before writing: {ev} {:+.0} ms after the fault began ({:+.0} ms from {what}), no write attempted under token {tok}",
                (at - applied) * 1000.0,
                (at - resume) * 1000.0
            )
        } else {
            format!("no write under token {tok} after the fault, no demotion step traced")
        };
        out.push(StaleEvidence {
            fault: i,
            node: f.node.clone(),
            token,
            applied_s: applied,
            healed_s: healed,
            successor,
            rejected,
            accepted_after_successor,
            accepted,
            demotion,
            successor_won_s,
            belief_overlap_ms,
            outcome,
        });
    }
    out
}

/// Non-increasing steps among `next` rows in commit order: the `lag()` check
/// (`seq_lo <= lag(seq_hi)` or `token < lag(token)`), counted.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SeqSteps {
    pub next_rows: usize,
    pub seq_not_increasing: usize,
    pub token_backward: usize,
}

pub fn seq_steps(ledger: &[LedgerRow]) -> SeqSteps {
    let mut s = SeqSteps::default();
    let mut prev: Option<&LedgerRow> = None;
    for r in ledger.iter().filter(|r| r.op == "next") {
        s.next_rows += 1;
        if let Some(p) = prev {
            if r.seq_lo.unwrap_or(0) <= p.seq_hi.unwrap_or(0) {
                s.seq_not_increasing += 1;
            }
            if r.token < p.token {
                s.token_backward += 1;
            }
        }
        prev = Some(r);
    }
    s
}

/// Leaders acting by effect over run time: `(t, count)` steps from the timeline's intervals.
pub fn acting_steps(input: &CheckInput, clock: &Clock0) -> Vec<(f64, i32)> {
    let t = crate::check::acting_timeline::timeline(input);
    let mut ev: Vec<(i64, i32)> = Vec::new();
    for iv in &t.intervals {
        ev.push((iv.first_us, 1));
        ev.push((iv.last_us, -1));
    }
    // At equal times, starts before ends: a single-write interval still counts at its instant.
    ev.sort_by_key(|&(t, d)| (t, -d));
    let mut out = Vec::new();
    let mut n = 0;
    for (t, d) in ev {
        n += d;
        out.push((clock.wall_s(t), n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    fn clock() -> Clock0 {
        Clock0 {
            mono0_ns: 1_000_000_000,
            wall0_us: 1_700_000_000_000_000,
        }
    }

    fn fault(kind: FaultKind, node: &str, token: i64, at_ms: u64, len_ms: u64) -> FaultRecord {
        FaultRecord {
            kind,
            node: node.into(),
            token_before: Some(token),
            scheduled_ms: at_ms as f64,
            applied_at_mono_ns: 1_000_000_000 + at_ms * 1_000_000,
            healed_at_mono_ns: Some(1_000_000_000 + (at_ms + len_ms) * 1_000_000),
            verified: true,
            detail: String::new(),
        }
    }

    #[test]
    fn detection_is_the_first_survivors_confirmation_of_the_killed_node() {
        let ev = |node: &str, actor: &str, event: &str, ms: u64, detail: &str| TraceEvent {
            node: node.into(),
            actor: actor.into(),
            event: event.into(),
            token: None,
            mono_ns: 1_000_000_000 + ms * 1_000_000,
            detail: detail.into(),
        };
        let kills = [
            fault(FaultKind::KillLeader, "n1", 5, 1000, 0),
            fault(FaultKind::PauseLeader, "n2", 6, 5000, 300),
            fault(FaultKind::KillLeader, "n3", 7, 9000, 0),
        ];
        let events = [
            // Before the kill, about another node, by the killed node itself, another event:
            ev("n2", "elector", "peer-dead", 900, "n1"),
            ev("n2", "elector", "peer-dead", 1200, "n4"),
            ev("n1", "elector", "peer-dead", 1300, "n1"),
            ev("n2", "elector", "won", 1350, ""),
            ev("n5", "elector", "peer-dead", 1450, "n1"),
            ev("n2", "elector", "peer-dead", 1500, "n1"),
            // The pause's confirmation is no kill's; the second kill is never confirmed.
            ev("n4", "elector", "peer-dead", 5400, "n2"),
        ];
        assert_eq!(detections(&events, &kills), vec![450.0]);
        // More than 10 s later is not this kill's detection.
        let late = [ev("n2", "elector", "peer-dead", 11_500, "n1")];
        assert!(detections(&late, &kills[..1]).is_empty());
    }

    #[test]
    fn transitions_are_attributed_to_the_fault_before_them_once() {
        let input = healthy(); // token 5 (n1) at 1..3 ms, token 7 (n2) from 4 ms (pos = ms)
        let kill = fault(FaultKind::KillLeader, "n1", 5, 3, 0);
        let ts = transitions(&input.ledger, std::slice::from_ref(&kill), &clock());
        assert_eq!(ts.len(), 1);
        let t = &ts[0];
        assert_eq!((t.from_token, t.to_token), (5, 7));
        assert!((t.gap_ms - 2.0).abs() < 1e-9, "{t:?}"); // last next of 5 at 3 ms, first of 7 at 5 ms
        assert_eq!(t.cause, Some(0));
        assert!((t.from_fault_ms.unwrap() - 2.0).abs() < 1e-6);
        assert_eq!(false_failovers(&ts, std::slice::from_ref(&kill), 3), 0);
        // The same change after a pause shorter than the TTL is a false failover...
        let pause = fault(FaultKind::PauseLeader, "n1", 5, 3, 1);
        let ts = transitions(&input.ledger, std::slice::from_ref(&pause), &clock());
        assert_eq!(false_failovers(&ts, std::slice::from_ref(&pause), 3), 1);
        // ...and after one past the TTL, the point of the exercise.
        assert_eq!(false_failovers(&ts, &[pause], 1), 0);
    }

    #[test]
    fn a_stale_write_refused_with_its_token_is_the_evidence() {
        let mut input = healthy();
        input.rejections.push(Rejection {
            id: 1,
            resource: "sequence".into(),
            token: 5,
            max_token: 7,
            holder: "n1".into(),
            max_holder: "n2".into(),
            op: "next".into(),
            reason: "stale-token".into(),
            at_us: 1_700_000_000_000_000 + 8000,
        });
        let pause = fault(FaultKind::PauseLeader, "n1", 5, 3, 4);
        let ev = stale_evidence(&input, &[pause], &[], &clock());
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].rejected.len(), 1);
        assert_eq!(ev[0].accepted_after_successor, 0);
        assert!(
            ev[0].outcome.starts_with(
                "stale write fenced out: next with token 5 (n1) refused at max_token 7"
            ),
            "{}",
            ev[0].outcome
        );
        // Fencing off: the stale row is accepted after the successor started.
        let mut off = healthy();
        off.ledger.push(next(9, 5, "n1", 5, 5));
        let pause = fault(FaultKind::PauseLeader, "n1", 5, 3, 4);
        let ev = stale_evidence(&off, &[pause], &[], &clock());
        assert_eq!(ev[0].accepted_after_successor, 1);
        assert!(ev[0].outcome.starts_with("STALE WRITES ACCEPTED"));
        let s = seq_steps(&off.ledger);
        assert_eq!((s.seq_not_increasing, s.token_backward), (1, 1));
        assert_eq!(seq_steps(&healthy().ledger).seq_not_increasing, 0);
    }

    #[test]
    fn elections_pair_campaign_and_won_and_tie_the_first_win_to_a_kill() {
        let ev = |node: &str, event: &str, ms: u64| TraceEvent {
            node: node.into(),
            actor: "elector".into(),
            event: event.into(),
            token: (event == "won").then_some(1),
            mono_ns: 1_000_000_000 + ms * 1_000_000,
            detail: String::new(),
        };
        let mut events = vec![
            ev("n1", "campaign", 0),
            ev("n2", "campaign", 1),
            ev("n1", "won", 5),
            ev("n2", "won", 300),
        ];
        // n2 queued for 299 ms but its election (vacancy → won) took 12.5 ms.
        events[3].detail = "election_us=12500".into();
        let kill = fault(FaultKind::KillLeader, "n1", 1, 100, 0);
        let els = elections(&events, &[kill], &clock());
        assert_eq!(els.len(), 2);
        assert!((els[0].campaign_ms.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(els[0].after_fault, None);
        assert!((els[1].campaign_ms.unwrap() - 299.0).abs() < 1e-9);
        assert!((els[1].after_fault_ms.unwrap() - 200.0).abs() < 1e-6);
        assert_eq!(els[0].election_ms, None);
        assert_eq!(els[1].election_ms, Some(12.5));
        let wins = wins_per_node(&els, &["n1".into(), "n2".into(), "n3".into()]);
        assert_eq!(wins["n3"], 0);
    }

    #[test]
    fn acting_steps_count_overlaps() {
        let mut input = healthy();
        let mut row = next(20, 9, "n3", 50, 50);
        row.committed_us = 1_700_000_000_000_000 + 5500;
        input.ledger.push(row);
        let steps = acting_steps(&input, &clock());
        assert_eq!(steps.iter().map(|s| s.1).max(), Some(2));
        assert_eq!(steps.last().unwrap().1, 0);
    }
}
