//! Request routing and the handlers. Every refusal is a precise status with a JSON body
//! `{"error": "...", ...}`, and a refused request changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::confirm::Confirmed;
use super::slots::ConnState;
use super::{ui, HttpApp, ShardApp};
use crate::actors::supervisor::{StepDownError, SupervisorMsg};
use crate::config::{lease_read_until, ReadMode};
use crate::leadership::ReadView;
use crate::metrics as m;
use crate::work::scheduler::WORKSET_RESOURCE;
use crate::work::sequencer::{AnswerHomes, NextCallError, NextError, SEQUENCE_RESOURCE};

/// Header naming the leader's HTTP address on a 409.
pub const LEADER_HEADER: &str = "x-baton-leader";
const NEXT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the round trip of a `quorum` or `resource` read.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) type Resp = Response<Full<Bytes>>;

fn json_resp(status: StatusCode, body: serde_json::Value) -> Resp {
    json_text_resp(status, body.to_string())
}

/// A response whose JSON text the caller wrote itself (the `/next` hot path, where building a
/// `serde_json::Value` map per request showed in the profile).
fn json_text_resp(status: StatusCode, body: String) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, code: &str, detail: impl Into<String>) -> Resp {
    json_resp(status, json!({ "error": code, "detail": detail.into() }))
}

fn method_not_allowed(allow: &'static str) -> Resp {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("allowed: {allow}"),
    );
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

/// [`route`] within the per-request bound: a handler that overruns it answers 503 and the
/// connection closes, so no request holds its slot longer than `request_timeout_ms`.
pub(super) async fn bounded_route(
    app: &HttpApp,
    conn: &Arc<ConnState>,
    home: &AnswerHomes,
    req: Request<Incoming>,
) -> Resp {
    match tokio::time::timeout(app.limits.request_timeout(), route(app, conn, home, req)).await {
        Ok(r) => r,
        Err(_) => closing(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "request_timeout",
            format!(
                "no answer within {} ms",
                app.limits.request_timeout().as_millis()
            ),
        )),
    }
}

/// Asks hyper to close the connection after this response (its request was not fully read, or
/// the client was too slow to keep).
fn closing(mut r: Resp) -> Resp {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

async fn route(
    app: &HttpApp,
    conn: &Arc<ConnState>,
    home: &AnswerHomes,
    req: Request<Incoming>,
) -> Resp {
    let path = req.uri().path().to_owned();
    match (path.as_str(), req.method()) {
        ("/status", &Method::GET) => status(app),
        ("/status", _) => method_not_allowed("GET"),
        // A draining node (shutting down) answers 503, so its peers' placement moves its shards
        // away before it releases them.
        ("/healthz", &Method::GET) if app.placement.is_draining() => json_resp(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "ok": false, "draining": true }),
        ),
        ("/healthz", &Method::GET) => json_resp(StatusCode::OK, json!({ "ok": true })),
        ("/healthz", _) => method_not_allowed("GET"),
        ("/metrics", &Method::GET) => metrics(app),
        ("/metrics", _) => method_not_allowed("GET"),
        ("/next", &Method::POST) => next(app, conn, home, req).await,
        ("/next", _) => method_not_allowed("POST"),
        ("/read", &Method::GET) => read(app, conn, req).await,
        ("/read", _) => method_not_allowed("GET"),
        ("/stepdown", &Method::POST) => stepdown(app, conn, req).await,
        ("/stepdown", _) => method_not_allowed("POST"),
        // The fleet page: read-only and public, like `/status` (see `ui`).
        ("/ui" | "/ui/", &Method::GET) => ui::page(),
        ("/ui/app.js", &Method::GET) => ui::script(),
        ("/ui/app.css", &Method::GET) => ui::style(),
        ("/ui/fleet", &Method::GET) => ui::fleet(app).await,
        ("/ui" | "/ui/" | "/ui/app.js" | "/ui/app.css" | "/ui/fleet", _) => {
            method_not_allowed("GET")
        }
        // Raft peer RPC is never served here: it has its own authenticated listener
        // (src/backends/raft/server.rs), so `/peer/*` is a plain 404 on the client port.
        _ => error(StatusCode::NOT_FOUND, "not_found", path),
    }
}

