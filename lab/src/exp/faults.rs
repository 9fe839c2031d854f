//! Applying an experiment's fault schedule to a running fleet. Kill, pause and step-down are done
//! here directly (by pid, over HTTP); partitions go through [`crate::chaos`], which owns the
//! network namespaces. Every fault is verified as applied (the process is gone / stopped) before
//! it counts, and a pause is always undone (SIGCONT on drop, also on error or cancellation).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;

use super::spec::{FaultKind, FaultSpec};
use crate::fleet::servers::pid_alive;
use crate::fleet::{self, FleetState};
use baton::clock::monotonic_ns;

/// One fault occurrence, scheduled.
#[derive(Clone, Debug)]
pub struct Occurrence {
    pub kind: FaultKind,
    /// From the start of the load.
    pub at: Duration,
    pub length: Option<Duration>,
    pub restart_after: Option<Duration>,
}

/// One fault as applied.
#[derive(Clone, Debug, Serialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    /// The node it hit (the leader at that moment).
    pub node: String,
    /// That node's token when it was hit.
    pub token_before: Option<i64>,
    /// Planned offset from the load start, ms.
    pub scheduled_ms: f64,
    /// `CLOCK_MONOTONIC` ns: the fault took effect (signal sent, request sent, rule installed)...
    pub applied_at_mono_ns: u64,
    /// ...and was undone (SIGCONT, rule removed, step-down answered); a kill heals on restart.
    pub healed_at_mono_ns: Option<u64>,
    /// Whether it was observed to have taken effect (process gone / stopped / path cut).
    pub verified: bool,
    pub detail: String,
}

/// Expands the fault specs into occurrences within `duration`, with seeded jitter, in time order.
pub fn schedule(
    faults: &[FaultSpec],
    ttl_ms: u64,
    duration: Duration,
    rng: &mut StdRng,
) -> Vec<Occurrence> {
    let mut out = Vec::new();
    for f in faults {
        let first = f.at.eval(ttl_ms);
        let every = f.every.map(|e| e.eval(ttl_ms)).unwrap_or_default();
        for k in 0..f.count {
            let base = first + every * k as u32;
            let jitter = if f.jitter_ms > 0 {
                rng.gen_range(-(f.jitter_ms as i64)..=f.jitter_ms as i64)
            } else {
                0
            };
            let at_ms = (base.as_millis() as i64 + jitter).max(0) as u64;
            let at = Duration::from_millis(at_ms);
            if at >= duration {
                break;
            }
            out.push(Occurrence {
                kind: f.kind,
                at,
                length: f.length.map(|l| l.eval(ttl_ms)),
                restart_after: f.restart_after.map(|r| r.eval(ttl_ms)),
            });
        }
    }
    out.sort_by_key(|o| o.at);
    out
}

fn proc_state(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next().map(str::to_owned)
}

/// SIGCONT on drop: a stopped node is never left behind.
struct ContOnDrop(u32);

