//! The `Elector` seam: one narrow interface every election backend implements.
//!
//! The shape follows etcd's `concurrency` package and client-go's `leaderelection`:
//!
//! * **liveness** (a session / lease / Raft quorum contact) is renewed by [`Elector::renew`], and
//! * **leadership** is won by [`Elector::campaign`] and given up by [`Elector::resign`].
//!
//! The retry/renew loop that drives these calls is written exactly once, in
//! `crate::actors::elector`; a backend only answers single requests. Every win carries a
//! [`FenceToken`] that strictly increases across holders (for a correct backend); the protected
//! resource, not the backend, is what finally enforces it.
//!
//! What is **not** guaranteed by any backend here: that a node which believes it leads still does.
//! A lease is a timer-based belief. The node stops acting when its watchdog deadline passes, and the
//! fence rejects whatever it wrote after that.

//!
//! This module is the ground floor of the crate: it imports nothing else from baton, so config,
//! backends, actors and HTTP can all name its types without an import circle.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A fencing token: strictly increasing across leadership changes. Carried by every protected write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FenceToken(pub i64);

impl FenceToken {
    /// A token from a backend's counter (raft term, etcd revision, zxid, epoch), checked: a value
    /// that is not a positive `i64` is an error — the caller does not act — never a wrapped or
    /// negative token (the resource would then refuse every later holder, forever).
    pub fn checked<T>(what: &str, value: T) -> ElectorResult<FenceToken>
    where
        T: TryInto<i64> + Copy + fmt::Display,
    {
        match value.try_into() {
            Ok(v) if v > 0 => Ok(FenceToken(v)),
            _ => Err(ElectorError::Unavailable(format!(
                "{what} {value} is not a usable fencing token (must be in 1..={})",
                i64::MAX
            ))),
        }
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Which backend elects. Six are built in; each lives in its own module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// etcd's election API over a lease; token = the leader key's create revision.
    Etcd,
    /// openraft among the fleet's own nodes, no external service; token = the Raft term. The only
    /// built-in backend that can hand leadership to a named successor.
    Raft,
    /// A Redis `SET NX PX` lock with **no** fencing token: its "token" is the acquiring node's
    /// wall-clock milliseconds, not guaranteed to increase across holders. A deliberately unsafe
    /// baseline.
    RedisNaive,
    /// The Redis lock plus an `INCR` counter taken atomically with it; tokens increase only for as
    /// long as the counter survives (a Redis restart without persistence makes them regress).
    Redis,
    /// ZooKeeper's ephemeral-sequential recipe; token = the candidacy znode's `czxid`.
    Zk,
    /// A lease row in PostgreSQL, expiry judged by the database's clock; token = the row's epoch.
    PgLease,
    /// A user's own [`Elector`], given to `NodeBuilder::with_elector`.
    Custom,
}

impl BackendKind {
    /// The kebab-case name used in the config file, in serde, in the `backend` metric label and by
    /// [`FromStr`](std::str::FromStr) (which accepts every name but `custom`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Etcd => "etcd",
            BackendKind::Raft => "raft",
            BackendKind::RedisNaive => "redis-naive",
            BackendKind::Redis => "redis",
            BackendKind::Zk => "zk",
            BackendKind::PgLease => "pg-lease",
            BackendKind::Custom => "custom",
        }
    }
}

impl BackendKind {
    /// Every built-in backend ([`BackendKind::Custom`] is not one).
    pub const ALL: [BackendKind; 6] = [
        BackendKind::Etcd,
        BackendKind::Raft,
        BackendKind::RedisNaive,
        BackendKind::Redis,
        BackendKind::Zk,
        BackendKind::PgLease,
    ];
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendKind, String> {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = BackendKind::ALL.iter().map(|b| b.as_str()).collect();
                format!("unknown backend {s:?}; one of {}", names.join(", "))
            })
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who leads, as far as the backend can tell, and where to send clients.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    /// The leader's node id; for a foreign holder whose value is not our JSON, that value as text.
    pub node_id: String,
    /// The leader's HTTP address, when the leader is one of ours (an `etcdctl elect` holder has none).
    pub http_addr: Option<String>,
}

