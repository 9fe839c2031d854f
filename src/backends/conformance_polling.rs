//! Two more conformance checks, for the polling elector (`PollingElector`) on each store it
//! runs on (pg-lease, redis and redis-naive, sharded raft): the two ways a granted acquisition
//! can outlive its candidacy. Each is deterministic: the candidate's store is wrapped in a
//! [`Gated`] store, which holds one acquisition, before it is sent or after it was answered,
//! until the check lets it go.
//!
//! | check | what must hold |
//! | --- | --- |
//! | [`a_poll_granted_after_close_is_released`] | a poll sent only after its candidacy was closed, and granted: the campaign fails (`LeaseLost`) and releases the grant, so another candidate wins at once, not a lease later |
//! | [`a_dropped_poll_granted_before_close_is_released`] | a poll granted, its answer never seen (the campaign dropped, as the elector actor withdraws a candidacy), then `close()`: the close releases the grant, so another candidate wins at once |
//!
//! A backend is given as a factory ([`MakeGated`]) that builds one gated candidate on a named
//! election ([`gated_shards`] builds them from configs).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;
use rand::Rng;
use tokio::sync::{mpsc, Notify};

use super::conformance::Options;
use super::polling::{HeldLease, LeaseStore, Poll, Shards, StoreError};
use super::{BackendKind, Elector, ElectorError, ElectorResult, LeaderInfo};
use crate::config::NodeConfig;

/// A gated candidate factory: `make(election, node_id)` builds one candidate on the election
/// named `election`, its store gated.
pub type MakeGated =
    dyn Fn(&str, &str) -> BoxFuture<'static, ElectorResult<(Arc<dyn Elector>, Gate)>> + Send + Sync;

/// Where a [`Gated`] store holds its next acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Before it is sent: it lands only once let go.
    BeforeSend,
    /// After it was answered: the store has acted on it; the campaign sees the answer once
    /// let go (or never, if the campaign is dropped meanwhile).
    Answer,
}

/// The test's side of a [`Gated`] store: arm a hold, see the acquisition arrive, let it go.
#[derive(Clone)]
pub struct Gate(Arc<GateInner>);

struct GateInner {
    armed: Mutex<Option<Hold>>,
    arrived_tx: mpsc::UnboundedSender<String>,
    arrived: tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>,
    go: Notify,
}

impl Default for Gate {
    fn default() -> Gate {
        let (arrived_tx, rx) = mpsc::unbounded_channel();
        Gate(Arc::new(GateInner {
            armed: Mutex::new(None),
            arrived_tx,
            arrived: tokio::sync::Mutex::new(rx),
            go: Notify::new(),
        }))
    }
}

impl Gate {
    /// The next acquisition is held at `hold`.
    pub fn arm(&self, hold: Hold) {
        *self.0.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some(hold);
    }

    /// Waits (up to `within`) for the held acquisition: what it is at (`"before send"`, or its
    /// answer).
    pub async fn arrived(&self, within: Duration) -> Option<String> {
        let mut rx = self.0.arrived.lock().await;
        tokio::time::timeout(within, rx.recv()).await.ok().flatten()
    }

    /// Lets the held acquisition go on.
    pub fn release(&self) {
        self.0.go.notify_one();
    }

    fn take_armed(&self) -> Option<Hold> {
        self.0
            .armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    async fn hold(&self, at: String) {
        let _ = self.0.arrived_tx.send(at);
        self.0.go.notified().await;
    }
}

/// A store that passes every request to `S`, except that it holds an acquisition where its
/// [`Gate`] was armed.
pub struct Gated<S> {
    inner: S,
    gate: Gate,
}

#[async_trait]
impl<S: LeaseStore> LeaseStore for Gated<S> {
    const ALREADY_HOLDING: &'static str = S::ALREADY_HOLDING;
    const NO_SUCCESSOR: &'static str = S::NO_SUCCESSOR;

    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn lease_lost(&self, epoch: i64) -> String {
        self.inner.lease_lost(epoch)
    }
    fn renewed_ttl(&self) -> Option<Duration> {
        self.inner.renewed_ttl()
    }
    async fn acquire(&self, holder: &str) -> Result<Poll, StoreError> {
        match self.gate.take_armed() {
            None => self.inner.acquire(holder).await,
            Some(Hold::BeforeSend) => {
                self.gate.hold("before send".into()).await;
                self.inner.acquire(holder).await
            }
            Some(Hold::Answer) => {
                let answer = self.inner.acquire(holder).await;
                self.gate.hold(format!("answered {answer:?}")).await;
                answer
            }
        }
    }
    async fn renew_all(&self, leases: Vec<HeldLease>) -> Result<Vec<bool>, StoreError> {
        self.inner.renew_all(leases).await
    }
    async fn release(&self, holder: &str, epoch: Option<i64>) -> Result<(), StoreError> {
        self.inner.release(holder, epoch).await
    }
    async fn expire_dead(&self, dead: &str) -> Result<bool, StoreError> {
        self.inner.expire_dead(dead).await
    }
    async fn confirm(&self, holder: &str, epoch: i64) -> Result<bool, StoreError> {
        self.inner.confirm(holder, epoch).await
    }
    async fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        self.inner.leader().await
    }
}

