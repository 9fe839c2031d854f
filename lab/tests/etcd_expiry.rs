//! Revoking a dead etcd leader's lease before etcd's 500 ms sweep does (`src/backends/etcd_expiry.rs`),
//! against a private single-member etcd: never while the lease can still be renewed, and the
//! waiting candidate wins once it has expired.

use std::time::{Duration, Instant};

use baton::backends::etcd::EtcdElector;
use baton::backends::etcd_expiry::{
    proves_expired, revoke_when_expired, revoke_when_expired_via, LeaseEnd, LeaseTtlReader,
    TtlReading,
};
use baton::backends::{BackendKind, Elector};
use baton::config::NodeConfig;
use baton_lab::fleet::servers::EtcdCluster;
use etcd_client::Client;

const TTL_SECS: i64 = 3;

/// Both tests time a 3 s lease on a 2-core machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Etcd {
    cluster: EtcdCluster,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.cluster.stop();
    }
}

fn start_etcd() -> Etcd {
    let dir = tempfile::Builder::new()
        .prefix("baton-etcd-expiry-")
        .tempdir()
        .unwrap();
    let cluster = EtcdCluster::start(&dir.path().join("etcd"), 1, 100, 1000).expect("start etcd");
    Etcd { cluster, _dir: dir }
}

/// A holder outside baton: campaigns first under `name` on its own lease, renewed by the caller.
async fn holder(etcd: &Etcd, name: &str) -> (Client, i64, Instant) {
    let mut c = Client::connect(etcd.cluster.endpoints(), None)
        .await
        .unwrap();
    let sent = Instant::now();
    let lease = c.lease_grant(TTL_SECS, None).await.unwrap().id();
    c.campaign(name, "outside-holder", lease).await.unwrap();
    (c, lease, sent)
}

/// Renews `lease` once; the returned instant was taken before the request left, so the lease
/// cannot expire before it + TTL.
async fn renew(c: &Client, lease: i64) -> Instant {
    let mut c = c.clone();
    let sent = Instant::now();
    let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let ttl = stream.message().await.unwrap().expect("an answer").ttl();
    assert!(
        ttl > 0,
        "the renewal came after expiry: the machine stalled for >400 ms, nothing was tested"
    );
    sent
}

async fn campaigner(etcd: &Etcd, name: &str) -> EtcdElector {
    let mut cfg = NodeConfig {
        node_id: "waiter".into(),
        lease_ttl_ms: (TTL_SECS * 1000) as u64,
        ..NodeConfig::for_backend(BackendKind::Etcd)
    };
    cfg.etcd.endpoints = etcd.cluster.endpoints();
    cfg.etcd.election_name = name.into();
    EtcdElector::connect(&cfg.backend_common(), &cfg.etcd)
        .await
        .unwrap()
}

async fn ttl_of(c: &Client, lease: i64) -> i64 {
    c.clone()
        .lease_time_to_live(lease, None)
        .await
        .unwrap()
        .ttl()
}

/// The leader renews late every time — 2.6 s apart on a 3 s lease, so each time its lease reads
/// 0 for a good half second — but never lets it expire. A rule that revoked on "0 seconds left"
/// would depose it within the first cycle; ours must not, and the candidate behind must keep
/// waiting. Then the leader stops renewing: the candidate wins, never before the lease could
/// have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewer_keeps_its_lease_and_a_dead_one_is_revoked_after_expiry() {
    let _serial = SERIAL.lock().await;
    let etcd = start_etcd();
    let (holder_client, lease, mut last_renewal) = holder(&etcd, "late").await;
    let waiter = std::sync::Arc::new(campaigner(&etcd, "late").await);
    let campaign = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.campaign().await }
    });
    // The candidate's own session is renewed as the node's elector would (every second).
    let session = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            loop {
                let _ = waiter.renew().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });

    for _ in 0..4 {
        tokio::time::sleep_until((last_renewal + Duration::from_millis(2600)).into()).await;
        assert!(
            !campaign.is_finished(),
            "the candidate won while the leader was still renewing"
        );
        last_renewal = renew(&holder_client, lease).await;
    }
    assert!(ttl_of(&holder_client, lease).await > 0);

    // The leader dies (stops renewing).
    let win = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("the candidate wins after the lease expires")
        .unwrap()
        .expect("campaign");
    let after = last_renewal.elapsed();
    session.abort();
    assert!(
        after >= Duration::from_secs(TTL_SECS as u64),
        "won {after:?} after the last renewal: before the lease could have expired"
    );
    assert!(win.token.0 > 0);
    eprintln!("won {after:?} after the last renewal of a {TTL_SECS} s lease");
}

/// Called directly on leases nobody renews: returns only once each has expired, and takes the
/// lease out itself unless etcd's sweep happened to get there first. Five leases, granted 100 ms
/// apart so they expire at different phases of the sweep (every 500 ms): it cannot beat a reaper
/// that acts within ~100 ms of expiry on all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_when_expired_waits_for_expiry_and_beats_the_sweep() {
    let _serial = SERIAL.lock().await;
    let etcd = start_etcd();
    let c = Client::connect(etcd.cluster.endpoints(), None)
        .await
        .unwrap();
    let reaps = (0..5u64).map(|i| {
        let mut c = c.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100 * i)).await;
            let granted_at = Instant::now();
            let lease = c.lease_grant(TTL_SECS, None).await.unwrap().id();
            let end = revoke_when_expired(&c, lease, 0.01, Duration::from_secs(1))
                .await
                .expect("etcd answers");
            (lease, end, granted_at.elapsed())
        }
    });
    let mut ends = Vec::new();
    for (lease, end, after) in futures::future::join_all(reaps).await {
        assert!(
            after >= Duration::from_secs(TTL_SECS as u64),
            "{end:?} {after:?} after the grant: before the lease could have expired"
        );
        assert!(ttl_of(&c, lease).await < 0, "the lease is gone");
        eprintln!("{end:?} {after:?} after the grant");
        ends.push(end);
    }
    assert!(
        ends.contains(&LeaseEnd::Revoked),
        "etcd's sweep beat the reaper every time: {ends:?}"
    );

    // A lease granted for 2 s cannot be proven expired before etcd sweeps it: left alone.
    let lease = c.clone().lease_grant(2, None).await.unwrap().id();
    let end = revoke_when_expired(&c, lease, 0.01, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(end, LeaseEnd::TooShort);
    assert!(ttl_of(&c, lease).await > 0, "a 2 s lease was revoked");
}