impl LeaderInfo {
    /// The value a node publishes as its candidacy (JSON, so foreign holders stay readable).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("LeaderInfo serializes")
    }

    /// Parses a published candidacy; a foreign value (e.g. from `etcdctl elect`) becomes its text.
    pub fn decode(raw: &[u8]) -> LeaderInfo {
        serde_json::from_slice(raw).unwrap_or_else(|_| LeaderInfo {
            node_id: String::from_utf8_lossy(raw).into_owned(),
            http_addr: None,
        })
    }
}

/// One successful liveness renewal: the lease is good for `ttl` counted from `sent_at`, the
/// moment the renewal *request was sent* (never the moment the answer arrived: the backend may
/// have started its timer any time after the send).
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    /// When the renewal (or grant) request was sent, on the monotonic clock.
    pub sent_at: Instant,
    /// How long the backend keeps the lease from `sent_at`, before any safety margin.
    pub ttl: Duration,
}

/// A won election.
#[derive(Clone, Debug)]
pub struct Win {
    /// The fencing token of the term won; every protected write of the term carries it.
    pub token: FenceToken,
    /// The liveness grant in force when the win was observed; the watchdog starts from it.
    pub grant: Grant,
    /// When the contest this node won began, as this node saw it: the seat fell vacant (etcd,
    /// zk: the deletion of the candidacy ahead of ours arrived; raft: this node became
    /// candidate; polling backends: the last poll that still found the seat held, so the
    /// polling gap counts). `won - vacant_since` is the election latency; the time spent
    /// queued behind a live leader before that is not. `None` when the backend could not tell.
    pub vacant_since: Option<Instant>,
}

/// What [`Elector::expire_dead_holder`] did, and what a campaign of the caller's that is
/// already waiting must do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadHolderExpiry {
    /// Nothing was ended: the lease names another holder or nobody, or the backend does not end
    /// leases early (the trait's default).
    NotEnded,
    /// The dead holder's lease is ended, and a waiting campaign learns it by itself at once: it
    /// waits on the holder's key, whose deletion wakes it (etcd, zk), or polls often enough. It
    /// goes on, keeping its place in the queue.
    EndedCampaignWakes,
    /// The dead holder's lease is ended, but a waiting campaign polls for a free seat and would
    /// see it only at its next poll (pg-lease, redis, sharded raft): the caller wakes it
    /// ([`Elector::wake_campaign`]) to poll now. Waking, not restarting: a restarted campaign
    /// would drop a poll in flight, whose acquisition can still land (for the old candidacy, if
    /// the restart also closed it) and hold the seat for a whole lease.
    EndedCampaignPolls,
}

impl DeadHolderExpiry {
    /// Whether a lease was ended.
    pub fn ended(self) -> bool {
        self != DeadHolderExpiry::NotEnded
    }
}

/// Why an [`Elector`] call failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectorError {
    /// The session/lease is gone: whatever leadership rode on it is over.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The backend could not be reached or answered with an error; the caller may retry.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The request is not possible on this backend (e.g. naming a successor on etcd).
    #[error("not supported by the {backend} backend: {what}")]
    Unsupported {
        /// The backend that refused.
        backend: BackendKind,
        /// The refused request, e.g. `"naming a successor"`.
        what: &'static str,
    },
    /// Misconfiguration found at construction.
    #[error("invalid elector configuration: {0}")]
    Config(String),
}

/// The result of every [`Elector`] call.
pub type ElectorResult<T> = Result<T, ElectorError>;