/// Electors on gated stores, each with its gate (open until armed).
fn gated<S: LeaseStore>(shards: Shards<S>) -> Vec<(Arc<dyn Elector>, Gate)> {
    let mut gates = Vec::new();
    let electors = shards
        .map(|inner| {
            let gate = Gate::default();
            gates.push(gate.clone());
            Gated { inner, gate }
        })
        .electors();
    electors
        .into_iter()
        .map(|e| Arc::new(e) as Arc<dyn Elector>)
        .zip(gates)
        .collect()
}

/// One gated elector per shard config, built as `backends::build_shards` builds the polling
/// backends' electors (sharded raft: this node's raft member starts; give it every shard's
/// config).
pub async fn gated_shards(cfgs: &[NodeConfig]) -> ElectorResult<Vec<(Arc<dyn Elector>, Gate)>> {
    let Some(first) = cfgs.first() else {
        return Ok(Vec::new());
    };
    match first.backend {
        #[cfg(feature = "pg-lease")]
        BackendKind::PgLease => Ok(gated(super::pg_lease::PgLeaseStore::connect_shards(cfgs)?)),
        #[cfg(feature = "redis")]
        kind @ (BackendKind::Redis | BackendKind::RedisNaive) => Ok(gated(
            super::redis::RedisStore::connect_shards(cfgs, kind == BackendKind::Redis)?,
        )),
        #[cfg(feature = "raft")]
        BackendKind::Raft => Ok(gated(super::raft::shards::stores(cfgs).await?)),
        other => Err(ElectorError::Config(format!(
            "{other} does not elect with the polling elector"
        ))),
    }
}

/// The checks, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// See [`a_poll_granted_after_close_is_released`].
    PollGrantedAfterCloseIsReleased,
    /// See [`a_dropped_poll_granted_before_close_is_released`].
    DroppedPollGrantedBeforeCloseIsReleased,
}

impl Check {
    /// Every check, in the order [`run_all`] runs them.
    pub const ALL: [Check; 2] = [
        Check::PollGrantedAfterCloseIsReleased,
        Check::DroppedPollGrantedBeforeCloseIsReleased,
    ];

    /// The snake_case name of the check's function, as printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            Check::PollGrantedAfterCloseIsReleased => "a_poll_granted_after_close_is_released",
            Check::DroppedPollGrantedBeforeCloseIsReleased => {
                "a_dropped_poll_granted_before_close_is_released"
            }
        }
    }
}

