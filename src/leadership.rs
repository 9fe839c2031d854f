//! The one place that answers "who leads, am I acting, and until when" for this node.
//!
//! Each fact has exactly one writer, an actor of the tree: the supervisor writes the term's token
//! and whether leader work runs; the watchdog writes the lease deadline it enforces (so the
//! deadline read here moves with every renewal, as the watchdog's does); the elector's observer
//! writes who the backend says leads; the tree's failure budget (`actors::budget`) writes what
//! the resource last said of it. HTTP, the node handle and metrics only read. Reads never
//! block on an actor: a read lock on a few words. What a read (`GET /read`) needs is also
//! published, by whichever writer changed it and while it still holds the write lock, as a
//! lock-free snapshot ([`Leadership::read_view`]): a lease read takes no lock that the writers
//! (the sequencer's group commits among them) take.

use std::sync::atomic::{fence, AtomicI64, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

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
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// This node holds a term (from `Elected` until demotion begins; its work may still be
    /// draining after that, see [`Status::acting`]).
    Leader,
    /// Another node leads, as the backend reports it.
    Follower,
    /// Neither: no leader is known, or the backend names this node before (or after) it holds a
    /// term.
    Candidate,
    /// Holds no term and does not campaign: the fleet-wide failure budget is spent (as this node
    /// last read it, see [`Status::failure_budget`]) until its window passes or an operator
    /// runs `baton budget reset`.
    BudgetBlocked,
}

impl Role {
    /// Every role, in the order of [`Role::as_str`]'s names.
    pub const ALL: [Role; 4] = [
        Role::Leader,
        Role::Follower,
        Role::Candidate,
        Role::BudgetBlocked,
    ];

    /// The lowercase name (`leader`, `follower`, `candidate`, `budget_blocked`), as in
    /// `/status` and the `role` label of [`ROLE`](crate::metrics::ROLE).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::BudgetBlocked => "budget_blocked",
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

/// [`ReadView`] as a seqlock over plain atomics, for readers that must not take `term`'s lock.
///
/// Written only while `term`'s write lock is held (so writers never race each other): the
/// sequence turns odd, the fields are stored, the sequence turns even again. A reader reads the
/// sequence, the fields, and the sequence again, and retries until both are the same even number:
/// then no write overlapped its loads and the fields are one write's. Instants are stored as
/// signed ns from `epoch`.
#[repr(align(64))]
struct ReadSnapshot {
    seq: AtomicU64,
    /// Which of the optional fields are present (`HAS_*`); 0 = no term.
    present: AtomicU64,
    token: AtomicI64,
    lease_deadline: AtomicI64,
    lease_sent_at: AtomicI64,
    committed_seq: AtomicI64,
    committed_cursor: AtomicI64,
}

const HAS_TOKEN: u64 = 1;
const HAS_DEADLINE: u64 = 1 << 1;
const HAS_SENT: u64 = 1 << 2;
const HAS_SEQ: u64 = 1 << 3;
const HAS_CURSOR: u64 = 1 << 4;

impl ReadSnapshot {
    fn new() -> ReadSnapshot {
        ReadSnapshot {
            seq: AtomicU64::new(0),
            present: AtomicU64::new(0),
            token: AtomicI64::new(0),
            lease_deadline: AtomicI64::new(0),
            lease_sent_at: AtomicI64::new(0),
            committed_seq: AtomicI64::new(0),
            committed_cursor: AtomicI64::new(0),
        }
    }

