//! `POST /next`: IDs from the sequencer of the shard this node leads.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::resp::*;
use super::shard_pick::*;
use super::slots::ConnState;
use super::{HttpApp, ShardApp};
use crate::work::sequencer::{AnswerHomes, IdBlock, NextCallError, NextError};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct NextBody {
    n: Option<u32>,
}

pub(super) const NEXT_TIMEOUT: Duration = Duration::from_secs(5);

/// [`query_pairs`] then [`pick_shard`]: the request's parameters and the shard it names.
// The error is the whole 400 response, as in `query_pairs`.
pub(super) async fn next(
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
    answer(res, n, shard, shard_no, with_shard)
}

/// The answer to a `POST /next` for `n` IDs of shard `shard_no` (named in it when
/// `with_shard`): the block issued, or why none was.
fn answer(
    res: Result<IdBlock, NextCallError>,
    n: u32,
    shard: &ShardApp,
    shard_no: usize,
    with_shard: bool,
) -> Resp {
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
