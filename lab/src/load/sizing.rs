//! How many connections an open-loop run needs, and what limited a run that fell short.
//!
//! Each connection carries one request at a time, so by Little's law a run that offers `rate`
//! requests per second with a mean service time `W` keeps `rate × W` connections busy on
//! average. [`size_connections`] asks for `rate × W × headroom` (bursts, and a service time that
//! grows with the load), at least [`MIN_CONNECTIONS`], and at most the least of [`MAX_CONNECTIONS`],
//! what this process's descriptor limit leaves, and what the node admits (`[http]
//! max_connections`, itself capped at half the node's descriptor limit). [`choose_connections`]
//! measures `W` first: the unloaded service time (one connection at a low rate), then the
//! service time of the warm-up at the offered rate, and sizes the measured window from it.
//!
//! A run that did not carry its offered rate is then [`classify`]d: the connections (every one
//! busy, while the node answered about as fast as unloaded: more connections would carry more),
//! the node (every connection busy, and the node's answers slowed by queueing: it is saturated
//! and more connections would only queue there), or the generator (connections were free and
//! the slots still went out late, or a generator thread was busy all the time).

use std::time::Duration;

use serde::Serialize;

use super::{LoadReport, LoadSpec, Summary};

/// Fewest connections [`size_connections`] picks.
pub const MIN_CONNECTIONS: usize = 8;
/// Most connections [`size_connections`] picks, whatever the service time says: one node's
/// connection slots (`[http] max_connections`, default 1024) bind well before it.
pub const MAX_CONNECTIONS: usize = 4096;
/// `rate × W` is the mean; the measured window gets this many times it.
pub const DEFAULT_HEADROOM: f64 = 2.0;
/// The service time that sizes the first warm-up step is at least this: an unloaded answer
/// in 0.1 ms says little about the same route under load.
pub const MIN_SIZING_SERVICE: Duration = Duration::from_micros(500);
/// Descriptors this process keeps for everything but the load (PostgreSQL, status sweeps, the
/// fleet's logs and pipes).
pub const DESCRIPTOR_RESERVE: usize = 256;
/// Connection slots left free on the node for everyone else (status sweeps, operators).
pub const NODE_SLOT_RESERVE: usize = 16;
/// A run "carried" its offered rate when it sent at least this share of it.
pub const CARRIED: f64 = 0.97;
/// "Every connection busy": mean connections in flight at least this share of them.
pub const ALL_BUSY: f64 = 0.9;
/// The node "queued" requests when its service time p50 was at least this many times its
/// unloaded p50 (and at least [`QUEUED_MIN_EXTRA`] more).
pub const QUEUED_FACTOR: f64 = 4.0;
/// See [`QUEUED_FACTOR`]: below this much extra a slower answer is noise, not a queue.
pub const QUEUED_MIN_EXTRA: Duration = Duration::from_micros(500);
/// A generator thread busy this share of the window (or more) is a limit of its own.
pub const GENERATOR_BUSY: f64 = 0.9;

/// What bounds the connection count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SizingLimits {
    /// [`MAX_CONNECTIONS`] unless a caller documents another.
    pub max: usize,
    /// What this process's descriptor limit leaves (`None`: unknown, not a bound).
    pub descriptors: Option<usize>,
    /// What the node admits, less [`NODE_SLOT_RESERVE`] (`None`: unknown).
    pub node: Option<usize>,
}

impl SizingLimits {
    /// [`MAX_CONNECTIONS`], this process's `RLIMIT_NOFILE` soft limit less
    /// [`DESCRIPTOR_RESERVE`] (half of it when that is small), and the node's slots:
    /// `node_max_connections` capped at half `node_nofile` as the node itself caps it.
    pub fn here(node_max_connections: Option<usize>, node_nofile: Option<u64>) -> SizingLimits {
        let own = own_nofile_soft_limit().map(|n| {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > 2 * DESCRIPTOR_RESERVE {
                n - DESCRIPTOR_RESERVE
            } else {
                n / 2
            }
        });
        let node = node_max_connections.map(|m| {
            let cap = match node_nofile {
                Some(n) => baton::http::connection_cap(m, n),
                None => m,
            };
            cap.saturating_sub(NODE_SLOT_RESERVE).max(1)
        });
        SizingLimits {
            max: MAX_CONNECTIONS,
            descriptors: own,
            node,
        }
    }
}

