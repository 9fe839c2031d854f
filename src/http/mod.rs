//! HTTP, hyper 1. `serve` takes a bound listener and a shutdown future, so tests bind
//! port 0 and stop the server when they are done.
//!
//! Every client holds bounded resources: a connection slot out of `max_connections`
//! (past it, the slot of the connection longest without progress, or a fixed 503 and close when
//! every slot is serving a request: a flood cannot take the descriptors the node needs for its
//! own work, nor lock new clients out; see `slots`), a header-read clock that also bounds idle keep-alive, a body-read clock and size
//! limit, and a bound on the whole request. A leader whose accept loop keeps failing cannot serve
//! its clients, and its followers cannot tell: it steps down (`AcceptHealth`).
//!
//! With `[http] tls_cert_file`/`tls_key_file` (feature `tls`) the server speaks HTTPS only. The
//! handshake happens inside the connection's slot and is bounded by the header-read timeout, so a
//! client that opens TCP and never handshakes holds a slot (evictable, it makes no progress) no
//! longer than one that never sends a request head.

mod confirm;
mod next;
mod read;
mod resp;
mod routes;
mod shard_pick;
mod slots;
mod status;
mod stepdown;
mod ui;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use ractor::ActorRef;
use tokio::net::{TcpListener, TcpStream};

use crate::actors::messages::SupervisorMsg;
use crate::config::{HttpConfig, ReadMode, Secret};
use crate::elector::Elector;
use crate::leadership::Leadership;
use crate::metrics as m;
use crate::trace::ActorTrace;
use crate::work::sequencer::{AnswerHomes, SequencerHandle};
use crate::work::Fence;
use slots::{Admission, Slots};

pub use shard_pick::LEADER_HEADER;
pub(crate) use ui::UiState;

/// What `GET /read` needs besides the leadership mirror.
pub(crate) struct ReadSettings {
    /// The mode of a request without `?mode=` (`read_mode_default`).
    pub default_mode: ReadMode,
    /// `read_lease_margin_ms`.
    pub lease_margin: Duration,
    /// `clock_rate_error`: the same bound the watchdog's deadline assumes.
    pub rate_bound: f64,
    /// Whether this node runs the built-in sequencer / scheduler (else their fields are null).
    pub sequencer: bool,
    /// See `sequencer`.
    pub scheduler: bool,
    /// The node's runtime: backend and database clients run their calls there, not on the
    /// HTTP server's own thread (the sequencer's commits are the exception, see
    /// `work::sequencer`).
    pub node_rt: tokio::runtime::Handle,
    /// The lease-read hot path's counter handles (see [`ReadCounters`]).
    pub counters: ReadCounters,
}

/// Counter handles of `GET /read`'s hot outcome, each registered with the recorder on first use
/// and kept: `metrics::counter!` with labels builds and hashes its key and looks it up in the
/// recorder's registry on every call, which a lease read served from memory should not pay.
#[derive(Default)]
pub(crate) struct ReadCounters {
    lease_ok: std::sync::OnceLock<metrics::Counter>,
}

impl ReadCounters {
    /// `baton_reads_total{mode="lease",outcome="ok"}`.
    pub fn lease_ok(&self) -> &metrics::Counter {
        self.lease_ok.get_or_init(
            || metrics::counter!(m::READS, "mode" => ReadMode::Lease.as_str(), "outcome" => "ok"),
        )
    }
}

/// One shard's term as the handlers see it (one entry at K = 1: shard 0).
pub(crate) struct ShardApp {
    /// This shard's number (its index in `HttpApp::shards`).
    pub shard: usize,
    pub shared: Arc<Leadership>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub sequencer: SequencerHandle,
    /// The shard's election backend, for `quorum` reads.
    pub elector: Arc<dyn Elector>,
    /// The fenced resource in the shard's fence domain, for `resource` reads.
    pub fence: Fence,
    /// Shares one backend confirmation among the `quorum` reads that arrived before it began.
    pub confirms: confirm::ConfirmBatches,
}

