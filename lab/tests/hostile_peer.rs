//! Issue 15: a hostile outsider against a real 3-node raft fleet under steady `POST /next` load.
//! For a sustained burst it forges every raft peer RPC — vote (with and without the transfer
//! flag, and at a term near `i64::MAX`), pre-vote, append from a leader that does not exist,
//! transfer_leader, snapshot, and a shard lease grant — unsigned, signed with a wrong secret, signed with the right secret
//! but a stale timestamp, and sent to the client port. Every one must be refused (401 / 403 /
//! 404), leadership must not move (same leader, same token for the whole burst), `/next` must stay
//! available, and each node's `baton_peer_auth_failures_total` must count exactly the refusals it
//! answered. Two controls keep the test honest: a correctly signed pre-vote is answered 200 (so
//! the refusals are not just a broken server), and a correctly signed vote at term `i64::MAX`
//! is refused by the term bound (400) without moving anything.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::backends::raft::auth::{now_unix_ms, PeerAuth, FROM_HEADER, MAC_HEADER, TS_HEADER};
use baton::backends::raft::types::{TypeConfig, Vote};
use baton::config::NodeConfig;
use baton_lab::fleet::client::NodeClient;
use bytes::Bytes;
use common::{next_anywhere, repo_path, Fleet};
use hyper::Method;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};

const SETTLE: Duration = Duration::from_secs(30);
const BURST: Duration = Duration::from_secs(10);
/// The forgery rate. Sustained but paced: the test machine has two shared cores, and a node
/// starved of CPU misses heartbeats and re-elects for reasons that have nothing to do with
/// forged messages — which this test must not confuse with a successful attack.
const FORGED_PER_SEC: u64 = 300;
/// How long the leader must hold one term before the burst starts (start-up churn settles).
const STABLE_BEFORE: Duration = Duration::from_secs(3);

/// One forged request: which RPC, and its JSON body.
struct Forgery {
    method: &'static str,
    body: Bytes,
}

fn json<T: serde::Serialize>(v: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap())
}

fn vote_req(term: u64, candidate: u64, transfer: bool) -> Bytes {
    let mut req = VoteRequest::<TypeConfig>::new(Vote::new(term, candidate), None);
    req.leadership_transfer = transfer;
    json(&req)
}

/// Every attack of the issue, aimed at a fleet whose leader is raft id `leader` in `term`.
fn forgeries(term: u64, leader: u64, follower: u64) -> Vec<Forgery> {
    let append = AppendEntriesRequest::<TypeConfig> {
        // A leader that does not exist (raft id 9), one term ahead.
        vote: Vote::new_committed(term + 1, 9),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let transfer =
        TransferLeaderRequest::<TypeConfig>::new(Vote::new_committed(term, leader), follower, None);
    let snapshot = serde_json::json!({
        "vote": Vote::new_committed(term + 1, 9),
        "meta": { "last_log_id": null, "last_membership": { "log_id": null, "membership": { "configs": [], "nodes": {} } }, "snapshot_id": "" },
    });
    vec![
        Forgery {
            method: "vote",
            body: vote_req(term + 1, follower, false),
        },
        Forgery {
            method: "vote",
            body: vote_req(term + 100, follower, true),
        },
        Forgery {
            method: "vote",
            body: vote_req(i64::MAX as u64, follower, false),
        },
        Forgery {
            method: "pre_vote",
            body: vote_req(term + 1, follower, false),
        },
        Forgery {
            method: "append",
            body: json(&append),
        },
        Forgery {
            method: "transfer_leader",
            body: json(&transfer),
        },
        Forgery {
            method: "snapshot",
            body: json(&snapshot),
        },
        // The shard lease table's requests (sharded fleets) ride the same authenticated
        // listener: a forged grant of shard 0 to a node that does not exist.
        Forgery {
            method: "shard",
            body: json(&serde_json::json!({
                "acquire": { "shard": 0, "holder": { "id": "n9-forged", "node": "n9", "info": "{}" } }
            })),
        },
    ]
}

/// How a forgery is dressed, and the status each must get.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Dress {
    /// No auth headers at all, to the peer port: 401.
    Unsigned,
    /// Signed with a wrong secret, to the peer port: 403.
    WrongSecret,
    /// Signed with the *right* secret 60 s ago, to the peer port: 403 (outside the window).
    Stale,
    /// Unsigned, to the client port: 404 (peer RPC is not served there at all).
    ClientPort,
}

impl Dress {
    fn expected(self) -> u16 {
        match self {
            Dress::Unsigned => 401,
            Dress::WrongSecret | Dress::Stale => 403,
            Dress::ClientPort => 404,
        }
    }
}

struct Target {
    id: String,
    http: String,
    peer: String,
}

struct Keys {
    right: PeerAuth,
    wrong: PeerAuth,
}

