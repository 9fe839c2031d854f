//! `GET /read?mode=lease|quorum|resource`: the leader's view of the work, answered from memory
//! only inside the lease bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::json;

use super::confirm::Confirmed;
use super::resp::*;
use super::shard_pick::*;
use super::slots::ConnState;
use super::{HttpApp, ShardApp};
use crate::config::{lease_read_until, ReadMode};
use crate::leadership::ReadView;
use crate::metrics as m;
use crate::work::scheduler::WORKSET_RESOURCE;
use crate::work::sequencer::SEQUENCE_RESOURCE;

/// Bound on the round trip of a `quorum` or `resource` read.
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) fn count_read(mode: ReadMode, outcome: &'static str) {
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
pub(super) async fn read(app: &HttpApp, conn: &Arc<ConnState>, req: Request<Incoming>) -> Resp {
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
pub(super) fn lease_left(
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
pub(super) fn answer_from_memory(
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
pub(super) fn memory_answer_json(
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
pub(super) async fn quorum_read(
    app: &HttpApp,
    shard: &ShardApp,
    view: ReadView,
    requested: ReadMode,
) -> Resp {
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
pub(super) async fn resource_read(app: &HttpApp, shard: &ShardApp, view: ReadView) -> Resp {
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
pub(super) fn deposed(shard: &ShardApp, detail: &str) -> Resp {
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
}
