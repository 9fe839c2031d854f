//! PostgreSQL connections, shared by every part of a node that talks to PostgreSQL (the fence in
//! `work`, the `pg-lease` backend): one place that builds a pool (TLS or plain), one rule for how
//! long a call may go unanswered and a connection type that is closed when one was ([`Conn`]),
//! and one that renders a driver error with its causes. It sits below both, so neither imports
//! the other.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Config as PoolConfig, Manager, Object, Pool, Runtime};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Socket};

/// An error with its sources: tokio-postgres says only "db error" or "error performing TLS
/// handshake" at the top, the reason (e.g. an unknown issuer) is below.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Builds the pool for `pc`: over TLS verified against `tls_ca_file` when it is set, with
/// `sslmode=require` (never a silent fallback to plain text, whatever the URL says); plain
/// otherwise. Every PostgreSQL pool of a node (the fence's, pg-lease's) is made here.
///
/// Each connection gets `TCP_USER_TIMEOUT` = [`answer_bound`]`(statement_timeout)` (unless the
/// URL sets its own `tcp_user_timeout`): data the server has not acknowledged for that long
/// closes the connection, and the call on it fails, instead of waiting out TCP's
/// retransmissions (which back off towards minutes) while a partition drops the packets.
pub(crate) fn create_pool(
    pc: PoolConfig,
    tls_ca_file: Option<&std::path::Path>,
    statement_timeout: Duration,
) -> Result<Pool, String> {
    let unacked_bound = answer_bound(statement_timeout);
    let Some(ca) = tls_ca_file else {
        return build(&pc, NoTls, unacked_bound);
    };
    #[cfg(feature = "tls")]
    {
        let mut pc = pc;
        let tls = crate::tls::postgres_connector(ca).map_err(|e| e.to_string())?;
        pc.ssl_mode = Some(deadpool_postgres::SslMode::Require);
        build(&pc, tls, unacked_bound)
    }
    #[cfg(not(feature = "tls"))]
    Err(format!(
        "tls_ca_file {} is set, but this build of baton has no TLS (cargo feature `tls`)",
        ca.display()
    ))
}

/// One session for administrative SQL (migrations, roles), connected without TLS as `url`, and
/// the task driving its connection (it ends once the client is dropped). The server's notices
/// ("function ... does not exist, skipping" from every idempotent `DROP ... IF EXISTS`) are
/// logged at DEBUG here: the driver's own loop would log each one at INFO.
pub(crate) async fn admin_session(
    url: &str,
) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let (client, mut conn) = tokio_postgres::connect(url, NoTls).await?;
    let driver = tokio::spawn(async move {
        loop {
            match futures::future::poll_fn(|cx| conn.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notice(n))) => {
                    tracing::debug!(severity = n.severity(), "PostgreSQL: {}", n.message());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %error_chain(&e), "administrative session ended");
                    return;
                }
                None => return,
            }
        }
    });
    Ok((client, driver))
}

/// How long a call may go unanswered: the server's own `statement_timeout` plus a second for the
/// round trip. A healthy server answers within it, if only with its statement-timeout error;
/// past it the packets are being lost (a partition drops them, it does not refuse them) or the
/// server is stopped. TCP alone would keep the call waiting for its retransmissions: after a
/// 15 s cut from PostgreSQL the sequencer's next answer came 12.3 s after the heal
/// (`experiments/FINDINGS.md`). The fence gives up a call at this bound; every connection's `TCP_USER_TIMEOUT` is it.
pub(crate) fn answer_bound(statement_timeout: Duration) -> Duration {
    statement_timeout + Duration::from_secs(1)
}

/// A call to PostgreSQL left unanswered past its bound. When this process was itself stopped
/// for part of the wait (SIGSTOP, a frozen VM, an overloaded machine), the message says so: the
/// database's silence is then not what the bound measured.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub(crate) struct Unanswered {
    /// The bound, counted in time this process was running.
    pub(crate) bound: Duration,
    /// How long this process was not running during the wait.
    pub(crate) paused: Duration,
}

impl Unanswered {
    fn describe(&self) -> String {
        let bound_ms = self.bound.as_millis();
        if self.paused < PAUSE_WORTH_NAMING {
            return format!("PostgreSQL did not answer within {bound_ms} ms");
        }
        format!(
            "this process was paused (not running: stopped, frozen or starved of CPU) for ~{} ms \
             while it waited for PostgreSQL, which then did not answer within {bound_ms} ms of \
             it running",
            self.paused.as_millis()
        )
    }
}

/// A local stall shorter than this is scheduling noise, not worth naming in an error.
const PAUSE_WORTH_NAMING: Duration = Duration::from_millis(200);
/// However long the process was paused, a call is given up after this many times its bound.
const MAX_STRETCH: u32 = 4;