fn own_nofile_soft_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    // rlim_t is u64 here, not on every target.
    #[allow(clippy::unnecessary_cast)]
    (rc == 0).then_some(r.rlim_cur as u64)
}

/// The soft `Max open files` of process `pid` (`/proc/<pid>/limits`).
pub fn nofile_of(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One sizing decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sizing {
    /// The connections to open.
    pub connections: usize,
    /// Little's law's figure before the bounds: `ceil(rate × service × headroom)`, at least
    /// [`MIN_CONNECTIONS`].
    pub wanted: usize,
    /// The bound that cut `wanted` down (`max`, `descriptors`, `node`), if one did.
    pub capped_by: Option<String>,
    pub rate: f64,
    pub service_ms: f64,
    pub headroom: f64,
}

/// Connections for `rate` requests/s at a mean service time `service`: see the module docs.
pub fn size_connections(
    rate: f64,
    service: Duration,
    headroom: f64,
    limits: &SizingLimits,
) -> Sizing {
    let raw = (rate.max(0.0) * service.as_secs_f64() * headroom.max(1.0)).ceil();
    let wanted = if raw.is_finite() && raw < usize::MAX as f64 {
        (raw as usize).max(MIN_CONNECTIONS)
    } else {
        usize::MAX
    };
    let mut connections = wanted;
    let mut capped_by = None;
    for (name, cap) in [
        ("max", Some(limits.max)),
        ("descriptors", limits.descriptors),
        ("node", limits.node),
    ] {
        if let Some(cap) = cap.filter(|c| *c < connections) {
            connections = cap.max(1);
            capped_by = Some(name.to_owned());
        }
    }
    Sizing {
        connections,
        wanted,
        capped_by,
        rate,
        service_ms: service.as_secs_f64() * 1000.0,
        headroom,
    }
}

/// What limited a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// It carried the offered rate.
    None,
    /// Every connection was busy while the node answered about as fast as unloaded: the
    /// connection count, not the node, capped the run.
    Connections,
    /// Every connection was busy and the node's answers had slowed by queueing: the node.
    Node,
    /// A generator thread was busy all the time, or connections were free and the slots still
    /// went out late: the generator.
    Generator,
}

/// The facts [`classify`] decides on, from one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunFacts {
    pub offered_rate: f64,
    /// Requests sent per second.
    pub achieved_rate: f64,
    pub connections: usize,
    /// Mean requests in flight (Little's law on the run: Σ service / window).
    pub busy_connections_mean: f64,
    pub service_p50_ms: f64,
    /// The route's service time p50 at one connection and a low rate.
    pub unloaded_service_p50_ms: Option<f64>,
    /// The busiest generator thread's share of the window (1.0 = a whole core).
    pub generator_busiest: Option<f64>,
    /// The node's busiest thread's share of the window, where it was sampled.
    #[serde(default)]
    pub node_busiest: Option<f64>,
}

/// What limited the run, and why in words.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub limit: Limit,
    pub why: String,
}

