//! Redis behind Sentinel (issue 32): `baton fleet up --backend redis --redis-topology sentinel`
//! (a primary, one replica, three Sentinels, all ours on loopback) under open-loop `POST /next`
//! load, then `baton chaos sentinel-failover` (`kill -9` of the primary; the Sentinels promote
//! the replica). The nodes follow the new primary without a restart.
//!
//! **A repeated token refused.** Replication is asynchronous, so the promoted replica can lack
//! the last `INCR`s of the token counter, and the next acquisition is handed a token that an
//! earlier term already claimed the resource with. The test makes that happen on purpose rather
//! than by luck: it cuts the replica off its primary first (a wrong `masterauth` on the replica,
//! then `CLIENT KILL TYPE master`: it keeps failing to reconnect, while it still answers the
//! Sentinels, so it stays eligible), hands leadership over twice (two `INCR`s and two claims
//! the replica never sees), then kills the primary. The fenced resource must refuse the reused
//! token (`fence_rejections`), the fleet must serve again under a token the fence accepts, and
//! the history checker must pass over the ledger and the load's history with 0 violations.
//!
//! The control, with the fence off: the same reused token is accepted and issues IDs again, and
//! the checker fails (the token goes back in the ledger, or two holders write under it).
//!
//! The same fault under `redis-naive` (no token, only the lock): the fleet serves again after the
//! failover, and the checker passes (its "tokens" are wall-clock times, which the fence orders).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_lab::check::{self, load::acks_from_ops};
use baton_lab::fleet::redis_server::RedisServer;
use baton_lab::load::{self, LoadSpec, Outcome};

mod common;
use common::Fleet;

const SETTLE: Duration = Duration::from_secs(40);

/// Two fleets with five Redis processes each, on 2 cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn sentinel_fleet(backend: &str) -> Fleet {
    Fleet::up_with(backend, 3, &["--redis-topology", "sentinel"])
}