/// Everything a request handler may touch.
pub(crate) struct HttpApp {
    /// `shards[s]`: shard `s` (K entries; shard 0 answers requests that name no shard).
    pub shards: Vec<ShardApp>,
    /// Placement's view and this node's draining flag (`/healthz` answers 503 while draining).
    pub placement: Arc<crate::actors::placement::PlacementState>,
    pub read: ReadSettings,
    /// baton's own Prometheus recorder, when it installed one (feature `prometheus`, and no
    /// recorder installed before it); `/metrics` answers 404 otherwise.
    #[cfg(feature = "prometheus")]
    pub prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    pub admin_token: Option<Secret>,
    pub max_block: u32,
    pub limits: HttpConfig,
    /// Connections served at once: `limits.max_connections`, lowered below the descriptor limit
    /// by [`connection_cap`].
    pub max_connections: usize,
    pub trace: ActorTrace,
    /// The fleet page's members and its last sweep (`GET /ui`).
    pub ui: UiState,
    /// Set when the server speaks HTTPS only (`[http] tls_cert_file`).
    #[cfg(feature = "tls")]
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The failure detector's view (`[detector] kind = "swim"`), shown under `detector` in
    /// `/status`.
    #[cfg(feature = "swim")]
    pub detector: Option<crate::detector::SharedView>,
}

impl HttpApp {
    fn speaks_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }
}

/// The HTTPS acceptor for `limits`, when it names a certificate (None: plain HTTP).
#[cfg(feature = "tls")]
pub(crate) fn tls_acceptor(
    limits: &HttpConfig,
) -> Result<Option<tokio_rustls::TlsAcceptor>, crate::tls::TlsError> {
    let (Some(cert), Some(key)) = (&limits.tls_cert_file, &limits.tls_key_file) else {
        return Ok(None);
    };
    // http/1.1 only: the server is hyper's http1, and ALPN lets a client learn it up front.
    let cfg = crate::tls::server_config(cert, key, &[b"http/1.1"])?;
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(cfg))))
}

