//! Sharded leadership (issue 28) against real servers: K shards over a fleet of `baton node`
//! processes, placed by balanced rendezvous hashing, each shard its own election, token and
//! fence row.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{raft_leader, Fleet};

const SETTLE: Duration = Duration::from_secs(45);

/// Who leads each shard: `shard -> (node id, http addr, token)`, once every shard `0..k` has
/// exactly one leader among the live nodes and the live nodes' counts differ by at most one.
async fn settled_placement(
    fleet: &Fleet,
    k: u32,
    within: Duration,
) -> BTreeMap<u32, (String, String, i64)> {
    let until = Instant::now() + within;
    loop {
        let rows = baton_lab::fleet::status(&fleet.state()).await;
        let live: Vec<_> = rows
            .iter()
            .filter(|r| r.alive && r.role.is_some())
            .collect();
        let mut leaders: BTreeMap<u32, Vec<(String, String, i64)>> = BTreeMap::new();
        for r in &live {
            for (s, t) in &r.shards_led {
                leaders
                    .entry(*s)
                    .or_default()
                    .push((r.id.clone(), r.http_addr.clone(), *t));
            }
        }
        let counts: Vec<usize> = live.iter().map(|r| r.shards_led.len()).collect();
        let balanced = counts
            .iter()
            .max()
            .zip(counts.iter().min())
            .is_some_and(|(a, b)| a - b <= 1);
        let one_each = (0..k).all(|s| leaders.get(&s).is_some_and(|l| l.len() == 1));
        if balanced && one_each {
            return leaders
                .into_iter()
                .map(|(s, mut l)| (s, l.remove(0)))
                .collect();
        }
        assert!(
            Instant::now() < until,
            "no settled placement of {k} shards within {within:?}: {rows:?}\n{}",
            fleet.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// [`settled_placement`], once it has held for a second and a half: the same leader and token
/// for every shard in two looks (a fleet that has just come up may still be handing shards to
/// members it has only now counted live).
async fn stable_placement(
    fleet: &Fleet,
    k: u32,
    within: Duration,
) -> BTreeMap<u32, (String, String, i64)> {
    let until = Instant::now() + within;
    let mut seen = settled_placement(fleet, k, within).await;
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let now = settled_placement(
            fleet,
            k,
            until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(1)),
        )
        .await;
        if now == seen {
            return now;
        }
        assert!(
            Instant::now() < until,
            "placement did not hold still within {within:?}"
        );
        seen = now;
    }
}

/// Every actor-trace line of the fleet, sorted by the (shared, one machine) monotonic clock.
fn traces(fleet: &Fleet) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for n in &fleet.state().nodes {
        let path = Path::new(&n.config)
            .parent()
            .unwrap()
            .join("actor-trace.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        out.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()),
        );
    }
    out.sort_by_key(|l| l["mono_ns"].as_u64().unwrap_or(0));
    out
}

/// For every hand-over in the traces (a `demote-begin` with reason `handover`) that a new term
/// followed: the old owner checkpointed, stopped and began releasing before the new owner was
/// elected. Returns how many hand-overs were checked.
fn assert_handover_order(lines: &[serde_json::Value]) -> usize {
    let mut checked = 0;
    for (i, l) in lines.iter().enumerate() {
        if !(l["actor"] == "supervisor"
            && l["event"] == "demote-begin"
            && l["detail"] == "handover")
        {
            continue;
        }
        let (node, shard, token) = (&l["node"], &l["shard"], l["token"].as_i64().unwrap());
        let later = |pred: &dyn Fn(&serde_json::Value) -> bool| {
            lines.iter().skip(i + 1).position(pred).map(|p| p + i + 1)
        };
        let Some(next_elected) = lines.iter().enumerate().skip(i).find(|(_, x)| {
            x["shard"] == *shard
                && x["event"] == "elected"
                && x["token"].as_i64().unwrap_or(0) > token
        }) else {
            continue;
        };
        let same = |x: &serde_json::Value| x["node"] == *node && x["shard"] == *shard;
        let checkpointed =
            later(&|x| same(x) && x["event"] == "checkpointed" && x["token"] == token);
        let stopped =
            later(&|x| same(x) && x["actor"] == "supervisor" && x["event"] == "work-stopped");
        let release = later(&|x| same(x) && x["event"] == "release-begin");
        let (Some(c), Some(s), Some(r)) = (checkpointed, stopped, release) else {
            let term: Vec<String> = lines[i..]
                .iter()
                .filter(|x| same(x))
                .take(12)
                .map(|x| x.to_string())
                .collect();
            panic!("hand-over of shard {shard} term {token} on {node} without checkpoint/stop/release in the trace:\n{}", term.join("\n"));
        };
        assert!(
            c < s && s < r && r < next_elected.0,
            "shard {shard}: term {token} on {node}: checkpoint {c}, stopped {s}, release {r} must all precede the next term's election at {} ({})",
            next_elected.0,
            next_elected.1
        );
        checked += 1;
    }
    checked
}