async fn send(client: &NodeClient, t: &Target, f: &Forgery, dress: Dress, keys: &Keys) -> u16 {
    let path = format!("/peer/{}", f.method);
    let sign =
        |auth: &PeerAuth, ts: u64| (ts.to_string(), auth.sign("POST", &path, "n2", ts, &f.body));
    let signed = match dress {
        Dress::WrongSecret => Some(sign(&keys.wrong, now_unix_ms())),
        Dress::Stale => Some(sign(&keys.right, now_unix_ms() - 60_000)),
        Dress::Unsigned | Dress::ClientPort => None,
    };
    let mut headers = vec![(FROM_HEADER, "n2"), ("content-type", "application/json")];
    if let Some((ts, mac)) = &signed {
        headers.push((TS_HEADER, ts));
        headers.push((MAC_HEADER, mac));
    }
    let addr = if dress == Dress::ClientPort {
        &t.http
    } else {
        &t.peer
    };
    match client
        .send(Method::POST, addr, &path, &headers, f.body.clone())
        .await
    {
        Ok(r) => r.status.as_u16(),
        Err(e) => panic!("{} {path} ({dress:?}): no answer: {e}", t.id),
    }
}

/// A correctly signed request (the control): its status.
async fn send_authentic(
    client: &NodeClient,
    t: &Target,
    method: &str,
    body: Bytes,
    key: &PeerAuth,
) -> u16 {
    let path = format!("/peer/{method}");
    let ts = now_unix_ms();
    let mac = key.sign("POST", &path, "n2", ts, &body);
    let ts = ts.to_string();
    let headers = [
        (FROM_HEADER, "n2"),
        (TS_HEADER, ts.as_str()),
        (MAC_HEADER, mac.as_str()),
    ];
    client
        .send(Method::POST, &t.peer, &path, &headers, body)
        .await
        .map(|r| r.status.as_u16())
        .unwrap_or(0)
}