/// hyper's read buffer per connection (its default is ~400 KiB), so 1,000 connections cannot
/// pin 400 MB between them.
const MAX_READ_BUF_BYTES: usize = 64 * 1024;
/// Largest request head (431 past it); baton's own requests need a few hundred bytes.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Pause after a failed accept (EMFILE and friends) instead of spinning on it.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// At most one "accept failed" log line per this interval; the rest are counted.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// What a connection past the cap gets: written without waiting (it fits any socket buffer).
const REFUSAL_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 59\r\nconnection: close\r\nretry-after: 1\r\n\r\n{\"error\":\"too_many_connections\",\"detail\":\"retry shortly\"}\r\n";

/// The connection cap actually enforced: the configured one, but never more than half the
/// descriptor soft limit, so the node's own database, peer and file descriptors always fit.
pub fn connection_cap(configured: usize, nofile_soft_limit: u64) -> usize {
    let half = usize::try_from(nofile_soft_limit / 2).unwrap_or(usize::MAX);
    configured.min(half).max(1)
}

/// Runs [`serve`] on `[http] threads` threads of its own, each with a single-threaded runtime
/// accepting on the same listener, so client traffic (however many connections, however busy)
/// queues behind other client work only, never in front of the node's timer-critical tasks
/// (raft heartbeats, lease renewals, the watchdog) on the node's runtime. The threads share one
/// set of connection slots, so `max_connections` bounds the node, not each thread. The receiver
/// resolves when every thread has stopped.
pub(crate) fn spawn_server(
    listener: TcpListener,
    app: Arc<HttpApp>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = app.limits.server_threads(cores);
    // Moved between runtimes as std listeners: a tokio one is bound to its runtime's reactor.
    // Each thread gets a duplicate of the one socket; the kernel hands each new connection to
    // one of the accepts that are waiting.
    let listener = listener.into_std()?;
    let mut listeners = Vec::with_capacity(threads);
    for _ in 1..threads {
        listeners.push(listener.try_clone()?);
    }
    listeners.push(listener);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let last_out = Arc::new(LastOut(std::sync::Mutex::new(Some(done_tx))));
    // One shutdown for all: the first thread awaits it and tells the others.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = Some(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let slots = Arc::new(Slots::new(app.max_connections));
    let commit_rts = spawn_commit_threads(
        &app,
        app.limits.commit_threads(cores, app.shards.len()),
        &stop_rx,
        &last_out,
    )?;
    for (s, shard) in app.shards.iter().enumerate() {
        if let Some(rt) = commit_rts.get(s % commit_rts.len().max(1)) {
            shard.sequencer.offer_commit_runtime(rt.clone());
        }
    }
    for (i, listener) in listeners.into_iter().enumerate() {
        let rt = client_runtime("baton-http")?;
        // A shard's sequencer commit path runs on one of these threads (see
        // `work::sequencer`), shard s on thread s mod threads, so K shards' commits use the
        // threads side by side; offered before the thread starts so no term that begins
        // meanwhile runs elsewhere.
        if commit_rts.is_empty() {
            for shard in app.shards.iter().skip(i).step_by(threads) {
                shard.sequencer.offer_commit_runtime(rt.handle().clone());
            }
        }
        let (first_stop, mut stop_rx) = (shutdown.take(), stop_rx.clone());
        let (served, slots) = (app.clone(), slots.clone());
        run_client_thread(format!("baton-http-{i}"), rt, &app, &last_out, async move {
            let stop = async move {
                match first_stop {
                    Some(f) => f.await,
                    None => {
                        let _ = stop_rx.wait_for(|stopped| *stopped).await;
                    }
                }
            };
            match TcpListener::from_std(listener) {
                Ok(listener) => serve(listener, served, slots, stop).await,
                Err(e) => tracing::error!(error = %e, "HTTP listener lost between runtimes"),
            }
        })?;
    }
    Ok(done_rx)
}

/// A single-threaded runtime for client work (a client thread's, or a commit thread's).
fn client_runtime(name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name(name)
        .build()
}

/// Runs `run` on `rt` on a thread of its own named `name`, at the client threads' nice value
/// (`[http] thread_nice`: the node's timer-critical work comes first), and lets go of
/// `last_out` once the runtime has dropped.
fn run_client_thread(
    name: String,
    rt: tokio::runtime::Runtime,
    app: &Arc<HttpApp>,
    last_out: &Arc<LastOut>,
    run: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (nice, last_out) = (app.limits.thread_nice, last_out.clone());
    std::thread::Builder::new().name(name).spawn(move || {
        crate::rlimit::nice_this_thread(nice);
        rt.block_on(run);
        // The runtime drops here, on its own thread (never inside an async context).
        drop(rt);
        drop(last_out);
    })?;
    Ok(())
}

/// Resolves `spawn_server`'s receiver when the last server thread lets go of it.
struct LastOut(std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>);

impl Drop for LastOut {
    fn drop(&mut self) {
        if let Some(tx) = self.0.lock().ok().and_then(|mut g| g.take()) {
            let _ = tx.send(());
        }
    }
}

/// Accepts connections into `slots` until `shutdown` resolves, then lets in-flight requests
/// finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Arc<HttpApp>,
    slots: Arc<Slots>,
    shutdown: impl Future<Output = ()>,
) {
    // Where the sequencer delivers this thread's `POST /next` answers, a batch at a time
    // (one home per shard).
    let home = AnswerHomes::current(app.shards.len());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut health = AcceptHealth::new(app.limits.accept_failure_stepdown());
    tokio::pin!(shutdown);
    loop {
        // Accepting while evicted connections are still closing would spend descriptors faster
        // than they come back; the kernel's backlog holds newcomers meanwhile (no descriptor).
        while slots.too_many_closing() {
            let _ =
                tokio::time::timeout(Duration::from_millis(10), slots.released.notified()).await;
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    health.succeeded();
                    admit(stream, &slots, &app, &home, &graceful);
                }
                Err(e) => {
                    on_accept_error(&app, &mut health, &e);
                    tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                }
            },
            _ = &mut shutdown => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}

