//! Open-loop load against `POST /next` of whichever node leads, recording a history for
//! `baton check` and an HDR latency histogram.
//!
//! Request `i` is *scheduled* at `t0 + i / rate` whatever happened to earlier requests, and its
//! latency is measured from that scheduled time, so a stalled server shows up as latency instead
//! of silently lowering the offered load (no coordinated omission). `connections` workers, each
//! with its own keep-alive connection, take the next unclaimed slot when free; if all are busy
//! the backlog is paid for in latency.
//!
//! The core is [`run`]: a target list, a rate and a duration in; every request's record
//! ([`Op`]) and the histograms out. `baton load` and benchmarks are thin wrappers around it.
//!
//! The workers run on `threads` threads of their own (default half the cores), each a
//! single-threaded runtime that owns its share of the connections, and each worker writes and
//! reads its own connection ([`conn`]: no client library's connection task in between). The
//! generator shares the machine with the server it measures, so what it spends is taken from
//! the server (`scripts/bench/perf.sh gen`, FINDINGS §11.3 and §11.5). The leader tracker's
//! `/status` sweeps stay on the caller's runtime.

pub mod conn;
pub mod cpu;
pub mod leader;
pub mod neighbour;
pub mod sizing;

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use hyper::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use baton::clock::monotonic_ns;
use conn::{Conn, Exchange};
use leader::LeaderTracker;

/// 503 error codes the server only sends when nothing was issued to this request.
pub const DEFINITE_503: &[&str] = &["no_leader", "not_ready", "fenced"];

/// How many 409 redirects one request follows before it counts as rejected.
const MAX_HOPS: u32 = 3;

/// What to run.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Node HTTP addresses (`host:port`); the generator finds the leader among them.
    pub targets: Vec<String>,
    /// Requests per second offered.
    pub rate: f64,
    pub duration: Duration,
    /// Concurrent keep-alive connections (workers).
    pub connections: usize,
    /// Per-request deadline (redirects included); past it the outcome is unknown.
    pub timeout: Duration,
    /// After `duration`, how long scheduled-but-unsent requests may still go out; the rest are
    /// counted as `unsent`.
    pub drain: Duration,
    /// Request path, e.g. `/next`.
    pub path: String,
    /// Send every slot as `GET {path}` to the believed leader, and count any 200 as ok (no ID,
    /// no body parsed): with `path` a trivial handler such as `/healthz` this is the same
    /// generator and server stack without the fenced, durable work, so a run of it beside one
    /// of `/next` says how close the sequencer comes to the machine's own HTTP limit.
    pub probe: bool,
    /// Set to end the load before `duration`: no slot is taken after it is set (slots not yet
    /// due are neither sent nor `unsent`). The nemesis sets it once its last fault has healed
    /// and the fleet has settled, instead of idling out the bound.
    pub stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Share of the slots sent as `GET /read` instead (0 = none, 1 = reads only); which slots
    /// is a fixed function of the slot id, so a rerun mixes the same way.
    pub read_fraction: f64,
    /// `?mode=` of those reads (`lease`, `quorum`, `resource`), taken in turn by read slot;
    /// empty: the node's default.
    pub read_modes: Vec<String>,
    /// Threads the workers run on (each its own single-threaded runtime; at most one per
    /// connection). One costs ~19 us of CPU per request on this project's 2-core machines, so it
    /// tops out around 50k requests/s; more only pays where there are cores to spare.
    pub threads: usize,
    /// K shards of a sharded fleet (1: unsharded). Worker `w` is pinned to shard `w mod K`:
    /// it sends `{path}?shard=S` and follows that shard's leader.
    pub shards: u32,
}

impl LoadSpec {
    pub fn new(targets: Vec<String>, rate: f64, duration: Duration) -> LoadSpec {
        LoadSpec {
            targets,
            rate,
            duration,
            connections: 8,
            timeout: Duration::from_secs(2),
            drain: Duration::from_secs(3),
            path: "/next".into(),
            probe: false,
            stop: None,
            read_fraction: 0.0,
            read_modes: Vec::new(),
            threads: 1,
            shards: 1,
        }
    }

    /// The shard worker `w` is pinned to (`None` on an unsharded fleet).
    pub fn shard_of_worker(&self, w: u32) -> Option<u32> {
        (self.shards > 1).then(|| w % self.shards)
    }

    /// Whether slot `id` is a read: a multiplicative hash of the id against the fraction.
    pub fn is_read_slot(&self, id: u64) -> bool {
        if self.read_fraction <= 0.0 {
            return false;
        }
        let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
        (h as f64 / (1u64 << 53) as f64) < self.read_fraction
    }