impl Drop for ContOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid this fleet started.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// `kill -9` of the leader; verified when the process is gone.
pub async fn kill_leader(
    state: &Arc<Mutex<FleetState>>,
    scheduled_ms: f64,
) -> anyhow::Result<FaultRecord> {
    let snapshot = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (leader, token) = fleet::current_leader(&snapshot, Duration::from_secs(15)).await?;
    let (node, pid) = (leader.id, leader.pid);
    let applied = monotonic_ns();
    snapshot.kill_node(&node)?;
    let until = Instant::now() + Duration::from_secs(5);
    let mut verified = false;
    while Instant::now() < until {
        if !pid_alive(pid) {
            verified = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(FaultRecord {
        kind: FaultKind::KillLeader,
        node,
        token_before: Some(token),
        scheduled_ms,
        applied_at_mono_ns: applied,
        healed_at_mono_ns: None,
        verified,
        detail: format!("SIGKILL pid {pid}"),
    })
}

/// Restarts a killed node with its state dir; returns the restart time.
pub async fn restart(state: &Arc<Mutex<FleetState>>, node: &str) -> anyhow::Result<u64> {
    let pid = {
        let s = state.lock().unwrap_or_else(|p| p.into_inner());
        s.node(node)?.pid
    };
    let until = Instant::now() + Duration::from_secs(10);
    while pid_alive(pid) {
        if Instant::now() > until {
            bail!("{node} (pid {pid}) survived SIGKILL");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let at = monotonic_ns();
    state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .start_node(node)
        .with_context(|| format!("restarting {node}"))?;
    Ok(at)
}

/// SIGSTOP of the leader for `length`, then SIGCONT; verified through `/proc/<pid>/stat`.
pub async fn pause_leader(
    state: &Arc<Mutex<FleetState>>,
    length: Duration,
    scheduled_ms: f64,
) -> anyhow::Result<FaultRecord> {
    let snapshot = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (leader, token) = fleet::current_leader(&snapshot, Duration::from_secs(15)).await?;
    let (node, pid) = (leader.id, leader.pid);
    let applied = monotonic_ns();
    // SAFETY: kill(2) on a pid this fleet started.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let guard = ContOnDrop(pid);
    let mut verified = false;
    for _ in 0..100 {
        if proc_state(pid).as_deref() == Some("T") {
            verified = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let target =
        Instant::now() + length.saturating_sub(Duration::from_nanos(monotonic_ns() - applied));
    tokio::time::sleep_until(target).await;
    drop(guard);
    let healed = monotonic_ns();
    let mut resumed = false;
    for _ in 0..100 {
        if proc_state(pid).as_deref() != Some("T") {
            resumed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(FaultRecord {
        kind: FaultKind::PauseLeader,
        node,
        token_before: Some(token),
        scheduled_ms,
        applied_at_mono_ns: applied,
        healed_at_mono_ns: Some(healed),
        verified: verified && resumed,
        detail: format!(
            "SIGSTOP pid {pid} for {} ms{}",
            length.as_millis(),
            if resumed { "" } else { " (still stopped?)" }
        ),
    })
}

/// `POST /stepdown` to the leader; verified by a 200.
pub async fn stepdown_leader(
    state: &Arc<Mutex<FleetState>>,
    scheduled_ms: f64,
) -> anyhow::Result<FaultRecord> {
    stepdown_leader_to(state, scheduled_ms, None).await
}

/// `POST /stepdown` to the leader, handing over to the `pick`-th other live node when given
/// (a leadership transfer); verified by a 200.
pub async fn stepdown_leader_to(
    state: &Arc<Mutex<FleetState>>,
    scheduled_ms: f64,
    pick: Option<u64>,
) -> anyhow::Result<FaultRecord> {
    let snapshot = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let client = snapshot.admin_client(Duration::from_secs(40));
    for _ in 0..5 {
        let (leader, token) = fleet::current_leader(&snapshot, Duration::from_secs(15)).await?;
        let node = leader.id.clone();
        let successor = pick.and_then(|k| {
            let others: Vec<&fleet::FleetNode> = snapshot
                .nodes
                .iter()
                .filter(|n| n.id != node && pid_alive(n.pid))
                .collect();
            (!others.is_empty()).then(|| others[k as usize % others.len()].id.clone())
        });
        let applied = monotonic_ns();
        let r = crate::fleet::client::post_stepdown(&client, &leader, successor.as_deref()).await?;
        let healed = monotonic_ns();
        match r.status.as_u16() {
            200 => {
                return Ok(FaultRecord {
                    kind: if pick.is_some() {
                        FaultKind::Transfer
                    } else {
                        FaultKind::Stepdown
                    },
                    node,
                    token_before: Some(token),
                    scheduled_ms,
                    applied_at_mono_ns: applied,
                    healed_at_mono_ns: Some(healed),
                    verified: true,
                    detail: format!(
                        "{}{}",
                        successor.map(|s| format!("to {s}: ")).unwrap_or_default(),
                        r.json()["stepped_down"]
                    ),
                })
            }
            // Leadership moved between the status read and the request (409), or an election
            // is under way (503 no_leader): look again.
            409 | 503 => tokio::time::sleep(Duration::from_millis(100)).await,
            s => bail!(
                "POST /stepdown to {node} answered {s}: {}",
                String::from_utf8_lossy(&r.body)
            ),
        }
    }
    bail!("the leader kept moving away from POST /stepdown")
}

/// Partition of the leader from its election backend for `length` (network namespaces).
pub async fn partition_leader(
    state: &Arc<Mutex<FleetState>>,
    length: Duration,
    scheduled_ms: f64,
) -> anyhow::Result<FaultRecord> {
    partition_leader_from(state, FaultKind::PartitionLeader, length, scheduled_ms).await
}

/// The partition `kind` names (backend, resource or both) of the leader for `length`.
pub async fn partition_leader_from(
    state: &Arc<Mutex<FleetState>>,
    kind: FaultKind,
    length: Duration,
    scheduled_ms: f64,
) -> anyhow::Result<FaultRecord> {
    use crate::chaos::CutTarget;
    let target = match kind {
        FaultKind::PartitionLeader => CutTarget::Backend,
        FaultKind::PartitionLeaderResource => CutTarget::Resource,
        FaultKind::PartitionLeaderBoth => CutTarget::Both,
        other => bail!("{} is not a partition", other.as_str()),
    };
    let snapshot = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (_, token) = fleet::current_leader(&snapshot, Duration::from_secs(15)).await?;
    let r = crate::chaos::partition_leader_from(&snapshot, target, length).await?;
    Ok(FaultRecord {
        kind,
        node: r.node.clone(),
        token_before: Some(token),
        scheduled_ms,
        applied_at_mono_ns: r.applied_at_mono_ns,
        healed_at_mono_ns: (r.healed_at_mono_ns > 0).then_some(r.healed_at_mono_ns),
        verified: r.verified,
        detail: r.detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More kills per run than `detector`'s two, and every pause shorter than the lease (the
    /// specs `detector-kills` and `detector-pauses`; moved here from spec.rs's tests).
    #[test]
    fn the_detector_schedules_kill_often_and_pause_below_the_lease() {
        use super::super::spec::ExpSpec;
        let (kills, _) = ExpSpec::load("detector-kills").unwrap();
        let ttl = 3000;
        let occ = schedule(
            &kills.faults,
            ttl,
            kills.duration.eval(ttl),
            &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1),
        );
        assert!(occ.len() >= 10, "{} kills", occ.len());
        let (pauses, _) = ExpSpec::load("detector-pauses").unwrap();
        let occ = schedule(
            &pauses.faults,
            ttl,
            pauses.duration.eval(ttl),
            &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1),
        );
        assert_eq!(occ.len(), 16);
        assert!(occ
            .iter()
            .all(|o| o.length.is_some_and(|l| l < Duration::from_millis(ttl))));
    }
}