fn metric_sum(text: &str, name: &str, shard: u32) -> f64 {
    let label = format!("shard=\"{shard}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_spread_evenly_and_every_interface_names_its_shard() {
    const K: u32 = 8;
    let fleet = Fleet::up_with("etcd", 3, &["--shards", "8"]);
    let nodes = fleet.state().nodes;
    // POST /next?shard=S: the shard's leader answers with its shard and token; every other
    // node answers 409 naming that shard's leader. A placement that moves while this runs (a
    // probe missed on a loaded machine) is looked at again, up to three times.
    let mut placed = stable_placement(&fleet, K, SETTLE).await;
    let mut tries = 1;
    while let Err(e) = next_answers_name_the_shard_leader(&fleet, &placed).await {
        assert!(tries < 3, "placement kept moving: {e}");
        tries += 1;
        placed = stable_placement(&fleet, K, SETTLE).await;
    }
    // ?key=K goes to fnv1a64(K) mod 8, the documented hash.
    let key = "customer-42";
    let s = baton::shard::shard_of_key(key.as_bytes(), K).0;
    let (_, addr, _) = &placed[&s];
    let r = fleet
        .client
        .post(addr, &format!("/next?key={key}"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["shard"].as_u64(), Some(u64::from(s)));
    // A sharded fleet refuses a request that names no shard, and a shard past K.
    let any = &nodes[0].http_addr;
    let r = fleet.client.post(any, "/next").await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "shard_required");
    let r = fleet.client.post(any, "/next?shard=8").await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "bad_shard");
    // GET /read?shard=S from the shard's leader.
    let (_, addr3, token3) = &placed[&3];
    let r = fleet
        .client
        .get(addr3, "/read?shard=3&mode=resource")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["shard"].as_u64(), Some(3));
    assert_eq!(r.json()["token"].as_i64(), Some(*token3));

    // /status lists every shard and placement's live members; /metrics: leaders_acting{shard}
    // sums to exactly 1 per shard. The live set is looked at until it shows all three, for a
    // few seconds (a member unanswered for `down_after_ms` on a loaded machine leaves it).
    let until = Instant::now() + Duration::from_secs(10);
    let st = loop {
        let st = fleet.client.get(any, "/status").await.unwrap().json();
        if st["placement"]["live"].as_array().map(Vec::len) == Some(3) || Instant::now() > until {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        st["shards"].as_array().map(Vec::len),
        Some(K as usize),
        "{st}"
    );
    assert_eq!(
        st["placement"]["live"].as_array().map(Vec::len),
        Some(3),
        "{st}"
    );
    // Each shard's leader read that shard's own failure budget as its term began (K = 1's
    // code path, per shard): open, nothing spent.
    for (s, (leader, addr, _)) in &placed {
        let st = fleet.client.get(addr, "/status").await.unwrap().json();
        let b = &st["shards"][*s as usize]["failure_budget"];
        assert_eq!(b["exhausted"], false, "shard {s} on {leader}: {st}");
        assert_eq!(b["failed_terms"], 0, "shard {s} on {leader}: {st}");
    }
    let mut texts = Vec::new();
    for n in &nodes {
        let body = fleet
            .client
            .get(&n.http_addr, "/metrics")
            .await
            .unwrap()
            .body;
        texts.push(String::from_utf8(body.to_vec()).unwrap());
    }
    for s in 0..K {
        let acting: f64 = texts
            .iter()
            .map(|t| metric_sum(t, "leaders_acting", s))
            .sum();
        assert_eq!(acting, 1.0, "shard {s}: leaders_acting sums to {acting}");
    }
    let led: f64 = texts
        .iter()
        .filter_map(|t| {
            t.lines()
                .find(|l| l.starts_with("baton_shards_led"))?
                .rsplit(' ')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum();
    assert_eq!(led, f64::from(K));

    // `baton fleet status` shows the placement.
    let out = common::baton(&["fleet", "status", "--dir", fleet.path().to_str().unwrap()]);
    assert!(out.contains("shards led"), "{out}");

    // One lease per node for all its shards: each node renews it about twice per renew interval
    // (1 s here) whatever the number of shards it leads or seeks, where one lease per shard
    // would send one keepalive per shard per second (K / N ≈ 3 here, more with orphans sought).
    let keepalives = |texts: &[String]| -> Vec<f64> {
        texts
            .iter()
            .map(|t| backend_requests(t, "etcd", "keepalive"))
            .collect()
    };
    let before = keepalives(&metrics_texts(&fleet).await);
    let window = Duration::from_secs(6);
    tokio::time::sleep(window).await;
    let after_texts = metrics_texts(&fleet).await;
    for ((n, b), a) in nodes.iter().zip(before).zip(keepalives(&after_texts)) {
        let per_s = (a - b) / window.as_secs_f64();
        assert!(
            per_s <= 2.5,
            "{}: {per_s:.1} keepalives/s for its shards; one shared lease sends at most ~2",
            n.id
        );
    }
    for (n, t) in nodes.iter().zip(&after_texts) {
        let grants = backend_requests(t, "etcd", "lease-grant");
        assert!(
            grants <= 2.0,
            "{}: {grants} leases granted; its shards share one",
            n.id
        );
    }
}

/// The raft leader of a raft fleet, from the members' durable votes (`raft/vote.json`): the
/// committed vote of the highest term names it (fleet node `nI` is raft id `I`).
/// A `--netns` fleet (each node in its own network namespace, as the partition event needs):
/// every member sees every other one and the shards spread. Members' addresses must be the
/// namespaces', not loopback: with loopback each node counted the others dead and sought every
/// shard alone, and the fleet never balanced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_in_network_namespaces_see_every_member_and_spread() {
    const K: u32 = 6;
    let fleet = Fleet::up_with("etcd", 3, &["--netns", "--shards", "6"]);
    let placed = stable_placement(&fleet, K, SETTLE).await;
    let per_node: HashSet<&String> = placed.values().map(|(id, _, _)| id).collect();
    assert_eq!(per_node.len(), 3, "every node leads some shard: {placed:?}");
    // The node's own sweep of the fleet (`/ui/fleet`) asks every member at its configured
    // address: all three must answer.
    let addr = &fleet.state().nodes[0].http_addr;
    let r = fleet.client.get(addr, "/ui/fleet").await.unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let members = r.json()["members"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 3, "{members:?}");
    for m in &members {
        assert_eq!(m["up"], true, "a member the node cannot reach: {m}");
        assert!(
            !m["addr"].as_str().unwrap_or("").starts_with("127."),
            "a member named by loopback inside a namespace: {m}"
        );
    }
}

/// `POST /next?shard=S` on every node for every shard of `placed`: 200 with the shard and its
/// token from the leader, 409 naming the leader from every other node. `Err` (to look again)
/// when an answer shows the placement has moved since; a wrong answer of any other kind panics.
async fn next_answers_name_the_shard_leader(
    fleet: &Fleet,
    placed: &BTreeMap<u32, (String, String, i64)>,
) -> Result<(), String> {
    let nodes = fleet.state().nodes;
    for (s, (leader, addr, token)) in placed {
        let r = fleet
            .client
            .post(addr, &format!("/next?shard={s}"))
            .await
            .unwrap();
        let v = r.json();
        if r.status == 409 || r.status == 503 || v["token"].as_i64() != Some(*token) {
            return Err(format!("shard {s} on {leader}: {} {v}", r.status));
        }
        assert_eq!(r.status, 200, "shard {s} on {leader}: {:?}", r.body);
        assert_eq!(v["shard"].as_u64(), Some(u64::from(*s)));
        assert!(v["seq"].as_i64().unwrap() >= 1);
        for n in nodes.iter().filter(|n| &n.id != leader) {
            let r = fleet
                .client
                .post(&n.http_addr, &format!("/next?shard={s}"))
                .await
                .unwrap();
            if r.status != 409 || r.leader_header.as_deref() != Some(addr.as_str()) {
                return Err(format!("{} on shard {s}: {} {:?}", n.id, r.status, r.body));
            }
            assert_eq!(
                r.json()["leader"]["node_id"].as_str(),
                Some(leader.as_str())
            );
        }
    }
    Ok(())
}

/// Every node's `/metrics` text.
async fn metrics_texts(fleet: &Fleet) -> Vec<String> {
    let mut texts = Vec::new();
    for n in &fleet.state().nodes {
        let r = fleet.client.get(&n.http_addr, "/metrics").await.unwrap();
        texts.push(String::from_utf8(r.body.to_vec()).unwrap());
    }
    texts
}

/// `baton_backend_requests_total{backend, op}` in one node's metrics text (0 if never counted).
fn backend_requests(text: &str, backend: &str, op: &str) -> f64 {
    let (b, o) = (format!("backend=\"{backend}\""), format!("op=\"{op}\""));
    text.lines()
        .filter(|l| {
            l.starts_with("baton_backend_requests_total{") && l.contains(&b) && l.contains(&o)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A stale leader of shard 3 is refused on shard 3, and shard 4 keeps writing: the fence rows
/// are per shard. Then a kill -9 moves the dead node's shards, a restart brings balance back
/// with about K/N moves, and every hand-over ran checkpoint → stop → release first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_shard_fence_failover_and_rebalance_on_pg_lease() {
    per_shard_fence_failover_and_rebalance("pg-lease").await;
}

/// The same on raft: one raft group for the fleet whose state machine holds every shard's
/// lease (`backends::raft::shards`), the shards placed by the same placement layer. The kill -9
/// may take the raft leader with it; its shards still move, with tokens that only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_shard_fence_failover_and_rebalance_on_raft() {
    per_shard_fence_failover_and_rebalance("raft").await;
}

/// The same on ZooKeeper, where a node's shards share one candidacy session (every shard's
/// znode is created in it, one `sync` renews them all) and one read-only session: each node
/// opens two sessions, not two per shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_shard_fence_failover_and_rebalance_on_zk() {
    per_shard_fence_failover_and_rebalance("zk").await;
}

/// The leader reads of an idle zk fleet do not grow with K: each shard's observe loop keeps a
/// watch, and the quiet re-checks behind the watches are one multi-read per node for all its
/// shards (`zk.rs`, `SharedLeaderRead`). K = 16 on 3 nodes, a 15 s idle window: a node sends at
/// most about one read per 10 retry intervals (2.5 s), so 7 in the window (3 when its shards'
/// watches were set together and re-check together); re-checks per shard would be 16 every 20
/// retry intervals (5 s), 48 or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_quiet_leader_rechecks_are_one_read_per_node_not_per_shard() {
    const K: u32 = 16;
    const WINDOW: Duration = Duration::from_secs(15);
    /// Every leader-read request of the zk backend, by its counter's `op` label.
    const READS: [&str; 4] = [
        "read-list",
        "read-get",
        "read-watch-children",
        "read-recheck",
    ];
    /// Per node in the window: twice what shared re-checks send, a quarter of one per shard.
    const MOST_PER_NODE: f64 = 12.0;
    let fleet = Fleet::up_with("zk", 3, &["--shards", "16"]);
    let placed = stable_placement(&fleet, K, SETTLE).await;
    let reads = |text: &str| -> BTreeMap<&str, f64> {
        READS
            .iter()
            .map(|op| (*op, backend_requests(text, "zk", op)))
            .collect()
    };
    let before: Vec<_> = metrics_texts(&fleet)
        .await
        .iter()
        .map(|t| reads(t))
        .collect();
    tokio::time::sleep(WINDOW).await;
    let after: Vec<_> = metrics_texts(&fleet)
        .await
        .iter()
        .map(|t| reads(t))
        .collect();
    // An idle fleet: nothing changed that a watch would report and re-read.
    let still = settled_placement(&fleet, K, SETTLE).await;
    assert_eq!(still, placed, "the placement moved in the idle window");
    let mut rechecks = 0.0;
    for ((n, b), a) in fleet.state().nodes.iter().zip(&before).zip(&after) {
        let sent: BTreeMap<&str, f64> = READS.iter().map(|op| (*op, a[op] - b[op])).collect();
        let total: f64 = sent.values().sum();
        eprintln!(
            "{}: {total} leader reads in {WINDOW:?} for {K} shards: {sent:?}",
            n.id
        );
        assert!(
            total <= MOST_PER_NODE,
            "{}: {total} zookeeper leader reads in an idle {WINDOW:?} for {K} shards ({sent:?}): \
             the quiet re-checks are per shard again, not one read per node",
            n.id
        );
        rechecks += sent["read-recheck"];
    }
    assert!(
        rechecks >= 3.0,
        "{rechecks} shared re-checks in {WINDOW:?}: every node re-checks its quiet watches"
    );
}

