//! The shard lease table that raft's state machine replicates (`[shards] count = K > 1`): per
//! shard the holder and its epoch (the fencing token), the two log commands that change them
//! ([`ShardCmd`]), and the raft leader's in-memory view of when each holder last renewed
//! (`Leases`). Pure data and rules: no I/O, no raft handle. Why expiry is judged this way:
//! the module docs of [`super::shards`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// The replicated table
// ---------------------------------------------------------------------------------------------

/// Who holds a shard's lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The candidacy: the node id and a random suffix, one per campaign of one elector (a
    /// restarted node is a new candidacy: its old lease must run out first).
    pub id: String,
    /// The node id.
    pub node: String,
    /// The node's [`LeaderInfo`](crate::backends::LeaderInfo) as JSON (where its clients go).
    pub info: String,
}

/// One shard's row of the table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// The newest grant's epoch, the shard's fencing token (0: never granted). Kept when the
    /// lease is released, so the next grant is higher.
    pub epoch: i64,
    /// The holder, while the lease has not been released (it may have expired: only the raft
    /// leader can tell).
    pub holder: Option<Holder>,
}

/// The replicated part of the table: what snapshots carry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTable {
    slots: BTreeMap<u32, Slot>,
}

impl LeaseTable {
    /// Whether no shard was ever granted (a K = 1 fleet's table).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Shard `shard`'s row, if it was ever granted.
    pub fn slot(&self, shard: u32) -> Option<&Slot> {
        self.slots.get(&shard)
    }
}

/// A command of the shard lease table, carried by the raft log (the log's application data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardCmd {
    /// Grant `shard` to `holder` if its epoch is still `expect` and this entry was appended in
    /// raft term `term` (the term in which the leader judged the shard free or expired).
    Grant {
        /// The shard.
        shard: u32,
        /// Who gets it.
        holder: Holder,
        /// The epoch the leader judged free or expired.
        expect: i64,
        /// The raft term the judgement was made in.
        term: u64,
    },
    /// End `holder`'s lease on `shard` (at `epoch`, or any epoch when `None`).
    Release {
        /// The shard.
        shard: u32,
        /// The candidacy id releasing it.
        holder: String,
        /// The epoch released (`None`: whichever this candidacy holds).
        epoch: Option<i64>,
    },
}

impl fmt::Display for ShardCmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardCmd::Grant {
                shard,
                holder,
                expect,
                term,
            } => write!(
                f,
                "grant shard {shard} to {} (expect epoch {expect}, term {term})",
                holder.id
            ),
            ShardCmd::Release {
                shard,
                holder,
                epoch,
            } => write!(f, "release shard {shard} by {holder} (epoch {epoch:?})"),
        }
    }
}

/// What applying a log entry did (the raft log's application response).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardOutcome {
    /// A blank or membership entry.
    #[default]
    None,
    /// Granted.
    Granted {
        /// The new epoch: the shard's fencing token for this term.
        epoch: i64,
    },
    /// Not granted: the shard's epoch moved since the judgement, or the term did.
    Refused {
        /// The shard's epoch as it is.
        epoch: i64,
    },
    /// Whether a release ended a lease.
    Released(bool),
}

/// What the raft leader judged of an `acquire`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Judged {
    /// Free, expired, or already this candidacy's: propose a grant expecting this epoch.
    Grant { expect: i64 },
    /// Held by this node, unexpired.
    Held { node: String },
}

/// The table and this node's own clocks for it, under the state machine's lock. The clocks are
/// never replicated nor persisted: a node that restarts or installs a snapshot counts every
/// held shard as granted at that moment (later is always the safe side).
#[derive(Debug, Default)]
pub(crate) struct Leases {
    table: LeaseTable,
    /// When this node applied each shard's newest grant.
    applied_at: BTreeMap<u32, Instant>,
    /// When this node (as raft leader) received each shard's newest successful renewal, and
    /// of which epoch.
    heard: BTreeMap<u32, (i64, Instant)>,
}