    /// Publishes `view` (`None`: no term). The caller holds `term`'s write lock.
    fn publish(&self, epoch: Instant, view: Option<ReadView>) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let mut present = 0;
        if let Some(v) = view {
            present |= HAS_TOKEN;
            self.token.store(v.token.0, Ordering::Relaxed);
            let mut put = |bit: u64, field: &AtomicI64, value: Option<i64>| {
                if let Some(x) = value {
                    present |= bit;
                    field.store(x, Ordering::Relaxed);
                }
            };
            put(
                HAS_DEADLINE,
                &self.lease_deadline,
                v.lease_deadline.map(|t| to_ns(epoch, t)),
            );
            put(
                HAS_SENT,
                &self.lease_sent_at,
                v.lease_sent_at.map(|t| to_ns(epoch, t)),
            );
            put(HAS_SEQ, &self.committed_seq, v.committed_seq);
            put(HAS_CURSOR, &self.committed_cursor, v.committed_cursor);
        }
        self.present.store(present, Ordering::Relaxed);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// One write's fields, never a mix of two.
    fn load(&self, epoch: Instant) -> Option<ReadView> {
        let mut spins = 0u32;
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let present = self.present.load(Ordering::Relaxed);
                let token = self.token.load(Ordering::Relaxed);
                let deadline = self.lease_deadline.load(Ordering::Relaxed);
                let sent = self.lease_sent_at.load(Ordering::Relaxed);
                let seq = self.committed_seq.load(Ordering::Relaxed);
                let cursor = self.committed_cursor.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    if present & HAS_TOKEN == 0 {
                        return None;
                    }
                    let has = |bit: u64| present & bit != 0;
                    return Some(ReadView {
                        token: FenceToken(token),
                        lease_deadline: has(HAS_DEADLINE).then(|| from_ns(epoch, deadline)),
                        lease_sent_at: has(HAS_SENT).then(|| from_ns(epoch, sent)),
                        committed_seq: has(HAS_SEQ).then_some(seq),
                        committed_cursor: has(HAS_CURSOR).then_some(cursor),
                    });
                }
            }
            // A writer is between its two stores (a few stores long), or was preempted there.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// `t` as signed ns from `epoch` (an instant before it is negative).
fn to_ns(epoch: Instant, t: Instant) -> i64 {
    match t.checked_duration_since(epoch) {
        Some(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        None => -i64::try_from(epoch.duration_since(t).as_nanos()).unwrap_or(i64::MAX),
    }
}

fn from_ns(epoch: Instant, ns: i64) -> Instant {
    if ns >= 0 {
        epoch + Duration::from_nanos(ns as u64)
    } else {
        epoch - Duration::from_nanos(ns.unsigned_abs())
    }
}

impl TermView {
    /// What a read sees of this view: `None` unless this node holds a term.
    fn read_view(&self) -> Option<ReadView> {
        let token = self.token?;
        let of_term = |v: Option<(FenceToken, i64)>| v.filter(|(k, _)| *k == token).map(|(_, x)| x);
        Some(ReadView {
            token,
            lease_deadline: self.lease_deadline,
            lease_sent_at: self.lease_sent_at,
            committed_seq: of_term(self.committed_seq),
            committed_cursor: of_term(self.committed_cursor),
        })
    }
}

/// See the module docs. Shared as `Arc<Leadership>`.
pub struct Leadership {
    node_id: String,
    http_addr: Option<String>,
    backend: BackendKind,
    term: RwLock<TermView>,
    /// `term`'s [`ReadView`], republished by every write of `term` before its lock is released.
    snapshot: ReadSnapshot,
    /// The origin of `snapshot`'s instants.
    epoch: Instant,
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
            snapshot: ReadSnapshot::new(),
            epoch: Instant::now(),
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
            self.publish(&t);
        }
    }