fn status(app: &HttpApp) -> Resp {
    json_resp(StatusCode::OK, status_body(app))
}

/// The body of `GET /status`: shard 0's status at the top level (today's fields); with K > 1,
/// every shard's under `shards` and placement's view under `placement`.
pub(super) fn status_body(app: &HttpApp) -> serde_json::Value {
    let mut body = serde_json::to_value(app.shards[0].shared.status()).expect("status serializes");
    if app.shards.len() > 1 {
        let shards: Vec<serde_json::Value> = app
            .shards
            .iter()
            .enumerate()
            .map(|(s, shard)| {
                let st = shard.shared.status();
                json!({
                    "shard": s,
                    "role": st.role,
                    "token": st.fence_token,
                    "leader": st.leader,
                    "acting": st.acting,
                    "lease_ttl_remaining_ms": st.lease_ttl_remaining_ms,
                    "failure_budget": st.failure_budget,
                })
            })
            .collect();
        body["shards"] = serde_json::Value::Array(shards);
        body["placement"] = serde_json::to_value(app.placement.view()).unwrap_or_default();
    }
    #[cfg(feature = "swim")]
    if let Some(view) = &app.detector {
        let view = view.lock().unwrap_or_else(|p| p.into_inner()).clone();
        body["detector"] = serde_json::to_value(view).unwrap_or_default();
    }
    body
}

fn metrics(app: &HttpApp) -> Resp {
    let mut led = 0u32;
    for (s, shard) in app.shards.iter().enumerate() {
        let st = shard.shared.status();
        let label = s.to_string();
        for role in crate::leadership::Role::ALL.map(crate::leadership::Role::as_str) {
            metrics::gauge!(m::ROLE, "role" => role, "shard" => label.clone())
                .set(if st.role.as_str() == role { 1.0 } else { 0.0 });
        }
        metrics::gauge!(m::LEADERS_ACTING, "shard" => label).set(if st.acting { 1.0 } else { 0.0 });
        led += u32::from(st.role == crate::leadership::Role::Leader);
    }
    metrics::gauge!(m::SHARDS_LED).set(f64::from(led));
    #[cfg(feature = "prometheus")]
    let text = app.prometheus.as_ref().map(|h| h.render());
    #[cfg(not(feature = "prometheus"))]
    let text: Option<String> = None;
    let Some(text) = text else {
        return error(
            StatusCode::NOT_FOUND,
            "no_metrics",
            "this node records to the embedding process's metrics recorder",
        );
    };
    let mut r = Response::new(Full::new(Bytes::from(text)));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// Reads a whole body of at most `limit` bytes: 413 past it, 400 if the stream breaks.
async fn collect_limited(body: Incoming, limit: usize) -> Result<Bytes, Resp> {
    match Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("body over {limit} bytes"),
            ))
        }
        Err(e) => Err(error(StatusCode::BAD_REQUEST, "bad_body", e.to_string())),
    }
}

/// [`collect_limited`] within the body-read bound: a client that trickles its body, or sends
/// fewer bytes than its Content-Length, gets 408 and the connection closes.
async fn collect_client_body(app: &HttpApp, body: Incoming) -> Result<Bytes, Resp> {
    let limit = app.limits.max_body_bytes;
    let bound = app.limits.body_read_timeout();
    match tokio::time::timeout(bound, collect_limited(body, limit)).await {
        // A refused body was not read to its end: the connection cannot carry another request.
        Ok(r) => r.map_err(closing),
        Err(_) => Err(closing(error(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("request body not received within {} ms", bound.as_millis()),
        ))),
    }
}

