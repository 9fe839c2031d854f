//! The one place that answers "who leads, am I acting, and until when" for this node.
//!
//! Each fact has exactly one writer, an actor of the tree: the supervisor writes the term's token
//! and whether leader work runs; the watchdog writes the lease deadline it enforces (so the
//! deadline read here moves with every renewal, as the watchdog's does); the elector's observer
//! writes who the backend says leads; the tree's failure budget (`actors::budget`) writes what
//! the resource last said of it. HTTP, the node handle and metrics only read. Reads never
//! block on an actor: a read lock on a few words.

use std::sync::RwLock;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::watch;

use crate::elector::{BackendKind, FenceToken, LeaderInfo};

#[derive(Clone, Copy, Default)]
struct TermView {
    /// The token of the term this node believes it holds (set on Elected, cleared on demote-begin).
    token: Option<FenceToken>,
    /// The watchdog's deadline for that term: this node stops acting when it passes.
    lease_deadline: Option<Instant>,
    /// When the renewal that set `lease_deadline` was sent (the lease read window's origin).
    lease_sent_at: Option<Instant>,
    /// The highest seq the fence accepted from this node's sequencer, and under which term
    /// (the claim's `last_seq`, then every accepted group commit's end). Never an ID in flight.
    committed_seq: Option<(FenceToken, i64)>,
    /// The work-set cursor the fence accepted (claimed or checkpointed), and under which term.
    committed_cursor: Option<(FenceToken, i64)>,
    /// Set while leader work runs (from work-started to work-stopped).
    acting: Option<FenceToken>,
    /// The last deadline the watchdog enforced, and for which term. Unlike `lease_deadline` it
    /// outlives the term, so work that is still draining can compare its exit with it.
    last_deadline: Option<(FenceToken, Instant)>,
}

/// This node's role as `/status` and the node handle report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// This node holds a term (from `Elected` until demotion begins; its work may still be
    /// draining after that, see [`Status::acting`]).
    Leader,
    /// Another node leads, as the backend reports it.
    Follower,
    /// Neither: no leader is known, or the backend names this node before (or after) it holds a
    /// term.
    Candidate,
}

impl Role {
    /// The lowercase name (`leader`, `follower`, `candidate`), as in `/status` and the `role`
    /// label of [`ROLE`](crate::metrics::ROLE).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
        }
    }
}

/// A point-in-time view (the body of `GET /status`).
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    /// This node's id.
    pub node_id: String,
    /// This node's role at the time of the read.
    pub role: Role,
    /// The token of the term this node holds; `None` when it holds none.
    pub fence_token: Option<FenceToken>,
    /// Time left before the watchdog's deadline; `None` when this node holds no term.
    pub lease_ttl_remaining_ms: Option<u64>,
    /// Who leads: this node while it holds a term, else whom the backend last reported (`None`
    /// when nobody is known to lead). May lag the backend by one observation.
    pub leader: Option<LeaderInfo>,
    /// The election backend in use.
    pub backend: BackendKind,
    /// Whether this node's leader work is running (may outlast `role = leader` while it drains).
    pub acting: bool,
    /// `CLOCK_MONOTONIC` as this process reads it, ns: lets an observer compare the node's clock
    /// rate with its own (a node started under libfaketime reads a scaled clock).
    pub monotonic_ns: u64,
    /// The fleet-wide failure budget as this node last read it from the fenced resource; `None`
    /// while it is off (`[failure_budget] failed_terms = 0`) or has not been read yet.
    pub failure_budget: Option<FailureBudgetStatus>,
}