/// See the module docs; the thresholds are this module's constants.
pub fn classify(f: &RunFacts) -> Verdict {
    let busy_share = f.busy_connections_mean / f.connections.max(1) as f64;
    let busy = format!(
        "{:.0} of {} connections busy on average",
        f.busy_connections_mean, f.connections
    );
    if f.achieved_rate >= CARRIED * f.offered_rate {
        return Verdict {
            limit: Limit::None,
            why: format!(
                "sent {:.0}/s of {:.0}/s offered; {busy}",
                f.achieved_rate, f.offered_rate
            ),
        };
    }
    let short = format!(
        "sent {:.0}/s of {:.0}/s offered",
        f.achieved_rate, f.offered_rate
    );
    if let Some(g) = f.generator_busiest.filter(|g| *g >= GENERATOR_BUSY) {
        return Verdict {
            limit: Limit::Generator,
            why: format!(
                "{short}: a generator thread was busy {:.0}% of the window; {busy}",
                g * 100.0
            ),
        };
    }
    if busy_share < ALL_BUSY {
        return Verdict {
            limit: Limit::Generator,
            why: format!("{short} with connections free ({busy}): the slots went out late"),
        };
    }
    let queued = match f.unloaded_service_p50_ms {
        Some(u) => {
            f.service_p50_ms >= QUEUED_FACTOR * u
                && f.service_p50_ms - u >= QUEUED_MIN_EXTRA.as_secs_f64() * 1000.0
        }
        // Without an unloaded figure, a service time this long is the node's queue.
        None => f.service_p50_ms >= 5.0,
    };
    let unloaded = f
        .unloaded_service_p50_ms
        .map(|u| format!(" (unloaded {u:.3} ms)"))
        .unwrap_or_default();
    if queued {
        let cpu = match f.node_busiest {
            Some(n) if n < GENERATOR_BUSY => format!(
                ", though its busiest thread was busy only {:.0}% of the window: the node was short of CPU (other processes had it), not of work",
                n * 100.0
            ),
            Some(n) => format!(", its busiest thread busy {:.0}%: the node is saturated", n * 100.0),
            None => ": the node is saturated".into(),
        };
        Verdict {
            limit: Limit::Node,
            why: format!(
                "{short}; {busy}, and the node's service p50 {:.3} ms{unloaded} shows requests queued in it{cpu}",
                f.service_p50_ms
            ),
        }
    } else {
        Verdict {
            limit: Limit::Connections,
            why: format!(
                "{short}; {busy} while the node answered in {:.3} ms p50{unloaded}: the connection count capped this run (Little's law wants ~{:.0})",
                f.service_p50_ms,
                (f.offered_rate * f.service_p50_ms / 1000.0 * DEFAULT_HEADROOM).ceil()
            ),
        }
    }
}

/// One step of [`choose_connections`]: a run and what it showed.
#[derive(Clone, Debug, Serialize)]
pub struct SizingStep {
    pub what: String,
    pub offered_rate: f64,
    pub connections: usize,
    pub achieved_rate: f64,
    pub service_mean_ms: f64,
    pub service_p50_ms: f64,
    pub busy_connections_mean: f64,
    pub limit: Limit,
}

/// How the measured window's connection count was chosen.
#[derive(Clone, Debug, Serialize)]
pub struct ConnectionChoice {
    pub connections: usize,
    /// `flag` (`--connections`) or `littles_law`.
    pub chosen_by: String,
    pub headroom: f64,
    pub limits: SizingLimits,
    /// The last sizing (`None` with the flag).
    pub sizing: Option<Sizing>,
    /// The route at one connection and a low rate (the reference for "the node queued").
    pub unloaded_service_p50_ms: Option<f64>,
    pub steps: Vec<SizingStep>,
}

impl ConnectionChoice {
    /// One line for the text report.
    pub fn describe(&self) -> String {
        match &self.sizing {
            None => format!("connections: {} (--connections)", self.connections),
            Some(s) => format!(
                "connections: {} (Little's law: {:.0}/s x {:.3} ms x {} = {}{})",
                self.connections,
                s.rate,
                s.service_ms,
                s.headroom,
                s.wanted,
                s.capped_by
                    .as_ref()
                    .map(|c| format!(", capped by {c}"))
                    .unwrap_or_default()
            ),
        }
    }
}

fn step(what: &str, spec: &LoadSpec, s: &Summary) -> SizingStep {
    SizingStep {
        what: what.to_owned(),
        offered_rate: spec.rate,
        connections: spec.connections,
        achieved_rate: s.achieved_rate,
        service_mean_ms: s.service_mean_ms,
        service_p50_ms: s.service_ms.p50,
        busy_connections_mean: s.busy_connections_mean,
        limit: classify(&RunFacts {
            offered_rate: spec.rate,
            achieved_rate: s.achieved_rate,
            connections: spec.connections,
            busy_connections_mean: s.busy_connections_mean,
            service_p50_ms: s.service_ms.p50,
            unloaded_service_p50_ms: None,
            generator_busiest: s.generator_threads_busy.first().copied(),
            node_busiest: None,
        })
        .limit,
    }
}

/// Rate and length of the unloaded probe (one connection).
const PROBE_RATE: f64 = 500.0;
const PROBE: Duration = Duration::from_millis(400);