    fn read_path(&self, id: u64) -> String {
        if self.read_modes.is_empty() {
            return "/read".into();
        }
        let m = &self.read_modes[(id % self.read_modes.len() as u64) as usize];
        format!("/read?mode={m}")
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.targets.is_empty() {
            bail!("load needs at least one target");
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            bail!("rate must be a positive number of requests per second");
        }
        if self.connections == 0 {
            bail!("load needs at least one connection");
        }
        if self.threads == 0 {
            bail!("load needs at least one thread");
        }
        if !(0.0..=1.0).contains(&self.read_fraction) {
            bail!("read fraction must be in [0, 1]");
        }
        for m in &self.read_modes {
            if !["lease", "quorum", "resource"].contains(&m.as_str()) {
                bail!("read mode must be lease, quorum or resource, not {m:?}");
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// 200 with a `(token, seq)`.
    Ok,
    /// Definitely not issued: a 409 / 4xx, a 503 in [`DEFINITE_503`], or never sent.
    Rejected,
    /// May or may not have been issued: timeout, reset after send, other 5xx.
    Unknown,
}

/// One request of the history. Times are `CLOCK_MONOTONIC` ns ([`monotonic_ns`]), comparable
/// with every other process on this machine.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Op {
    /// Slot index: scheduled at `t0 + id / rate`.
    pub id: u64,
    /// Worker (connection) that sent it.
    pub conn: u32,
    pub sched_ns: u64,
    /// First byte of the first attempt was about to be written.
    pub invoke_ns: u64,
    /// The final answer (or the failure) was in.
    pub complete_ns: u64,
    pub outcome: Outcome,
    /// The node of the last attempt.
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    /// HTTP attempts (1 + redirects/reconnects followed).
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `read` for a `GET /read`, `probe` for a [`LoadSpec::probe`] slot (no token or seq, so
    /// never an ack); absent for `POST /next` (older histories have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A read's answering mode (`lease`, `quorum`, `resource`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// A `lease` read answered by `quorum` (its window was closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fell_back: Option<bool>,
    /// The shard this request was for, on a sharded fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
}

impl Op {
    /// Whether this is a `GET /read` (it issues nothing: never an ack).
    pub fn is_read(&self) -> bool {
        self.kind.as_deref() == Some("read")
    }
}

/// What a run produced.
pub struct LoadReport {
    pub spec: LoadSpec,
    pub t0_ns: u64,
    /// From the first scheduled slot to the last completion.
    pub elapsed: Duration,
    /// Every request that was sent, by `id`.
    pub ops: Vec<Op>,
    /// Slots never sent (the drain deadline passed first).
    pub unsent: u64,
    /// Scheduled time → completion, µs, over `ok` requests.
    pub latency_us: Histogram<u64>,
    /// Invoke → completion, µs, over `ok` requests (without queueing behind busy connections).
    pub service_us: Histogram<u64>,
    /// CPU time each load thread spent from the common start to its last worker's end, s.
    pub thread_cpu_s: Vec<f64>,
}

/// Counts and percentiles, for printing and `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub offered_rate: f64,
    pub achieved_rate: f64,
    pub ok_rate: f64,
    pub elapsed_s: f64,
    pub sent: usize,
    pub ok: usize,
    pub rejected: usize,
    pub unknown: usize,
    pub unsent: u64,
    pub tokens: Vec<i64>,
    pub latency_ms: Percentiles,
    pub service_ms: Percentiles,
    /// Mean service time (invoke -> answer) of the `ok` requests, ms.
    pub service_mean_ms: f64,
    /// Connections (workers) the run had.
    pub connections: usize,
    /// Requests in flight on average over the run (the sum of every sent request's time from
    /// invoke to answer over the run's length, Little's law): `connections` means every
    /// connection was busy all the time.
    pub busy_connections_mean: f64,
    /// Each load thread's CPU time over the run's length (1.0 = busy all of it), busiest first:
    /// one near 1.0 means the generator, not the node, set the pace.
    pub generator_threads_busy: Vec<f64>,
    /// `GET /read`s sent, answered, and answered by `quorum` after asking for `lease`.
    pub reads: usize,
    pub reads_ok: usize,
    pub reads_fell_back: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 1 h, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |v: u64| v as f64 / 1000.0;
    if h.is_empty() {
        return Percentiles {
            p50: 0.0,
            p99: 0.0,
            p999: 0.0,
            max: 0.0,
        };
    }
    Percentiles {
        p50: ms(h.value_at_quantile(0.50)),
        p99: ms(h.value_at_quantile(0.99)),
        p999: ms(h.value_at_quantile(0.999)),
        max: ms(h.max()),
    }
}

impl LoadReport {
    pub fn count(&self, o: Outcome) -> usize {
        self.ops.iter().filter(|op| op.outcome == o).count()
    }

    /// The acknowledged `(token, seq)` pairs, in slot order.
    pub fn acked(&self) -> Vec<(i64, i64)> {
        self.ops
            .iter()
            .filter(|o| o.outcome == Outcome::Ok && !o.is_read())
            .filter_map(|o| Some((o.token?, o.seq?)))
            .collect()
    }

    pub fn summary(&self) -> Summary {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let ok = self.count(Outcome::Ok);
        let mut tokens: Vec<i64> = self.ops.iter().filter_map(|o| o.token).collect();
        tokens.sort_unstable();
        tokens.dedup();
        let in_flight_ns: u128 = self
            .ops
            .iter()
            .map(|o| u128::from(o.complete_ns.saturating_sub(o.invoke_ns)))
            .sum();
        let ok_service_ns: u128 = self
            .ops
            .iter()
            .filter(|o| o.outcome == Outcome::Ok)
            .map(|o| u128::from(o.complete_ns.saturating_sub(o.invoke_ns)))
            .sum();
        Summary {
            offered_rate: self.spec.rate,
            achieved_rate: self.ops.len() as f64 / secs,
            ok_rate: ok as f64 / secs,
            elapsed_s: secs,
            sent: self.ops.len(),
            ok,
            rejected: self.count(Outcome::Rejected),
            unknown: self.count(Outcome::Unknown),
            unsent: self.unsent,
            tokens,
            latency_ms: percentiles(&self.latency_us),
            service_ms: percentiles(&self.service_us),
            service_mean_ms: if ok > 0 {
                ok_service_ns as f64 / ok as f64 / 1e6
            } else {
                0.0
            },
            connections: self.spec.connections,
            busy_connections_mean: in_flight_ns as f64 / 1e9 / secs,
            generator_threads_busy: {
                let mut v: Vec<f64> = self.thread_cpu_s.iter().map(|c| c / secs).collect();
                v.sort_by(|a, b| b.total_cmp(a));
                v
            },
            reads: self.ops.iter().filter(|o| o.is_read()).count(),
            reads_ok: self
                .ops
                .iter()
                .filter(|o| o.is_read() && o.outcome == Outcome::Ok)
                .count(),
            reads_fell_back: self
                .ops
                .iter()
                .filter(|o| o.is_read() && o.fell_back == Some(true))
                .count(),
        }
    }

    /// Human-readable summary lines.
    pub fn render(&self) -> String {
        let s = self.summary();
        let mut out = String::new();
        out.push_str(&format!(
            "load: {} requests in {:.2}s: offered {:.0}/s, achieved {:.1}/s (ok {:.1}/s)\n",
            s.sent, s.elapsed_s, s.offered_rate, s.achieved_rate, s.ok_rate
        ));
        out.push_str(&format!(
            "outcomes: ok {}  rejected {}  unknown {}  unsent {}  tokens {:?}\n",
            s.ok, s.rejected, s.unknown, s.unsent, s.tokens
        ));
        if s.reads > 0 {
            out.push_str(&format!(
                "reads: {} sent, {} answered, {} lease reads fell back to quorum\n",
                s.reads, s.reads_ok, s.reads_fell_back
            ));
        }
        out.push_str(&format!(
            "latency from scheduled time (ok): p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  max {:.3} ms\n",
            s.latency_ms.p50, s.latency_ms.p99, s.latency_ms.p999, s.latency_ms.max
        ));
        out.push_str(&format!(
            "service time (ok):                p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  max {:.3} ms\n",
            s.service_ms.p50, s.service_ms.p99, s.service_ms.p999, s.service_ms.max
        ));
        let busy: Vec<String> = s
            .generator_threads_busy
            .iter()
            .map(|b| format!("{:.0}%", b * 100.0))
            .collect();
        out.push_str(&format!(
            "connections: {} ({:.1} busy on average); load threads busy: {}\n",
            s.connections,
            s.busy_connections_mean,
            busy.join(" ")
        ));
        out
    }
}

/// Writes a history as JSON lines, one [`Op`] per line.
pub fn write_history(path: &Path, ops: &[Op]) -> anyhow::Result<()> {
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::new(f);
    for op in ops {
        serde_json::to_writer(&mut w, op)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    Ok(())
}

/// Reads a history written by [`write_history`]; blank lines are skipped.
pub fn read_history(path: &Path) -> anyhow::Result<Vec<Op>> {
    let f = File::open(path).with_context(|| format!("opening history {}", path.display()))?;
    let mut ops = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        ops.push(
            serde_json::from_str(&line)
                .with_context(|| format!("{}:{}: not a history line", path.display(), i + 1))?,
        );
    }
    Ok(ops)
}

struct Shared {
    spec: LoadSpec,
    /// One tracker per shard (one in all on an unsharded fleet).
    leaders: Vec<Arc<LeaderTracker>>,
    next_slot: AtomicU64,
    total: u64,
    t0: Instant,
    t0_ns: u64,
    hard_deadline: Instant,
    /// `read_paths[i]`: the path of read mode `i` (one entry, `/read`, without modes): built
    /// once, not per request.
    read_paths: Vec<String>,
}

impl Shared {
    fn read_path(&self, id: u64) -> &str {
        &self.read_paths[(id % self.read_paths.len() as u64) as usize]
    }
}

/// The fields of a node's JSON answer the generator records; anything else in it is skipped
/// unparsed (a typed parse, not a `serde_json::Value` per answer: the generator's CPU is taken
/// from the node it measures).
#[derive(Deserialize, Default)]
struct Answer<'a> {
    token: Option<i64>,
    seq: Option<i64>,
    #[serde(borrow)]
    mode: Option<std::borrow::Cow<'a, str>>,
    fell_back: Option<bool>,
    #[serde(borrow)]
    error: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> Answer<'a> {
    /// `body` parsed; a body that is not such an object is an empty answer.
    fn parse(body: &'a [u8]) -> Answer<'a> {
        serde_json::from_slice(body).unwrap_or_default()
    }
}

struct WorkerOut {
    ops: Vec<Op>,
    unsent: u64,
}

/// Runs the load and returns every request's record. Errors only on a bad spec.
pub async fn run(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    spec.validate()?;
    let total = (spec.rate * spec.duration.as_secs_f64()).round() as u64;
    let leaders: Vec<Arc<LeaderTracker>> = (0..spec.shards.max(1))
        .map(|s| {
            Arc::new(LeaderTracker::new(
                spec.targets.clone(),
                Duration::from_millis(500),
                (spec.shards > 1).then_some(s),
            ))
        })
        .collect();
    // Find the leader before the clock starts, so the first slots are not all redirects.
    for leader in &leaders {
        leader.refresh(leader.generation()).await;
    }
    // Each shard opens its connections before the clock starts: opening hundreds of them inside
    // the measured window put a ~100 ms connect storm into the first slots' latency. A
    // connection that fails here is simply opened (and its failure recorded) by its first
    // request. Each worker's record buffer is reserved up front too, so no slot waits on a
    // reallocation. (Histograms are built from the records afterwards: per-connection HDR
    // histograms, ~180 MB at 256 connections, faulted in after t0 made the first slots tens of
    // ms late.)
    let per_worker_ops = (total as usize / spec.connections.max(1)) * 5 / 4 + 16;
    let threads = spec.threads.clamp(1, spec.connections);
    let mut shards = Vec::with_capacity(threads);
    for t in 0..threads {
        let workers: Vec<(u32, String)> = (t..spec.connections)
            .step_by(threads)
            .map(|w| (w as u32, leaders[w % leaders.len()].current(w)))
            .collect();
        shards.push(Shard::spawn(workers, per_worker_ops)?);
    }
    for shard in &mut shards {
        shard.opened().await?;
    }
    // Read the ns clock first: the Instant read after it is no earlier, so no slot is sent
    // before its recorded `sched_ns`.
    let t0_ns = monotonic_ns() + 1_000_000;
    let t0 = Instant::now() + Duration::from_millis(1);
    let shared = Arc::new(Shared {
        hard_deadline: t0 + spec.duration + spec.drain,
        spec: spec.clone(),
        leaders,
        next_slot: AtomicU64::new(0),
        total,
        t0,
        t0_ns,
        read_paths: if spec.read_modes.is_empty() {
            vec![spec.read_path(0)]
        } else {
            (0..spec.read_modes.len() as u64)
                .map(|i| spec.read_path(i))
                .collect()
        },
    });
    for shard in &mut shards {
        shard.start(shared.clone());
    }
    let mut ops = Vec::with_capacity(total as usize);
    let mut unsent = 0;
    let mut latency_us = new_histogram();
    let mut service_us = new_histogram();
    let mut thread_cpu_s = Vec::with_capacity(shards.len());
    for shard in shards {
        let (outs, cpu) = shard.finished().await?;
        thread_cpu_s.push(cpu);
        for out in outs {
            ops.extend(out.ops);
            unsent += out.unsent;
        }
    }
    ops.sort_by_key(|o| o.id);
    for op in ops.iter().filter(|o| o.outcome == Outcome::Ok) {
        let _ = latency_us.record((op.complete_ns.saturating_sub(op.sched_ns) / 1000).max(1));
        let _ = service_us.record((op.complete_ns.saturating_sub(op.invoke_ns) / 1000).max(1));
    }
    let last = ops.iter().map(|o| o.complete_ns).max().unwrap_or(t0_ns);
    Ok(LoadReport {
        spec,
        t0_ns,
        elapsed: Duration::from_nanos(last.saturating_sub(t0_ns)),
        ops,
        unsent,
        latency_us,
        service_us,
        thread_cpu_s,
    })
}

/// This thread's CPU time so far (`CLOCK_THREAD_CPUTIME_ID`), s.
fn thread_cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the struct we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc == 0 {
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    } else {
        0.0
    }
}

/// One load thread: a single-threaded runtime with its workers and their connections. It opens
/// its connections, says so, waits for the common start, runs its workers and hands back their
/// records.
struct Shard {
    opened: Option<tokio::sync::oneshot::Receiver<()>>,
    start: Option<tokio::sync::oneshot::Sender<Arc<Shared>>>,
    /// Its workers' records, and the thread's CPU time from the common start to their end.
    done: tokio::sync::oneshot::Receiver<anyhow::Result<(Vec<WorkerOut>, f64)>>,
}

impl Shard {
    /// `workers`: each worker's number and the address its connection opens to.
    fn spawn(workers: Vec<(u32, String)>, per_worker_ops: usize) -> anyhow::Result<Shard> {
        use tokio::sync::oneshot;
        let (opened_tx, opened) = oneshot::channel();
        let (start, start_rx) = oneshot::channel::<Arc<Shared>>();
        let (done_tx, done) = oneshot::channel();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building a load thread's runtime")?;
        std::thread::Builder::new()
            .name("baton-load".into())
            .spawn(move || {
                let outs = rt.block_on(async move {
                    let conns = futures::future::join_all(workers.iter().map(|(_, addr)| async {
                        Conn::open(addr, Duration::from_secs(2)).await.ok()
                    }))
                    .await;
                    let outs: Vec<WorkerOut> = workers
                        .iter()
                        .map(|_| WorkerOut::with_capacity(per_worker_ops))
                        .collect();
                    let _ = opened_tx.send(());
                    // The caller gone (an error elsewhere): nothing to run.
                    let Ok(sh) = start_rx.await else {
                        return Ok((Vec::new(), 0.0));
                    };
                    let cpu_at_start = thread_cpu_now();
                    let tasks: Vec<_> = workers
                        .iter()
                        .zip(conns)
                        .zip(outs)
                        .map(|(((w, _), conn), out)| {
                            tokio::spawn(worker(sh.clone(), *w, conn, out))
                        })
                        .collect();
                    let mut outs = Vec::with_capacity(tasks.len());
                    for t in tasks {
                        outs.push(t.await.context("load worker panicked")?);
                    }
                    Ok((outs, thread_cpu_now() - cpu_at_start))
                });
                let _ = done_tx.send(outs);
            })
            .context("spawning a load thread")?;
        Ok(Shard {
            opened: Some(opened),
            start: Some(start),
            done,
        })
    }