/// Runs every check in order (all of them, even after a failure); `Err` names every failed
/// check and why.
pub async fn run_all(make: &MakeGated, opts: Options) -> Result<(), String> {
    let mut failures = Vec::new();
    for check in Check::ALL {
        let t0 = Instant::now();
        let r = match check {
            Check::PollGrantedAfterCloseIsReleased => {
                a_poll_granted_after_close_is_released(make, opts).await
            }
            Check::DroppedPollGrantedBeforeCloseIsReleased => {
                a_dropped_poll_granted_before_close_is_released(make, opts).await
            }
        };
        let took = t0.elapsed();
        match r {
            Ok(()) => eprintln!("conformance: {} ok ({took:.1?})", check.name()),
            Err(e) => {
                eprintln!("conformance: {} FAILED ({took:.1?}): {e}", check.name());
                failures.push(format!("{}: {e}", check.name()));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Two candidates on a fresh election: `a` (whose gate the check arms) and `b`.
struct Pair {
    a: Arc<dyn Elector>,
    gate: Gate,
    b: Arc<dyn Elector>,
}

impl Pair {
    async fn new(make: &MakeGated, check: &str) -> Result<Pair, String> {
        let election = format!(
            "conformance-{check}-{:08x}",
            rand::thread_rng().gen::<u32>()
        );
        let built = |id: &'static str| {
            let election = election.clone();
            async move {
                make(&election, id)
                    .await
                    .map_err(|e| format!("building candidate {id} on {election}: {e}"))
            }
        };
        let (a, gate) = built("c1").await?;
        let (b, _) = match built("c2").await {
            Ok(b) => b,
            Err(e) => {
                let _ = a.close().await;
                return Err(e);
            }
        };
        Ok(Pair { a, gate, b })
    }

    /// `a`'s campaign, held at `hold` once it has sent (or is about to send) its first poll:
    /// the running campaign and what the held poll is at.
    async fn held_campaign(
        &self,
        hold: Hold,
        opts: Options,
    ) -> Result<(tokio::task::JoinHandle<ElectorResult<super::Win>>, String), String> {
        self.gate.arm(hold);
        let a = self.a.clone();
        let campaign = tokio::spawn(async move { a.campaign().await });
        let within = opts.ttl * 3 + Duration::from_secs(10);
        match self.gate.arrived(within).await {
            Some(at) => Ok((campaign, at)),
            None => {
                campaign.abort();
                Err(format!(
                    "c1's first poll did not reach the store within {within:?}"
                ))
            }
        }
    }

    /// `b` must win at once: well inside the lease a stray grant of `a`'s would hold.
    async fn b_wins_at_once(&self, opts: Options, stray: &str) -> Result<(), String> {
        let within = opts.ttl / 2;
        match tokio::time::timeout(within, self.b.campaign()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("c2's campaign failed: {e}")),
            Err(_) => {
                let leader = match self.b.leader().await {
                    Ok(Some(l)) => format!("{:?}", l.node_id),
                    Ok(None) => "no leader".into(),
                    Err(e) => format!("error {e}"),
                };
                Err(format!(
                    "c2 did not win within {within:?} of an empty seat (leader() says {leader}): {stray} holds the seat for its lease"
                ))
            }
        }
    }

    /// Closes `a` (`when`: what its campaign is at, for the message).
    async fn close_a(&self, when: &str) -> Result<(), String> {
        match tokio::time::timeout(Duration::from_secs(5), self.a.close()).await {
            Ok(Ok(())) => Ok(()),
            other => Err(format!("close() of c1 {when} failed: {other:?}")),
        }
    }

    async fn teardown(&self) {
        for e in [&self.a, &self.b] {
            let _ = tokio::time::timeout(Duration::from_secs(5), e.close()).await;
        }
    }
}

/// Runs `body` on a fresh pair and always closes both candidates.
async fn with_pair<B>(make: &MakeGated, check: &str, body: B) -> Result<(), String>
where
    B: for<'a> FnOnce(&'a Pair) -> BoxFuture<'a, Result<(), String>>,
{
    let pair = Pair::new(make, check).await?;
    let r = body(&pair).await;
    pair.gate.release();
    pair.teardown().await;
    r
}

/// The crossed win and withdrawal: candidate `c1`'s first poll is held before it is sent, its
/// candidacy is closed, and only then is the poll sent, to an empty seat, and granted. The
/// campaign must not take that term (`LeaseLost`), and must release it: `c2` then wins at
/// once, instead of a lease later.
pub async fn a_poll_granted_after_close_is_released(
    make: &MakeGated,
    opts: Options,
) -> Result<(), String> {
    with_pair(make, "a_poll_granted_after_close_is_released", |p| {
        Box::pin(async move {
            let (campaign, _) = p.held_campaign(Hold::BeforeSend, opts).await?;
            if let Err(e) = p.close_a("with its poll held").await {
                campaign.abort();
                return Err(e);
            }
            p.gate.release();
            match tokio::time::timeout(Duration::from_secs(5), campaign).await {
                Ok(Ok(Err(ElectorError::LeaseLost(_)))) => {}
                Ok(Ok(Ok(win))) => {
                    return Err(format!(
                        "c1's campaign won (token {}) although its candidacy was closed before the poll was sent",
                        win.token
                    ))
                }
                other => {
                    return Err(format!(
                        "c1's campaign, its poll sent after close(), ended with {other:?}, not LeaseLost"
                    ))
                }
            }
            p.b_wins_at_once(opts, "the grant c1's poll got after close()")
                .await
        })
    })
    .await
}

/// The dropped poll for a closed candidacy: candidate `c1`'s first poll is granted (the seat
/// was empty) but its answer is held; the campaign is dropped, as the elector actor withdraws
/// a candidacy, so nobody ever sees that answer; then `close()`. The close must release that
/// grant (the candidacy's id was recorded before the poll was sent): `c2` then wins at once.
pub async fn a_dropped_poll_granted_before_close_is_released(
    make: &MakeGated,
    opts: Options,
) -> Result<(), String> {
    with_pair(
        make,
        "a_dropped_poll_granted_before_close_is_released",
        |p| {
            Box::pin(async move {
                let (campaign, at) = p.held_campaign(Hold::Answer, opts).await?;
                campaign.abort();
                let _ = campaign.await;
                if !at.contains("Won") {
                    return Err(format!("c1's first poll, to an empty seat, was {at}"));
                }
                p.close_a("after its dropped campaign").await?;
                p.b_wins_at_once(opts, "the grant of c1's dropped poll")
                    .await
            })
        },
    )
    .await
}
