//! The raft backend against the real thing: three `RaftElector`s in-process, each serving its
//! own authenticated peer listener, sharing a cluster secret. A node is isolated with the
//! `isolate-peers` fault file (both directions), as in a real fleet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::backends::raft::faults::{isolate_peers_path, CHECK_EVERY};
use baton::backends::raft::RaftElector;
use baton::backends::{BackendKind, Elector, ElectorError, FenceToken, Win};
use baton::config::{NodeConfig, PeerSpec, Secret};
use openraft::async_runtime::WatchReceiver;
use tokio::sync::mpsc;

mod common;

/// The tests are timing-sensitive (150-300 ms elections) on a 2-core machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Cluster {
    _dirs: Vec<tempfile::TempDir>,
    cfgs: Vec<NodeConfig>,
    electors: Vec<Arc<RaftElector>>,
}

impl Cluster {
    /// `n` members with this file's timing (150-300 ms elections, renewals well inside the grant).
    async fn start(n: usize) -> Cluster {
        Cluster::start_with(n, |cfg| {
            cfg.election_timeout_ms = "150-300".into();
            // The grant is min(lease, 150 ms election minimum): renew well inside it.
            cfg.renew_interval_ms = 40;
            cfg.retry_interval_ms = 20;
            cfg.deadline_margin_ms = 20;
        })
        .await
    }

    /// `n` members configured as a user would start: `NodeConfig::default()` plus the node id,
    /// a state dir, the peers and the cluster secret, then `tune`.
    async fn start_with(n: usize, tune: fn(&mut NodeConfig)) -> Cluster {
        let (dirs, mut cfgs) =
            common::raft_member_configs(n, "raft-backend-test-secret-0123456789");
        cfgs.iter_mut().for_each(tune);
        let mut c = Cluster {
            _dirs: dirs,
            cfgs,
            electors: Vec::new(),
        };
        for i in 0..n {
            let e = c.open(i).await;
            c.electors.push(e);
        }
        c
    }

    /// Starts (or restarts) node `i`'s elector from its state dir. Its previous incarnation's
    /// peer listener may take a moment to let go of the port, so binding is retried briefly.
    async fn open(&self, i: usize) -> Arc<RaftElector> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match RaftElector::start(&self.cfgs[i]).await {
                Ok(e) => return Arc::new(e),
                Err(e) if Instant::now() < deadline && e.to_string().contains("binding") => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("starting n{}: {e}", i + 1),
            }
        }
    }

    async fn restart(&mut self, i: usize) {
        self.electors[i].close().await.unwrap();
        // Drop the old incarnation (and its peer listener) before the new one binds the port.
        let placeholder = self.electors.remove(i);
        drop(placeholder);
        let e = self.open(i).await;
        self.electors.insert(i, e);
    }

    /// Cuts (or heals) node `i`'s peer traffic both ways; returns once the fault is in effect.
    async fn isolate(&self, i: usize, cut: bool) {
        let path = isolate_peers_path(&self.cfgs[i].state_dir);
        if cut {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"").unwrap();
        } else {
            let _ = std::fs::remove_file(&path);
        }
        tokio::time::sleep(CHECK_EVERY + Duration::from_millis(10)).await;
    }

    /// Campaigns on every listed node; wins arrive on the channel as `(index, win, at)`.
    fn campaign(&self, which: &[usize]) -> Campaigns {
        let (tx, rx) = mpsc::unbounded_channel();
        let tasks = which
            .iter()
            .map(|&i| {
                let (e, tx) = (self.electors[i].clone(), tx.clone());
                tokio::spawn(async move {
                    let r = e.campaign().await;
                    let _ = tx.send((i, r, Instant::now()));
                })
            })
            .collect();
        Campaigns { rx, tasks }
    }
}