/// Reads a small body: 413 past the limit, 408 if it is slower than the body bound, 415 unless
/// JSON, 400 unless it parses. An empty body is `T::default()`.
async fn read_json<T: for<'de> Deserialize<'de> + Default>(
    app: &HttpApp,
    req: Request<Incoming>,
) -> Result<T, Resp> {
    // Nothing to read (no body, or `Content-Length: 0`): no body timer, no collecting.
    if req.body().is_end_stream() {
        return Ok(T::default());
    }
    let limit = app.limits.max_body_bytes;
    if let Some(len) = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(closing(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("body over {limit} bytes"),
            )));
        }
    }
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let body = collect_client_body(app, req.into_body()).await?;
    if body.is_empty() {
        return Ok(T::default());
    }
    match content_type.as_deref() {
        Some(ct)
            if ct
                .split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")) => {}
        other => {
            return Err(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("expected application/json, got {}", other.unwrap_or("none")),
            ));
        }
    }
    serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "malformed_json", e.to_string()))
}

/// Parses `key=value` pairs of the query; unknown keys are an error (a typo must not be ignored).
// The error is the whole 400 response, made once per bad request: boxing it would buy nothing.
#[allow(clippy::result_large_err)]
fn query_pairs<'a>(
    req: &'a Request<Incoming>,
    allowed: &[&str],
) -> Result<Vec<(&'a str, &'a str)>, Resp> {
    let mut out = Vec::new();
    for pair in req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !allowed.contains(&k) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "unknown_parameter",
                k.to_owned(),
            ));
        }
        out.push((k, v));
    }
    Ok(out)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NextBody {
    n: Option<u32>,
}

/// [`query_pairs`] then [`pick_shard`]: the request's parameters and the shard it names.
// The error is the whole 400 response, as in `query_pairs`.
#[allow(clippy::type_complexity, clippy::result_large_err)]
fn shard_query<'a, 'r>(
    app: &'a HttpApp,
    req: &'r Request<Incoming>,
    allowed: &[&str],
) -> Result<(Vec<(&'r str, &'r str)>, (usize, &'a ShardApp, bool)), Resp> {
    let pairs = query_pairs(req, allowed)?;
    let shard = pick_shard(app, &pairs)?;
    Ok((pairs, shard))
}

/// The shard a request is about: `?shard=S` (0..K) or `?key=K` (its FNV-1a hash mod K, see
/// [`crate::shard::shard_of_key`]); neither is shard 0 on an unsharded node and a 400 on a
/// sharded one (a request must not land on an arbitrary shard). Also whether it was named.
// The error is the whole 400 response, as in `query_pairs`.
#[allow(clippy::result_large_err)]
fn pick_shard<'a>(
    app: &'a HttpApp,
    pairs: &[(&str, &str)],
) -> Result<(usize, &'a ShardApp, bool), Resp> {
    let k = app.shards.len();
    let mut chosen: Option<usize> = None;
    for (key, v) in pairs {
        let s = match *key {
            "shard" => match v.parse::<usize>() {
                Ok(s) if s < k => s,
                _ => {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        "bad_shard",
                        format!("shard must be an integer in 0..{k}"),
                    ))
                }
            },
            "key" => crate::shard::shard_of_key(v.as_bytes(), k as u32).0 as usize,
            _ => continue,
        };
        if chosen.is_some_and(|c| c != s) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "bad_shard",
                "shard and key name different shards",
            ));
        }
        chosen = Some(s);
    }
    match chosen {
        Some(s) => Ok((s, &app.shards[s], true)),
        None if k == 1 => Ok((0, &app.shards[0], false)),
        None => Err(error(
            StatusCode::BAD_REQUEST,
            "shard_required",
            format!("this fleet runs {k} shards: name one with ?shard=S (0..{k}) or ?key=K"),
        )),
    }
}

fn not_leader(shard: &ShardApp) -> Resp {
    let st = shard.shared.status();
    match st.leader.filter(|l| l.node_id != shard.shared.node_id()) {
        Some(leader) => {
            let mut r = json_resp(
                StatusCode::CONFLICT,
                json!({ "error": "not_leader", "leader": leader, "shard": shard.shard }),
            );
            if let Some(addr) = leader
                .http_addr
                .as_deref()
                .and_then(|a| HeaderValue::from_str(a).ok())
            {
                r.headers_mut().insert(LEADER_HEADER, addr);
            }
            r
        }
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_leader",
            "no leader is known right now; retry shortly",
        ),
    }
}

