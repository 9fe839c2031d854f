//! TLS where a deployment needs it (SPEC §10): the client HTTP API over HTTPS only, and TLS to
//! PostgreSQL (fenced resource and pg-lease store), Redis and etcd. Every certificate comes from
//! a private CA generated here, at test time; every server is ours, on loopback.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use baton::backends::BackendKind;
use baton::config::NodeConfig;
use baton::node::{NodeBuilder, NodeHandle};
use baton_lab::fleet::client::NodeClient;
use baton_lab::fleet::redis_server::RedisServer;
use baton_lab::fleet::servers::{free_ports, EtcdCluster, PgServer, ServerTls};

/// A CA (its certificate in `ca.pem`) and a server certificate it issued for 127.0.0.1 and
/// `localhost`, all PEM files in `dir`.
struct TestCa {
    dir: PathBuf,
    server: ServerTls,
}

impl TestCa {
    fn generate(dir: &Path, name: &str) -> TestCa {
        TestCa {
            dir: dir.join(name),
            server: common::test_ca(dir, name),
        }
    }

    fn ca_file(&self) -> &Path {
        &self.server.ca_file
    }
}

/// Two unrelated CAs: `ours` issued the servers' certificates, `other` did not.
struct Cas {
    tmp: tempfile::TempDir,
    ours: TestCa,
    other: TestCa,
}

fn cas() -> Cas {
    let tmp = tempfile::tempdir().unwrap();
    let ours = TestCa::generate(tmp.path(), "ours");
    let other = TestCa::generate(tmp.path(), "other");
    assert_ne!(ours.dir, other.dir);
    Cas { tmp, ours, other }
}

/// A private PostgreSQL (TLS-only for every role but the superuser when `tls` is given),
/// migrated and provisioned; stopped however the test ends.
struct Pg {
    server: PgServer,
}

impl Drop for Pg {
    fn drop(&mut self) {
        self.server.stop();
    }
}

async fn private_pg(root: &Path, tls: Option<&ServerTls>) -> Pg {
    let port = free_ports(1).unwrap()[0];
    let (root, tls) = (root.join("pg"), tls.cloned());
    let server = tokio::task::spawn_blocking(move || match tls {
        Some(tls) => PgServer::start_tls(&root, port, &tls),
        None => PgServer::start(&root, port),
    })
    .await
    .unwrap()
    .expect("start a private PostgreSQL");
    let pg = Pg { server };
    baton::work::fence::migrate(&pg.server.admin_url(), Some(true))
        .await
        .expect("migrate the fenced resource");
    baton::backends::pg_lease::provision(&pg.server.admin_url())
        .await
        .expect("provision the pg-lease role");
    pg
}

/// One pg-lease node on `pg`, its state under `root`; sequencer on (`POST /next` is a fenced
/// write), scheduler off.
fn node_config(pg: &Pg, root: &Path, node_id: &str) -> NodeConfig {
    let mut cfg = NodeConfig {
        node_id: node_id.into(),
        backend: BackendKind::PgLease,
        state_dir: root.join(node_id),
        // A lease backend's own timing (the default config is raft's).
        ..NodeConfig::for_backend(BackendKind::PgLease)
    };
    cfg.scheduler.enabled = false;
    cfg.resource.database_url = pg.server.app_url();
    cfg.pg_lease.database_url = pg.server.lease_url();
    std::fs::create_dir_all(&cfg.state_dir).unwrap();
    cfg
}

async fn start_serving(cfg: NodeConfig) -> anyhow::Result<(NodeHandle, String)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let node = NodeBuilder::new(cfg)
        .with_default_work()
        .serve_http(listener)
        .start()
        .await?;
    Ok((node, addr))
}