/// The body of the tests above, on a 3-node fleet of `backend` with K = 6.
async fn per_shard_fence_failover_and_rebalance(backend: &str) {
    const K: u32 = 6;
    let fleet = Fleet::up_with(backend, 3, &["--shards", "6"]);
    let placed = stable_placement(&fleet, K, SETTLE).await;
    if backend == "zk" {
        // Sessions opened by each node so far, for all its shards' candidacies and reads.
        for (n, t) in fleet.state().nodes.iter().zip(metrics_texts(&fleet).await) {
            let sessions = backend_requests(&t, "zk", "connect");
            assert!(
                (1.0..=3.0).contains(&sessions),
                "{}: {sessions} zookeeper sessions opened for {K} shards; its shards share two",
                n.id
            );
        }
    }

    // Shard 3's leader steps down: its old token is now stale on shard 3.
    let (old3, addr3, token3) = placed[&3].clone();
    let r = fleet
        .client
        .post(&addr3, "/stepdown?shard=3")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let until = Instant::now() + SETTLE;
    let new3 = loop {
        let p = settled_placement(&fleet, K, SETTLE).await;
        if p[&3].2 > token3 {
            break p[&3].clone();
        }
        assert!(Instant::now() < until, "shard 3 got no new term");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // A write to shard 3 under the new term makes the fence row move (the claim already did).
    let r = fleet.post_at_leader(&new3.1, "/next?shard=3").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let db = fleet.node_db(&old3).await;
    let stale = db
        .query_one(
            "SELECT baton.fence_assert('orders#3', $1, $2)",
            &[&token3, &old3],
        )
        .await;
    let err = stale.expect_err("a stale shard-3 token must be refused");
    assert_eq!(err.code().map(|c| c.code()), Some("BF409"), "{err}");
    // Shard 4's leader keeps writing, and its fence row is untouched by shard 3's.
    let p = settled_placement(&fleet, K, SETTLE).await;
    let (l4, addr4, token4) = p[&4].clone();
    let r = fleet.post_at_leader(&addr4, "/next?shard=4").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let db4 = fleet.node_db(&l4).await;
    db4.query_one(
        "SELECT baton.fence_assert('orders#4', $1, $2)",
        &[&token4, &l4],
    )
    .await
    .expect("shard 4's leader writes on");
    let admin = fleet.admin_db().await;
    let rows = admin
        .query(
            "SELECT name, max_token FROM baton.fenced_resource ORDER BY name",
            &[],
        )
        .await
        .unwrap();
    let fence: BTreeMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(fence.get("leadership#3"), Some(&new3.2), "{fence:?}");
    assert_eq!(fence.get("leadership#4"), Some(&token4), "{fence:?}");

    // kill -9 the node leading the most shards (on raft: the raft leader, which leads some
    // too): they move to the others, balanced.
    let before = stable_placement(&fleet, K, SETTLE).await;
    let victim = if backend == "raft" {
        raft_leader(&fleet)
    } else {
        before
            .values()
            .map(|(n, _, _)| n.clone())
            .max_by_key(|n| before.values().filter(|(m, _, _)| m == n).count())
            .unwrap()
    };
    fleet.kill9(&victim);
    let after_kill = settled_placement(&fleet, K, SETTLE).await;
    assert!(
        after_kill.values().all(|(n, _, _)| *n != victim),
        "{after_kill:?}"
    );
    // Every shard that moved did so under a higher token: its own, per shard. A shard whose
    // holder lived on kept its term (on raft: its lease outlived the raft leader's election,
    // since the new raft leader counts every held shard as renewed when it took over).
    for (s, (n, _, t)) in &after_kill {
        let (was, _, t0) = &before[s];
        assert!(
            (n == was && t == t0) || t > t0,
            "shard {s} went from {was} (token {t0}) to {n} with token {t}"
        );
    }
    // Restart: it takes about K/N shards back, and balance holds (max - min <= 1).
    fleet.start(&victim);
    let until = Instant::now() + SETTLE;
    let after_start = loop {
        let p = settled_placement(&fleet, K, SETTLE).await;
        if p.values().any(|(n, _, _)| *n == victim) {
            break p;
        }
        assert!(Instant::now() < until, "{victim} took no shard back: {p:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let moved = after_kill
        .iter()
        .filter(|(s, (n, _, _))| after_start[s].0 != *n)
        .count();
    assert!(
        (1..=4).contains(&moved),
        "a join of 1 of 3 moved {moved} of {K} shards"
    );

    let checked = assert_handover_order(&traces(&fleet));
    assert!(
        checked >= 2,
        "expected hand-overs in the traces, checked {checked}"
    );
}

/// A rolling restart of the whole fleet under load: every shard moves at least once, and no
/// acknowledged ID is lost or issued twice (checked against each shard's ledger). A client
/// only ever needs the retry that a 409 or 503 asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_moves_every_shard_without_losing_an_id() {
    const K: u32 = 4;
    let fleet = Fleet::up_with("etcd", 3, &["--shards", "4"]);
    let placed = stable_placement(&fleet, K, SETTLE).await;
    let addrs: Vec<String> = fleet
        .state()
        .nodes
        .iter()
        .map(|n| n.http_addr.clone())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut loads = Vec::new();
    for s in 0..K {
        let (client, addrs, stop) = (fleet.client.clone(), addrs.clone(), stop.clone());
        let mut target = placed[&s].1.clone();
        loads.push(tokio::spawn(async move {
            let (mut got, mut other) = (Vec::new(), Vec::new());
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match client.post(&target, &format!("/next?shard={s}")).await {
                    Ok(r) if r.status == 200 => {
                        let v = r.json();
                        got.push((v["token"].as_i64().unwrap(), v["seq"].as_i64().unwrap()));
                    }
                    Ok(r) if r.status == 409 && r.leader_header.is_some() => {
                        target = r.leader_header.unwrap();
                    }
                    Ok(r) if r.status == 409 || r.status == 503 => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Ok(r) => other.push(format!("{} {:?}", r.status, r.body)),
                    // The node was restarting: ask another one who leads.
                    Err(_) => {
                        i += 1;
                        target = addrs[i % addrs.len()].clone();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (got, other)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    common::baton(&[
        "fleet",
        "restart",
        "--rolling",
        "--settle",
        "4s",
        "--dir",
        fleet.path().to_str().unwrap(),
    ]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let admin = fleet.admin_db().await;
    for (s, load) in loads.into_iter().enumerate() {
        let (got, other) = load.await.unwrap();
        assert!(
            other.is_empty(),
            "shard {s}: answers other than 200/409/503: {other:?}"
        );
        assert!(
            got.len() > 20,
            "shard {s}: only {} IDs during the restart",
            got.len()
        );
        let tokens: HashSet<i64> = got.iter().map(|(t, _)| *t).collect();
        assert!(
            tokens.len() >= 2,
            "shard {s} never moved: tokens {tokens:?}"
        );
        // Strictly increasing as issued, so none repeats.
        assert!(
            got.windows(2).all(|w| w[1].1 > w[0].1),
            "shard {s}: IDs not increasing"
        );
        let resource = baton::shard::ShardId(s as u32).resource("sequence");
        let bad: i64 = admin
            .query_one(
                "SELECT count(*) FROM (SELECT token, seq_lo, lag(seq_hi) OVER w AS prev_hi, lag(token) OVER w AS prev_token
                   FROM baton.fence_log WHERE op = 'next' AND resource = $1 WINDOW w AS (ORDER BY pos)) x
                 WHERE seq_lo <= prev_hi OR token < prev_token",
                &[&resource],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(bad, 0, "shard {s}: the ledger has non-increasing steps");
        for (token, seq) in &got {
            let n: i64 = admin
                .query_one(
                    "SELECT count(*) FROM baton.fence_log WHERE op = 'next' AND resource = $1 AND token = $2 AND $3 BETWEEN seq_lo AND seq_hi",
                    &[&resource, token, seq],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(
                n, 1,
                "shard {s}: acknowledged ({token}, {seq}) is not in the ledger exactly once"
            );
        }
    }
    settled_placement(&fleet, K, SETTLE).await;
    assert!(assert_handover_order(&traces(&fleet)) >= 4);
}

/// One `POST /next?shard=S` to each shard's leader; every one must answer 200.
async fn one_next_per_shard(
    fleet: &Fleet,
    placed: &BTreeMap<u32, (String, String, i64)>,
    when: &str,
) {
    for (s, (_, addr, _)) in placed {
        let r = fleet
            .client
            .post(addr, &format!("/next?shard={s}"))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "shard {s}{when}: {:?}", r.body);
    }
}

/// Idle shards hold no PostgreSQL connection each: K = 64 on 3 pg-lease nodes (each node
/// leading ~21). A node's first `WARM_SEQ_PIPES` (8) terms open their sequencer's connection
/// beside the claim and keep it (failover as fast as unsharded); the others open theirs at
/// their first commit and close it after `SEQ_IDLE_CLOSE` idle. Before, every shard a node
/// had ever led kept one (K = 1024 exhausted the server's `max_connections`): this fleet held
/// at least 64 sequencer connections, more than all its connections may be now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_shards_do_not_hold_a_database_connection_each() {
    use baton::work::fence::{SEQ_APPLICATION_NAME, WARM_SEQ_PIPES};
    use baton::work::SEQ_IDLE_CLOSE;
    const K: u32 = 64;
    const NODES: usize = 3;
    let fleet = Fleet::up_with("pg-lease", NODES, &["--shards", "64"]);
    let placed = stable_placement(&fleet, K, SETTLE).await;
    let db = fleet.admin_db().await;
    // (every client connection but this one, the sequencers' alone)
    let count = || async {
        let row = db
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE application_name = $1)
                   FROM pg_stat_activity
                  WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                &[&SEQ_APPLICATION_NAME],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(0), row.get::<_, i64>(1))
    };
    let warm = (NODES * WARM_SEQ_PIPES) as i64;
    let (all, seq) = count().await;
    eprintln!("idle, {K} shards led: {all} client connections, {seq} of them sequencers'");
    assert!(
        seq <= warm,
        "{seq} sequencer connections held by an idle fleet of {NODES} nodes: at most \
         {WARM_SEQ_PIPES} per node are kept warm"
    );
    // Counted without the name too (a sequencer that pinned one per shard held K alone):
    // the rest are each node's fence pool and lease pool (4 + 4).
    assert!(
        all < i64::from(K),
        "{all} client connections for {K} idle shards: the sequencers hold one per shard again"
    );

    // Every shard serves: those without a warm connection open one at their first commit.
    // The most seen after any shard's commit, not the count after the last: on a loaded host
    // the 64 requests can take longer than SEQ_IDLE_CLOSE, and the first cold connections are
    // then closed again before the last shard is asked (this count failed so at load ~8).
    let mut busy = 0;
    for (s, (_, addr, _)) in &placed {
        let r = fleet
            .client
            .post(addr, &format!("/next?shard={s}"))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "shard {s}: {:?}", r.body);
        busy = busy.max(count().await.1);
    }
    eprintln!("after one ID from every shard: at most {busy} sequencer connections at once");
    assert!(
        busy > warm,
        "{busy} sequencer connections at most while every shard committed: the cold ones opened none"
    );
    // Idle again: past SEQ_IDLE_CLOSE the cold ones are closed.
    let until = Instant::now() + SEQ_IDLE_CLOSE + Duration::from_secs(10);
    loop {
        let (_, seq) = count().await;
        if seq <= warm {
            eprintln!("{seq} sequencer connections once idle again");
            break;
        }
        assert!(
            Instant::now() < until,
            "{seq} sequencer connections {:?} after the last commit: the idle ones were not closed",
            SEQ_IDLE_CLOSE + Duration::from_secs(10)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // And a shard whose connection was closed opens a new one at its next commit.
    one_next_per_shard(&fleet, &placed, " after its idle close").await;
}