/// `call`'s output, unless it goes unanswered for `bound` of the time this process was running.
/// A process that was stopped (SIGSTOP, a frozen VM) finds its timer expired the moment it runs
/// again, although the answer may be waiting in the socket: the time it was stopped (measured by
/// [`crate::clock::stall`]) is given back to the call, up to [`MAX_STRETCH`] times the bound in
/// all, so a commit that landed is reported as landed rather than as unknown.
pub(crate) async fn answered_within<F: Future>(
    bound: Duration,
    call: F,
) -> Result<F::Output, Unanswered> {
    let mark = crate::clock::stall::mark();
    let started = tokio::time::Instant::now();
    let mut call = std::pin::pin!(call);
    let mut deadline = started + bound;
    loop {
        if let Ok(output) = tokio::time::timeout_at(deadline, call.as_mut()).await {
            return Ok(output);
        }
        let waited = started.elapsed();
        let paused = crate::clock::stall::stalled_since(mark).min(waited);
        let running = waited - paused;
        let left = bound.saturating_sub(running);
        if left < Duration::from_millis(1) || waited + left > bound * MAX_STRETCH {
            return Err(Unanswered { bound, paused });
        }
        deadline = tokio::time::Instant::now() + left;
    }
}

/// A pooled connection that remembers whether a call on it went unanswered. If one did, dropping
/// it closes the connection instead of returning it to its pool: deadpool's fast recycling
/// checks only `is_closed`, so the next call would be handed the same connection and queue
/// behind the answer that never comes (a stopped backend, or a partition that drops packets).
pub(crate) struct Conn {
    /// `Some` until dropped.
    client: Option<Object>,
    unanswered: AtomicBool,
}

impl Conn {
    pub(crate) fn new(client: Object) -> Conn {
        Conn {
            client: Some(client),
            unanswered: AtomicBool::new(false),
        }
    }

    /// `call`'s output, or [`Unanswered`] when it is not answered within `bound` of this
    /// process running (see [`answered_within`]; logged here, once for every caller); the
    /// connection is then closed when this drops, whatever else still holds it meanwhile.
    pub(crate) async fn within<F: Future>(
        &self,
        bound: Duration,
        call: F,
    ) -> Result<F::Output, Unanswered> {
        let answered = answered_within(bound, call).await;
        if let Err(e) = &answered {
            tracing::warn!(
                bound_ms = bound.as_millis() as u64,
                paused_ms = e.paused.as_millis() as u64,
                "{e}; closing that connection"
            );
            self.unanswered.store(true, Ordering::Relaxed);
        }
        answered
    }

    /// Takes the connection out of its pool and closes it (a transaction left in an unknown
    /// state).
    pub(crate) fn discard(self) {
        self.close_on_drop();
    }

    /// Closes the connection when this drops instead of returning it to its pool; calls
    /// already sent on it are still answered meanwhile.
    pub(crate) fn close_on_drop(&self) {
        self.unanswered.store(true, Ordering::Relaxed);
    }

    /// Whether the connection is gone or a call on it went unanswered (do not send more).
    pub(crate) fn is_closed(&self) -> bool {
        self.unanswered.load(Ordering::Relaxed)
            || self.client.as_ref().is_none_or(|c| c.is_closed())
    }
}

impl std::ops::Deref for Conn {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.client
            .as_ref()
            .expect("a Conn holds its connection until it drops")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if self.unanswered.load(Ordering::Relaxed) {
                drop(Object::take(client));
            }
        }
    }
}

/// [`PoolConfig::create_pool`], with the driver's config adjusted first.
fn build<T>(pc: &PoolConfig, tls: T, unacked_bound: Duration) -> Result<Pool, String>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let mut pg = pc.get_pg_config().map_err(|e| e.to_string())?;
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(unacked_bound);
    }
    let manager = Manager::from_config(pg, tls, pc.get_manager_config());
    Pool::builder(manager)
        .config(pc.get_pool_config())
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A silent database: given up at the bound, and the error names no pause.
    #[tokio::test(start_paused = true)]
    async fn a_silent_call_is_given_up_at_its_bound() {
        let _one = crate::clock::stall::one_test_at_a_time();
        let bound = Duration::from_millis(3000);
        let t0 = tokio::time::Instant::now();
        let e = answered_within(bound, std::future::pending::<()>())
            .await
            .unwrap_err();
        assert_eq!(t0.elapsed(), bound);
        assert_eq!(
            e.to_string(),
            "PostgreSQL did not answer within 3000 ms",
            "{e:?}"
        );
    }

    /// The case: the process is stopped while the answer is on its way. The stopped time
    /// is given back, so an answer that arrives (here 1 s after the bound) is returned instead of
    /// an "outcome unknown"; and a call that stays silent is reported as a local pause.
    #[tokio::test(start_paused = true)]
    async fn time_this_process_was_stopped_does_not_count_against_the_bound() {
        let _one = crate::clock::stall::one_test_at_a_time();
        let bound = Duration::from_millis(3000);
        let answer = async {
            tokio::time::sleep(Duration::from_millis(2000)).await;
            crate::clock::stall::pretend_stalled(Duration::from_millis(2500));
            tokio::time::sleep(Duration::from_millis(2000)).await;
            42
        };
        assert_eq!(answered_within(bound, answer).await.unwrap(), 42);

        let silent = async {
            crate::clock::stall::pretend_stalled(Duration::from_millis(4000));
            std::future::pending::<()>().await
        };
        let t0 = tokio::time::Instant::now();
        let e = answered_within(bound, silent).await.unwrap_err();
        assert!(t0.elapsed() <= bound * MAX_STRETCH, "{:?}", t0.elapsed());
        let text = e.to_string();
        assert!(
            text.contains("this process was paused") && text.contains("~"),
            "{text}"
        );
    }
}
