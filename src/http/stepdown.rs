//! `POST /stepdown`: a graceful demotion, guarded by the admin token.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::{Request, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::resp::*;
use super::shard_pick::*;
use super::slots::ConnState;
use super::HttpApp;
use crate::actors::messages::{StepDownError, SupervisorMsg};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct StepDownBody {
    to: Option<String>,
}

/// Equal-length comparison whose time does not depend on where the inputs differ, so the token
/// cannot be guessed byte by byte from response times (only its length can leak).
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 401 without credentials, 403 with wrong ones; `None` when the request may proceed.
pub(super) fn check_admin(app: &HttpApp, req: &Request<Incoming>) -> Option<Resp> {
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

pub(super) async fn stepdown(app: &HttpApp, conn: &Arc<ConnState>, req: Request<Incoming>) -> Resp {
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

    #[test]
    fn constant_time_eq_compares_whole_values() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }
}