fn auth_failures(metrics_text: &str) -> u64 {
    metrics_text
        .lines()
        .filter(|l| l.starts_with("baton_peer_auth_failures_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `/next` availability while the burst runs: (ok, failed, tokens seen with when first seen).
struct Load {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64, BTreeMap<i64, Instant>)>,
}

/// The leader once it has held the same term for [`STABLE_BEFORE`]: `(id, token)`.
async fn stable_leader(fleet: &Fleet) -> (String, i64) {
    let until = Instant::now() + SETTLE;
    let (mut id, _, mut token) = fleet.leader(SETTLE).await;
    let mut since = Instant::now();
    while since.elapsed() < STABLE_BEFORE {
        assert!(Instant::now() < until, "no stable leader within {SETTLE:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (now_id, _, now_token) = fleet.leader(SETTLE).await;
        if (now_id.as_str(), now_token) != (id.as_str(), token) {
            (id, token, since) = (now_id, now_token, Instant::now());
        }
    }
    (id, token)
}

fn start_load(fleet: &Fleet) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let (client, nodes, flag) = (fleet.client.clone(), fleet.state().nodes, stop.clone());
    let task = tokio::spawn(async move {
        let (mut ok, mut failed, mut tokens, mut hint) = (0u64, 0u64, BTreeMap::new(), None);
        while !flag.load(Ordering::Relaxed) {
            match next_anywhere(&client, &nodes, &mut hint).await {
                Ok((token, _)) => {
                    ok += 1;
                    tokens.entry(token).or_insert_with(Instant::now);
                }
                Err(_) => {
                    failed += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        (ok, failed, tokens)
    });
    Load { stop, task }
}

/// `config/raft.toml` with 1-2 s elections and a 1 s lease instead of 150-250 ms and 150 ms: on
/// two shared cores a node starved for a few hundred ms loses its lease or re-elects on its own
/// (seen with the 150 ms lease while three builds ran beside the test: terms 3 and 4 mid-burst,
/// every forgery still refused), which is not what this test is about. The attacks do not depend
/// on timeouts (a transfer, a transfer-flagged vote and an append at a higher term act at once),
/// so they lose nothing by it.
fn patient_raft_config(dir: &std::path::Path) -> std::path::PathBuf {
    let base = std::fs::read_to_string(repo_path("config/raft.toml")).unwrap();
    assert!(base.contains("election_timeout_ms = \"150-250\""));
    let text = base
        .replace(
            "election_timeout_ms = \"150-250\"",
            "election_timeout_ms = \"1000-2000\"",
        )
        .replace("lease_ttl_ms = 150", "lease_ttl_ms = 1000")
        .replace("renew_interval_ms = 40", "renew_interval_ms = 200")
        .replace("retry_interval_ms = 20", "retry_interval_ms = 100");
    let path = dir.join("raft-patient.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_peer_rpcs_are_refused_and_change_nothing() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let base = patient_raft_config(cfg_dir.path());
    let fleet = Fleet::up_with("raft", 3, &["--config", base.to_str().unwrap()]);
    let (leader_id, token) = stable_leader(&fleet).await;
    let state = fleet.state();
    let targets: Vec<Target> = state
        .nodes
        .iter()
        .map(|n| Target {
            id: n.id.clone(),
            http: n.http_addr.clone(),
            peer: n
                .peer_addr
                .clone()
                .expect("raft fleets record the peer listener"),
        })
        .collect();
    // The peer listener is not the client port.
    for t in &targets {
        assert_ne!(
            t.http, t.peer,
            "{}: peer RPC must have its own listener",
            t.id
        );
    }
    let cfg = NodeConfig::from_file(&state.nodes[0].config).unwrap();
    let secret = cfg
        .raft
        .cluster_secret
        .clone()
        .expect("baton fleet writes a cluster secret");
    assert_eq!(secret.expose().len(), 64, "32 random bytes, hex");
    let keys = Keys {
        right: PeerAuth::new(secret.expose().as_bytes(), 30_000),
        wrong: PeerAuth::new(b"not-the-cluster-secret-0123456789abcdef", 30_000),
    };
    let raft_id = |id: &str| id.trim_start_matches('n').parse::<u64>().unwrap();
    let leader = raft_id(&leader_id);
    let follower = targets
        .iter()
        .map(|t| raft_id(&t.id))
        .find(|&i| i != leader)
        .unwrap();
    let term = token as u64;
    let attacks = forgeries(term, leader, follower);
    let client = NodeClient::new(Duration::from_secs(5));

    // Control 1: the listener does serve authentic requests (a harmless pre-vote at this term).
    let leader_t = targets.iter().find(|t| t.id == leader_id).unwrap();
    let status = send_authentic(
        &client,
        leader_t,
        "pre_vote",
        vote_req(term, follower, false),
        &keys.right,
    )
    .await;
    assert_eq!(status, 200, "an authentic pre-vote must be answered");

    let load = start_load(&fleet);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let mut answered: BTreeMap<(Dress, u16), u64> = BTreeMap::new();
    let mut refused_by_node: BTreeMap<String, u64> = BTreeMap::new();
    let dresses = [
        Dress::Unsigned,
        Dress::WrongSecret,
        Dress::Stale,
        Dress::ClientPort,
    ];
    let mut pace = tokio::time::interval(Duration::from_micros(1_000_000 / FORGED_PER_SEC));
    while started.elapsed() < BURST {
        for t in &targets {
            for f in &attacks {
                for d in dresses {
                    pace.tick().await;
                    let status = send(&client, t, f, d, &keys).await;
                    assert_eq!(
                        status,
                        d.expected(),
                        "{} /peer/{} ({d:?}) answered {status}",
                        t.id,
                        f.method
                    );
                    *answered.entry((d, status)).or_default() += 1;
                    if d != Dress::ClientPort {
                        *refused_by_node.entry(t.id.clone()).or_default() += 1;
                    }
                }
            }
        }
    }
    // Control 2: even with the right secret, a term that cannot be a token is refused (400) and
    // changes nothing — the term bound behind the authentication.
    for t in &targets {
        let status = send_authentic(
            &client,
            t,
            "vote",
            vote_req(i64::MAX as u64, follower, true),
            &keys.right,
        )
        .await;
        assert_eq!(
            status, 400,
            "{}: a vote at term i64::MAX must be refused",
            t.id
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    load.stop.store(true, Ordering::Relaxed);
    let (ok, failed, first_seen) = load.task.await.unwrap();
    let tokens: BTreeSet<i64> = first_seen.keys().copied().collect();
    let changes: Vec<String> = first_seen
        .iter()
        .map(|(t, at)| {
            format!(
                "token {t} first seen at burst {:+?}",
                at.saturating_duration_since(started)
            )
        })
        .collect();

    let sent: u64 = answered.values().sum();
    let availability = ok as f64 / (ok + failed).max(1) as f64;
    eprintln!(
        "burst {:?}: {sent} forged requests, answers {answered:?}; /next ok {ok} failed {failed} \
         (availability {:.4}); tokens seen {tokens:?}",
        started.elapsed(),
        availability
    );
    assert!(sent >= 200, "the burst must be sustained, sent only {sent}");

    // Zero leadership changes: the same leader with the same token throughout and after.
    assert_eq!(
        tokens,
        BTreeSet::from([token]),
        "/next saw another term during the burst: {changes:?}"
    );
    let (after_id, _, after_token) = fleet.leader(SETTLE).await;
    assert_eq!(
        (after_id.as_str(), after_token),
        (leader_id.as_str(), token)
    );
    assert!(ok >= 100, "the /next load barely ran ({ok} ok)");
    assert!(
        availability >= 0.99,
        "/next availability {availability:.4} under the burst"
    );

    // Every refusal at a peer listener was counted, by that node, and nothing else was.
    for t in &targets {
        let text = client.get(&t.http, "/metrics").await.unwrap();
        let counted = auth_failures(&String::from_utf8_lossy(&text.body));
        let expected = refused_by_node.get(&t.id).copied().unwrap_or(0);
        assert_eq!(
            counted, expected,
            "{}: baton_peer_auth_failures_total",
            t.id
        );
    }
}
