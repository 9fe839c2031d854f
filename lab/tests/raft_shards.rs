//! Sharded raft's lease table against the real thing: three nodes in-process, each one raft
//! member serving the shard lease table on its authenticated peer listener, each with K = 2
//! shard electors (`backends::raft::shards`). No PostgreSQL: these tests are about who may
//! hold a shard, and when, across a change of raft leader.

use std::time::{Duration, Instant};

use baton::backends::raft::shards::{connect_shards, RaftShardElector};
use baton::backends::{Elector, Grant};
use baton::config::{MemberSpec, NodeConfig};
use openraft::async_runtime::WatchReceiver;

mod common;

/// Timing-sensitive on a 2-core machine: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const K: u32 = 2;
const TTL: Duration = Duration::from_millis(1000);

struct Cluster {
    _dirs: Vec<tempfile::TempDir>,
    /// Per node, its K shard electors; `None` once the node is gone.
    nodes: Vec<Option<Vec<RaftShardElector>>>,
}

impl Cluster {
    async fn start(n: usize) -> Cluster {
        let (dirs, cfgs) = common::raft_member_configs(n, "raft-shards-test-secret-0123456789");
        let members: Vec<MemberSpec> = cfgs
            .iter()
            .map(|cfg| MemberSpec {
                id: cfg.node_id.clone(),
                addr: cfg.advertise_addr.clone().unwrap(),
            })
            .collect();
        let mut c = Cluster {
            _dirs: dirs,
            nodes: Vec::new(),
        };
        for mut cfg in cfgs {
            cfg.election_timeout_ms = "150-300".into();
            cfg.lease_ttl_ms = TTL.as_millis() as u64;
            cfg.renew_interval_ms = 300;
            cfg.retry_interval_ms = 100;
            cfg.deadline_margin_ms = 50;
            cfg.shards.count = K;
            cfg.shards.members = members.clone();
            cfg.validate().unwrap();
            // One config per shard: sharded raft names its shards by index, not by election.
            let cfgs: Vec<NodeConfig> = vec![cfg.clone(); K as usize];
            c.nodes.push(Some(connect_shards(&cfgs).await.unwrap()));
        }
        c
    }

    fn shard(&self, node: usize, shard: u32) -> &RaftShardElector {
        &self.nodes[node].as_ref().expect("node is up")[shard as usize]
    }

    /// The raft leader's index, once the live nodes agree on one.
    async fn raft_leader(&self) -> usize {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let seen: Vec<Option<u64>> = self
                .nodes
                .iter()
                .flatten()
                .map(|n| {
                    n[0].raft()
                        .raft()
                        .and_then(|r| r.metrics().borrow_watched().current_leader)
                })
                .collect();
            if let Some(Some(id)) = seen.first() {
                if seen.iter().all(|l| *l == Some(*id)) {
                    return *id as usize - 1;
                }
            }
            assert!(Instant::now() < until, "no raft leader: {seen:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drops node `i`'s electors: its raft member shuts down and its peer listener closes.
    async fn kill(&mut self, i: usize) -> Instant {
        self.nodes[i] = None;
        Instant::now()
    }

    /// Shard `shard` renewed by node `i`, retried (a raft election in progress answers
    /// nothing) until it succeeds or `within` has passed.
    async fn renew(&self, i: usize, shard: u32, within: Duration) -> Option<Grant> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            match self.shard(i, shard).renew().await {
                Ok(Some(g)) => return Some(g),
                Ok(None) => panic!("n{} does not hold shard {shard}", i + 1),
                Err(baton::backends::ElectorError::LeaseLost(why)) => {
                    panic!("n{} lost shard {shard}: {why}", i + 1)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        None
    }
}

/// The safety rule of the table: after the raft leader dies, a shard held by a node that stops
/// renewing is granted to another node only a full lease after the *new* raft leader took
/// over — not when the holder's last renewal (well before the change) would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_shard_goes_to_another_node_only_a_lease_after_the_raft_leader_changed() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3).await;
    let l = c.raft_leader().await;
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    let (h, w) = (others[0], others[1]);
    // The holder and the rival are both followers of raft: the leader that dies is neither.
    let won = tokio::time::timeout(Duration::from_secs(10), c.shard(h, 1).campaign())
        .await
        .expect("the holder wins a free shard")
        .unwrap();
    // The holder's last renewal, then most of a lease in silence: by its own count its lease
    // runs out at `last.sent_at + TTL`, shortly after the raft leader dies.
    let last = c.renew(h, 1, TTL).await.expect("renewed");
    tokio::time::sleep(TTL * 7 / 10).await;
    let killed = c.kill(l).await;
    // The other survivor campaigns for it at once, and keeps asking.
    let win = tokio::time::timeout(TTL * 6, c.shard(w, 1).campaign())
        .await
        .expect("the shard is granted once its lease is over")
        .unwrap();
    let at = Instant::now();
    assert!(
        at >= killed + TTL,
        "granted {:?} after the raft leader died: the new raft leader must wait a whole lease ({TTL:?}) from its own start",
        at - killed
    );
    assert!(at >= last.sent_at + TTL);
    assert!(
        win.token > won.token,
        "tokens grow per shard: {} then {}",
        won.token,
        win.token
    );
    // The old holder's lease is over for good: a late renewal is refused, not revived.
    let late = c.shard(h, 1).renew().await;
    assert!(
        matches!(late, Err(baton::backends::ElectorError::LeaseLost(_))),
        "{late:?}"
    );
}

/// A holder that keeps renewing keeps its shard, and its term, across a change of raft leader:
/// its renewals resume at the new leader (which counts every held shard as renewed when it took
/// over), and a rival campaigning all along is never granted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewing_holder_keeps_its_shard_across_a_raft_leader_change() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3).await;
    let l = c.raft_leader().await;
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    let (h, w) = (others[0], others[1]);
    let won = tokio::time::timeout(Duration::from_secs(10), c.shard(h, 0).campaign())
        .await
        .expect("the holder wins a free shard")
        .unwrap();
    let mut last = c.renew(h, 0, TTL).await.expect("renewed").sent_at;
    c.kill(l).await;
    let rival = c.shard(w, 0);
    let watch_until = Instant::now() + TTL * 3;
    let mut campaign = Box::pin(rival.campaign());
    while Instant::now() < watch_until {
        // Renew every 300 ms (the renew interval), racing the rival's campaign.
        let tick = tokio::time::sleep(Duration::from_millis(300));
        tokio::select! {
            r = &mut campaign => panic!("the rival was granted a shard its holder kept renewing: {:?}", r.map(|w| w.token)),
            _ = tick => {}
        }
        let g = c
            .renew(h, 0, TTL.saturating_sub(last.elapsed()))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "the holder could not renew within its lease ({:?} since the last)",
                    last.elapsed()
                )
            });
        assert!(g.sent_at - last < TTL, "a gap in the holder's lease");
        last = g.sent_at;
    }
    assert!(c
        .shard(h, 0)
        .confirm_leadership("", won.token)
        .await
        .unwrap());
    drop(campaign);
    c.shard(w, 0).close().await.unwrap();
    c.shard(h, 0).resign(None).await.unwrap();
}