/// The fleet-wide failure budget of a shard (`[failure_budget]`), as this node last read it
/// from the fenced resource: before each campaign, at each term's start, after each failed term
/// it recorded, and every `recheck_ms` while exhausted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailureBudgetStatus {
    /// Whether the budget is spent: this node does not campaign for the shard.
    pub exhausted: bool,
    /// Failed terms the resource counted within the window (after the latest reset).
    pub failed_terms: u32,
    /// The limit that exhausts it (`failed_terms` of the config).
    pub limit: u32,
    /// The window.
    pub window_ms: u64,
    /// While exhausted: time left until enough failures have left the window for the budget
    /// to reopen, as of this read (an operator reset reopens it sooner).
    pub reopens_in_ms: Option<u64>,
    /// The latest failed term counted: `term T on NODE: ERROR` (the program's exit status, the
    /// job's error chain).
    pub last_failure: Option<String>,
    /// How long ago the resource was read.
    pub checked_ms_ago: u64,
}

/// One read of the budget and when it was made.
#[derive(Clone)]
struct BudgetSeen {
    status: FailureBudgetStatus,
    at: Instant,
}

impl BudgetSeen {
    /// The status with its times counted to now.
    fn now(&self) -> FailureBudgetStatus {
        let age = self.at.elapsed();
        let age_ms = age.as_millis() as u64;
        FailureBudgetStatus {
            reopens_in_ms: self
                .status
                .reopens_in_ms
                .map(|ms| ms.saturating_sub(age_ms)),
            checked_ms_ago: age_ms,
            ..self.status.clone()
        }
    }
}

/// What a leader knows for a read, taken in one snapshot ([`Leadership::read_view`]).
#[derive(Clone, Copy, Debug)]
pub struct ReadView {
    /// The term this node holds.
    pub token: FenceToken,
    /// The watchdog's deadline for it (`None` before the watchdog armed).
    pub lease_deadline: Option<Instant>,
    /// When the renewal behind that deadline was sent.
    pub lease_sent_at: Option<Instant>,
    /// The highest seq committed through the fence in this term (`None`: not claimed yet).
    pub committed_seq: Option<i64>,
    /// The work-set cursor committed through the fence in this term (`None`: not claimed yet).
    pub committed_cursor: Option<i64>,
}

/// See the module docs. Shared as `Arc<Leadership>`.
pub struct Leadership {
    node_id: String,
    http_addr: Option<String>,
    backend: BackendKind,
    term: RwLock<TermView>,
    leader: watch::Receiver<Option<LeaderInfo>>,
    /// Written only by the node's `FailureBudget` (`actors::budget`).
    budget: RwLock<Option<BudgetSeen>>,
}

