//! `GET /status` and `GET /metrics`.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::resp::*;
use super::HttpApp;
use crate::metrics as m;

pub(super) fn status(app: &HttpApp) -> Resp {
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

pub(super) fn metrics(app: &HttpApp) -> Resp {
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