async fn next(
    app: &HttpApp,
    conn: &Arc<ConnState>,
    home: &AnswerHomes,
    req: Request<Incoming>,
) -> Resp {
    let mut n: Option<u32> = None;
    let (pairs, (shard_no, shard, named)) = match shard_query(app, &req, &["n", "shard", "key"]) {
        Ok(x) => x,
        Err(r) => return r,
    };
    for (_, v) in pairs.into_iter().filter(|(k, _)| *k == "n") {
        match v.parse::<u32>() {
            Ok(k) if k >= 1 => n = Some(k),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_n",
                    format!("n must be an integer in 1..={}", app.max_block),
                )
            }
        }
    }
    let body: NextBody = match read_json(app, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    // The whole request is in: from here this connection is not a candidate for eviction.
    let _serving = conn.serving();
    if let (Some(q), Some(b)) = (n, body.n) {
        if q != b {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_n",
                "n given twice with different values",
            );
        }
    }
    let n = n.or(body.n).unwrap_or(1);
    if n == 0 || n > app.max_block {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_n",
            format!("n must be an integer in 1..={}", app.max_block),
        );
    }
    // A node without the built-in sequencer (e.g. `baton run`, or `[sequencer] enabled =
    // false`) will never answer: say so, instead of a 503 that invites retrying forever.
    if !app.read.sequencer {
        return error(
            StatusCode::NOT_FOUND,
            "no_sequencer",
            "this node runs no sequencer (POST /next is served by `baton node` with [sequencer] enabled = true); nothing was issued",
        );
    }
    if !shard.shared.is_leading() {
        return not_leader(shard);
    }
    let res = shard
        .sequencer
        .next(n, NEXT_TIMEOUT, Some(home.of_shard(shard_no).clone()))
        .await;
    // The shard is in the answer whenever there are shards or the client named one; a K = 1
    // fleet asked without one answers exactly as before shards existed.
    let with_shard = named || app.shards.len() > 1;
    match res {
        // A few integers: written directly (the same text `json!` would produce).
        Ok(block) if n == 1 && !with_shard => json_text_resp(
            StatusCode::OK,
            format!(r#"{{"token":{},"seq":{}}}"#, block.token.0, block.first),
        ),
        Ok(block) if n == 1 => json_text_resp(
            StatusCode::OK,
            format!(
                r#"{{"shard":{shard_no},"token":{},"seq":{}}}"#,
                block.token.0, block.first
            ),
        ),
        Ok(block) => {
            let mut body = json!({ "token": block.token, "seq": block.first, "first": block.first, "last": block.last, "n": n });
            if with_shard {
                body["shard"] = json!(shard_no);
            }
            json_resp(StatusCode::OK, body)
        }
        Err(NextCallError::NotRunning) | Err(NextCallError::Next(NextError::Demoting)) => {
            if !shard.shared.is_leading() {
                not_leader(shard)
            } else {
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_ready",
                    "leader work is starting or stopping; retry",
                )
            }
        }
        Err(NextCallError::Next(NextError::Fenced(d))) => {
            error(StatusCode::SERVICE_UNAVAILABLE, "fenced", d)
        }
        Err(NextCallError::Next(NextError::Unavailable(d))) => {
            error(StatusCode::SERVICE_UNAVAILABLE, "resource_unavailable", d)
        }
        Err(NextCallError::Timeout) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "no answer from the sequencer; nothing was issued to you",
        ),
    }
}

fn count_read(mode: ReadMode, outcome: &'static str) {
    metrics::counter!(m::READS, "mode" => mode.as_str(), "outcome" => outcome).increment(1);
}