impl Leadership {
    pub(crate) fn new(
        node_id: String,
        http_addr: Option<String>,
        backend: BackendKind,
        leader: watch::Receiver<Option<LeaderInfo>>,
    ) -> Leadership {
        Leadership {
            node_id,
            http_addr,
            backend,
            term: RwLock::new(TermView::default()),
            leader,
            budget: RwLock::new(None),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The supervisor: a term begins (`Some`) or demotion begins (`None`, which also clears the
    /// deadline: a node that is demoting no longer claims a lease).
    pub(crate) fn set_term(&self, token: Option<FenceToken>) {
        if let Ok(mut t) = self.term.write() {
            t.token = token;
            if token.is_none() {
                t.lease_deadline = None;
                t.lease_sent_at = None;
            }
        }
    }

    /// The watchdog: the deadline it now enforces for `token` (armed or moved by a renewal),
    /// with the send time of the renewal (or grant) it comes from.
    pub(crate) fn set_deadline(&self, token: FenceToken, deadline: Option<(Instant, Instant)>) {
        if let Ok(mut t) = self.term.write() {
            if t.token == Some(token) {
                t.lease_deadline = deadline.map(|(d, _)| d);
                t.lease_sent_at = deadline.map(|(_, s)| s);
                if let Some((d, _)) = deadline {
                    t.last_deadline = Some((token, d));
                }
            }
        }
    }

    /// The supervisor: leader work started (`Some`) or has fully stopped (`None`).
    pub(crate) fn set_acting(&self, token: Option<FenceToken>) {
        if let Ok(mut t) = self.term.write() {
            t.acting = token;
        }
    }

    /// The sequencer: the fence accepted everything up to `seq` under `token`. Called before
    /// any client hears of those IDs, so a read never trails an acknowledged ID.
    pub(crate) fn set_committed_seq(&self, token: FenceToken, seq: i64) {
        if let Ok(mut t) = self.term.write() {
            let keep = matches!(t.committed_seq, Some((tok, s)) if tok == token && s >= seq);
            if !keep {
                t.committed_seq = Some((token, seq));
            }
        }
    }

    /// The scheduler: the fence accepted the work-set cursor `position` under `token`.
    pub(crate) fn set_committed_cursor(&self, token: FenceToken, position: i64) {
        if let Ok(mut t) = self.term.write() {
            t.committed_cursor = Some((token, position));
        }
    }

    /// The failure budget as the resource just answered it (its times as of now).
    pub(crate) fn set_failure_budget(&self, status: FailureBudgetStatus) {
        if let Ok(mut b) = self.budget.write() {
            *b = Some(BudgetSeen {
                status,
                at: Instant::now(),
            });
        }
    }

    /// The failure budget as last read, `None` while it is off or not yet read.
    pub fn failure_budget(&self) -> Option<FailureBudgetStatus> {
        self.budget.read().ok()?.as_ref().map(BudgetSeen::now)
    }

    /// One consistent snapshot of what a read needs: `None` unless this node holds a term.
    pub fn read_view(&self) -> Option<ReadView> {
        let t = self.term.read().ok()?;
        let token = t.token?;
        let of_term = |v: Option<(FenceToken, i64)>| v.filter(|(k, _)| *k == token).map(|(_, x)| x);
        Some(ReadView {
            token,
            lease_deadline: t.lease_deadline,
            lease_sent_at: t.lease_sent_at,
            committed_seq: of_term(t.committed_seq),
            committed_cursor: of_term(t.committed_cursor),
        })
    }

    /// The last deadline the watchdog enforced for the term `token` (moved by every renewal), also
    /// after that term's demotion began: for audits of when draining work stopped.
    pub fn last_deadline(&self, token: FenceToken) -> Option<Instant> {
        let t = self.term.read().ok()?;
        t.last_deadline.filter(|(t, _)| *t == token).map(|(_, d)| d)
    }

    /// Whether this node currently holds a term (the cheap check on the `/next` hot path).
    pub fn is_leading(&self) -> bool {
        self.term.read().map(|t| t.token.is_some()).unwrap_or(false)
    }

    /// The token of the term this node holds, if any.
    pub fn token(&self) -> Option<FenceToken> {
        self.term.read().ok().and_then(|t| t.token)
    }

    /// A watch of who leads, as the backend reports it.
    pub fn leader_watch(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.leader.clone()
    }

    /// A consistent snapshot of the term view plus the latest observed leader; never blocks on an
    /// actor.
    pub fn status(&self) -> Status {
        let t = self.term.read().map(|g| *g).unwrap_or_default();
        let leader = self.leader.borrow().clone();
        let leading = t.token.is_some();
        let role = if leading {
            Role::Leader
        } else if leader.as_ref().is_some_and(|l| l.node_id != self.node_id) {
            Role::Follower
        } else {
            Role::Candidate
        };
        Status {
            node_id: self.node_id.clone(),
            role,
            fence_token: t.token,
            lease_ttl_remaining_ms: t
                .lease_deadline
                .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
            leader: if leading {
                Some(LeaderInfo {
                    node_id: self.node_id.clone(),
                    http_addr: self.http_addr.clone(),
                })
            } else {
                leader
            },
            backend: self.backend,
            acting: t.acting.is_some(),
            monotonic_ns: crate::clock::monotonic_ns(),
            failure_budget: self.failure_budget(),
        }
    }
}
