//! The live fleet page, `GET /ui`: one HTML page, a script and a style sheet, embedded in the
//! binary (no build step, nothing fetched from anywhere else), and `GET /ui/fleet`, the one JSON
//! document the script polls every second:
//!
//! * `members`: every member's `/status` as this node gets it (its own from memory), or why not
//!   (`up: false` and an `error`). Members are the configured ones (`[shards] members`, else the
//!   raft peers) plus any leader this node follows that the config does not list (an etcd fleet
//!   at K = 1 lists none: its page shows this node and its leader);
//! * `fence_rejections`: the newest writes the fenced resource refused, from its own table
//!   (`baton.fence_rejections`, every shard's domain), newest first.
//!
//! Same-origin only: the script never asks the peers itself (their origins differ, and the
//! Content-Security-Policy allows `self` alone). This node asks them over plain HTTP with short
//! timeouts, and every page open on it shares one sweep (one in flight, reused for
//! [`SWEEP_FRESH`]), so however many pages poll, the peers and the database see at most about two
//! sweeps a second from it.
//!
//! Read-only and public, like `/status`: it shows what `/status` shows plus the rejections'
//! tokens and node ids, and changes nothing, so it takes no admin token (`POST /stepdown` does).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::resp::Resp;
use super::status::status_body;
use super::HttpApp;
use crate::actors::placement::MemberClient;
use crate::config::MemberSpec;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// Only this origin's script, style and JSON; no inline script or style, no frames, no forms.
/// The page renders server strings as text only, and this is the second line if it ever did not.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// How long one sweep answers later polls: the page polls every second, so two open pages (or
/// a hundred) still cost one sweep.
const SWEEP_FRESH: Duration = Duration::from_millis(500);
/// Bound on one peer's `/status` (connect, ask, read the answer): a dead or stalled peer shows
/// as down this soon, and never holds the sweep longer.
const PEER_TIMEOUT: Duration = Duration::from_millis(700);
/// Largest peer answer read (a K = 64 `/status` is about 10 KiB).
const MAX_PEER_ANSWER_BYTES: u64 = 64 * 1024;
/// Rejections listed.
const REJECTIONS_SHOWN: i32 = 20;
/// Bound on the rejections read (the database may be down: the page still shows the fleet).
const REJECTIONS_TIMEOUT: Duration = Duration::from_secs(1);

/// What the page needs besides the leadership mirrors: whom to ask, and the last sweep.
pub(crate) struct UiState {
    /// This node's client address as it advertises it (`None`: it does not).
    own_addr: Option<String>,
    /// The members to show (this node may be among them).
    members: Vec<MemberSpec>,
    /// The last sweep's JSON and when it finished; the lock also keeps sweeps one at a time.
    last_sweep: tokio::sync::Mutex<Option<(Instant, Bytes)>>,
    /// How the members are asked (plain HTTP or HTTPS).
    client: MemberClient,
}

impl UiState {
    pub(crate) fn new(
        own_addr: Option<String>,
        members: Vec<MemberSpec>,
        client: MemberClient,
    ) -> UiState {
        UiState {
            own_addr,
            members,
            last_sweep: tokio::sync::Mutex::new(None),
            client,
        }
    }
}