/// One election backend. Calls are single requests; none of them loops or sleeps on its own except
/// `campaign`, which by nature waits until this node wins. All calls must be safe to run
/// concurrently (a renewal while a campaign is blocked), and `campaign` must be cancel-safe: dropping
/// its future and calling [`Elector::close`] leaves no candidacy behind.
#[async_trait]
pub trait Elector: Send + Sync + 'static {
    /// Which backend this is (a user's own returns [`BackendKind::Custom`]); used in status,
    /// error messages and the `backend` metric label.
    fn kind(&self) -> BackendKind;

    /// Whether [`Elector::resign`] can hand leadership to a named successor.
    fn supports_transfer(&self) -> bool {
        false
    }

    /// Wait until this node leads; returns the fencing token of this term of leadership.
    /// Establishes the liveness session first if there is none.
    async fn campaign(&self) -> ElectorResult<Win>;

    /// Renew liveness once (one round trip). `Ok(None)` when there is no session to renew.
    async fn renew(&self) -> ElectorResult<Option<Grant>>;

    /// Give up leadership. With `successor`, hand it to that node where the backend can.
    async fn resign(&self, successor: Option<&str>) -> ElectorResult<()>;

    /// The current leader as the backend sees it.
    async fn leader(&self) -> ElectorResult<Option<LeaderInfo>>;

    /// Whether this node (`me`, its node id) still leads under `token`, established with the
    /// backend *now* (a linearizable check, one round trip): what a `quorum` read on
    /// `GET /read` waits for before it answers from the leader's memory. `Ok(false)` when
    /// another node (or nobody) leads, or this node leads a different term.
    ///
    /// The default compares [`Elector::leader`] with `me`, which is right only where
    /// `leader()` is itself a linearizable read of the backend; every built-in backend overrides
    /// it with its own check (raft: a ReadIndex round; etcd: a revision-checked read of the
    /// election key; zk: `sync` then read; redis and pg-lease: a compare on the lease record).
    async fn confirm_leadership(&self, me: &str, token: FenceToken) -> ElectorResult<bool> {
        let _ = token;
        Ok(self.leader().await?.is_some_and(|l| l.node_id == me))
    }

    /// Follow the leader. The default polls [`Elector::leader`]; backends with a native watch
    /// (etcd's observe) override it. Returns only when `tx` has no receivers.
    async fn observe(&self, tx: tokio::sync::watch::Sender<Option<LeaderInfo>>, every: Duration) {
        loop {
            if let Ok(info) = self.leader().await {
                tx.send_if_modified(|cur| {
                    let changed = *cur != info;
                    *cur = info.clone();
                    changed
                });
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    }

    /// A failure detector confirmed node `dead` (a node id) dead: end its lease now, so that a
    /// follower need not wait it out. A compare-and-delete, atomic in the backend: the lease is
    /// ended only if, at that moment, it still names `dead` as its holder, and only that term
    /// (the holder and token the backend holds for it then); a lease someone else took meanwhile
    /// is left alone. `Ok(true)` when a lease was ended. The fence is untouched: whoever wins
    /// next gets a higher token, so the dead holder's late writes (if it was only paused) are
    /// refused. The answer also says whether this candidate's campaign in flight, if any, must be
    /// woken to see the seat free now (see [`DeadHolderExpiry`]): the caller acts on it, so
    /// that no caller needs to know how a backend's campaign waits. The default does nothing
    /// ([`DeadHolderExpiry::NotEnded`]): the lease runs out as before.
    async fn expire_dead_holder(&self, dead: &str) -> ElectorResult<DeadHolderExpiry> {
        let _ = dead;
        Ok(DeadHolderExpiry::NotEnded)
    }

    /// A campaign of this elector that is waiting between polls polls now (after
    /// [`DeadHolderExpiry::EndedCampaignPolls`]); one in the middle of a poll polls again as
    /// soon as it is answered. With no campaign waiting, the next one's first wait is cut short.
    /// The default does nothing: campaigns that wait on a watch need no waking.
    fn wake_campaign(&self) {}

    /// End the session: revoke the lease, withdraw any candidacy. Idempotent.
    async fn close(&self) -> ElectorResult<()>;
}

/// Requests an elector sent to its backend service (labels `backend`, `op`): how much a backend
/// costs while nodes wait, renew and watch. Incremented by every backend at each request it sends.
pub const BACKEND_REQUESTS: &str = "baton_backend_requests_total";

/// Counts one request to the backend service (see [`BACKEND_REQUESTS`]).
pub fn count_request(backend: BackendKind, op: &'static str) {
    metrics::counter!(BACKEND_REQUESTS, "backend" => backend.as_str(), "op" => op).increment(1);
}

#[cfg(test)]
mod token_tests {
    use super::*;

    #[test]
    fn tokens_are_checked_never_wrapped() {
        assert_eq!(FenceToken::checked("t", 7u64).unwrap(), FenceToken(7));
        assert_eq!(
            FenceToken::checked("t", i64::MAX as u64).unwrap(),
            FenceToken(i64::MAX)
        );
        // One past i64::MAX would be negative with `as i64`.
        assert!(FenceToken::checked("t", i64::MAX as u64 + 1).is_err());
        assert!(FenceToken::checked("t", u64::MAX).is_err());
        assert!(FenceToken::checked("t", 0i64).is_err());
        assert!(FenceToken::checked("t", -5i64).is_err());
    }
}