/// `GET /read[?mode=lease|quorum|resource]`: the leader's view of the singleton work (the
/// highest committed seq, the work-set cursor, the token serving them), never a stale one:
/// * `lease`: from memory, no round trip, only inside [`lease_read_until`]'s window on the
///   monotonic clock; outside it the read is a `quorum` read and says `fell_back: true`;
/// * `quorum`: [`Elector::confirm_leadership`](crate::elector::Elector::confirm_leadership)
///   first, then from memory (values the fence already accepted, never IDs in flight);
/// * `resource`: one read of PostgreSQL (`baton.read_state`), refused if the resource has
///   accepted a newer token than this node's.
///
/// A lease read inside its window is answered on the HTTP thread that parsed it, from the
/// leadership's lock-free snapshot ([`crate::leadership::Leadership::read_view`]): no lock that
/// the sequencer or any other writer takes, no message to an actor, no other runtime.
///
/// Followers answer 409 with the leader, like `POST /next`.
async fn read(app: &HttpApp, conn: &Arc<ConnState>, req: Request<Incoming>) -> Resp {
    let mut mode = app.read.default_mode;
    let (pairs, (_, shard, _)) = match shard_query(app, &req, &["mode", "shard", "key"]) {
        Ok(x) => x,
        Err(r) => return r,
    };
    for (_, v) in pairs.into_iter().filter(|(k, _)| *k == "mode") {
        match v.parse::<ReadMode>() {
            Ok(m) => mode = m,
            Err(e) => return error(StatusCode::BAD_REQUEST, "bad_mode", e),
        }
    }
    let _serving = conn.serving();
    let Some(view) = shard.shared.read_view() else {
        count_read(mode, "not_leader");
        return not_leader(shard);
    };
    match mode {
        ReadMode::Lease => match lease_left(
            &view,
            app.read.rate_bound,
            app.read.lease_margin,
            Instant::now(),
        ) {
            Some(left) => answer_from_memory(app, shard, &view, ReadMode::Lease, mode, Some(left)),
            None => {
                metrics::counter!(m::READ_LEASE_FALLBACKS).increment(1);
                quorum_read(app, shard, view, mode).await
            }
        },
        ReadMode::Quorum => quorum_read(app, shard, view, mode).await,
        ReadMode::Resource => resource_read(app, shard, view).await,
    }
}

/// What is left of `view`'s lease-read window at `now`; `None` when it is closed (or was
/// never opened: no renewal yet).
fn lease_left(
    view: &ReadView,
    rate_bound: f64,
    margin: Duration,
    now: Instant,
) -> Option<Duration> {
    let until = lease_read_until(
        view.lease_sent_at?,
        view.lease_deadline?,
        rate_bound,
        margin,
    )?;
    until.checked_duration_since(now).filter(|d| !d.is_zero())
}

/// The answer from this node's memory of what the fence accepted in this term.
fn answer_from_memory(
    app: &HttpApp,
    shard: &ShardApp,
    view: &ReadView,
    used: ReadMode,
    requested: ReadMode,
    lease_left: Option<Duration>,
) -> Resp {
    let seq = view.committed_seq.filter(|_| app.read.sequencer);
    let cursor = view.committed_cursor.filter(|_| app.read.scheduler);
    if (app.read.sequencer && seq.is_none()) || (app.read.scheduler && cursor.is_none()) {
        count_read(used, "not_ready");
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "leader work has not claimed its state yet; retry",
        );
    }
    match used {
        // The hot path: one counter looked up once per server, not per read.
        ReadMode::Lease => app.read.counters.lease_ok().increment(1),
        _ => count_read(used, "ok"),
    }
    let body = memory_answer_json(
        shard.shared.node_id(),
        shard.shard,
        view.token.0,
        seq,
        cursor,
        used,
        requested,
        lease_left,
    );
    json_text_resp(StatusCode::OK, body)
}