impl Leases {
    /// A table restored at `now` (from a snapshot, or the disk at start): every held shard
    /// counts as granted at `now`.
    pub fn restored(table: LeaseTable, now: Instant) -> Leases {
        let applied_at = table
            .slots
            .iter()
            .filter(|(_, s)| s.holder.is_some())
            .map(|(shard, _)| (*shard, now))
            .collect();
        Leases {
            table,
            applied_at,
            heard: BTreeMap::new(),
        }
    }

    /// The replicated part.
    pub fn table(&self) -> &LeaseTable {
        &self.table
    }

    /// Applies one committed command, appended in raft term `term`, at `now` on this node's
    /// clock. Deterministic in everything replicated.
    pub fn apply(&mut self, cmd: &ShardCmd, term: u64, now: Instant) -> ShardOutcome {
        match cmd {
            ShardCmd::Grant {
                shard,
                holder,
                expect,
                term: judged_in,
            } => {
                let slot = self.table.slots.entry(*shard).or_default();
                if *judged_in != term || slot.epoch != *expect {
                    return ShardOutcome::Refused { epoch: slot.epoch };
                }
                // A term that is not a usable token is refused (the node would not act on it).
                let Ok(term_floor) = i64::try_from(term) else {
                    return ShardOutcome::Refused { epoch: slot.epoch };
                };
                let Some(next) = slot.epoch.checked_add(1) else {
                    return ShardOutcome::Refused { epoch: slot.epoch };
                };
                slot.epoch = next.max(term_floor);
                slot.holder = Some(holder.clone());
                self.applied_at.insert(*shard, now);
                ShardOutcome::Granted { epoch: slot.epoch }
            }
            ShardCmd::Release {
                shard,
                holder,
                epoch,
            } => {
                let Some(slot) = self.table.slots.get_mut(shard) else {
                    return ShardOutcome::Released(false);
                };
                let ours = slot.holder.as_ref().is_some_and(|h| h.id == *holder)
                    && epoch.is_none_or(|e| e == slot.epoch);
                if ours {
                    slot.holder = None;
                }
                ShardOutcome::Released(ours)
            }
        }
    }

    /// The latest moment the holder of `shard` at `epoch` may count its lease from, as this
    /// node knows it; never before `since` (when this node became raft leader).
    fn last_heard(&self, shard: u32, epoch: i64, since: Instant) -> Instant {
        let mut last = since;
        if let Some(at) = self.applied_at.get(&shard) {
            last = last.max(*at);
        }
        if let Some((e, at)) = self.heard.get(&shard) {
            if *e == epoch {
                last = last.max(*at);
            }
        }
        last
    }

    /// The holder of `shard` if its lease has not expired at `now` (judged as in the module
    /// docs, with this node raft leader since `since`).
    fn live_holder(
        &self,
        shard: u32,
        since: Instant,
        now: Instant,
        ttl: Duration,
    ) -> Option<&Holder> {
        let slot = self.table.slots.get(&shard)?;
        let holder = slot.holder.as_ref()?;
        let last = self.last_heard(shard, slot.epoch, since);
        (now < last + ttl).then_some(holder)
    }

    /// The raft leader's judgement of `candidacy`'s acquisition of `shard` at `now`.
    pub fn judge(
        &self,
        shard: u32,
        candidacy: &str,
        since: Instant,
        now: Instant,
        ttl: Duration,
    ) -> Judged {
        let expect = self.table.slots.get(&shard).map_or(0, |s| s.epoch);
        match self.live_holder(shard, since, now, ttl) {
            Some(h) if h.id != candidacy => Judged::Held {
                node: h.node.clone(),
            },
            _ => Judged::Grant { expect },
        }
    }

    /// Whether `candidacy` holds `shard` at `epoch`, unexpired at `now`.
    pub fn holds(
        &self,
        shard: u32,
        candidacy: &str,
        epoch: i64,
        since: Instant,
        now: Instant,
        ttl: Duration,
    ) -> bool {
        self.table
            .slots
            .get(&shard)
            .is_some_and(|s| s.epoch == epoch)
            && self
                .live_holder(shard, since, now, ttl)
                .is_some_and(|h| h.id == candidacy)
    }