/// Open-loop `POST /next` at 100/s over 4 connections against every node (the generator follows
/// the leader), until `stop` is set.
fn start_load(
    fleet: &Fleet,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<load::LoadReport>> {
    let targets = fleet
        .state()
        .nodes
        .iter()
        .map(|n| n.http_addr.clone())
        .collect();
    let mut spec = LoadSpec::new(targets, 100.0, Duration::from_secs(180));
    spec.connections = 4;
    spec.stop = Some(stop);
    tokio::spawn(load::run(spec))
}

/// The checker over the fleet's ledger, refusals and the load's acknowledged IDs.
async fn check_history(fleet: &Fleet, report: &load::LoadReport) -> check::Verdict {
    let admin = fleet.admin_db().await;
    let mut input = check::load::read(&admin, None).await.unwrap();
    input.acks = acks_from_ops("load", &report.ops);
    check::run(&input)
}

/// The accepted token of the leadership resource.
async fn max_token(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT max_token FROM baton.fenced_resource WHERE name = 'leadership'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Cuts `replica` off its primary and keeps it off: a `masterauth` the primary (which has no
/// password) refuses makes every reconnection fail at AUTH, and `CLIENT KILL TYPE master` drops
/// the live link. The replica keeps answering the Sentinels, so it stays a failover candidate
/// (Sentinel accepts a replica whose link has been down for up to ~10 x down-after). The value
/// is not a credential: any string the primary refuses will do.
fn cut_replication(replica: &RedisServer) {
    let set = replica
        .ask("CONFIG SET masterauth not-the-primarys-password", |r| {
            r.ends_with("\r\n")
        })
        .unwrap_or_default();
    assert!(set.starts_with("+OK"), "CONFIG SET masterauth: {set:?}");
    let killed = replica
        .ask("CLIENT KILL TYPE master", |r| r.ends_with("\r\n"))
        .unwrap_or_default();
    assert!(
        killed.starts_with(':'),
        "CLIENT KILL TYPE master: {killed:?}"
    );
    let until = Instant::now() + Duration::from_secs(5);
    while replica.replica_link_up() {
        assert!(
            Instant::now() < until,
            "the replica's link to its primary is still up 5 s after the cut"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The token counter as `server` has it.
fn counter_on(server: &RedisServer) -> i64 {
    let reply = server
        .ask("GET baton:leader:token", |r| {
            r.lines().count() >= 2 || r.starts_with("$-1")
        })
        .unwrap_or_default();
    reply
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no token counter on port {}: {reply:?}", server.port))
}

/// What [`cut_hand_over_twice_fail_over`] leaves behind: a `redis` fleet whose Sentinels just
/// promoted a replica that lacks the last two `INCR`s, under load.
struct AfterFailover {
    fleet: Fleet,
    stop: Arc<AtomicBool>,
    run: tokio::task::JoinHandle<anyhow::Result<load::LoadReport>>,
    db: tokio_postgres::Client,
    /// The counter on the replica when it was cut off (the token of the leader then).
    replica_counter: i64,
    /// Tokens claimed at the resource from the cut on, in order (the first is the cut's).
    claimed: Vec<i64>,
    /// The resource's `max_token` when the primary died.
    fence_max: i64,
    rejections_before: i64,
    ledger_before: i64,
    named_at: Instant,
}

/// The scenario of the module doc, up to the Sentinels naming the replica: a `redis` fleet
/// behind Sentinel (`fencing` on or off), load, the replica cut off, two hand-overs it never
/// sees, the primary killed.
async fn cut_hand_over_twice_fail_over(fencing: &str) -> AfterFailover {
    let fleet = Fleet::up_with(
        "redis",
        3,
        &["--redis-topology", "sentinel", "--fencing", fencing],
    );
    let (mut leader, mut addr, mut token) =
        fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let run = start_load(&fleet, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The replica stops receiving: from here on the primary's INCRs are the primary's alone.
    let state = fleet.state();
    let replica = state.redis_sentinel.as_ref().unwrap().replica.clone();
    let cut = replica.clone();
    tokio::task::spawn_blocking(move || cut_replication(&cut))
        .await
        .unwrap();
    let replica_counter = {
        let r = replica.clone();
        tokio::task::spawn_blocking(move || counter_on(&r))
            .await
            .unwrap()
    };
    assert_eq!(
        replica_counter, token,
        "before the hand-overs the replica has the leader's token"
    );

    // Two hand-overs the replica never sees: two INCRs, two claims the fence records.
    let db = fleet.admin_db().await;
    let mut claimed = vec![token];
    for _ in 0..2 {
        let r = fleet.client.post(&addr, "/stepdown").await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        (leader, addr, token) = fleet.new_leader(&leader, token, SETTLE).await;
        claimed.push(token);
    }
    // The new leader's claim commits before it answers as leader, but give it a moment.
    let until = Instant::now() + Duration::from_secs(10);
    while max_token(&db).await != token {
        assert!(
            Instant::now() < until,
            "the fence never accepted token {token}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fence_max = token;
    let lost = fence_max - replica_counter;
    assert_eq!(
        lost, 2,
        "claimed {claimed:?}; the replica stopped at {replica_counter}"
    );
    let rejections_before: i64 = db
        .query_one(
            "SELECT coalesce(max(id), 0) FROM baton.fence_rejections",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let ledger_before: i64 = db
        .query_one("SELECT coalesce(max(pos), 0) FROM baton.fence_log", &[])
        .await
        .unwrap()
        .get(0);

    // The primary dies; the Sentinels promote the replica, which lacks the last two INCRs.
    let mut state = fleet.state();
    let report = baton_lab::chaos::sentinel_failover(&mut state)
        .await
        .expect("sentinel-failover");
    let named_at = Instant::now();
    eprintln!("{}", report.detail);
    assert!(report.verified, "{report:?}");
    assert_eq!(
        fleet.state().redis.as_ref().unwrap().port,
        replica.port,
        "fleet.json names the promoted replica as the primary"
    );
    AfterFailover {
        fleet,
        stop,
        run,
        db,
        replica_counter,
        claimed,
        fence_max,
        rejections_before,
        ledger_before,
        named_at,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_under_a_redis_fleet_with_a_repeated_token_refused() {
    let _serial = SERIAL.lock().await;
    let AfterFailover {
        fleet,
        stop,
        run,
        db,
        replica_counter,
        claimed,
        fence_max,
        rejections_before,
        ledger_before,
        named_at,
    } = cut_hand_over_twice_fail_over("on").await;
    // The first acquisition on the new primary gets replica_counter + 1: the token the first
    // hand-over's leader claimed with. The fence refuses it (below max_token).
    let reused = replica_counter + 1;
    assert!(claimed.contains(&reused), "{claimed:?}");
    let until = Instant::now() + Duration::from_secs(60);
    let (rej_token, rej_max, rej_holder, reason) = loop {
        let rows = db
            .query(
                "SELECT token, max_token, holder, reason FROM baton.fence_rejections
                  WHERE id > $1 AND op = 'claim' ORDER BY id LIMIT 1",
                &[&rejections_before],
            )
            .await
            .unwrap();
        if let Some(r) = rows.first() {
            break (
                r.get::<_, i64>(0),
                r.get::<_, i64>(1),
                r.get::<_, String>(2),
                r.get::<_, String>(3),
            );
        }
        assert!(
            Instant::now() < until,
            "no refused claim within 60 s of the failover\n{}",
            fleet.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "{:.1?} after the Sentinels named the new primary: {rej_holder}'s claim with token {rej_token} refused (resource at {rej_max}): {reason}",
        named_at.elapsed()
    );
    assert_eq!(
        rej_token, reused,
        "the first token after the failover is a reused one"
    );
    assert_eq!(rej_max, fence_max);
    assert_eq!(reason, "stale-token");
    // "Reused": the fence had already accepted a claim under exactly this token.
    let seen: i64 = db
        .query_one(
            "SELECT count(*) FROM baton.fence_log WHERE op = 'claim' AND token = $1 AND pos <= $2",
            &[&rej_token, &ledger_before],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        seen >= 1,
        "token {rej_token} was never claimed before the failover"
    );

    // The counter climbs back (one refused term per token); then a term the fence accepts
    // serves again, under the new primary.
    let until = Instant::now() + Duration::from_secs(60);
    let (served_token, served_by) = loop {
        if let Some(found) = common::serving_claim(&db, ledger_before, fence_max).await {
            break found;
        }
        assert!(
            Instant::now() < until,
            "no term claimed and served within 60 s of the failover\n{}",
            fleet.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "serving again {:.1?} after the failover: {served_by} at token {served_token}",
        named_at.elapsed()
    );
    // A little load under the new term, then the whole history is checked.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let report = run.await.unwrap().unwrap();
    let summary = report.summary();
    let after: Vec<i64> = report
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok && o.token.is_some_and(|t| t >= served_token))
        .filter_map(|o| o.token)
        .collect();
    assert!(
        !after.is_empty(),
        "no ID acknowledged under the new primary: {summary:?}"
    );
    let verdict = check_history(&fleet, &report).await;
    eprintln!("{}", verdict.line());
    assert!(verdict.pass, "{}", verdict.render());
    assert!(verdict.acked > 0);
    // Nothing was ever written under the reused token after the failover.
    let written: i64 = db
        .query_one(
            "SELECT count(*) FROM baton.fence_log WHERE token = $1 AND pos > $2",
            &[&rej_token, &ledger_before],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        written, 0,
        "the reused token {rej_token} wrote after the failover"
    );
}

/// The control: the same scenario with the fence off (`--fencing off`). The reused token is
/// accepted, so two holders write under one token and the token goes back in the ledger: the
/// checker fails. This is what the fence prevents above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_fence_off_the_reused_token_is_served_twice_and_the_checker_fails() {
    let _serial = SERIAL.lock().await;
    let s = cut_hand_over_twice_fail_over("off").await;
    let reused = s.replica_counter + 1;
    // A claim under the reused token after the failover, and IDs issued under it.
    let until = Instant::now() + Duration::from_secs(60);
    let holders = loop {
        let rows =
            s.db.query(
                "SELECT DISTINCT holder FROM baton.fence_log WHERE token = $1 AND op = 'next'",
                &[&reused],
            )
            .await
            .unwrap();
        let after: i64 = s
            .db
            .query_one(
                "SELECT count(*) FROM baton.fence_log WHERE token = $1 AND op = 'next' AND pos > $2",
                &[&reused, &s.ledger_before],
            )
            .await
            .unwrap()
            .get(0);
        if after > 0 {
            break rows
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>();
        }
        assert!(
            Instant::now() < until,
            "no ID issued under the reused token {reused} within 60 s of the failover (claimed {:?})\n{}",
            s.claimed,
            s.fleet.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "{:.1?} after the failover: token {reused} (claimed before it; the resource was at {}) issues IDs again; holders under it: {holders:?}",
        s.named_at.elapsed(),
        s.fence_max
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.stop.store(true, Ordering::Relaxed);
    let report = s.run.await.unwrap().unwrap();
    let verdict = check_history(&s.fleet, &report).await;
    eprintln!("{}", verdict.render());
    assert!(
        !verdict.pass,
        "the fence was off and the token was reused: the checker must fail"
    );
    assert!(
        verdict.failed("token_order").is_some() || verdict.failed("one_holder_per_token").is_some(),
        "{}",
        verdict.render()
    );
}

/// `redis-naive` behind Sentinel, the same fault without the deliberate cut: the nodes find the
/// new primary and the fleet serves again; the checker passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_naive_fleet_serves_again_after_a_sentinel_failover() {
    let _serial = SERIAL.lock().await;
    let fleet = sentinel_fleet("redis-naive");
    fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let run = start_load(&fleet, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut state = fleet.state();
    let old_primary = state.redis.as_ref().unwrap().port;
    let fault = baton_lab::chaos::sentinel_failover(&mut state)
        .await
        .expect("sentinel-failover");
    eprintln!("{}", fault.detail);
    assert_ne!(fleet.state().redis.as_ref().unwrap().port, old_primary);
    // A leader again, serving, after the failover.
    fleet.leader(SETTLE).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let report = run.await.unwrap().unwrap();
    let acked_after = report
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok && o.invoke_ns > fault.healed_at_mono_ns)
        .count();
    assert!(acked_after > 0, "{:?}", report.summary());
    let verdict = check_history(&fleet, &report).await;
    eprintln!("{}", verdict.line());
    assert!(verdict.pass, "{}", verdict.render());
}

/// The servers of [`sentinel_and_data_passwords`], stopped however the test ends.
struct AuthServers {
    pg: baton_lab::fleet::servers::PgServer,
    primary: RedisServer,
    set: baton_lab::fleet::redis_server::RedisSentinelSet,
    _dir: tempfile::TempDir,
}

impl Drop for AuthServers {
    fn drop(&mut self) {
        self.set.stop();
        self.primary.stop();
        self.pg.stop();
    }
}

/// A `redis` node of one, on `servers`, with `sentinel_password` (or none).
async fn auth_node(
    servers: &AuthServers,
    data_password: &str,
    sentinel_password: Option<&str>,
    state: &std::path::Path,
) -> (baton::node::NodeHandle, String) {
    use baton::backends::BackendKind;
    use baton::config::{NodeConfig, Secret};
    let mut cfg = NodeConfig {
        node_id: "a1".into(),
        backend: BackendKind::Redis,
        state_dir: state.to_owned(),
        ..NodeConfig::for_backend(BackendKind::Redis)
    };
    std::fs::create_dir_all(&cfg.state_dir).unwrap();
    cfg.scheduler.enabled = false;
    cfg.resource.database_url =
        baton_lab::fleet::servers::PgServer::multi_host_url(&[&servers.pg], "baton_app").unwrap();
    // Any host and port: behind Sentinel the URL gives the scheme and the credentials only.
    cfg.redis.url = format!("redis://:{data_password}@127.0.0.1:1/");
    cfg.redis.sentinels = servers.set.addrs();
    cfg.redis.master_name = Some(servers.set.master_name.clone());
    cfg.redis.sentinel_password = sentinel_password.map(Secret::new);
    cfg.validate().expect("a valid config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let node = baton::node::NodeBuilder::new(cfg)
        .with_default_work()
        .serve_http(listener)
        .start()
        .await
        .expect("start the node");
    (node, addr)
}

/// `POST /next` answered 200 within `within`: its token.
async fn next_within(addr: &str, within: Duration) -> Option<i64> {
    let client = baton_lab::fleet::client::NodeClient::new(Duration::from_secs(2));
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(r) = client.post(addr, "/next").await {
            if r.status == 200 {
                return r.json()["token"].as_i64();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Passwords behind Sentinel (issue 32): the data servers ask for one (`requirepass`, and
/// `masterauth` between them; the Sentinels reach them with `sentinel auth-pass`), the Sentinels
/// for another (their own `requirepass`). A `redis` node with the data servers' password in
/// `[redis] url` and the Sentinels' in `sentinel_password` leads, serves `POST /next`, and after
/// `kill -9` of the primary serves again from the replica the Sentinels promoted. The control
/// first: the same node without `sentinel_password` never leads (the Sentinels refuse it), so the
/// option is what lets it in. (TLS to the Sentinels is not exercised here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_and_data_passwords() {
    use baton_lab::fleet::random_hex;
    use baton_lab::fleet::redis_server::RedisSentinelSet;
    use baton_lab::fleet::servers::{free_ports, stop_pid, PgServer};
    let _serial = SERIAL.lock().await;
    let dir = tempfile::Builder::new()
        .prefix("baton-sentinel-auth-")
        .tempdir()
        .unwrap();
    let root = dir.path().to_owned();
    let (data_pw, sentinel_pw) = (random_hex(16), random_hex(16));
    let (dp, sp) = (data_pw.clone(), sentinel_pw.clone());
    let (pg, primary, set) = tokio::task::spawn_blocking(move || {
        let pg = PgServer::start_on_free_port(&root.join("pg")).expect("postgres");
        let port = free_ports(1).unwrap()[0];
        let primary = RedisServer::start_with_password(&root.join("redis-primary"), port, &dp)
            .expect("the Redis primary");
        let set = RedisSentinelSet::start_with_password(&root, &primary, Some(&sp))
            .expect("a replica and three Sentinels, with passwords");
        (pg, primary, set)
    })
    .await
    .unwrap();
    let servers = AuthServers {
        pg,
        primary,
        set,
        _dir: dir,
    };
    baton::work::fence::migrate(&servers.pg.admin_url(), Some(true))
        .await
        .expect("migrate");
    let state = tempfile::tempdir().unwrap();

    // The control: the Sentinels refuse a client without their password.
    let (node, addr) = auth_node(&servers, &data_pw, None, &state.path().join("a")).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !node.is_leading(),
        "a node without the Sentinels' password leads: the Sentinels do not ask for one?"
    );
    assert_eq!(next_within(&addr, Duration::from_millis(500)).await, None);
    node.shutdown().await.unwrap();

    let (node, addr) = auth_node(
        &servers,
        &data_pw,
        Some(&sentinel_pw),
        &state.path().join("b"),
    )
    .await;
    let token = next_within(&addr, Duration::from_secs(30))
        .await
        .expect("the node with both passwords serves POST /next within 30 s");

    // The failover: the Sentinels (reached with their password) promote the replica (reached
    // with the data servers' password), and the node follows them to it.
    stop_pid(servers.primary.pid, libc::SIGKILL, Duration::from_secs(5));
    let killed_at = Instant::now();
    let (set, replica_port) = (servers.set.clone(), servers.set.replica.port);
    let named = tokio::task::spawn_blocking(move || {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if set.named_primary() == Some(replica_port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })
    .await
    .unwrap();
    assert!(named, "the Sentinels did not name the replica within 30 s");
    let after = next_within(&addr, Duration::from_secs(30))
        .await
        .expect("the node serves POST /next from the promoted replica within 30 s of the naming");
    eprintln!(
        "passwords behind Sentinel: served under token {token}, the replica named and served again under token {after} {:.2} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    node.shutdown().await.unwrap();
}

/// A `redis` node on `servers` over TLS: `rediss://` with the data servers' password, trusting
/// exactly `ca_file`, the Sentinels' password; sequencer on, scheduler off.
fn tls_node_config(
    servers: &AuthServers,
    id: &str,
    data_password: &str,
    sentinel_password: &str,
    ca_file: &std::path::Path,
    state: &std::path::Path,
) -> baton::config::NodeConfig {
    use baton::backends::BackendKind;
    use baton::config::{NodeConfig, Secret};
    let mut cfg = NodeConfig {
        node_id: id.into(),
        backend: BackendKind::Redis,
        state_dir: state.join(id),
        ..NodeConfig::for_backend(BackendKind::Redis)
    };
    std::fs::create_dir_all(&cfg.state_dir).unwrap();
    cfg.scheduler.enabled = false;
    cfg.resource.database_url =
        baton_lab::fleet::servers::PgServer::multi_host_url(&[&servers.pg], "baton_app").unwrap();
    // Behind Sentinel the URL gives the scheme (rediss: TLS to the data servers and to the
    // Sentinels) and the data servers' credentials; its host and port are not used.
    cfg.redis.url = format!("rediss://:{data_password}@127.0.0.1:1/");
    cfg.redis.tls_ca_file = Some(ca_file.to_owned());
    cfg.redis.sentinels = servers.set.addrs();
    cfg.redis.master_name = Some(servers.set.master_name.clone());
    cfg.redis.sentinel_password = Some(Secret::new(sentinel_password));
    cfg.validate().expect("a valid config");
    cfg
}

/// One request through the configured backend (`leader()`): its error, or `None` when it was
/// answered within 10 s.
async fn leader_error(cfg: &baton::config::NodeConfig) -> Option<String> {
    let elector = match baton::backends::build(cfg).await {
        Err(e) => return Some(e.to_string()),
        Ok(elector) => elector,
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), elector.leader()).await;
    let _ = elector.close().await;
    match answer {
        Err(_) => Some("timed out".into()),
        Ok(Err(e)) => Some(e.to_string()),
        Ok(Ok(_)) => None,
    }
}

/// The node among `nodes` that leads, other than `not`, with a token above `above`, within
/// `within`: its index and token.
async fn leader_among(
    nodes: &[(baton::node::NodeHandle, String)],
    not: Option<usize>,
    above: i64,
    within: Duration,
) -> Option<(usize, i64)> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let leading: Vec<(usize, i64)> = nodes
            .iter()
            .enumerate()
            .filter(|(i, (n, _))| Some(*i) != not && n.is_leading())
            .filter_map(|(i, (n, _))| n.token().map(|t| (i, t.0)))
            .filter(|(_, t)| *t > above)
            .collect();
        if let [one] = leading[..] {
            return Some(one);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Sentinel over TLS (issue 32), against real servers: a primary and a replica that speak TLS
/// only and replicate over TLS, three Sentinels that listen on TLS only and reach the data
/// servers and each other over TLS, passwords on both (the data servers' in the `rediss://` URL,
/// the Sentinels' in `sentinel_password`), all certificates from a private CA made here.
///
/// - Every server refuses plain text (our probe gets no `PONG` without TLS, one with it).
/// - The control: a node trusting another CA is refused, with an error that names the
///   certificate and the Sentinels.
/// - Three `redis` nodes (fence on) elect a leader and serve `POST /next` under load; `kill -9`
///   of the primary, the Sentinels promote the replica (and the old primary comes back as its
///   replica, in sync over TLS); the leader steps down and another node is elected on the
///   promoted replica with a higher token, which the fence accepts and serves under; the
///   checker passes over the ledger and the load's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_with_passwords_fails_over_under_the_fence() {
    use baton_lab::fleet::random_hex;
    use baton_lab::fleet::redis_server::RedisSentinelSet;
    use baton_lab::fleet::servers::{free_ports, stop_pid, PgServer};
    let _serial = SERIAL.lock().await;
    let dir = tempfile::Builder::new()
        .prefix("baton-sentinel-tls-")
        .tempdir()
        .unwrap();
    let root = dir.path().to_owned();
    let ours = common::test_ca(&root, "ca-ours");
    let other = common::test_ca(&root, "ca-other");
    let (data_pw, sentinel_pw) = (random_hex(16), random_hex(16));
    let (dp, sp, tls) = (data_pw.clone(), sentinel_pw.clone(), ours.clone());
    let (pg, primary, set) = tokio::task::spawn_blocking(move || {
        let pg = PgServer::start_on_free_port(&root.join("pg")).expect("postgres");
        let port = free_ports(1).unwrap()[0];
        let primary =
            RedisServer::start_tls_with_password(&root.join("redis-primary"), port, &tls, &dp)
                .expect("the Redis primary, TLS only");
        let set = RedisSentinelSet::start_with_password(&root, &primary, Some(&sp))
            .expect("a TLS replica in sync and three TLS Sentinels that found each other");
        (pg, primary, set)
    })
    .await
    .unwrap();
    let servers = AuthServers {
        pg,
        primary,
        set,
        _dir: dir,
    };
    baton::work::fence::migrate(&servers.pg.admin_url(), Some(true))
        .await
        .expect("migrate (fence on)");

    // TLS only, everywhere: the same probe without TLS gets nothing back.
    let all: Vec<RedisServer> = [servers.primary.clone(), servers.set.replica.clone()]
        .into_iter()
        .chain(servers.set.sentinels.iter().cloned())
        .collect();
    let plain_answers = tokio::task::spawn_blocking(move || {
        all.iter()
            .map(|s| {
                assert!(s.tls.is_some(), "port {} started without TLS", s.port);
                let mut plain = s.clone();
                plain.tls = None;
                (s.port, s.ping(), plain.ping())
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for (port, over_tls, plain) in plain_answers {
        assert!(over_tls, "port {port} does not answer PING over TLS");
        assert!(!plain, "port {port} answers PING in plain text");
    }

    let state = tempfile::tempdir().unwrap();
    // The control: a node that trusts another CA is refused by the Sentinels' certificates,
    // and says so.
    let stranger = tls_node_config(
        &servers,
        "x1",
        &data_pw,
        &sentinel_pw,
        &other.ca_file,
        state.path(),
    );
    let refused = leader_error(&stranger)
        .await
        .expect("a node trusting another CA was answered through the TLS Sentinels");
    eprintln!("trusting another CA: {refused}");
    assert!(
        refused.to_lowercase().contains("certificate"),
        "the refusal does not name the certificate: {refused}"
    );
    assert!(
        refused.contains("Sentinels"),
        "the refusal does not say it was the Sentinels': {refused}"
    );

    // Three nodes over TLS, the fence on.
    let mut nodes = Vec::new();
    for id in ["t1", "t2", "t3"] {
        let cfg = tls_node_config(
            &servers,
            id,
            &data_pw,
            &sentinel_pw,
            &ours.ca_file,
            state.path(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let node = baton::node::NodeBuilder::new(cfg)
            .with_default_work()
            .serve_http(listener)
            .start()
            .await
            .expect("start the node");
        nodes.push((node, addr));
    }
    let (first, first_token) = leader_among(&nodes, None, 0, Duration::from_secs(40))
        .await
        .expect("one of three nodes leads over TLS within 40 s");
    next_within(&nodes[first].1, Duration::from_secs(30))
        .await
        .expect("the leader serves POST /next over TLS to Redis");
    let stop = Arc::new(AtomicBool::new(false));
    let mut spec = LoadSpec::new(
        nodes.iter().map(|(_, a)| a.clone()).collect(),
        100.0,
        Duration::from_secs(180),
    );
    spec.connections = 4;
    spec.stop = Some(stop.clone());
    let run = tokio::spawn(load::run(spec));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The failover, as `baton chaos sentinel-failover` does it: kill -9 of the primary, the
    // Sentinels (over TLS) name the replica, the old primary comes back as its replica (over
    // TLS) and syncs.
    let mut old = servers.primary.clone();
    let (set, replica_port) = (servers.set.clone(), servers.set.replica.port);
    let (named_after, in_sync) = tokio::task::spawn_blocking(move || {
        stop_pid(old.pid, libc::SIGKILL, Duration::from_secs(5));
        let killed = Instant::now();
        let until = killed + Duration::from_secs(30);
        while set.named_primary() != Some(replica_port) {
            assert!(
                Instant::now() < until,
                "the TLS Sentinels did not name the replica within 30 s; first Sentinel's log: {}",
                set.sentinels[0].log().display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let named_after = killed.elapsed();
        let agreed_by = Instant::now() + Duration::from_secs(10);
        while !set.all_name(replica_port) && Instant::now() < agreed_by {
            std::thread::sleep(Duration::from_millis(50));
        }
        old.restart_as_replica_of(replica_port)
            .expect("the old primary back as a replica");
        let in_sync = old.wait_replica_in_sync(Duration::from_secs(15)).is_ok();
        old.stop();
        (named_after, in_sync)
    })
    .await
    .unwrap();
    eprintln!("the TLS Sentinels named the replica {named_after:.2?} after the kill");
    assert!(
        in_sync,
        "the old primary did not sync from the promoted replica over TLS"
    );

    // After the failover the leader steps down; another node is elected through the TLS
    // Sentinels, on the promoted replica, with a higher token, and serves under it.
    let db = common::connect(&servers.pg.admin_url()).await;
    let (leader, token) = leader_among(&nodes, None, 0, Duration::from_secs(30))
        .await
        .expect("a leader after the failover");
    let fence_max = max_token(&db).await;
    let ledger_before: i64 = db
        .query_one("SELECT coalesce(max(pos), 0) FROM baton.fence_log", &[])
        .await
        .unwrap()
        .get(0);
    nodes[leader]
        .0
        .step_down(None)
        .await
        .expect("the leader steps down");
    let (next, next_token) = leader_among(&nodes, Some(leader), token.max(fence_max), SETTLE)
        .await
        .expect("another node elected with a higher token after the failover");
    let until = Instant::now() + Duration::from_secs(30);
    let (served_token, served_by) = loop {
        if let Some(found) = common::serving_claim(&db, ledger_before, fence_max + 1).await {
            break found;
        }
        assert!(
            Instant::now() < until,
            "no term above {fence_max} claimed and served within 30 s of the step-down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "over TLS: t{} led at token {first_token}; after the failover t{} (token {token}) stepped down, t{} elected at token {next_token}; the fence accepted and served {served_by} at {served_token} (max before {fence_max})",
        first + 1,
        leader + 1,
        next + 1
    );
    assert!(served_token > fence_max);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let report = run.await.unwrap().unwrap();
    let acked_after = report
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok && o.token.is_some_and(|t| t >= served_token))
        .count();
    assert!(
        acked_after > 0,
        "no ID acknowledged under the new term: {:?}",
        report.summary()
    );
    let mut input = check::load::read(&db, None).await.unwrap();
    input.acks = acks_from_ops("load", &report.ops);
    let verdict = check::run(&input);
    eprintln!("{}", verdict.line());
    assert!(verdict.pass, "{}", verdict.render());
    assert!(verdict.acked > 0);
    for (node, _) in &nodes {
        node.shutdown().await.unwrap();
    }
}