    async fn opened(&mut self) -> anyhow::Result<()> {
        if let Some(rx) = self.opened.take() {
            rx.await
                .context("a load thread ended before opening its connections")?;
        }
        Ok(())
    }

    fn start(&mut self, shared: Arc<Shared>) {
        if let Some(tx) = self.start.take() {
            let _ = tx.send(shared);
        }
    }

    async fn finished(self) -> anyhow::Result<(Vec<WorkerOut>, f64)> {
        self.done.await.context("a load thread panicked")?
    }
}

impl WorkerOut {
    fn with_capacity(ops: usize) -> WorkerOut {
        WorkerOut {
            ops: Vec::with_capacity(ops),
            unsent: 0,
        }
    }
}

async fn worker(sh: Arc<Shared>, w: u32, mut conn: Option<Conn>, mut out: WorkerOut) -> WorkerOut {
    let period_ns = 1e9 / sh.spec.rate;
    loop {
        if sh
            .spec
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
        {
            break;
        }
        let id = sh.next_slot.fetch_add(1, Ordering::Relaxed);
        if id >= sh.total {
            break;
        }
        let offset = Duration::from_nanos((id as f64 * period_ns) as u64);
        let sched = sh.t0 + offset;
        let sched_ns = sh.t0_ns + offset.as_nanos() as u64;
        if sched > Instant::now() {
            tokio::time::sleep_until(sched).await;
        }
        if Instant::now() > sh.hard_deadline {
            out.unsent += 1;
            continue;
        }
        let op = one_request(&sh, w, id, sched_ns, &mut conn).await;
        out.ops.push(op);
    }
    out
}

/// One slot: send to the believed leader, follow up to [`MAX_HOPS`] redirects, classify.
async fn one_request(sh: &Shared, w: u32, id: u64, sched_ns: u64, conn: &mut Option<Conn>) -> Op {
    let invoke_ns = monotonic_ns();
    let deadline = Instant::now() + sh.spec.timeout;
    let mut op = Op {
        id,
        conn: w,
        sched_ns,
        invoke_ns,
        complete_ns: 0,
        outcome: Outcome::Unknown,
        node: String::new(),
        status: None,
        token: None,
        seq: None,
        attempts: 0,
        error: None,
        kind: None,
        mode: None,
        fell_back: None,
        shard: sh.spec.shard_of_worker(w),
    };
    let leader = &sh.leaders[w as usize % sh.leaders.len()];
    let is_read = !sh.spec.probe && sh.spec.is_read_slot(id);
    let sharded_path;
    let (method, path): (Method, &str) = if sh.spec.probe {
        op.kind = Some("probe".into());
        (Method::GET, &sh.spec.path)
    } else if is_read {
        op.kind = Some("read".into());
        (Method::GET, sh.read_path(id))
    } else {
        match op.shard {
            Some(shard) => {
                sharded_path = format!("{}?shard={shard}", sh.spec.path);
                (Method::POST, &sharded_path)
            }
            None => (Method::POST, &sh.spec.path),
        }
    };
    let mut not_sent_retries = 0;
    loop {
        op.attempts += 1;
        let generation = leader.generation();
        let addr = leader.current(w as usize + id as usize);
        op.node = addr.clone();
        let remaining = deadline.saturating_duration_since(Instant::now());
        if conn
            .as_ref()
            .is_none_or(|c| c.addr != addr || c.is_closed())
        {
            *conn = None;
            match Conn::open(&addr, remaining).await {
                Ok(c) => *conn = Some(c),
                Err(e) => {
                    // Nothing reached the server: definite.
                    op.outcome = Outcome::Rejected;
                    op.error = Some(e);
                    op.complete_ns = monotonic_ns();
                    leader.refresh_soon(generation);
                    return op;
                }
            }
        }
        let c = conn.as_mut().expect("connection just opened");
        let remaining = deadline.saturating_duration_since(Instant::now());
        match c.exchange(&method, path, remaining).await {
            Exchange::Reply {
                status,
                leader_header,
                body,
            } => {
                op.complete_ns = monotonic_ns();
                op.status = Some(status.as_u16());
                if sh.spec.probe {
                    op.outcome = if status == StatusCode::OK {
                        Outcome::Ok
                    } else {
                        op.error = Some(status.as_u16().to_string());
                        Outcome::Rejected
                    };
                    return op;
                }
                let v = Answer::parse(&body);
                if status == StatusCode::OK {
                    match (v.token, v.seq) {
                        (Some(t), Some(s)) => {
                            op.outcome = Outcome::Ok;
                            op.token = Some(t);
                            op.seq = Some(s);
                            if is_read {
                                op.mode = v.mode.map(|m| m.into_owned());
                                op.fell_back = v.fell_back;
                            }
                        }
                        _ => {
                            op.outcome = Outcome::Unknown;
                            op.error = Some(format!(
                                "200 without token/seq: {}",
                                String::from_utf8_lossy(&body)
                            ));
                        }
                    }
                    return op;
                }
                let code = v.error.as_deref().unwrap_or("").to_owned();
                if status == StatusCode::CONFLICT {
                    match leader_header {
                        Some(l) if l != addr && op.attempts <= MAX_HOPS => {
                            leader.set(&l);
                            continue;
                        }
                        _ => {
                            op.outcome = Outcome::Rejected;
                            op.error = Some(format!("409 {code}"));
                            leader.refresh_soon(generation);
                            return op;
                        }
                    }
                }
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    // A read issues nothing: whatever went wrong, nothing is in doubt.
                    op.outcome = if is_read || DEFINITE_503.contains(&code.as_str()) {
                        Outcome::Rejected
                    } else {
                        Outcome::Unknown
                    };
                    op.error = Some(format!("503 {code}"));
                    if code == "no_leader" {
                        leader.refresh_soon(generation);
                    }
                    return op;
                }
                op.outcome = if status.is_client_error() {
                    Outcome::Rejected
                } else {
                    Outcome::Unknown
                };
                op.error = Some(format!("{} {code}", status.as_u16()));
                return op;
            }
            Exchange::NotSent(e) => {
                *conn = None;
                // A closed keep-alive connection: reconnect once and send for real.
                if not_sent_retries < 1 && Instant::now() < deadline {
                    not_sent_retries += 1;
                    continue;
                }
                op.outcome = Outcome::Rejected;
                op.error = Some(e);
                op.complete_ns = monotonic_ns();
                leader.refresh_soon(generation);
                return op;
            }
            Exchange::Unknown(e) => {
                *conn = None;
                op.outcome = Outcome::Unknown;
                op.error = Some(e);
                op.complete_ns = monotonic_ns();
                leader.refresh_soon(generation);
                return op;
            }
        }
    }
}