    /// A renewal of `candidacy`'s lease on `shard` at `epoch`, received at `received` and judged
    /// at `now`: extended (heard at `received`) iff it still holds, unexpired.
    #[allow(clippy::too_many_arguments)]
    pub fn renew(
        &mut self,
        shard: u32,
        candidacy: &str,
        epoch: i64,
        since: Instant,
        now: Instant,
        ttl: Duration,
        received: Instant,
    ) -> bool {
        if !self.holds(shard, candidacy, epoch, since, now, ttl) {
            return false;
        }
        let at = match self.heard.get(&shard) {
            Some((e, prev)) if *e == epoch => received.max(*prev),
            _ => received,
        };
        self.heard.insert(shard, (epoch, at));
        true
    }

    /// Every shard's unexpired holder: `(shard, LeaderInfo JSON)`.
    pub fn live_holders(&self, since: Instant, now: Instant, ttl: Duration) -> Vec<(u32, String)> {
        self.table
            .slots
            .keys()
            .filter_map(|s| {
                self.live_holder(*s, since, now, ttl)
                    .map(|h| (*s, h.info.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_millis(3000);

    fn holder(id: &str) -> Holder {
        Holder {
            id: id.into(),
            node: id.split('-').next().unwrap().into(),
            info: format!("{{\"node_id\":\"{id}\",\"http_addr\":null}}"),
        }
    }

    fn grant(
        l: &mut Leases,
        shard: u32,
        who: &str,
        expect: i64,
        term: u64,
        at: Instant,
    ) -> ShardOutcome {
        let cmd = ShardCmd::Grant {
            shard,
            holder: holder(who),
            expect,
            term,
        };
        l.apply(&cmd, term, at)
    }

    /// The safety rule: after a raft leader change, a held shard is not granted to another
    /// node until a full TTL has passed since the new leader began, however long ago the old
    /// leader last heard the holder, and a renewal keeps it held.
    #[test]
    fn a_held_shard_waits_a_full_ttl_after_a_raft_leader_change() {
        let t0 = Instant::now();
        // Old leader (term 3) granted shard 1 to n1 at t0; n1 renewed through it until t0+2s.
        let mut old = Leases::default();
        assert_eq!(
            grant(&mut old, 1, "n1-a", 0, 3, t0),
            ShardOutcome::Granted { epoch: 3 }
        );
        assert!(old.renew(
            1,
            "n1-a",
            3,
            t0,
            t0 + Duration::from_secs(2),
            TTL,
            t0 + Duration::from_secs(2)
        ));
        // The new leader (term 4) applied the same log long before (a follower then, its own
        // clock): applied_at = t0. It became leader at t0 + 10 s: nothing heard since.
        let mut new = Leases::default();
        grant(&mut new, 1, "n1-a", 0, 3, t0);
        let since = t0 + Duration::from_secs(10);
        for after in [0, 1000, 2999] {
            let now = since + Duration::from_millis(after);
            assert_eq!(
                new.judge(1, "n2-b", since, now, TTL),
                Judged::Held { node: "n1".into() },
                "{after} ms after the leader change"
            );
        }
        // The holder's renewal at the new leader keeps it held past the first TTL.
        let r = since + Duration::from_millis(2500);
        assert!(new.renew(1, "n1-a", 3, since, r, TTL, r));
        assert!(matches!(
            new.judge(1, "n2-b", since, since + Duration::from_millis(4000), TTL),
            Judged::Held { .. }
        ));
        // A TTL after the last renewal, with none since, it is expired: granted, expecting
        // the old epoch, and the old holder's late renewal is refused (never revived).
        let late = r + TTL;
        assert_eq!(
            new.judge(1, "n2-b", since, late, TTL),
            Judged::Grant { expect: 3 }
        );
        assert!(!new.renew(1, "n1-a", 3, since, late, TTL, late));
        assert_eq!(
            grant(&mut new, 1, "n2-b", 3, 4, late),
            ShardOutcome::Granted { epoch: 4 }
        );
        assert!(!new.renew(1, "n1-a", 3, since, late, TTL, late));
        assert!(new.holds(1, "n2-b", 4, since, late, TTL));
    }

    #[test]
    fn a_fresh_grant_is_held_for_a_ttl_from_its_application_even_for_an_old_leader() {
        let since = Instant::now();
        let mut l = Leases::default();
        // The leader has led for a long time; a grant applied just now is not "expired".
        let now = since + Duration::from_secs(60);
        grant(&mut l, 0, "n1-a", 0, 2, now);
        assert!(matches!(
            l.judge(0, "n2-b", since, now, TTL),
            Judged::Held { .. }
        ));
        assert!(matches!(
            l.judge(0, "n2-b", since, now + TTL - Duration::from_millis(1), TTL),
            Judged::Held { .. }
        ));
        assert_eq!(
            l.judge(0, "n2-b", since, now + TTL, TTL),
            Judged::Grant { expect: 2 }
        );
        // Its own candidacy re-takes it at once (a grant whose answer was lost).
        assert_eq!(
            l.judge(0, "n1-a", since, now, TTL),
            Judged::Grant { expect: 2 }
        );
    }

    #[test]
    fn epochs_only_grow_per_shard_and_never_fall_below_the_raft_term() {
        let t = Instant::now();
        let mut l = Leases::default();
        assert_eq!(
            grant(&mut l, 5, "n1-a", 0, 7, t),
            ShardOutcome::Granted { epoch: 7 }
        );
        // Same term, next grant: epoch + 1.
        assert_eq!(
            grant(&mut l, 5, "n2-a", 7, 7, t),
            ShardOutcome::Granted { epoch: 8 }
        );
        // A later term below the epoch: still epoch + 1.
        assert_eq!(
            grant(&mut l, 5, "n3-a", 8, 8, t),
            ShardOutcome::Granted { epoch: 9 }
        );
        // A term above: the term.
        assert_eq!(
            grant(&mut l, 5, "n1-b", 9, 20, t),
            ShardOutcome::Granted { epoch: 20 }
        );
        // A grant judged on an older epoch (a concurrent grant won) is refused.
        assert_eq!(
            grant(&mut l, 5, "n2-b", 9, 20, t),
            ShardOutcome::Refused { epoch: 20 }
        );
        // A grant judged in one term but appended in another is refused.
        let cmd = ShardCmd::Grant {
            shard: 5,
            holder: holder("n2-b"),
            expect: 20,
            term: 20,
        };
        assert_eq!(l.apply(&cmd, 21, t), ShardOutcome::Refused { epoch: 20 });
        // Release keeps the epoch; the next grant is higher.
        let rel = ShardCmd::Release {
            shard: 5,
            holder: "n1-b".into(),
            epoch: Some(20),
        };
        assert_eq!(l.apply(&rel, 21, t), ShardOutcome::Released(true));
        assert_eq!(l.apply(&rel, 21, t), ShardOutcome::Released(false));
        assert_eq!(l.table().slot(5).unwrap().epoch, 20);
        assert_eq!(l.judge(5, "n3-c", t, t, TTL), Judged::Grant { expect: 20 });
        assert_eq!(
            grant(&mut l, 5, "n3-c", 20, 21, t),
            ShardOutcome::Granted { epoch: 21 }
        );
        // Shards are independent.
        assert_eq!(
            grant(&mut l, 6, "n3-c", 0, 21, t),
            ShardOutcome::Granted { epoch: 21 }
        );
    }

    #[test]
    fn a_restored_table_counts_every_held_shard_as_granted_at_restore() {
        let t = Instant::now();
        let mut l = Leases::default();
        grant(&mut l, 0, "n1-a", 0, 1, t);
        grant(&mut l, 1, "n2-a", 0, 1, t);
        l.apply(
            &ShardCmd::Release {
                shard: 1,
                holder: "n2-a".into(),
                epoch: None,
            },
            1,
            t,
        );
        let later = t + Duration::from_secs(100);
        let r = Leases::restored(l.table().clone(), later);
        assert!(matches!(
            r.judge(0, "n3-a", t, later + TTL / 2, TTL),
            Judged::Held { .. }
        ));
        assert_eq!(
            r.judge(1, "n3-a", t, later, TTL),
            Judged::Grant { expect: 1 }
        );
        assert_eq!(r.live_holders(t, later, TTL).len(), 1);
        assert!(r.live_holders(t, later + TTL, TTL).is_empty());
    }
}
