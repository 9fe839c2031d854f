//! The fenced resource's client side. The rule itself lives in PostgreSQL (`sql/0001_fence.sql`):
//! a stale node can believe anything, it cannot make the resource accept the past. Each protected
//! write is one call of a `SECURITY DEFINER` function: one round trip, one transaction.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Config as PoolConfig, Pool, PoolConfig as PoolSize, Timeouts};

use crate::backends::FenceToken;
use crate::config::ResourceConfig;
use crate::metrics as m;
use crate::pg::{answer_bound, create_pool, error_chain, Conn, Unanswered};
use crate::shard::ShardId;

mod admin;
mod budget;
mod reads;
mod seq_pipe;
mod transaction;

pub use admin::*;
pub use budget::*;
pub use reads::*;
pub use seq_pipe::*;
pub use transaction::*;

const ROLES_SQL: &str = include_str!("../sql/0000_roles.sql");
/// The schema, file by file, in the order [`migrate`] applies it (as `baton_owner`, in one
/// transaction: a later file may replace what an earlier one calls, and a node never sees the
/// schema half applied).
const SCHEMA_FILES: [(&str, &str); 4] = [
    ("0001_fence.sql", include_str!("../sql/0001_fence.sql")),
    ("0002_read.sql", include_str!("../sql/0002_read.sql")),
    ("0003_preempt.sql", include_str!("../sql/0003_preempt.sql")),
    (
        "0004_failure_budget.sql",
        include_str!("../sql/0004_failure_budget.sql"),
    ),
];
/// Session defaults for every role that calls the fenced functions (the shared application role
/// and each per-node role): nobody holds the fence row. A transaction left idle (a client paused
/// or gone mid-transaction, or a hostile `BEGIN; ...`) is ended by the server, which releases its
/// locks; no statement runs, or waits for a lock, for long. (A newer term does not wait even that
/// long for a lower token's open transaction: it ends it, see [`Fence::begin`]; these timeouts
/// bound the rest.) These are defaults a session could override: they bound a paused or buggy
/// client, not a hostile holder of the role's credentials (the trust boundary: the fence
/// protects against stale nodes).
const ROLE_TIMEOUTS: [(&str, &str); 3] = [
    ("idle_in_transaction_session_timeout", "5s"),
    ("statement_timeout", "5s"),
    ("lock_timeout", "5s"),
];
/// The shared application role (created by `sql/0000_roles.sql`).
pub const APP_ROLE: &str = "baton_app";

/// The `application_name` of the sequencers' connections (unless `database_url` names one),
/// so `pg_stat_activity` tells them from the rest.
pub const SEQ_APPLICATION_NAME: &str = "baton-sequencer";

/// How many of a node's shards may keep their sequencer's connection open while idle (see
/// [`Fence::take_warm_slot`]).
pub const WARM_SEQ_PIPES: usize = 8;
/// Serializes concurrent migrators (several `baton migrate` or fleets on one server).
const MIGRATION_LOCK_KEY: i64 = 0x0062_6174_6f6e; // "baton" in ASCII

/// Why a fenced call did not take effect.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The resource refused the write: a newer token (or another holder of this one) was accepted.
    #[error("fenced out ({reason}): {op} on {resource} with token {token} refused, resource is at token {max_token} held by {max_holder:?}")]
    Rejected {
        /// The fenced resource's name (the sequence, the work-set cursor, or the caller's own).
        resource: String,
        /// The refused operation: `claim`, `next`, `tick`, `checkpoint`, `user` (a
        /// [`Fence::begin`] transaction), or `failed-term` ([`Fence::record_failed_term`]); the
        /// `op` label of `baton_fence_rejections_total`.
        op: &'static str,
        /// The token this node wrote with.
        token: FenceToken,
        /// The highest token the resource has accepted; -1 when a refused user write could not
        /// be recorded and the resource's state is unknown.
        max_token: i64,
        /// The holder of `max_token`; empty when unknown.
        max_holder: String,
        /// Why, as the resource recorded it: `stale-token`, `holder-mismatch`,
        /// `seq-not-forward`, `seq-advance-too-large`.
        reason: String,
    },
    /// The resource could not be reached, or the call failed; the write did not happen or its
    /// outcome is unknown (the caller must not report it as done).
    #[error("resource unavailable: {0}")]
    Unavailable(String),
    /// The resource's `baton` schema or one of its functions does not exist (SQLSTATE 42883 or
    /// 3F000): [`migrate`] has not been run against this database. Carries the server's message.
    #[error("resource schema missing or outdated ({0}); run `baton migrate`")]
    Schema(String),
    /// An administrative request that cannot be right (nothing was changed).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl From<tokio_postgres::Error> for FenceError {
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            // undefined_function / undefined schema: nobody ran the migration.
            if db.code().code() == "42883" || db.code().code() == "3F000" {
                return FenceError::Schema(db.message().to_owned());
            }
            return FenceError::Unavailable(format!("{}: {}", db.code().code(), db.message()));
        }
        FenceError::Unavailable(error_chain(&e))
    }
}