/// `baton load`.
#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// Fleet directory (its `fleet.json` lists the nodes).
    #[arg(long, default_value = "state/fleet")]
    pub dir: PathBuf,
    /// Explicit node addresses instead of the fleet's (comma-separated host:port).
    #[arg(long, value_delimiter = ',')]
    pub targets: Option<Vec<String>>,
    /// Offered requests per second.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = baton::config::parse_duration_ms)]
    pub duration: u64,
    /// Concurrent connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Per-request deadline, e.g. 2s.
    #[arg(long, default_value = "2s", value_parser = baton::config::parse_duration_ms)]
    pub timeout: u64,
    /// Write every request's record here (JSON lines) for `baton check --history`.
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Share of requests sent as `GET /read` instead of `POST /next`, e.g. 0.3.
    #[arg(long, default_value_t = 0.0)]
    pub read_fraction: f64,
    /// `?mode=` of the reads: lease, quorum or resource; a comma-separated list takes turns
    /// (default: each node's configured mode).
    #[arg(long, value_delimiter = ',')]
    pub read_mode: Vec<String>,
    /// Threads sending the load (each a single-threaded runtime with its share of the
    /// connections). Default: half the cores, at least 1.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Send every slot as `GET PATH` instead (any 200 is ok, nothing is parsed), e.g. `/healthz`:
    /// plain HTTP on the same generator, to set beside a run of `/next` or `/read`.
    #[arg(long)]
    pub probe: Option<String>,
}