/// The body of an answer from memory, written directly (the lease-read hot path: building a
/// `serde_json::Value` map per read showed in the profile, as it did for `/next`, and so did
/// `fmt::write` and float formatting after it). `lease_window_left_ms` is given to the µs.
#[allow(clippy::too_many_arguments)]
fn memory_answer_json(
    node_id: &str,
    shard: usize,
    token: i64,
    seq: Option<i64>,
    cursor: Option<i64>,
    used: ReadMode,
    requested: ReadMode,
    lease_left: Option<Duration>,
) -> String {
    let mut num = itoa::Buffer::new();
    let mut out = String::with_capacity(224);
    out.push_str("{\"node_id\":");
    // Node ids are [A-Za-z0-9_-] (config validation); anything else is escaped properly.
    if node_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        out.push('"');
        out.push_str(node_id);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(node_id).to_string());
    }
    out.push_str(",\"shard\":");
    out.push_str(num.format(shard));
    out.push_str(",\"token\":");
    out.push_str(num.format(token));
    for (key, v) in [(",\"seq\":", seq), (",\"cursor\":", cursor)] {
        out.push_str(key);
        match v {
            Some(x) => out.push_str(num.format(x)),
            None => out.push_str("null"),
        }
    }
    out.push_str(",\"mode\":\"");
    out.push_str(used.as_str());
    out.push_str("\",\"requested_mode\":\"");
    out.push_str(requested.as_str());
    out.push_str("\",\"fell_back\":");
    out.push_str(if used != requested { "true" } else { "false" });
    out.push_str(",\"lease_window_left_ms\":");
    match lease_left {
        Some(d) => {
            let us = d.as_micros();
            out.push_str(num.format(us / 1000));
            out.push('.');
            let frac = (us % 1000) as u32;
            // Three digits, zero-padded.
            out.push(char::from(b'0' + (frac / 100) as u8));
            out.push(char::from(b'0' + (frac / 10 % 10) as u8));
            out.push(char::from(b'0' + (frac % 10) as u8));
        }
        None => out.push_str("null"),
    }
    out.push('}');
    out
}

/// A linearizable check with the backend, then the answer from memory (if the term held).
async fn quorum_read(app: &HttpApp, shard: &ShardApp, view: ReadView, requested: ReadMode) -> Resp {
    let (elector, me, token) = (
        shard.elector.clone(),
        shard.shared.node_id().to_owned(),
        view.token,
    );
    let rt = app.read.node_rt.clone();
    let confirmed = shard
        .confirms
        .confirm(token, || async move {
            // On the node's runtime: the backend's client lives there.
            let call = rt.spawn(async move {
                tokio::time::timeout(READ_TIMEOUT, elector.confirm_leadership(&me, token)).await
            });
            match call.await {
                Ok(Ok(Ok(true))) => Confirmed::Held,
                Ok(Ok(Ok(false))) => Confirmed::NotLeader,
                Ok(Ok(Err(e))) => Confirmed::Unavailable(e.to_string()),
                Ok(Err(_)) | Err(_) => Confirmed::Timeout,
            }
        })
        .await;
    match confirmed {
        Confirmed::Held => {}
        Confirmed::NotLeader => {
            count_read(ReadMode::Quorum, "not_leader");
            return deposed(
                shard,
                "the backend no longer names this node's term as leader",
            );
        }
        Confirmed::Unavailable(e) => {
            count_read(ReadMode::Quorum, "unavailable");
            return error(StatusCode::SERVICE_UNAVAILABLE, "backend_unavailable", e);
        }
        Confirmed::Timeout => {
            count_read(ReadMode::Quorum, "timeout");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "timeout",
                format!(
                    "the backend did not confirm leadership within {} ms",
                    READ_TIMEOUT.as_millis()
                ),
            );
        }
    }
    // Confirmed at some instant during the call: what this node had committed by then is the
    // latest (nobody else led that term). A fresh view can only be newer, never older.
    match shard.shared.read_view() {
        Some(now) if now.token == view.token => {
            answer_from_memory(app, shard, &now, ReadMode::Quorum, requested, None)
        }
        _ => {
            count_read(ReadMode::Quorum, "not_leader");
            deposed(shard, "this node's term ended during the read")
        }
    }
}