impl From<deadpool_postgres::PoolError> for FenceError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            // The server's own reason (e.g. a refused plain-text or unverified connection), not
            // the pool's "db error".
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            e => FenceError::Unavailable(e.to_string()),
        }
    }
}

/// The error of a call left unanswered ([`Conn::within`] logged it).
fn unanswered(why: Unanswered) -> FenceError {
    FenceError::Unavailable(format!(
        "{why}; the connection is closed and the outcome is unknown"
    ))
}

/// A handle on the fenced resource for one holder (node). Cheap to clone.
#[derive(Clone)]
pub struct Fence {
    pool: Pool,
    /// How long a call may go unanswered before its connection is given up
    /// ([`crate::pg::answer_bound`] of the statement timeout).
    answer_bound: Duration,
    /// The sequencer's own connection (see [`Fence::seq_pipe`]): made by the first pipe taken,
    /// so its I/O runs on the runtime the sequencer's commits run on.
    seq_pool: Pool,
    /// What [`Fence::for_shard`] builds a shard's own sequencer pool from.
    seq_pool_cfg: Arc<(PoolConfig, Option<std::path::PathBuf>, Duration)>,
    /// Warm slots taken, node-wide (shared by every shard's handle; see
    /// [`Fence::take_warm_slot`]).
    warm_seq_pipes: Arc<AtomicUsize>,
    holder: String,
    /// The shard whose fence domain this handle writes in: every resource name it is given
    /// is written as `shard.resource(name)` (unchanged for shard 0), so a shard's leader can
    /// only ever be checked against its own shard's fence row.
    shard: ShardId,
    /// Claims refused in a row (shared by every clone: one count per node).
    refused_claims_in_a_row: Arc<AtomicU64>,
    /// The token of this shard's latest claim that the resource did not answer (0: none).
    unanswered_claim_token: Arc<AtomicI64>,
}

/// What a refusal says: the columns every fenced function returns after `accepted`, read only
/// when it is false ([`Fence::judge`]).
struct Verdict {
    max_token: i64,
    max_holder: String,
    reason: Option<String>,
}

impl Verdict {
    fn from_row(row: &tokio_postgres::Row) -> Verdict {
        Verdict {
            max_token: row.get(1),
            max_holder: row.get(2),
            // Functions that can refuse for a reason other than the token say which.
            reason: row.try_get::<_, Option<String>>("reason").ok().flatten(),
        }
    }

    /// The resource's reason, or the token rule's when the function does not name one.
    fn reason(&self, token: FenceToken) -> String {
        self.reason.clone().unwrap_or_else(|| {
            if token.0 < self.max_token {
                "stale-token"
            } else {
                "holder-mismatch"
            }
            .to_owned()
        })
    }
}

impl Fence {
    /// Builds the pool; connects lazily, so a resource that is down at start is reported by the
    /// first write, not by a crash.
    pub fn new(cfg: &ResourceConfig, holder: &str) -> Result<Fence, FenceError> {
        let mut pc = PoolConfig::new();
        pc.url = Some(cfg.database_url.clone());
        pc.options = Some(format!("-c statement_timeout={}", cfg.statement_timeout_ms));
        let wait = Duration::from_millis(cfg.statement_timeout_ms);
        let size = |max_size: usize| PoolSize {
            max_size,
            timeouts: Timeouts {
                wait: Some(wait),
                create: Some(wait),
                recycle: Some(wait),
            },
            ..PoolSize::default()
        };
        let mut seq_pc = pc.clone();
        if !cfg.database_url.contains("application_name") {
            seq_pc.application_name = Some(SEQ_APPLICATION_NAME.to_owned());
        }
        pc.pool = Some(size(cfg.pool_size.max(1)));
        seq_pc.pool = Some(size(1));
        let pool =
            create_pool(pc, cfg.tls_ca_file.as_deref(), wait).map_err(FenceError::Unavailable)?;
        let seq_pool = create_pool(seq_pc.clone(), cfg.tls_ca_file.as_deref(), wait)
            .map_err(FenceError::Unavailable)?;
        Ok(Fence {
            pool,
            answer_bound: answer_bound(wait),
            seq_pool,
            seq_pool_cfg: Arc::new((seq_pc, cfg.tls_ca_file.clone(), wait)),
            warm_seq_pipes: Arc::default(),
            holder: holder.to_owned(),
            shard: ShardId::ZERO,
            refused_claims_in_a_row: Arc::default(),
            unanswered_claim_token: Arc::default(),
        })
    }