pub(super) fn page() -> Resp {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

pub(super) fn script() -> Resp {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

pub(super) fn style() -> Resp {
    asset(APP_CSS, "text/css; charset=utf-8")
}

fn asset(text: &'static str, content_type: &'static str) -> Resp {
    page_response(Bytes::from_static(text.as_bytes()), content_type)
}

/// A 200 with the page's headers: never cached (a stale script against a newer `/ui/fleet`
/// would misrender, and a cached fleet is a wrong fleet), never sniffed, never framed.
fn page_response(body: Bytes, content_type: &'static str) -> Resp {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// `GET /ui/fleet`: the last sweep while it is fresh, else a new one (concurrent polls wait for
/// the one in flight instead of starting their own).
pub(super) async fn fleet(app: &HttpApp) -> Resp {
    let mut last = app.ui.last_sweep.lock().await;
    let body = match &*last {
        Some((done, body)) if done.elapsed() < SWEEP_FRESH => body.clone(),
        _ => {
            let body = Bytes::from(sweep(app).await.to_string());
            *last = Some((Instant::now(), body.clone()));
            body
        }
    };
    drop(last);
    page_response(body, "application/json")
}

/// Every member's status (the peers asked side by side) and the newest rejections.
async fn sweep(app: &HttpApp) -> serde_json::Value {
    let me = app.shards[0].shared.node_id();
    let peers = peers_to_ask(app);
    let (answers, rejections) = tokio::join!(
        futures::future::join_all(peers.iter().map(|p| ask_status(app, &p.addr))),
        recent_rejections(app),
    );
    let mut members = vec![json!({
        "id": me,
        "addr": app.ui.own_addr,
        "up": true,
        "status": status_body(app),
    })];
    for (peer, answer) in peers.iter().zip(answers) {
        members.push(match answer {
            Ok(status) => json!({ "id": peer.id, "addr": peer.addr, "up": true, "status": status }),
            Err(why) => json!({ "id": peer.id, "addr": peer.addr, "up": false, "error": why }),
        });
    }
    members.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    json!({
        "node_id": me,
        "shard_count": app.shards.len(),
        "members": members,
        "fence_rejections": rejections,
    })
}

/// The configured members other than this node, then any leader it follows that they lack.
fn peers_to_ask(app: &HttpApp) -> Vec<MemberSpec> {
    let me = app.shards[0].shared.node_id();
    let mut peers: Vec<MemberSpec> = app
        .ui
        .members
        .iter()
        .filter(|m| m.id != me)
        .cloned()
        .collect();
    for leader in app.shards.iter().filter_map(|s| s.shared.status().leader) {
        let listed = leader.node_id == me || peers.iter().any(|p| p.id == leader.node_id);
        if let (false, Some(addr)) = (listed, leader.http_addr) {
            peers.push(MemberSpec {
                id: leader.node_id,
                addr,
            });
        }
    }
    peers
}

/// A peer's `/status` within [`PEER_TIMEOUT`], or why not (the page shows it as down).
async fn ask_status(app: &HttpApp, addr: &str) -> Result<serde_json::Value, String> {
    if app.speaks_tls() && !app.ui.client.speaks_tls() {
        // Its peers serve HTTPS too, and without `[http] member_ca_file` there is nothing to
        // verify their certificates against.
        return Err(
            "not asked: this fleet serves HTTPS and [http] member_ca_file is not set".into(),
        );
    }
    match tokio::time::timeout(PEER_TIMEOUT, get_status(&app.ui.client, addr)).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {} ms", PEER_TIMEOUT.as_millis())),
    }
}

/// One `GET /status` (at most [`MAX_PEER_ANSWER_BYTES`]), the member's JSON.
async fn get_status(client: &MemberClient, addr: &str) -> Result<serde_json::Value, String> {
    let answer = client.get(addr, "/status", MAX_PEER_ANSWER_BYTES).await?;
    if answer.code != 200 {
        return Err(format!("answered {}", answer.status_line));
    }
    serde_json::from_slice(&answer.body).map_err(|e| format!("not a status: {e}"))
}

/// The resource's newest rejections as `{rows, error}`: on the node's runtime, where the
/// database clients live, within [`REJECTIONS_TIMEOUT`].
async fn recent_rejections(app: &HttpApp) -> serde_json::Value {
    let fence = app.shards[0].fence.clone();
    let call = app.read.node_rt.spawn(async move {
        tokio::time::timeout(
            REJECTIONS_TIMEOUT,
            fence.recent_rejections(REJECTIONS_SHOWN),
        )
        .await
    });
    match call.await {
        Ok(Ok(Ok(rows))) => json!({ "rows": rows, "error": null }),
        Ok(Ok(Err(e))) => json!({ "rows": [], "error": e.to_string() }),
        Ok(Err(_)) | Err(_) => json!({
            "rows": [],
            "error": format!("no answer within {} ms", REJECTIONS_TIMEOUT.as_millis()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A one-shot peer that answers its first connection with `answer`, whatever it is asked.
    async fn peer_answering(answer: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = conn.read(&mut head).await;
            let _ = conn.write_all(answer).await;
        });
        addr
    }

    #[tokio::test]
    async fn a_peer_status_is_its_json_body() {
        let addr = peer_answering(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 34\r\n\r\n{\"node_id\":\"n2\",\"role\":\"leader\"}\r\n",
        )
        .await;
        let status = get_status(&MemberClient::default(), &addr).await.unwrap();
        assert_eq!(status["role"], "leader");
    }

    #[tokio::test]
    async fn a_peer_that_refuses_or_is_gone_is_down_with_the_reason() {
        let addr =
            peer_answering(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n").await;
        let why = get_status(&MemberClient::default(), &addr)
            .await
            .unwrap_err();
        assert_eq!(why, "answered HTTP/1.1 503 Service Unavailable");
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = closed.local_addr().unwrap().to_string();
        drop(closed);
        assert!(get_status(&MemberClient::default(), &gone)
            .await
            .unwrap_err()
            .starts_with("connect: "));
    }

    /// The page loads nothing but its own script and style from this node: no inline script,
    /// style or handler the Content-Security-Policy would block, and nothing from elsewhere.
    #[test]
    fn the_page_needs_nothing_the_policy_forbids() {
        for tag in [
            "<script>", "<style", " style=", " onclick", " onload", "http:", "https:",
        ] {
            assert!(!INDEX_HTML.contains(tag), "index.html has {tag}");
        }
        assert!(INDEX_HTML.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(INDEX_HTML.contains(r#"<link rel="stylesheet" href="/ui/app.css">"#));
        for text in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "eval(",
            "http:",
            "https:",
        ] {
            assert!(!APP_JS.contains(text), "app.js has {text}");
        }
    }
}