/// Serves `stream` in a slot (a free one, or one taken from the connection longest without
/// progress); when every slot is serving a request, answers 503 and closes it at once.
fn admit(
    stream: TcpStream,
    slots: &Arc<Slots>,
    app: &Arc<HttpApp>,
    home: &AnswerHomes,
    graceful: &hyper_util::server::graceful::GracefulShutdown,
) {
    let state = match slots.admit() {
        Admission::Free(state) => state,
        Admission::Evicted(state) => {
            metrics::counter!(m::HTTP_CONNECTIONS_EVICTED).increment(1);
            state
        }
        Admission::Full => {
            metrics::counter!(m::HTTP_CONNECTIONS_REFUSED).increment(1);
            // Best effort and never waiting: a client that does not read this still loses its
            // descriptor here, when `stream` drops. An HTTPS client could not read plain text:
            // it just sees the connection close.
            if !app.speaks_tls() {
                let _ = stream.try_write(REFUSAL_503);
            }
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let (app, slots, watcher) = (app.clone(), slots.clone(), graceful.watcher());
    let home = home.clone();
    tokio::spawn(async move {
        // Evicted: dropping the connection (or the handshake) closes its socket and frees its
        // descriptor.
        tokio::select! {
            _ = serve_connection(stream, &app, &home, &state, watcher) => {}
            _ = state.evicted.notified() => {}
        }
        slots.release(&state);
    });
}

/// Serves one admitted connection: over TLS once the handshake is done (within the header-read
/// bound), or as plain HTTP.
async fn serve_connection(
    stream: TcpStream,
    app: &Arc<HttpApp>,
    home: &AnswerHomes,
    state: &Arc<slots::ConnState>,
    watcher: hyper_util::server::graceful::Watcher,
) {
    #[cfg(feature = "tls")]
    if let Some(acceptor) = &app.tls {
        let bound = app.limits.header_read_timeout();
        match tokio::time::timeout(bound, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => {
                state.progressed();
                serve_http1(TokioIo::new(tls), app, home, state, watcher).await;
            }
            Ok(Err(e)) => {
                metrics::counter!(m::HTTP_TLS_HANDSHAKE_FAILURES).increment(1);
                tracing::debug!(error = %e, "TLS handshake failed");
            }
            Err(_) => {
                metrics::counter!(m::HTTP_TLS_HANDSHAKE_FAILURES).increment(1);
                tracing::debug!(
                    bound_ms = bound.as_millis() as u64,
                    "TLS handshake timed out"
                );
            }
        }
        return;
    }
    serve_http1(TokioIo::new(stream), app, home, state, watcher).await;
}

/// hyper's HTTP/1 on `io`, with every per-connection bound, until the connection ends.
async fn serve_http1<I>(
    io: I,
    app: &Arc<HttpApp>,
    home: &AnswerHomes,
    state: &Arc<slots::ConnState>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (svc_app, svc_state, svc_home) = (app.clone(), state.clone(), home.clone());
    let svc = service_fn(move |req| {
        let (app, conn, home) = (svc_app.clone(), svc_state.clone(), svc_home.clone());
        async move {
            conn.progressed();
            let resp = routes::bounded_route(&app, &conn, &home, req).await;
            conn.progressed();
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(app.limits.header_read_timeout())
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_READ_BUF_BYTES)
        .keep_alive(true)
        .serve_connection(io, svc);
    let _ = watcher.watch(conn).await;
}

/// Logs (rate-limited), counts, and steps down when accepting has failed for too long.
fn on_accept_error(app: &Arc<HttpApp>, health: &mut AcceptHealth, e: &std::io::Error) {
    metrics::counter!(m::HTTP_ACCEPT_FAILURES).increment(1);
    let verdict = health.failed(Instant::now());
    if let Some(suppressed) = verdict.log_suppressed {
        tracing::warn!(error = %e, suppressed, "accept failed");
    }
    if verdict.step_down {
        for shard in app.shards.iter().filter(|s| s.shared.is_leading()) {
            step_down_unserviceable(app, shard, &verdict, e);
        }
    }
}

fn step_down_unserviceable(
    app: &Arc<HttpApp>,
    shard: &ShardApp,
    verdict: &AcceptVerdict,
    e: &std::io::Error,
) {
    {
        let failing_ms = verdict.failing_for.as_millis();
        tracing::error!(error = %e, failing_ms, "cannot accept client connections: stepping down");
        metrics::counter!(m::HTTP_UNSERVICEABLE_STEPDOWNS).increment(1);
        app.trace.step(
            "http",
            "unserviceable-stepdown",
            shard.shared.token(),
            &format!("accept failing for {failing_ms} ms: {e}"),
        );
        let supervisor = shard.supervisor.clone();
        // Not awaited here: the accept loop keeps running (and recovering) meanwhile.
        tokio::spawn(async move {
            let _ = supervisor
                .call(
                    |reply| SupervisorMsg::StepDown {
                        successor: None,
                        reply,
                    },
                    Some(Duration::from_secs(30)),
                )
                .await;
        });
    }
}

/// `count` (`[http] commit_threads`) threads of their own for the shards' commit paths (with
/// none they run on the client threads), each a single-threaded runtime that lives until the
/// server stops.
fn spawn_commit_threads(
    app: &Arc<HttpApp>,
    count: usize,
    stop_rx: &tokio::sync::watch::Receiver<bool>,
    last_out: &Arc<LastOut>,
) -> std::io::Result<Vec<tokio::runtime::Handle>> {
    let mut handles = Vec::with_capacity(count);
    for i in 0..count {
        let rt = client_runtime("baton-commit")?;
        handles.push(rt.handle().clone());
        let mut stop_rx = stop_rx.clone();
        run_client_thread(format!("baton-commit-{i}"), rt, app, last_out, async move {
            let _ = stop_rx.wait_for(|stopped| *stopped).await;
        })?;
    }
    Ok(handles)
}

/// How the accept loop is doing: since when it fails, and when it last logged.
#[derive(Debug)]
struct AcceptHealth {
    stepdown_after: Duration,
    failing_since: Option<Instant>,
    last_log: Option<Instant>,
    suppressed: u64,
}

/// What to do about one failed accept.
#[derive(Debug, PartialEq, Eq)]
struct AcceptVerdict {
    /// Log now, mentioning this many failures not logged since the last line.
    log_suppressed: Option<u64>,
    step_down: bool,
    failing_for: Duration,
}

impl AcceptHealth {
    fn new(stepdown_after: Duration) -> AcceptHealth {
        AcceptHealth {
            stepdown_after,
            failing_since: None,
            last_log: None,
            suppressed: 0,
        }
    }

    fn succeeded(&mut self) {
        self.failing_since = None;
    }

    fn failed(&mut self, now: Instant) -> AcceptVerdict {
        let since = *self.failing_since.get_or_insert(now);
        let failing_for = now.saturating_duration_since(since);
        let log_due = self
            .last_log
            .is_none_or(|t| now.saturating_duration_since(t) >= ACCEPT_LOG_INTERVAL);
        let log_suppressed = if log_due {
            self.last_log = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        };
        let step_down = failing_for >= self.stepdown_after;
        if step_down {
            // Start the clock again: a node re-elected while still failing waits a whole bound
            // before it steps down again, instead of on every failed accept.
            self.failing_since = Some(now);
        }
        AcceptVerdict {
            log_suppressed,
            step_down,
            failing_for,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_stays_below_half_the_descriptor_limit() {
        assert_eq!(connection_cap(1024, 1024), 512);
        assert_eq!(connection_cap(100, 1024), 100);
        assert_eq!(connection_cap(1024, 1_048_576), 1024);
        assert_eq!(connection_cap(1024, 1), 1);
    }

    #[test]
    fn refusal_is_a_complete_http_response() {
        let text = std::str::from_utf8(REFUSAL_503).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), len);
    }

    #[test]
    fn accept_failures_log_sparingly_and_step_down_after_the_bound() {
        let t0 = Instant::now();
        let mut h = AcceptHealth::new(Duration::from_secs(5));
        let v = h.failed(t0);
        assert_eq!(v.log_suppressed, Some(0));
        assert!(!v.step_down);
        // 50 ms apart, as the loop retries: one log line per interval, not one per failure.
        let mut logged = 0;
        for i in 1..100u32 {
            let v = h.failed(t0 + Duration::from_millis(50) * i);
            logged += u32::from(v.log_suppressed.is_some());
            assert_eq!(v.step_down, 50 * i >= 5000, "at {} ms", 50 * i);
        }
        assert_eq!(logged, 0, "no second line within the log interval");
        let v = h.failed(t0 + Duration::from_secs(5));
        assert_eq!(v.log_suppressed, Some(99));
        assert!(v.step_down);
        // The clock restarted after the step-down decision.
        assert!(!h.failed(t0 + Duration::from_millis(5050)).step_down);
    }

    #[test]
    fn one_good_accept_resets_the_clock() {
        let t0 = Instant::now();
        let mut h = AcceptHealth::new(Duration::from_secs(5));
        h.failed(t0);
        h.succeeded();
        assert!(!h.failed(t0 + Duration::from_secs(6)).step_down);
        assert!(h.failed(t0 + Duration::from_secs(11)).step_down);
    }
}