    /// A handle writing in `shard`'s fence domain (see [`crate::shard`]). It shares this
    /// handle's pool, but its sequencer gets a connection of its own, so K shards' group
    /// commits run side by side instead of queueing on one connection.
    pub fn for_shard(&self, shard: ShardId) -> Result<Fence, FenceError> {
        let (pc, ca, wait) = &*self.seq_pool_cfg;
        let seq_pool =
            create_pool(pc.clone(), ca.as_deref(), *wait).map_err(FenceError::Unavailable)?;
        Ok(Fence {
            shard,
            seq_pool,
            // Tokens are per shard.
            unanswered_claim_token: Arc::default(),
            ..self.clone()
        })
    }

    /// Takes one of the node's [`WARM_SEQ_PIPES`] warm slots, if one is free: a sequencer
    /// holding one opens its connection beside its claim and keeps it open while idle, as an
    /// unsharded node's always did. The others open theirs at their first commit and close it
    /// after an idle spell ([`Fence::close_idle_seq_pipe`]), so K idle shards do not hold K
    /// PostgreSQL connections (at K = 1024 they exhausted the server's `max_connections`).
    pub fn take_warm_slot(&self) -> bool {
        self.warm_seq_pipes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < WARM_SEQ_PIPES).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back a slot [`Fence::take_warm_slot`] took.
    pub fn release_warm_slot(&self) {
        let _ = self
            .warm_seq_pipes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Closes this shard's sequencer connection if it sits idle in its pool (one taken by a
    /// pipe stays open until that pipe drops). True when one was closed.
    pub fn close_idle_seq_pipe(&self) -> bool {
        !self.seq_pool.retain(|_, _| false).removed.is_empty()
    }

    /// The shard this handle writes in.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// `name` as this handle's shard stores it.
    fn named(&self, name: &str) -> String {
        self.shard.resource(name)
    }

    /// The holder id (the node id) this handle records with every fenced write.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether the resource enforces the fence (only its owner can switch it off).
    pub async fn fencing_enabled(&self) -> Result<bool, FenceError> {
        let client = Conn::new(self.pool.get().await?);
        let asked = client.query_one("SELECT baton.fencing_enabled()", &[]);
        Ok(self.ask(&client, asked).await??.get(0))
    }

    /// `call` on `client`, or [`FenceError::Unavailable`] when PostgreSQL leaves it unanswered
    /// past the bound; the connection is then closed as `client` drops, so no later call waits
    /// behind the same lost answer. The call's outcome is unknown to the caller.
    async fn ask<F: Future>(&self, client: &Conn, call: F) -> Result<F::Output, FenceError> {
        client
            .within(self.answer_bound, call)
            .await
            .map_err(unanswered)
    }

    /// Calls one fenced function; maps a refusal to [`FenceError::Rejected`] (counted and logged).
    async fn call(
        &self,
        resource: &str,
        op: &'static str,
        token: FenceToken,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, FenceError> {
        let row = self.query_row(sql, params).await.inspect_err(|_| {
            if op == "claim" {
                self.unanswered_claim_token
                    .store(token.0, Ordering::Relaxed);
            }
        })?;
        self.judge(resource, op, token, row)
    }

    /// The one row of `sql` (prepared once per pooled connection), within the answer bound.
    async fn query_row(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, FenceError> {
        let client = Conn::new(self.pool.get().await?);
        let asked = async {
            let stmt = client.prepare_cached(sql).await?;
            client.query_one(&stmt, params).await
        };
        Ok(self.ask(&client, asked).await??)
    }

    /// The row of a fenced function, or its refusal as [`FenceError::Rejected`]. An accepted
    /// row is judged by its first column alone: the group commit's answer is read here once per
    /// commit on the sequencer's serial path, and the rest (the holder's name, the reason looked
    /// up by column name) only matters to a refusal.
    fn judge(
        &self,
        resource: &str,
        op: &'static str,
        token: FenceToken,
        row: tokio_postgres::Row,
    ) -> Result<tokio_postgres::Row, FenceError> {
        let accepted: bool = row.get(0);
        if op == "claim" {
            self.count_claim(accepted);
        }
        if accepted {
            return Ok(row);
        }
        Err(self.rejected(resource, op, token, Verdict::from_row(&row)))
    }

    /// How many of this node's terms in a row had their claim refused (0 after an accepted one).
    pub(crate) fn refused_claims_in_a_row(&self) -> u64 {
        self.refused_claims_in_a_row.load(Ordering::Relaxed)
    }

    /// Whether a claim of term `token` went unanswered (the resource unreachable, or the call
    /// failed): the term's work then failed on the resource, not on its own.
    pub(crate) fn claim_unanswered(&self, token: FenceToken) -> bool {
        self.unanswered_claim_token.load(Ordering::Relaxed) == token.0
    }

    /// Tracks whether the resource refuses every new term of this node.
    fn count_claim(&self, accepted: bool) {
        let in_a_row = if accepted {
            self.refused_claims_in_a_row.store(0, Ordering::Relaxed);
            0
        } else {
            self.refused_claims_in_a_row.fetch_add(1, Ordering::Relaxed) + 1
        };
        metrics::gauge!(m::FENCE_REFUSED_CLAIMS_IN_A_ROW).set(in_a_row as f64);
    }

    /// A new leader claims the sequence; returns the last committed seq.
    pub async fn seq_claim(&self, resource: &str, token: FenceToken) -> Result<i64, FenceError> {
        let resource = &*self.named(resource);
        let row = self
            .call(
                resource,
                "claim",
                token,
                "SELECT * FROM baton.seq_claim($1, $2, $3)",
                &[&resource, &token.0, &self.holder],
            )
            .await?;
        Ok(row.get(3))
    }

    /// A connection for a run of group commits (see [`SeqPipe`]); it goes back when the last
    /// `Arc` of it drops. It comes from a pool of one of its own, not the shared pool: a pooled
    /// connection's I/O runs on the runtime that opened it, and this one is opened by the first
    /// commit, so its I/O runs where the sequencer's commits do (a client or commit thread, see
    /// `work::sequencer`) instead of waking another thread for every reply.
    ///
    /// The pipe commits ranges of the sequence `resource` only.
    pub async fn seq_pipe(&self, resource: &str) -> Result<SeqPipe, FenceError> {
        let client = Conn::new(self.seq_pool.get().await?);
        let stmt = self
            .ask(&client, client.prepare_cached(SEQ_COMMIT_SQL))
            .await??;
        Ok(SeqPipe {
            client,
            stmt,
            resource: self.named(resource).into(),
            fence: self.clone(),
        })
    }

    /// One ID allocated and committed inside the database, one round trip per ID (the baseline
    /// `baton bench next` compares group commit against).
    pub async fn seq_next(&self, resource: &str, token: FenceToken) -> Result<i64, FenceError> {
        let resource = &*self.named(resource);
        let row = self
            .call(
                resource,
                "next",
                token,
                "SELECT * FROM baton.seq_next($1, $2, $3)",
                &[&resource, &token.0, &self.holder],
            )
            .await?;
        Ok(row.get(3))
    }

    /// A new leader claims the work-set cursor; returns the published position.
    pub async fn cursor_claim(&self, resource: &str, token: FenceToken) -> Result<i64, FenceError> {
        let resource = &*self.named(resource);
        let row = self
            .call(
                resource,
                "claim",
                token,
                "SELECT * FROM baton.cursor_claim($1, $2, $3)",
                &[&resource, &token.0, &self.holder],
            )
            .await?;
        Ok(row.get(3))
    }

    /// One scheduler tick from `from`; returns `(new_position, jobs_run)`.
    pub async fn sched_tick(
        &self,
        resource: &str,
        token: FenceToken,
        from: i64,
        limit: i32,
    ) -> Result<(i64, i64), FenceError> {
        let resource = &*self.named(resource);
        let row = self
            .call(
                resource,
                "tick",
                token,
                "SELECT * FROM baton.sched_tick($1, $2, $3, $4, $5)",
                &[&resource, &token.0, &self.holder, &from, &limit],
            )
            .await?;
        Ok((row.get(3), row.get(4)))
    }

    /// Publishes the work-set cursor.
    pub async fn cursor_checkpoint(
        &self,
        resource: &str,
        token: FenceToken,
        position: i64,
    ) -> Result<(), FenceError> {
        let resource = &*self.named(resource);
        self.call(
            resource,
            "checkpoint",
            token,
            "SELECT * FROM baton.cursor_checkpoint($1, $2, $3, $4)",
            &[&resource, &token.0, &self.holder, &position],
        )
        .await
        .map(drop)
    }
}