struct Campaigns {
    rx: mpsc::UnboundedReceiver<(usize, Result<Win, ElectorError>, Instant)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Campaigns {
    async fn next_win(&mut self, within: Duration) -> (usize, Win, Instant) {
        let (i, r, at) = tokio::time::timeout(within, self.rx.recv())
            .await
            .expect("no campaign won in time")
            .expect("campaign channel closed");
        (
            i,
            r.unwrap_or_else(|e| panic!("campaign on n{} failed: {e}", i + 1)),
            at,
        )
    }

    /// Asserts no further campaign returns for `d`.
    async fn none_for(&mut self, d: Duration) {
        if let Ok(Some((i, r, _))) = tokio::time::timeout(d, self.rx.recv()).await {
            panic!(
                "a second campaign returned while the first winner leads: n{} {:?}",
                i + 1,
                r.map(|w| w.token)
            );
        }
    }
}

impl Drop for Campaigns {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

const ELECT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_wins_and_failover_raises_the_token() {
    let _g = SERIAL.lock().await;
    let c = Cluster::start(3).await;
    let mut camp = c.campaign(&[0, 1, 2]);
    let (first, win, _) = camp.next_win(ELECT).await;
    assert!(win.token > FenceToken(0));
    // Exactly one: the others keep waiting while the winner renews.
    for _ in 0..10 {
        let g = c.electors[first].renew().await.unwrap();
        assert!(g.is_some(), "the winner must be able to renew");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    camp.none_for(Duration::from_millis(200)).await;
    for e in &c.electors {
        let l = e
            .leader()
            .await
            .unwrap()
            .expect("everyone knows the leader");
        assert_eq!(l.node_id, c.cfgs[first].node_id);
        assert_eq!(
            l.http_addr.as_deref(),
            c.cfgs[first].advertise_addr.as_deref()
        );
    }
    for (i, e) in c.electors.iter().enumerate() {
        if i != first {
            assert!(
                e.renew().await.unwrap().is_none(),
                "a follower has no lease to renew"
            );
        }
    }

    // The leader goes away: another node wins, with a higher token.
    c.electors[first].close().await.unwrap();
    let (second, win2, _) = camp.next_win(ELECT).await;
    assert_ne!(second, first);
    assert!(
        win2.token > win.token,
        "failover token {} must exceed {}",
        win2.token,
        win.token
    );
    camp.none_for(Duration::from_millis(300)).await;
}

/// The default config is the default backend's and starts as it is: three members from
/// `NodeConfig::default()` + id, state dir, peers and secret elect exactly one leader, which keeps
/// its lease by renewing at the default interval. (Before the defaults were raft's, `start`
/// refused them: a 3000/1000 ms lease timing does not fit raft's 150 ms grant.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_from_the_defaults_elect_one_leader() {
    let _g = SERIAL.lock().await;
    let c = Cluster::start_with(3, |_| {}).await;
    assert!(c.cfgs.iter().all(|cfg| cfg.backend == BackendKind::Raft));
    let mut camp = c.campaign(&[0, 1, 2]);
    let (first, win, _) = camp.next_win(ELECT).await;
    assert!(win.token > FenceToken(0));
    let renew_every = c.cfgs[first].renew_interval();
    for _ in 0..20 {
        let g = c.electors[first].renew().await.unwrap();
        assert!(g.is_some(), "the winner must be able to renew");
        tokio::time::sleep(renew_every).await;
    }
    camp.none_for(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terms_persist_across_restarts() {
    let _g = SERIAL.lock().await;
    let mut c = Cluster::start(3).await;
    let mut camp = c.campaign(&[0, 1, 2]);
    let (first, win, _) = camp.next_win(ELECT).await;
    drop(camp);

    // Restart the leader alone from its state dir: whoever leads next has a higher term.
    c.restart(first).await;
    let mut camp = c.campaign(&[0, 1, 2]);
    let (_, win2, _) = camp.next_win(ELECT).await;
    assert!(win2.token > win.token, "{} !> {}", win2.token, win.token);
    drop(camp);

    // Whole-fleet restart: every node comes back from disk, and the term still only goes up.
    for i in 0..3 {
        c.restart(i).await;
    }
    let mut camp = c.campaign(&[0, 1, 2]);
    let (_, win3, _) = camp.next_win(ELECT).await;
    assert!(win3.token > win2.token, "{} !> {}", win3.token, win2.token);
    eprintln!(
        "tokens across restarts: {} -> {} -> {}",
        win.token, win2.token, win3.token
    );
    for e in &c.electors {
        e.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_leader_self_fences_within_the_lease() {
    let _g = SERIAL.lock().await;
    let c = Cluster::start(3).await;
    let mut camp = c.campaign(&[0, 1, 2]);
    let (l, win, _) = camp.next_win(ELECT).await;
    let leader = c.electors[l].clone();
    let ttl = leader.lease_ttl();
    assert!(
        ttl <= Duration::from_millis(150),
        "lease {ttl:?} must not exceed the min election timeout"
    );

    let mut last_ok = leader.renew().await.unwrap().expect("leader renews");
    c.isolate(l, true).await;
    let cut_at = Instant::now();
    let failed = loop {
        match leader.renew().await {
            Ok(Some(g)) => last_ok = g,
            Ok(None) => panic!("an isolated leader does not know it lost"),
            Err(e) => break e,
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(2),
            "renewals kept succeeding while cut off"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let failed_after = cut_at.elapsed();
    eprintln!(
        "isolated n{}: renew failed {failed_after:?} after the cut: {failed}",
        l + 1
    );
    assert!(
        matches!(
            failed,
            ElectorError::Unavailable(_) | ElectorError::LeaseLost(_)
        ),
        "{failed}"
    );
    // The renewal that failed was itself bounded by the lease (plus one renew spacing + slack).
    assert!(
        failed_after <= ttl + Duration::from_millis(20 + 150),
        "renew failed only {failed_after:?} after the cut (lease {ttl:?})"
    );
    // The SPEC fact that makes the self-fence necessary: openraft still says Leader.
    let raft = leader.raft().unwrap();
    assert_eq!(
        raft.metrics().borrow_watched().state,
        openraft::ServerState::Leader,
        "an isolated openraft leader keeps reporting Leader"
    );

    // The others elect a new leader — never before the old leader's last grant ran out.
    let (l2, win2, won_at) = camp.next_win(ELECT).await;
    assert_ne!(l2, l);
    assert!(win2.token > win.token);
    eprintln!(
        "rival n{} won token {} {:?} after the last grant expired",
        l2 + 1,
        win2.token,
        won_at.duration_since(last_ok.sent_at + last_ok.ttl)
    );
    assert!(
        won_at >= last_ok.sent_at + last_ok.ttl,
        "rival won {:?} before the isolated leader's grant expired",
        (last_ok.sent_at + last_ok.ttl).duration_since(won_at)
    );
    // Still cut off: renew keeps failing, it never grants again.
    assert!(leader.renew().await.is_err());

    // Heal: the old leader learns the new term and reports the new leader.
    c.isolate(l, false).await;
    let deadline = Instant::now() + ELECT;
    loop {
        let info = leader.leader().await.unwrap();
        if info.as_ref().map(|i| i.node_id.as_str()) == Some(c.cfgs[l2].node_id.as_str()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old leader never learned the new one: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        leader.renew().await,
        Ok(None) | Err(ElectorError::LeaseLost(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_transfers_to_the_named_successor() {
    let _g = SERIAL.lock().await;
    let c = Cluster::start(3).await;
    assert!(c.electors[0].supports_transfer());
    let mut camp = c.campaign(&[0, 1, 2]);
    let (l, win, _) = camp.next_win(ELECT).await;
    // Name the follower with the *higher* raft id, so a hand-over to "whoever is first" would
    // not pass by luck half the time.
    let target = if l == 2 { 1 } else { 2 };
    // Let the successor catch up with the leader's log before handing over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let name = c.cfgs[target].node_id.clone();
    let t0 = Instant::now();
    c.electors[l].resign(Some(&name)).await.unwrap();
    let (got, win2, at) = camp.next_win(ELECT).await;
    assert_eq!(
        got,
        target,
        "leadership went to n{} instead of {name}",
        got + 1
    );
    assert!(win2.token > win.token);
    let dark = at.duration_since(t0);
    eprintln!(
        "hand-over n{} -> {name}: token {} -> {}, {dark:?}",
        l + 1,
        win.token,
        win2.token
    );
    // A transfer needs no election timeout: far below the 300 ms lease a timeout-based
    // hand-over would wait out.
    assert!(dark < Duration::from_millis(300), "hand-over took {dark:?}");
    // The resigned node does not win again: the third node's campaign and a fresh one on the
    // old leader both keep waiting while the successor leads.
    camp.none_for(Duration::from_millis(300)).await;
    let mut again = c.campaign(&[l]);
    again.none_for(Duration::from_millis(300)).await;
    assert!(c.electors[l].renew().await.unwrap().is_none());
    let info = c.electors[l].leader().await.unwrap().unwrap();
    assert_eq!(info.node_id, name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_successor_and_bad_config_are_errors() {
    let _g = SERIAL.lock().await;
    let c = Cluster::start(3).await;
    let mut camp = c.campaign(&[0, 1, 2]);
    let (l, _, _) = camp.next_win(ELECT).await;
    assert!(matches!(
        c.electors[l].resign(Some("nobody")).await,
        Err(ElectorError::Config(_))
    ));
    // A node that is not in its own peer list cannot start.
    let mut cfg = c.cfgs[0].clone();
    cfg.node_id = "n9".into();
    assert!(matches!(
        RaftElector::start(&cfg).await,
        Err(ElectorError::Config(_))
    ));
    let mut cfg = c.cfgs[0].clone();
    cfg.renew_interval_ms = 140; // the 150 ms grant minus its margin cannot fit this
    assert!(matches!(
        RaftElector::start(&cfg).await,
        Err(ElectorError::Config(_))
    ));
    let mut cfg = c.cfgs[0].clone();
    cfg.raft.heartbeat_interval_ms = 100; // > half of the 150 ms minimum election timeout
    assert!(matches!(
        RaftElector::start(&cfg).await,
        Err(ElectorError::Config(_))
    ));
}

/// A raft node refuses to start when its peer listener is reachable beyond loopback without a
/// cluster secret, or when it has peers and no secret; it starts with one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_listener_without_a_secret_is_refused() {
    let _g = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let me = PeerSpec {
        id: "n1".into(),
        addr: common::free_addr(),
        peer_addr: common::free_addr(),
    };
    let mut cfg = NodeConfig {
        node_id: "n1".into(),
        state_dir: dir.path().to_owned(),
        renew_interval_ms: 40,
        retry_interval_ms: 20,
        deadline_margin_ms: 20,
        ..NodeConfig::default()
    };
    cfg.backend = baton::backends::BackendKind::Raft;
    cfg.raft.peers = vec![me.clone()];
    let refused = |r: Result<RaftElector, ElectorError>, why: &str| match r {
        Err(ElectorError::Config(msg)) => {
            assert!(msg.contains("cluster_secret"), "{why}: {msg}");
            assert!(
                !dir.path().join("raft").exists(),
                "{why}: refused after touching the store"
            );
        }
        Err(e) => panic!("{why}: wrong error {e}"),
        Ok(_) => panic!("{why}: started without a cluster secret"),
    };

    // Off loopback, no secret: refused (even a one-member group).
    cfg.raft.peer_listen = Some("0.0.0.0:0".parse().unwrap());
    refused(RaftElector::start(&cfg).await, "0.0.0.0 without a secret");
    // Loopback, but with other members and no secret: refused.
    cfg.raft.peer_listen = None;
    let other = PeerSpec {
        id: "n2".into(),
        addr: common::free_addr(),
        peer_addr: common::free_addr(),
    };
    cfg.raft.peers = vec![me.clone(), other];
    refused(RaftElector::start(&cfg).await, "3 members without a secret");
    // A too-short secret is no secret.
    cfg.raft.cluster_secret = Some(Secret::new("short"));
    refused(RaftElector::start(&cfg).await, "a 5-byte secret");

    // With a secret, off loopback is allowed (the listener authenticates every request).
    cfg.raft.peers = vec![me];
    cfg.raft.peer_listen = Some("0.0.0.0:0".parse().unwrap());
    cfg.raft.cluster_secret = Some(Secret::new("raft-backend-test-secret-0123456789"));
    let e = RaftElector::start(&cfg)
        .await
        .expect("starts with a secret");
    assert!(e.peer_addr().port() != 0);
    e.close().await.unwrap();
}