/// One read of the fenced resource.
async fn resource_read(app: &HttpApp, shard: &ShardApp, view: ReadView) -> Resp {
    let fence = shard.fence.clone();
    let res = app
        .read
        .node_rt
        .spawn(async move {
            tokio::time::timeout(
                READ_TIMEOUT,
                fence.read_state(SEQUENCE_RESOURCE, WORKSET_RESOURCE),
            )
            .await
        })
        .await;
    let st = match res {
        Ok(Ok(Ok(st))) => st,
        Ok(Ok(Err(e))) => {
            count_read(ReadMode::Resource, "unavailable");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "resource_unavailable",
                e.to_string(),
            );
        }
        Ok(Err(_)) | Err(_) => {
            count_read(ReadMode::Resource, "timeout");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "timeout",
                format!(
                    "the resource did not answer within {} ms",
                    READ_TIMEOUT.as_millis()
                ),
            );
        }
    };
    if st.max_token > view.token.0 {
        count_read(ReadMode::Resource, "fenced");
        return deposed(
            shard,
            &format!(
                "the resource has accepted token {} (holder {}); this node holds {}",
                st.max_token, st.max_holder, view.token
            ),
        );
    }
    count_read(ReadMode::Resource, "ok");
    json_resp(
        StatusCode::OK,
        json!({
            "node_id": shard.shared.node_id(),
            "shard": shard.shard,
            "token": view.token,
            "seq": st.last_seq.unwrap_or(0),
            "cursor": st.cursor.unwrap_or(0),
            "max_token": st.max_token,
            "mode": "resource",
            "requested_mode": "resource",
            "fell_back": false,
            "lease_window_left_ms": null,
        }),
    )
}

/// This node found out mid-read that it no longer leads: 409 with the leader when another
/// one is known, else 503, never an answer.
fn deposed(shard: &ShardApp, detail: &str) -> Resp {
    let st = shard.shared.status();
    if st
        .leader
        .as_ref()
        .is_some_and(|l| l.node_id != shard.shared.node_id())
    {
        return not_leader(shard);
    }
    error(StatusCode::SERVICE_UNAVAILABLE, "deposed", detail)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StepDownBody {
    to: Option<String>,
}

/// Equal-length comparison whose time does not depend on where the inputs differ, so the token
/// cannot be guessed byte by byte from response times (only its length can leak).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 401 without credentials, 403 with wrong ones; `None` when the request may proceed.
fn check_admin(app: &HttpApp, req: &Request<Incoming>) -> Option<Resp> {
    let want = app.admin_token.as_ref()?;
    let Some(given) = req.headers().get(AUTHORIZATION) else {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "POST /stepdown needs the admin bearer token",
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
        return Some(r);
    };
    let token = given.as_bytes().strip_prefix(b"Bearer ").unwrap_or(b"");
    if constant_time_eq(token, want.expose().as_bytes()) {
        None
    } else {
        Some(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the admin bearer token is wrong",
        ))
    }
}