/// Measures the route's unloaded service time, warms up at the offered rate, and picks the
/// measured window's connections: `fixed` when given (the warm-up runs with it), else by
/// Little's law on the warm-up's service time. The warm-up runs in two halves: the first sized
/// from the unloaded service time (at least [`MIN_SIZING_SERVICE`]), the second from the first's
/// measured one; the window is sized from the second's, except that a half whose requests
/// queued in the node (see [`classify`]) keeps its count (more connections would only queue
/// there). `spec(connections, duration)` builds each run's spec.
pub async fn choose_connections(
    spec: impl Fn(usize, Duration) -> LoadSpec,
    rate: f64,
    warmup: Duration,
    fixed: Option<usize>,
    headroom: f64,
    limits: SizingLimits,
) -> anyhow::Result<ConnectionChoice> {
    let mut steps = Vec::new();
    let mut probe = spec(1, PROBE);
    probe.rate = PROBE_RATE.min(rate);
    let r = super::run(probe.clone()).await?;
    let ps = r.summary();
    let unloaded = (ps.ok > 0).then_some(ps.service_ms.p50);
    steps.push(step("unloaded probe", &probe, &ps));
    if let Some(c) = fixed {
        if !warmup.is_zero() {
            let w = spec(c, warmup);
            let s = super::run(w.clone()).await?.summary();
            steps.push(step("warm-up", &w, &s));
        }
        return Ok(ConnectionChoice {
            connections: c,
            chosen_by: "flag".into(),
            headroom,
            limits,
            sizing: None,
            unloaded_service_p50_ms: unloaded,
            steps,
        });
    }
    let first = Duration::from_secs_f64(unloaded.unwrap_or(0.0) / 1000.0).max(MIN_SIZING_SERVICE);
    let mut sizing = size_connections(rate, first, headroom, &limits);
    if !warmup.is_zero() {
        for half in ["warm-up, first half", "warm-up, second half"] {
            let w = spec(sizing.connections, warmup / 2);
            let report = super::run(w.clone()).await?;
            let s = report.summary();
            let mut st = step(half, &w, &s);
            st.limit = classify(&RunFacts {
                unloaded_service_p50_ms: unloaded,
                ..facts(&w, &report)
            })
            .limit;
            let keep = st.limit == Limit::Node;
            steps.push(st);
            if !keep && s.ok > 0 {
                sizing = size_connections(
                    rate,
                    Duration::from_secs_f64(s.service_mean_ms / 1000.0),
                    headroom,
                    &limits,
                );
            }
        }
    }
    Ok(ConnectionChoice {
        connections: sizing.connections,
        chosen_by: "littles_law".into(),
        headroom,
        limits,
        sizing: Some(sizing),
        unloaded_service_p50_ms: unloaded,
        steps,
    })
}