    /// Republishes the read snapshot from `t`; called with `term`'s write lock held.
    fn publish(&self, t: &TermView) {
        self.snapshot.publish(self.epoch, t.read_view());
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
                self.publish(&t);
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
                self.publish(&t);
            }
        }
    }

    /// The scheduler: the fence accepted the work-set cursor `position` under `token`.
    pub(crate) fn set_committed_cursor(&self, token: FenceToken, position: i64) {
        if let Ok(mut t) = self.term.write() {
            t.committed_cursor = Some((token, position));
            self.publish(&t);
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
    /// Takes no lock (see `ReadSnapshot`): it never waits for, nor delays, a writer such as
    /// the sequencer publishing a group commit; it sees every write whose lock was released
    /// before it began.
    pub fn read_view(&self) -> Option<ReadView> {
        self.snapshot.load(self.epoch)
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
        let failure_budget = self.failure_budget();
        let role = if leading {
            Role::Leader
        } else if failure_budget.as_ref().is_some_and(|b| b.exhausted) {
            Role::BudgetBlocked
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
            failure_budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    fn leadership() -> Leadership {
        let (_tx, rx) = watch::channel(None);
        Leadership::new("n1".into(), None, BackendKind::Raft, rx)
    }

    /// The lock-free view says what the locked one would, through every writer.
    #[test]
    fn the_read_snapshot_follows_every_writer() {
        let l = leadership();
        assert!(l.read_view().is_none(), "no term, no view");
        let (t1, t2) = (FenceToken(7), FenceToken(8));
        l.set_term(Some(t1));
        let v = l.read_view().unwrap();
        assert_eq!(v.token, t1);
        assert!(v.lease_deadline.is_none() && v.committed_seq.is_none());
        // A deadline before the view's epoch (a renewal sent before the node was built) too.
        let sent = Instant::now() - Duration::from_millis(5);
        let deadline = sent + Duration::from_millis(150);
        l.set_deadline(t1, Some((deadline, sent)));
        l.set_committed_seq(t1, 41);
        l.set_committed_seq(t1, 40); // lower: kept at 41
        l.set_committed_cursor(t1, 3);
        let v = l.read_view().unwrap();
        assert_eq!(
            (
                v.lease_deadline,
                v.lease_sent_at,
                v.committed_seq,
                v.committed_cursor
            ),
            (Some(deadline), Some(sent), Some(41), Some(3))
        );
        // Another term's deadline is ignored; values committed under another term are not
        // this term's.
        l.set_deadline(t2, Some((deadline + Duration::from_secs(1), sent)));
        assert_eq!(l.read_view().unwrap().lease_deadline, Some(deadline));
        l.set_term(Some(t2));
        let v = l.read_view().unwrap();
        assert_eq!(
            (v.token, v.committed_seq, v.committed_cursor),
            (t2, None, None)
        );
        // Demotion clears the view at once.
        l.set_term(None);
        assert!(l.read_view().is_none());
    }

    /// Issue 43: a node the spent failure budget keeps from campaigning says so in its role
    /// (not "candidate"), until the budget reopens; a term it holds still says leader.
    #[test]
    fn a_spent_budget_shows_as_the_role_budget_blocked() {
        let l = leadership();
        assert_eq!(l.status().role, Role::Candidate);
        let budget = |exhausted| FailureBudgetStatus {
            exhausted,
            failed_terms: 5,
            limit: 5,
            window_ms: 600_000,
            reopens_in_ms: exhausted.then_some(1000),
            last_failure: Some("term 3 on n1: exit=3".into()),
            checked_ms_ago: 0,
        };
        l.set_failure_budget(budget(true));
        let st = l.status();
        assert_eq!(st.role, Role::BudgetBlocked);
        assert_eq!(
            serde_json::to_value(&st).unwrap()["role"],
            "budget_blocked",
            "as /status says it"
        );
        assert_eq!(Role::BudgetBlocked.as_str(), "budget_blocked");
        l.set_term(Some(FenceToken(4)));
        assert_eq!(l.status().role, Role::Leader);
        l.set_term(None);
        l.set_failure_budget(budget(false));
        assert_eq!(l.status().role, Role::Candidate);
    }

    /// Readers racing a writer never see a mix of two writes: each write sets seq and cursor
    /// from one counter, and the deadline from the same counter.
    #[test]
    fn readers_racing_a_writer_see_whole_writes_only() {
        let l = Arc::new(leadership());
        let token = FenceToken(1);
        l.set_term(Some(token));
        let base = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seen = 0u64;
                    let mut last = -1;
                    while !stop.load(Ordering::Relaxed) {
                        let v = l.read_view().expect("the term holds throughout");
                        if let (Some(seq), Some(cursor)) = (v.committed_seq, v.committed_cursor) {
                            assert_eq!(cursor, seq * 3, "a torn read: {v:?}");
                            let d = v.lease_deadline.expect("set with them");
                            assert_eq!(d, base + Duration::from_micros(seq as u64), "{v:?}");
                            assert!(seq >= last, "went back from {last} to {seq}");
                            last = seq;
                            seen += 1;
                        }
                    }
                    seen
                })
            })
            .collect();
        // One writer publishing all three fields under one lock, as `publish` does.
        for i in 0..200_000i64 {
            let mut t = l.term.write().unwrap();
            t.committed_seq = Some((token, i));
            t.committed_cursor = Some((token, i * 3));
            t.lease_deadline = Some(base + Duration::from_micros(i as u64));
            t.lease_sent_at = Some(base);
            l.publish(&t);
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0, "a reader saw nothing");
        }
    }
}