async fn wait_leading(node: &NodeHandle, within: Duration) {
    let until = Instant::now() + within;
    while !node.is_leading() {
        assert!(Instant::now() < until, "not leading within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `POST /next` once the leader's work is up (it answers 503 `not_ready` while it starts).
async fn next_when_ready(client: &NodeClient, addr: &str) -> baton_lab::fleet::client::Reply {
    common::post_when_ready(client, addr, "/next", Duration::from_secs(15)).await
}

/// What a plain-text HTTP request to `addr` gets back before the server closes (or 3 s pass).
fn plain_http_answer(addr: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = s.write_all(b"GET /status HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_api_serves_https_only_verified_against_its_ca() {
    let cas = cas();
    let pg = private_pg(cas.tmp.path(), None).await;
    let mut cfg = node_config(&pg, cas.tmp.path(), "t1");
    cfg.http.tls_cert_file = Some(cas.ours.server.cert_file.clone());
    cfg.http.tls_key_file = Some(cas.ours.server.key_file.clone());
    // A short head bound, which also bounds the handshake (checked below).
    cfg.http.header_read_timeout_ms = 1000;
    let (node, addr) = start_serving(cfg).await.expect("start the node");
    wait_leading(&node, Duration::from_secs(15)).await;

    let client = NodeClient::new(Duration::from_secs(5))
        .with_tls_ca(cas.ours.ca_file())
        .unwrap();
    let status = client
        .get(&addr, "/status")
        .await
        .expect("GET /status over HTTPS");
    assert_eq!(status.status, 200);
    assert_eq!(status.json()["node_id"], "t1");
    assert_eq!(status.json()["role"], "leader");
    // A fenced write, answered over HTTPS.
    let next = next_when_ready(&client, &addr).await;
    assert_eq!(next.status, 200, "{:?}", next.body);
    assert!(next.json()["token"].as_i64().unwrap() >= 1);

    // Plain HTTP gets no HTTP answer, however it asks.
    let answer = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || plain_http_answer(&addr)
    })
    .await
    .unwrap();
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    assert!(NodeClient::new(Duration::from_secs(3))
        .get(&addr, "/status")
        .await
        .map(|r| r.status.as_u16())
        .is_err());

    // A client trusting another CA fails the handshake.
    let stranger = NodeClient::new(Duration::from_secs(5))
        .with_tls_ca(cas.other.ca_file())
        .unwrap();
    let err = stranger.get(&addr, "/status").await.unwrap_err();
    assert!(
        matches!(err, baton_lab::fleet::client::ClientError::Request(..)),
        "{err}"
    );

    // A client that opens TCP and never handshakes is closed within the head bound (1 s), not
    // left holding its slot.
    let held_for = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            let t0 = Instant::now();
            let mut s = TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap_or(0);
            assert_eq!(n, 0, "the server sent something to a silent client");
            t0.elapsed()
        }
    })
    .await
    .unwrap();
    assert!(
        held_for >= Duration::from_millis(900) && held_for < Duration::from_secs(5),
        "a silent client was held for {held_for:?}"
    );
    // And the server still serves.
    assert_eq!(client.get(&addr, "/status").await.unwrap().status, 200);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_config_is_checked_before_the_node_starts() {
    let cas = cas();
    let pg = private_pg(cas.tmp.path(), None).await;
    // A key that is not the certificate's.
    let mut cfg = node_config(&pg, cas.tmp.path(), "t2");
    cfg.http.tls_cert_file = Some(cas.ours.server.cert_file.clone());
    cfg.http.tls_key_file = Some(cas.other.server.key_file.clone());
    let err = format!(
        "{:#}",
        start_serving(cfg).await.err().expect("a mismatched key")
    );
    assert!(err.contains("TLS"), "{err}");
    // A certificate file that does not exist.
    let mut cfg = node_config(&pg, cas.tmp.path(), "t3");
    cfg.http.tls_cert_file = Some(cas.tmp.path().join("missing.pem"));
    cfg.http.tls_key_file = Some(cas.ours.server.key_file.clone());
    let err = format!(
        "{:#}",
        start_serving(cfg).await.err().expect("a missing file")
    );
    assert!(err.contains("missing.pem"), "{err}");
    // The key's contents never appear in an error.
    let key = std::fs::read_to_string(&cas.other.server.key_file).unwrap();
    let body = key.lines().nth(1).unwrap();
    assert!(!err.contains(body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_and_the_lease_go_over_tls_to_postgres() {
    let cas = cas();
    let pg = private_pg(cas.tmp.path(), Some(&cas.ours.server)).await;

    let mut cfg = node_config(&pg, cas.tmp.path(), "p1");
    cfg.resource.tls_ca_file = Some(cas.ours.ca_file().to_owned());
    cfg.pg_lease.tls_ca_file = Some(cas.ours.ca_file().to_owned());
    let (node, addr) = start_serving(cfg).await.expect("start a node over TLS");
    wait_leading(&node, Duration::from_secs(15)).await;
    let client = NodeClient::new(Duration::from_secs(5));
    let first = next_when_ready(&client, &addr).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let second = client.post(&addr, "/next").await.unwrap();
    assert!(second.json()["seq"].as_i64() > first.json()["seq"].as_i64());
    // Every connection of the node's roles is TLS (the server would refuse any other).
    let plain = pg
        .server
        .psql(
            "baton",
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.usename IN ('baton_app', 'baton_lease')",
        )
        .unwrap();
    let (tls_n, plain_n) = plain.trim().split_once('|').unwrap();
    assert!(tls_n.parse::<u32>().unwrap() >= 2, "{plain}");
    assert_eq!(plain_n, "0", "{plain}");
    node.shutdown().await.unwrap();

    // Without the CA a node connects in plain text, which the server refuses; trusting another
    // CA, it refuses the server's certificate. Both for the fence and for the lease store (a
    // node starts anyway: the resource may be down at start, so its writes report it).
    let plain = node_config(&pg, cas.tmp.path(), "p2");
    let err = fence_error(&plain).await;
    assert!(err.contains("no encryption"), "{err}");
    let err = leader_error(&plain)
        .await
        .expect("pg-lease in plain text refused");
    assert!(err.contains("no encryption"), "{err}");

    let mut stranger = node_config(&pg, cas.tmp.path(), "p3");
    stranger.resource.tls_ca_file = Some(cas.other.ca_file().to_owned());
    stranger.pg_lease.tls_ca_file = Some(cas.other.ca_file().to_owned());
    let err = fence_error(&stranger).await;
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    let err = leader_error(&stranger)
        .await
        .expect("pg-lease with another CA refused");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

/// The error of one fenced read through `cfg.resource`.
async fn fence_error(cfg: &NodeConfig) -> String {
    let fence = baton::work::Fence::new(&cfg.resource, &cfg.node_id).expect("a pool");
    match fence.fencing_enabled().await {
        Ok(on) => panic!("the resource answered ({on}) a client it should refuse"),
        Err(e) => format!("{e:#}"),
    }
}

/// Builds the configured backend and campaigns once; its token, or the error.
async fn campaign_once(cfg: &NodeConfig) -> Result<i64, String> {
    let elector = baton::backends::build(cfg)
        .await
        .map_err(|e| e.to_string())?;
    let win = tokio::time::timeout(Duration::from_secs(10), elector.campaign())
        .await
        .map_err(|_| "campaign timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let token = win.token.0;
    let _ = elector.resign(None).await;
    let _ = elector.close().await;
    Ok(token)
}

/// One request through the backend (a client trusting the wrong CA): its error, or `None` when
/// it was answered.
async fn leader_error(cfg: &NodeConfig) -> Option<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_backend_elects_over_tls() {
    let cas = cas();
    let port = free_ports(1).unwrap()[0];
    let (root, tls) = (cas.tmp.path().join("redis"), cas.ours.server.clone());
    let redis = tokio::task::spawn_blocking(move || RedisServer::start_tls(&root, port, &tls))
        .await
        .unwrap()
        .expect("start a private TLS Redis");
    let mut cfg = NodeConfig {
        node_id: "r1".into(),
        backend: BackendKind::Redis,
        // A lease backend's own timing (the default config is raft's).
        ..NodeConfig::for_backend(BackendKind::Redis)
    };
    cfg.redis.url = redis.url();
    assert!(cfg.redis.url.starts_with("rediss://"));
    cfg.redis.tls_ca_file = Some(cas.ours.ca_file().to_owned());
    let token = campaign_once(&cfg).await;

    let mut stranger = cfg.clone();
    stranger.node_id = "r2".into();
    stranger.redis.tls_ca_file = Some(cas.other.ca_file().to_owned());
    let refused = leader_error(&stranger).await;
    redis.stop();
    assert!(token.expect("a campaign over TLS") >= 1);
    let refused = refused.expect("a client trusting another CA was answered");
    assert!(!refused.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_backend_elects_over_tls() {
    let cas = cas();
    let (root, tls) = (cas.tmp.path().join("etcd"), cas.ours.server.clone());
    let etcd =
        tokio::task::spawn_blocking(move || EtcdCluster::start_tls(&root, 1, 100, 1000, &tls))
            .await
            .unwrap()
            .expect("start a private TLS etcd");
    let mut cfg = NodeConfig {
        node_id: "e1".into(),
        backend: BackendKind::Etcd,
        // A lease backend's own timing (the default config is raft's).
        ..NodeConfig::for_backend(BackendKind::Etcd)
    };
    cfg.etcd.endpoints = etcd.endpoints();
    assert!(cfg.etcd.endpoints[0].starts_with("https://"));
    cfg.etcd.tls_ca_file = Some(cas.ours.ca_file().to_owned());
    cfg.etcd.election_name = "tls".into();
    let token = campaign_once(&cfg).await;

    let mut stranger = cfg.clone();
    stranger.node_id = "e2".into();
    stranger.etcd.tls_ca_file = Some(cas.other.ca_file().to_owned());
    let refused = leader_error(&stranger).await;
    etcd.stop();
    assert!(token.expect("a campaign over TLS") >= 1);
    let refused = refused.expect("a client trusting another CA was answered");
    assert!(!refused.is_empty());
}

/// Two sharded nodes (K = 4) serving HTTPS only, listed in `[shards] members`; each verifies the
/// other against `member_ca` (`[http] member_ca_file`). Both are started before either is waited on.
async fn sharded_https_pair(
    cas: &Cas,
    pg: &Pg,
    member_ca: [&Path; 2],
) -> Vec<(NodeHandle, String)> {
    let listeners = [
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    ];
    let members: Vec<baton::config::MemberSpec> = ["s1", "s2"]
        .iter()
        .zip(&listeners)
        .map(|(id, l)| baton::config::MemberSpec {
            id: (*id).into(),
            addr: l.local_addr().unwrap().to_string(),
        })
        .collect();
    let mut nodes = Vec::new();
    for ((listener, member), ca) in listeners.into_iter().zip(&members).zip(member_ca) {
        let mut cfg = node_config(pg, cas.tmp.path(), &member.id);
        cfg.sequencer.enabled = false;
        cfg.advertise_addr = Some(member.addr.clone());
        cfg.shards.count = 4;
        cfg.shards.members = members.clone();
        cfg.http.tls_cert_file = Some(cas.ours.server.cert_file.clone());
        cfg.http.tls_key_file = Some(cas.ours.server.key_file.clone());
        cfg.http.member_ca_file = Some(ca.to_owned());
        let node = NodeBuilder::new(cfg)
            .serve_http(listener)
            .start()
            .await
            .expect("start a sharded HTTPS node");
        nodes.push((node, member.addr.clone()));
    }
    nodes
}

/// Placement asks the members over HTTPS when the fleet serves HTTPS: with the CA their
/// certificates chain to, both count each other live and split the 4 shards 2 and 2. A member
/// that verifies against a CA that did not issue them refuses its peer's certificate, counts
/// itself alone, and seeks every shard (safe: each shard still has one leader, but nothing is
/// balanced), so the verification is really made. Without `member_ca_file` such a config is
/// refused before the node starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_placement_probes_its_https_members_against_their_ca() {
    let cas = cas();
    let pg = private_pg(cas.tmp.path(), None).await;

    let mut cfg = node_config(&pg, cas.tmp.path(), "s0");
    cfg.shards.count = 4;
    cfg.shards.members = vec![baton::config::MemberSpec {
        id: "s0".into(),
        addr: "127.0.0.1:1".into(),
    }];
    cfg.http.tls_cert_file = Some(cas.ours.server.cert_file.clone());
    cfg.http.tls_key_file = Some(cas.ours.server.key_file.clone());
    let err = format!(
        "{:#}",
        cfg.validate()
            .expect_err("HTTPS shards without a member CA")
    );
    assert!(err.contains("member_ca_file"), "{err}");

    let ours = cas.ours.ca_file();
    let nodes = sharded_https_pair(&cas, &pg, [ours, ours]).await;
    let until = Instant::now() + Duration::from_secs(40);
    loop {
        let led: Vec<usize> = nodes.iter().map(|(n, _)| n.shards_led().len()).collect();
        let live: Vec<usize> = nodes
            .iter()
            .map(|(n, _)| n.placement().live.len())
            .collect();
        if led == [2, 2] && live == [2, 2] {
            break;
        }
        assert!(
            Instant::now() < until,
            "no 2 + 2 split over HTTPS within 40 s: led {led:?}, live {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (node, _) in nodes {
        node.shutdown().await.unwrap();
    }

    // s2 verifies against the other CA: it cannot see s1 live, ever.
    let nodes = sharded_https_pair(&cas, &pg, [ours, cas.other.ca_file()]).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let view = nodes[1].0.placement();
    assert_eq!(
        view.live,
        ["s2"],
        "s2 trusted a certificate its CA did not issue"
    );
    assert_eq!(nodes[0].0.placement().live, ["s1", "s2"]);
    for (node, _) in nodes {
        node.shutdown().await.unwrap();
    }
}