/// [`RunFacts`] of a finished run, its busiest load thread included (no unloaded reference:
/// the caller adds the one it measured).
pub fn facts(spec: &LoadSpec, report: &LoadReport) -> RunFacts {
    let s = report.summary();
    RunFacts {
        offered_rate: spec.rate,
        achieved_rate: s.achieved_rate,
        connections: spec.connections,
        busy_connections_mean: s.busy_connections_mean,
        service_p50_ms: s.service_ms.p50,
        unloaded_service_p50_ms: None,
        generator_busiest: s.generator_threads_busy.first().copied(),
        node_busiest: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, descriptors: Option<usize>, node: Option<usize>) -> SizingLimits {
        SizingLimits {
            max,
            descriptors,
            node,
        }
    }

    #[test]
    fn littles_law_with_headroom_then_the_tightest_bound() {
        let free = limits(MAX_CONNECTIONS, None, None);
        // 50k/s x 2 ms = 100 in flight; x2 headroom.
        let s = size_connections(50_000.0, Duration::from_millis(2), 2.0, &free);
        assert_eq!((s.connections, s.wanted, s.capped_by), (200, 200, None));
        // Rounds up: 1000/s x 1.5 ms x 2 = 3 -> the floor of 8.
        let s = size_connections(1000.0, Duration::from_micros(1500), 2.0, &free);
        assert_eq!(
            (s.connections, s.wanted),
            (MIN_CONNECTIONS, MIN_CONNECTIONS)
        );
        // 333 req/s x 100 ms x 1.5 = 49.95 -> 50, not 49.
        let s = size_connections(333.0, Duration::from_millis(100), 1.5, &free);
        assert_eq!(s.connections, 50);
        // A headroom below 1 would size below the mean: taken as 1.
        let s = size_connections(10_000.0, Duration::from_millis(10), 0.5, &free);
        assert_eq!(s.connections, 100);
        // 1M/s x 1 ms x 2 = 2000: the node's slots bind first, then descriptors, then the max.
        let s = size_connections(
            1e6,
            Duration::from_millis(1),
            2.0,
            &limits(4096, Some(1500), Some(1008)),
        );
        assert_eq!(
            (s.connections, s.wanted, s.capped_by.as_deref()),
            (1008, 2000, Some("node"))
        );
        let s = size_connections(
            1e6,
            Duration::from_millis(1),
            2.0,
            &limits(4096, Some(900), Some(1008)),
        );
        assert_eq!(
            (s.connections, s.capped_by.as_deref()),
            (900, Some("descriptors"))
        );
        let s = size_connections(
            1e7,
            Duration::from_millis(10),
            2.0,
            &limits(4096, None, None),
        );
        assert_eq!((s.connections, s.capped_by.as_deref()), (4096, Some("max")));
        // A bound above the want changes nothing.
        let s = size_connections(
            50_000.0,
            Duration::from_millis(2),
            2.0,
            &limits(4096, Some(19_744), Some(1008)),
        );
        assert_eq!((s.connections, s.capped_by), (200, None));
        // Nonsense in, a bounded answer out.
        let s = size_connections(f64::INFINITY, Duration::from_secs(1), 2.0, &free);
        assert_eq!(s.connections, MAX_CONNECTIONS);
    }

    #[test]
    fn limits_follow_the_node_cap_and_keep_slots_free() {
        let l = SizingLimits::here(Some(1024), Some(20_000));
        assert_eq!(l.node, Some(1024 - NODE_SLOT_RESERVE));
        // The node caps itself at half its descriptors.
        let l = SizingLimits::here(Some(1024), Some(1024));
        assert_eq!(l.node, Some(512 - NODE_SLOT_RESERVE));
        assert_eq!(SizingLimits::here(None, None).node, None);
        assert_eq!(l.max, MAX_CONNECTIONS);
        assert!(l.descriptors.is_some_and(|d| d > 0));
    }

    fn facts(achieved: f64, busy: f64, p50: f64) -> RunFacts {
        RunFacts {
            offered_rate: 100_000.0,
            achieved_rate: achieved,
            connections: 100,
            busy_connections_mean: busy,
            service_p50_ms: p50,
            unloaded_service_p50_ms: Some(0.1),
            generator_busiest: Some(0.5),
            node_busiest: None,
        }
    }

    #[test]
    fn a_short_run_is_blamed_on_what_was_full() {
        assert_eq!(classify(&facts(99_000.0, 100.0, 5.0)).limit, Limit::None);
        // Every connection busy, the node as fast as unloaded: the connections.
        let v = classify(&facts(50_000.0, 98.0, 0.2));
        assert_eq!(v.limit, Limit::Connections, "{v:?}");
        // Every connection busy, answers 20x slower than unloaded: the node's queue.
        let v = classify(&facts(50_000.0, 98.0, 2.0));
        assert_eq!(v.limit, Limit::Node, "{v:?}");
        // 4x slower, but by less than half a millisecond: still not a queue.
        assert_eq!(
            classify(&facts(50_000.0, 98.0, 0.45)).limit,
            Limit::Connections
        );
        // Connections free, slots late: the generator.
        assert_eq!(
            classify(&facts(50_000.0, 40.0, 2.0)).limit,
            Limit::Generator
        );
        // A generator thread flat out: the generator, whatever else.
        let mut f = facts(50_000.0, 98.0, 2.0);
        f.generator_busiest = Some(0.97);
        assert_eq!(classify(&f).limit, Limit::Generator);
        // No unloaded reference: a long service time is a queue, a short one is not.
        f.generator_busiest = None;
        f.unloaded_service_p50_ms = None;
        assert_eq!(classify(&f).limit, Limit::Connections);
        f.service_p50_ms = 8.0;
        assert_eq!(classify(&f).limit, Limit::Node);
        // Queued in the node while its threads were mostly idle: still the node, said so.
        f.node_busiest = Some(0.45);
        let v = classify(&f);
        assert_eq!(v.limit, Limit::Node);
        assert!(v.why.contains("short of CPU"), "{}", v.why);
        f.node_busiest = Some(0.98);
        assert!(classify(&f).why.contains("saturated"));
    }
}
