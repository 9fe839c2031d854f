//! The raft peer listener: a small hyper server of its own, never the client port, so client
//! traffic cannot starve heartbeats and votes (and a flood of peer connections cannot starve
//! clients). It answers only `POST /peer/<method>`, and only when the request authenticates
//! (see [`super::auth`]); everything is checked before the body is decoded or openraft sees it:
//!
//! 1. `POST` to a known `/peer/<method>` (else 405 / 404);
//! 2. the three auth headers present (else **401**), timestamp inside the window and the sender a
//!    member (else **403**) — before the body is read;
//! 3. the body read within [`Limits::body_timeout`] and [`Limits::max_body_bytes`] (else 408 / 413);
//! 4. the MAC over method, path, sender, timestamp and body verifies (else **403**);
//! 5. only then `RaftPeerRpc::handle` decodes it (and refuses terms that cannot be tokens).
//!
//! A refusal is counted in `baton_peer_auth_failures_total{reason}` and logged at most once per
//! [`WARN_EVERY_MS`]. Bounded resources: at most [`Limits::max_connections`] connections (the
//! next is closed at once and counted), a header-read timeout, a body timeout and size limit.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::auth::{
    now_unix_ms, AuthError, Credentials, PeerAuth, FROM_HEADER, MAC_HEADER, TS_HEADER,
};
use super::network::{PeerRpcError, RaftPeerRpc, PEER_METHODS};
use crate::metrics as m;

/// At most one auth-refusal warning per this many ms (the rest are counted, then summarised).
pub const WARN_EVERY_MS: u64 = 5_000;

/// The peer listener's resource bounds.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Open connections at once; a raft group needs a couple per member.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body.
    pub body_timeout: Duration,
    /// Largest body (append-entries batches, snapshot meta).
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            max_body_bytes: 64 * 1024 * 1024,
        }
    }
}

/// What the peer listener serves: authentication, membership and the raft handler.
pub(crate) struct PeerService {
    pub auth: PeerAuth,
    /// Node ids allowed in [`FROM_HEADER`].
    pub members: Vec<String>,
    pub rpc: RaftPeerRpc,
    pub limits: Limits,
    pub node_id: String,
    warn: WarnLimiter,
}

impl PeerService {
    pub fn new(
        auth: PeerAuth,
        members: Vec<String>,
        rpc: RaftPeerRpc,
        limits: Limits,
        node_id: String,
    ) -> PeerService {
        PeerService {
            auth,
            members,
            rpc,
            limits,
            node_id,
            warn: WarnLimiter::default(),
        }
    }
}

type Resp = Response<Full<Bytes>>;

fn reply(status: StatusCode, code: &str, detail: impl std::fmt::Display) -> Resp {
    let body = serde_json::json!({ "error": code, "detail": detail.to_string() }).to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn credentials(headers: &HeaderMap) -> Option<Credentials<'_>> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    Some(Credentials {
        from: get(FROM_HEADER)?,
        ts_ms: get(TS_HEADER)?,
        mac_hex: get(MAC_HEADER)?,
    })
}

/// At most one warning per [`WARN_EVERY_MS`]; the refusals in between are summarised in it.
#[derive(Default)]
struct WarnLimiter {
    last_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl WarnLimiter {
    /// `Some(number suppressed since the last warning)` when a warning may be logged now.
    fn admit(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last) >= WARN_EVERY_MS;
        if due
            && self
                .last_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl PeerService {
    /// Counts and (rate-limited) logs a refused request; nothing else happens.
    fn refuse(&self, e: AuthError, method: &str, from: Option<&str>) -> Resp {
        metrics::counter!(m::PEER_AUTH_FAILURES, "reason" => e.reason()).increment(1);
        if let Some(suppressed) = self.warn.admit(now_unix_ms()) {
            // The claimed sender is attacker-chosen: logged with Debug so it cannot forge lines.
            tracing::warn!(
                node = %self.node_id,
                method,
                claimed_from = ?from.unwrap_or("-"),
                reason = e.reason(),
                suppressed_since_last_warning = suppressed,
                "raft peer request refused"
            );
        }
        let status = match e {
            AuthError::Missing => StatusCode::UNAUTHORIZED,
            _ => StatusCode::FORBIDDEN,
        };
        reply(status, e.reason(), e)
    }

    async fn read_body(&self, body: Incoming) -> Result<Bytes, Resp> {
        let max = self.limits.max_body_bytes;
        let collect = Limited::new(body, max).collect();
        match tokio::time::timeout(self.limits.body_timeout, collect).await {
            Ok(Ok(b)) => Ok(b.to_bytes()),
            Ok(Err(e))
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                Err(reply(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("body over {max} bytes"),
                ))
            }
            Ok(Err(e)) => Err(reply(StatusCode::BAD_REQUEST, "bad_body", e)),
            Err(_) => Err(reply(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "body too slow",
            )),
        }
    }

    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Resp {
        let path = req.uri().path().to_owned();
        let Some(method) = path
            .strip_prefix("/peer/")
            .filter(|m| PEER_METHODS.contains(m))
        else {
            return reply(StatusCode::NOT_FOUND, "not_found", &path);
        };
        if req.method() != Method::POST {
            let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "POST");
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        let (parts, body) = req.into_parts();
        let Some(creds) = credentials(&parts.headers) else {
            let from = parts.headers.get(FROM_HEADER).and_then(|v| v.to_str().ok());
            return self.refuse(AuthError::Missing, method, from);
        };
        if let Err(e) = self.auth.check_fresh(&creds, now_unix_ms()) {
            return self.refuse(e, method, Some(creds.from));
        }
        if !self.members.iter().any(|m| m == creds.from) {
            return self.refuse(AuthError::UnknownSender, method, Some(creds.from));
        }
        let body = match self.read_body(body).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        if let Err(e) = self
            .auth
            .verify("POST", &path, &creds, &body, now_unix_ms())
        {
            return self.refuse(e, method, Some(creds.from));
        }
        self.dispatch(method, body).await
    }

    async fn dispatch(&self, method: &str, body: Bytes) -> Resp {
        match self.rpc.handle(method, body).await {
            Ok(bytes) => {
                let mut r = Response::new(Full::new(bytes));
                r.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r
            }
            Err(PeerRpcError::UnknownMethod(m)) => {
                reply(StatusCode::NOT_FOUND, "unknown_peer_method", m)
            }
            Err(PeerRpcError::BadRequest(d)) => {
                reply(StatusCode::BAD_REQUEST, "bad_peer_request", d)
            }
            Err(PeerRpcError::Failed(d)) => {
                reply(StatusCode::SERVICE_UNAVAILABLE, "peer_failed", d)
            }
        }
    }
}

/// Accepts peer connections until `shutdown` resolves, then lets in-flight requests finish
/// (bounded).
pub(crate) async fn serve(
    listener: TcpListener,
    service: Arc<PeerService>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(service.limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "raft peer accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the cap: close at once rather than queue (a queue is a slower way to starve).
            metrics::counter!(m::PEER_CONNECTIONS_REFUSED).increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc_state = service.clone();
        let svc = service_fn(move |req| {
            let s = svc_state.clone();
            async move { Ok::<_, Infallible>(s.handle(req).await) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(service.limits.header_read_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(2), graceful.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_rate_limited_and_count_what_they_skipped() {
        let w = WarnLimiter::default();
        assert_eq!(w.admit(1_000), Some(0));
        assert_eq!(w.admit(1_001), None);
        assert_eq!(w.admit(5_999), None);
        assert_eq!(w.admit(6_000), Some(2));
    }
}
