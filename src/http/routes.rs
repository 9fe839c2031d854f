//! Request routing: each request, within its time bound, to its handler. Every refusal is a
//! precise status with a JSON body `{"error": "...", ...}`, and a refused request changes
//! nothing.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::json;

use super::resp::*;
use super::slots::ConnState;
use super::{
    next::next,
    read::read,
    status::{metrics, status},
    stepdown::stepdown,
};
use super::{ui, HttpApp};
use crate::work::sequencer::AnswerHomes;

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
