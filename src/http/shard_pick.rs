//! Which shard a request is for (`?shard=`, `?key=`), and the 409 a node answers for a shard it
//! does not lead.

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Request, StatusCode};
use serde_json::json;

use super::resp::*;
use super::{HttpApp, ShardApp};

/// Header naming the leader's HTTP address on a 409.
pub const LEADER_HEADER: &str = "x-baton-leader";

#[allow(clippy::type_complexity, clippy::result_large_err)]
pub(super) fn shard_query<'a, 'r>(
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
pub(super) fn pick_shard<'a>(
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

pub(super) fn not_leader(shard: &ShardApp) -> Resp {
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