/// The load generator's threads when none are asked for: half the cores, at least 1, leaving
/// the rest to what is measured (the node's client threads default to the same share).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

pub async fn cli_main(a: LoadArgs) -> anyhow::Result<()> {
    let targets = match a.targets {
        Some(t) => t,
        None => crate::fleet::FleetState::load(&a.dir)?
            .nodes
            .iter()
            .map(|n| n.http_addr.clone())
            .collect(),
    };
    let mut spec = LoadSpec::new(targets, a.rate, Duration::from_millis(a.duration));
    spec.connections = a.connections;
    spec.threads = a.threads.unwrap_or_else(default_threads);
    spec.timeout = Duration::from_millis(a.timeout);
    spec.read_fraction = a.read_fraction;
    spec.read_modes = a.read_mode.clone();
    if let Some(path) = &a.probe {
        spec.path = path.clone();
        spec.probe = true;
    }
    let report = run(spec).await?;
    if let Some(p) = &a.history {
        write_history(p, &report.ops)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report.summary())?);
    } else {
        print!("{}", report.render());
        if let Some(p) = &a.history {
            println!("history: {} ({} records)", p.display(), report.ops.len());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Against in-process fake nodes (no fleet): redirects, outcome classification, and the
    //! open loop's accounting of a slow server.
    use super::*;

    #[test]
    fn read_slots_follow_the_fraction_and_modes_take_turns() {
        let mut spec = LoadSpec::new(vec!["x:1".into()], 100.0, Duration::from_secs(1));
        assert!((0..1000).all(|id| !spec.is_read_slot(id)));
        spec.read_fraction = 0.3;
        let n = (0..10_000).filter(|id| spec.is_read_slot(*id)).count();
        assert!((2700..3300).contains(&n), "{n} of 10000");
        spec.read_fraction = 1.0;
        assert!((0..1000).all(|id| spec.is_read_slot(id)));
        assert_eq!(spec.read_path(4), "/read");
        spec.read_modes = vec!["lease".into(), "quorum".into()];
        assert_eq!(spec.read_path(4), "/read?mode=lease");
        assert_eq!(spec.read_path(5), "/read?mode=quorum");
        assert!(spec.validate().is_ok());
        spec.read_modes.push("fast".into());
        assert!(spec.validate().is_err());
        spec.read_modes.pop();
        spec.read_fraction = 1.5;
        assert!(spec.validate().is_err());
    }
    use std::convert::Infallible;
    use std::sync::atomic::AtomicI64;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;

    type Handler = Arc<dyn Fn(&str, i64) -> (u16, Option<String>, String, Duration) + Send + Sync>;

    /// A fake node on a free loopback port; `handler(path, n)` sees the n-th `/next` (from 0).
    async fn fake_node(handler: Handler) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let count = Arc::new(AtomicI64::new(0));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (handler, count) = (handler.clone(), count.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (handler, count) = (handler.clone(), count.clone());
                        async move {
                            let path = req.uri().path().to_owned();
                            let n = if path == "/next" {
                                count.fetch_add(1, Ordering::SeqCst)
                            } else {
                                -1
                            };
                            let (status, leader, body, delay) = handler(&path, n);
                            tokio::time::sleep(delay).await;
                            let mut resp = Response::builder().status(status);
                            if let Some(l) = leader {
                                resp = resp.header(baton::http::LEADER_HEADER, l);
                            }
                            Ok::<_, Infallible>(resp.body(Full::new(Bytes::from(body))).unwrap())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        addr
    }

    /// A fake leader (token 1) that answers every `/next` with the next seq after `delay`.
    async fn fake_leader(delay: Duration) -> String {
        fake_node(Arc::new(move |path, n| match path {
            "/status" => (
                200,
                None,
                r#"{"role":"leader","fence_token":1}"#.into(),
                Duration::ZERO,
            ),
            _ => (
                200,
                None,
                format!(r#"{{"token":1,"seq":{}}}"#, n + 1),
                delay,
            ),
        }))
        .await
    }

    #[tokio::test]
    async fn follows_redirects_and_classifies_every_outcome() {
        let leader = fake_node(Arc::new(|path, n| match (path, n % 4) {
            ("/status", _) => (
                200,
                None,
                r#"{"role":"leader","fence_token":7}"#.into(),
                Duration::ZERO,
            ),
            (_, 0) => (
                200,
                None,
                format!(r#"{{"token":7,"seq":{}}}"#, n + 1),
                Duration::ZERO,
            ),
            (_, 1) => (503, None, r#"{"error":"not_ready"}"#.into(), Duration::ZERO),
            (_, 2) => (
                503,
                None,
                r#"{"error":"resource_unavailable"}"#.into(),
                Duration::ZERO,
            ),
            _ => (400, None, r#"{"error":"bad_n"}"#.into(), Duration::ZERO),
        }))
        .await;
        let l = leader.clone();
        let follower = fake_node(Arc::new(move |path, _| match path {
            // Knows no leader by /status: only the 409's header leads the way.
            "/status" => (
                200,
                None,
                r#"{"role":"follower","leader":null}"#.into(),
                Duration::ZERO,
            ),
            _ => (
                409,
                Some(l.clone()),
                r#"{"error":"not_leader"}"#.into(),
                Duration::ZERO,
            ),
        }))
        .await;
        // Only the follower is a target: every request starts there... until the hint says otherwise.
        let mut spec = LoadSpec::new(vec![follower.clone()], 400.0, Duration::from_millis(100));
        spec.connections = 1;
        let report = run(spec).await.unwrap();
        assert_eq!(report.ops.len(), 40);
        let by_outcome = |o| report.ops.iter().filter(|op| op.outcome == o).count();
        assert_eq!(
            (
                by_outcome(Outcome::Ok),
                by_outcome(Outcome::Rejected),
                by_outcome(Outcome::Unknown)
            ),
            (10, 20, 10)
        );
        for op in &report.ops {
            assert_eq!(op.node, leader, "every request ends at the leader: {op:?}");
            match op.outcome {
                Outcome::Ok => assert_eq!((op.token, op.status), (Some(7), Some(200))),
                Outcome::Unknown => {
                    assert_eq!(op.error.as_deref(), Some("503 resource_unavailable"))
                }
                Outcome::Rejected => assert!(
                    matches!(
                        op.error.as_deref(),
                        Some("503 not_ready") | Some("400 bad_n")
                    ),
                    "{op:?}"
                ),
            }
        }
        assert_eq!(
            report.ops[0].attempts, 2,
            "the first request follows the follower's 409"
        );
        assert!(
            report.ops[1..].iter().all(|o| o.attempts == 1),
            "later ones go straight to the leader"
        );
        let mut seqs: Vec<i64> = report.acked().iter().map(|a| a.1).collect();
        seqs.dedup();
        assert_eq!(seqs.len(), 10);
    }

    #[tokio::test]
    async fn a_slow_server_shows_as_latency_from_the_schedule_not_as_a_lower_rate() {
        // 50 ms per answer, one connection, 100 slots/s offered: at most ~20/s can be served.
        let slow = fake_leader(Duration::from_millis(50)).await;
        let mut spec = LoadSpec::new(vec![slow], 100.0, Duration::from_secs(1));
        spec.connections = 1;
        spec.drain = Duration::from_millis(500);
        let report = run(spec).await.unwrap();
        let s = report.summary();
        // The backlog is paid for: slots past the drain deadline are counted, not forgotten.
        assert_eq!(report.ops.len() as u64 + report.unsent, 100);
        assert!(report.unsent >= 50, "{s:?}");
        for op in &report.ops {
            assert_eq!(op.sched_ns, report.t0_ns + op.id * 10_000_000);
        }
        // Service time stays ~50 ms; latency from the schedule grows with the queue.
        assert!(
            s.service_ms.p50 >= 50.0 && s.service_ms.p50 < 150.0,
            "{s:?}"
        );
        assert!(
            s.latency_ms.max > 700.0,
            "queueing behind the slow server must show: {s:?}"
        );
    }

    #[tokio::test]
    async fn reads_record_their_mode_and_fall_back_and_busy_connections_follow_littles_law() {
        // Reads take 10 ms each; /read?mode=lease answers alternately from the lease and as a
        // fall-back, with the other fields a node sends.
        let node = fake_node(Arc::new(|path, _| match path {
            "/status" => (
                200,
                None,
                r#"{"role":"leader","fence_token":4}"#.into(),
                Duration::ZERO,
            ),
            _ => (
                200,
                None,
                r#"{"node_id":"n1","shard":0,"token":4,"seq":9,"cursor":null,"mode":"quorum","requested_mode":"lease","fell_back":true,"lease_window_left_ms":null}"#.into(),
                Duration::from_millis(10),
            ),
        }))
        .await;
        let mut spec = LoadSpec::new(vec![node], 40.0, Duration::from_secs(1));
        spec.connections = 4;
        spec.read_fraction = 1.0;
        spec.read_modes = vec!["lease".into()];
        let report = run(spec).await.unwrap();
        let s = report.summary();
        assert_eq!(
            (s.ok, s.reads, s.reads_ok, s.reads_fell_back),
            (40, 40, 40, 40),
            "{s:?}"
        );
        assert!(report
            .ops
            .iter()
            .all(|o| o.mode.as_deref() == Some("quorum")
                && o.token == Some(4)
                && o.seq == Some(9)));
        // 40/s x ~10-12 ms: about 0.4-0.5 of a connection busy, of 4.
        assert_eq!(s.connections, 4);
        assert!(
            (0.35..0.8).contains(&s.busy_connections_mean),
            "{}",
            s.busy_connections_mean
        );
        assert!(
            s.service_mean_ms >= 10.0 && s.service_mean_ms < 30.0,
            "{s:?}"
        );
    }

    #[tokio::test]
    async fn a_probe_gets_its_path_ok_on_any_200_and_issues_no_id() {
        // /healthz answers 200 with no token or seq; anything else here is a 404.
        let node = fake_node(Arc::new(|path, _| match path {
            "/status" => (
                200,
                None,
                r#"{"role":"leader","fence_token":1}"#.into(),
                Duration::ZERO,
            ),
            "/healthz" => (200, None, r#"{"ok":true}"#.into(), Duration::ZERO),
            _ => (404, None, String::new(), Duration::ZERO),
        }))
        .await;
        let mut spec = LoadSpec::new(vec![node], 500.0, Duration::from_millis(100));
        spec.path = "/healthz".into();
        spec.probe = true;
        let report = run(spec.clone()).await.unwrap();
        let s = report.summary();
        assert_eq!(s.ok, 50, "{s:?}");
        assert!(report.acked().is_empty() && s.tokens.is_empty() && s.reads == 0);
        assert!(report
            .ops
            .iter()
            .all(|o| o.kind.as_deref() == Some("probe")));
        // A probe of a path that is not 200 is refused, not ok.
        spec.path = "/nope".into();
        let s = run(spec).await.unwrap().summary();
        assert_eq!((s.ok, s.rejected), (0, 50), "{s:?}");
    }

    #[tokio::test]
    async fn threads_share_the_slots_each_sent_once_on_its_own_runtime() {
        let node = fake_leader(Duration::ZERO).await;
        let mut spec = LoadSpec::new(vec![node], 2000.0, Duration::from_millis(300));
        spec.connections = 5;
        spec.threads = 3;
        let report = run(spec.clone()).await.unwrap();
        assert_eq!(report.unsent, 0);
        let ids: Vec<u64> = report.ops.iter().map(|o| o.id).collect();
        assert_eq!(
            ids,
            (0..600).collect::<Vec<_>>(),
            "every slot once, in order"
        );
        assert!(report.ops.iter().all(|o| o.outcome == Outcome::Ok));
        // Each load thread measured its own CPU over the run.
        let busy = report.summary().generator_threads_busy;
        assert_eq!(busy.len(), 3, "{busy:?}");
        assert!(busy.iter().all(|b| (0.0..1.5).contains(b)), "{busy:?}");
        assert!(
            busy.windows(2).all(|w| w[0] >= w[1]),
            "busiest first: {busy:?}"
        );
        let mut seqs: Vec<i64> = report.ops.iter().filter_map(|o| o.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), 600, "each answer recorded once");
        // Every connection (worker) took part, wherever its thread.
        let mut conns: Vec<u32> = report.ops.iter().map(|o| o.conn).collect();
        conns.sort_unstable();
        conns.dedup();
        assert_eq!(conns, [0, 1, 2, 3, 4]);
        spec.threads = 0;
        assert!(run(spec).await.is_err(), "zero threads is a bad spec");
    }
}