async fn stepdown(app: &HttpApp, conn: &Arc<ConnState>, req: Request<Incoming>) -> Resp {
    if let Some(refusal) = check_admin(app, &req) {
        return refusal;
    }
    let mut to: Option<String> = None;
    let (pairs, (_, shard, _)) = match shard_query(app, &req, &["to", "shard"]) {
        Ok(x) => x,
        Err(r) => return r,
    };
    for (_, v) in pairs.into_iter().filter(|(k, _)| *k == "to") {
        if v.is_empty() {
            return error(StatusCode::BAD_REQUEST, "bad_to", "to= needs a node id");
        }
        to = Some(v.to_owned());
    }
    let body: StepDownBody = match read_json(app, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let _serving = conn.serving();
    let successor = to.or(body.to);
    if let Some(s) = &successor {
        if s == shard.shared.node_id() {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_to",
                "cannot step down to itself",
            );
        }
    }
    let res = shard
        .supervisor
        .call(
            |reply| SupervisorMsg::StepDown { successor, reply },
            Some(Duration::from_secs(30)),
        )
        .await;
    match res {
        Ok(ractor::rpc::CallResult::Success(Ok(report))) => {
            json_resp(StatusCode::OK, json!({ "stepped_down": report }))
        }
        Ok(ractor::rpc::CallResult::Success(Err(StepDownError::NotLeader))) => not_leader(shard),
        Ok(ractor::rpc::CallResult::Success(Err(StepDownError::Unsupported(d)))) => {
            error(StatusCode::NOT_IMPLEMENTED, "unsupported", d)
        }
        Ok(ractor::rpc::CallResult::Timeout) => error(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            "step-down did not finish in 30 s",
        ),
        Ok(ractor::rpc::CallResult::SenderError) | Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_stopping",
            "the supervisor is not running",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(sent: Option<Instant>, deadline: Option<Instant>) -> ReadView {
        ReadView {
            token: crate::elector::FenceToken(3),
            lease_deadline: deadline,
            lease_sent_at: sent,
            committed_seq: Some(10),
            committed_cursor: Some(2),
        }
    }

    /// The window is `lease_read_until`'s, to the instant: open before it, closed at and after
    /// it, and closed without a renewal.
    #[test]
    fn the_lease_window_is_open_only_before_its_end() {
        let sent = Instant::now();
        let deadline = sent + Duration::from_millis(150);
        let margin = Duration::from_millis(20);
        let until = lease_read_until(sent, deadline, 0.01, margin).unwrap();
        let v = view(Some(sent), Some(deadline));
        let left = lease_left(&v, 0.01, margin, sent).unwrap();
        assert_eq!(left, until - sent);
        assert_eq!(
            lease_left(&v, 0.01, margin, until - Duration::from_nanos(1)),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(lease_left(&v, 0.01, margin, until), None);
        assert_eq!(
            lease_left(&v, 0.01, margin, until + Duration::from_millis(1)),
            None
        );
        // A margin that eats the lease: never open.
        assert_eq!(lease_left(&v, 0.01, Duration::from_millis(150), sent), None);
        assert_eq!(
            lease_left(&view(None, Some(deadline)), 0.01, margin, sent),
            None
        );
        assert_eq!(
            lease_left(&view(Some(sent), None), 0.01, margin, sent),
            None
        );
    }

    /// The hand-written answer is the JSON the `json!` one was: same fields, same values.
    #[test]
    fn the_answer_from_memory_is_the_same_json() {
        let left = Duration::from_micros(12_345);
        let text = memory_answer_json(
            "n-1_a",
            0,
            7,
            Some(41),
            None,
            ReadMode::Lease,
            ReadMode::Lease,
            Some(left),
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({
                "node_id": "n-1_a", "shard": 0, "token": 7, "seq": 41, "cursor": null,
                "mode": "lease", "requested_mode": "lease", "fell_back": false,
                "lease_window_left_ms": 12.345,
            })
        );
        let text = memory_answer_json(
            "odd \"id\"",
            3,
            -1,
            None,
            Some(9),
            ReadMode::Quorum,
            ReadMode::Lease,
            None,
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({
                "node_id": "odd \"id\"", "shard": 3, "token": -1, "seq": null, "cursor": 9,
                "mode": "quorum", "requested_mode": "lease", "fell_back": true,
                "lease_window_left_ms": null,
            })
        );
        // Tiny and large windows stay plain JSON numbers, to the µs.
        for d in [
            Duration::from_nanos(1),
            Duration::from_micros(7),
            Duration::from_micros(1_050),
            Duration::from_secs(86_400),
        ] {
            let text = memory_answer_json(
                "n1",
                0,
                1,
                Some(1),
                Some(1),
                ReadMode::Lease,
                ReadMode::Lease,
                Some(d),
            );
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let ms = v["lease_window_left_ms"].as_f64().unwrap();
            let want = d.as_micros() as f64 / 1000.0;
            assert!((ms - want).abs() < 1e-9, "{text}: {ms} != {want}");
        }
    }

    #[test]
    fn constant_time_eq_compares_whole_values() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }
}