/// A sharded node queues behind the same few leases in many elections: its reapers share one
/// [`LeaseTtlReader`], so 20 reapers of one lease (started out of step) cost about what one costs,
/// where 20 readers of their own cost 20 times as much. Both groups watch a lease renewed for
/// 2 s and then left to expire; every reaper still ends only once its lease has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapers_of_one_lease_share_its_readings() {
    let _serial = SERIAL.lock().await;
    let etcd = start_etcd();
    let c = Client::connect(etcd.cluster.endpoints(), None)
        .await
        .unwrap();
    const REAPERS: u64 = 20;
    let shared = LeaseTtlReader::new(c.clone(), Duration::from_secs(1));
    let own: Vec<LeaseTtlReader> = (0..REAPERS)
        .map(|_| LeaseTtlReader::new(c.clone(), Duration::from_secs(1)))
        .collect();
    let lease_shared = c.clone().lease_grant(TTL_SECS, None).await.unwrap().id();
    let lease_own = c.clone().lease_grant(TTL_SECS, None).await.unwrap().id();
    // Renewed twice, a second apart: each reaper sees the lease alive, then its last second.
    let renewals = {
        let c = c.clone();
        async move {
            let mut last = Instant::now();
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let (a, b) = tokio::join!(renew(&c, lease_shared), renew(&c, lease_own));
                last = a.min(b);
            }
            last
        }
    };
    let reap = |reader: &'static LeaseTtlReader, lease: i64, i: u64| async move {
        // Out of step: 50 ms apart over the first second.
        tokio::time::sleep(Duration::from_millis(50 * i)).await;
        let end = revoke_when_expired_via(reader, lease, 0.01).await.unwrap();
        (end, Instant::now())
    };
    let shared: &'static LeaseTtlReader = Box::leak(Box::new(shared));
    let own: &'static [LeaseTtlReader] = Box::leak(own.into_boxed_slice());
    let shared_reaps =
        futures::future::join_all((0..REAPERS).map(|i| reap(shared, lease_shared, i)));
    let own_reaps =
        futures::future::join_all((0..REAPERS).map(|i| reap(&own[i as usize], lease_own, i)));
    let (last_renewal, shared_ends, own_ends) = tokio::join!(renewals, shared_reaps, own_reaps);
    let expired_at = last_renewal + Duration::from_secs(TTL_SECS as u64);
    for (end, at) in shared_ends.iter().chain(&own_ends) {
        assert!(matches!(end, LeaseEnd::Revoked | LeaseEnd::Gone), "{end:?}");
        assert!(*at >= expired_at, "a reaper ended before its lease expired");
    }
    let shared_sent = shared.requests_sent();
    let own_sent: u64 = own.iter().map(LeaseTtlReader::requests_sent).sum();
    eprintln!("LeaseTimeToLive requests for {REAPERS} reapers: shared reader {shared_sent}, a reader each {own_sent}");
    assert!(
        shared_sent * 4 <= own_sent,
        "sharing saved less than 4x: shared {shared_sent}, own {own_sent}"
    );
    assert!(
        shared_sent <= 3 * own_sent / REAPERS + 10,
        "20 reapers sharing a reader cost more than ~3 alone: shared {shared_sent}, own {own_sent}"
    );
}

fn reading(base: Instant, sent_ms: u64, received_ms: u64, ttl_secs: i64) -> TtlReading {
    TtlReading {
        sent: base + Duration::from_millis(sent_ms),
        received: base + Duration::from_millis(received_ms),
        ttl_secs,
    }
}

/// The rule itself, at its edges (3 s granted, 1% clock-rate error).
#[test]
fn two_zero_readings_prove_expiry_only_a_second_apart_and_within_the_renewal_window() {
    let t = Instant::now();
    let zero = reading(t, 0, 2, 0);
    // A second later (plus the 2% margin): expired.
    assert!(proves_expired(zero, reading(t, 1030, 1032, 0), 3, 0.01));
    // Under a second (after the margin): a renewal-free lease may still have time left.
    assert!(!proves_expired(zero, reading(t, 1010, 1012, 0), 3, 0.01));
    assert!(!proves_expired(zero, reading(t, 500, 502, 0), 3, 0.01));
    // So long after that a renewal in between could have decayed back to 0: proves nothing.
    assert!(!proves_expired(zero, reading(t, 1990, 1999, 0), 3, 0.01));
    // A renewal shows as 1 or more; only zeros count.
    assert!(!proves_expired(zero, reading(t, 1030, 1032, 2), 3, 0.01));
    assert!(!proves_expired(
        reading(t, 0, 2, 1),
        reading(t, 1030, 1032, 0),
        3,
        0.01
    ));
    // A 2 s lease leaves no window at all.
    assert!(!proves_expired(zero, reading(t, 1030, 1032, 0), 2, 0.01));
}
