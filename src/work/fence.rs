//! The fenced resource's client side. The rule itself lives in PostgreSQL (`sql/0001_fence.sql`):
//! a stale node can believe anything, it cannot make the resource accept the past. Each protected
//! write is one call of a `SECURITY DEFINER` function: one round trip, one transaction.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Config as PoolConfig, Pool, PoolConfig as PoolSize, Timeouts};

use crate::backends::FenceToken;
use crate::config::{FailureBudgetConfig, ResourceConfig};
use crate::metrics as m;
use crate::pg::{admin_session, answer_bound, create_pool, error_chain, Conn, Unanswered};
use crate::shard::ShardId;

const ROLES_SQL: &str = include_str!("sql/0000_roles.sql");
/// The schema, file by file, in the order [`migrate`] applies it (as `baton_owner`, in one
/// transaction: a later file may replace what an earlier one calls, and a node never sees the
/// schema half applied).
const SCHEMA_FILES: [(&str, &str); 4] = [
    ("0001_fence.sql", include_str!("sql/0001_fence.sql")),
    ("0002_read.sql", include_str!("sql/0002_read.sql")),
    ("0003_preempt.sql", include_str!("sql/0003_preempt.sql")),
    (
        "0004_failure_budget.sql",
        include_str!("sql/0004_failure_budget.sql"),
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

const SEQ_COMMIT_SQL: &str = "SELECT * FROM baton.seq_commit($1, $2, $3, $4, $5)";

/// One connection kept for consecutive group commits of the sequence, `seq_commit` prepared on
/// it. Commits sent on one pipe run in PostgreSQL in the order they were sent: tokio-postgres
/// writes a client's requests in the order their futures are first polled (its documented
/// rule), [`SeqPipe::send_commit`] polls once before it returns, and one backend executes what
/// it reads one statement after another. So a second commit can wait in the backend's socket
/// while the first is being flushed, and the backend goes from one to the next without a round
/// trip to the node in between, yet the later range never reaches the fence row first (which
/// the resource would refuse as `seq-not-forward`, ending the term).
pub struct SeqPipe {
    /// Closed, not returned to the pool, once a commit on it went unanswered.
    client: Conn,
    stmt: tokio_postgres::Statement,
    /// The sequence's resource name as this shard writes it, built once per pipe rather than
    /// once per commit.
    resource: Arc<str>,
    fence: Fence,
}

impl SeqPipe {
    /// Sends the commit of `[lo, hi]` of the pipe's sequence under `token` before it returns,
    /// behind every commit sent on this pipe before; what it returns resolves with that
    /// commit's outcome. Commits sent after a failed one still run (each is its own transaction).
    pub fn send_commit(
        self: &Arc<Self>,
        token: FenceToken,
        lo: i64,
        hi: i64,
    ) -> impl Future<Output = Result<(), FenceError>> + Send + 'static {
        let pipe = self.clone();
        let mut outcome = Box::pin(async move {
            let resource: &str = &pipe.resource;
            let row = pipe
                .client
                .query_one(
                    &pipe.stmt,
                    &[&resource, &token.0, &pipe.fence.holder, &lo, &hi],
                )
                .await?;
            pipe.fence.judge(resource, "next", token, row).map(drop)
        });
        // The first poll encodes the call and hands it to the connection (the statement is
        // already prepared, so nothing is awaited before that). Nothing is woken by this poll;
        // the caller's await polls again with its own waker.
        let mut noop = std::task::Context::from_waker(std::task::Waker::noop());
        let first = outcome.as_mut().poll(&mut noop);
        let pipe = self.clone();
        async move {
            match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => pipe.fence.ask(&pipe.client, outcome).await?,
            }
        }
    }

    /// Closes the connection once the last holder of this pipe drops it, instead of giving it
    /// back to the pool (the term that used it is over); commits already sent are still
    /// answered. Nothing more may be sent on it.
    pub fn retire(&self) {
        self.client.close_on_drop();
    }

    /// Whether the connection is gone, or presumed dead (the next commit needs a new pipe).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// What the fenced resource holds for a read ([`Fence::read_state`]), from one snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceState {
    /// The sequence's last committed seq (`None`: no sequencer ever claimed it).
    pub last_seq: Option<i64>,
    /// The work-set's published cursor (`None`: no scheduler ever claimed it).
    pub cursor: Option<i64>,
    /// The highest token the resource has accepted.
    pub max_token: i64,
    /// Who wrote under it.
    pub max_holder: String,
}

impl Fence {
    /// One read of the sequence, the work-set cursor and the fence row in one statement
    /// (`baton.read_state`): linearizable, no lock taken, nothing written.
    pub async fn read_state(
        &self,
        seq_resource: &str,
        cursor_resource: &str,
    ) -> Result<ResourceState, FenceError> {
        let (seq_resource, cursor_resource) =
            (&*self.named(seq_resource), &*self.named(cursor_resource));
        let row = self
            .query_row(
                "SELECT * FROM baton.read_state($1, $2)",
                &[&seq_resource, &cursor_resource],
            )
            .await?;
        Ok(ResourceState {
            last_seq: row.get(0),
            cursor: row.get(1),
            max_token: row.get(2),
            max_holder: row.get(3),
        })
    }
}

/// One write the fenced resource refused (`baton.fence_rejections`), as the fleet page lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rejection {
    /// When the resource refused it, on the resource's clock (ms since the Unix epoch).
    pub at_unix_ms: i64,
    /// The resource written to.
    pub resource: String,
    /// What was attempted (`claim`, `next`, `tick`, `checkpoint`, `user`, ...).
    pub op: String,
    /// The refused writer's token.
    pub token: i64,
    /// The refused writer (its node id).
    pub holder: String,
    /// The highest token the resource had accepted then.
    pub max_token: i64,
    /// Who wrote under `max_token`.
    pub max_holder: String,
    /// `stale-token` or `holder-mismatch`.
    pub reason: String,
}

impl Fence {
    /// The newest `limit` refused writes on the whole resource (every fence domain, every
    /// shard), newest first (`baton.recent_fence_rejections`; read-only, at most 100).
    pub async fn recent_rejections(&self, limit: i32) -> Result<Vec<Rejection>, FenceError> {
        let client = Conn::new(self.pool.get().await?);
        let asked = async {
            let stmt = client
                .prepare_cached("SELECT * FROM baton.recent_fence_rejections($1)")
                .await?;
            client.query(&stmt, &[&limit]).await
        };
        let rows = self.ask(&client, asked).await??;
        Ok(rows
            .iter()
            .map(|row| Rejection {
                at_unix_ms: row.get(0),
                resource: row.get(1),
                op: row.get(2),
                token: row.get(3),
                holder: row.get(4),
                max_token: row.get(5),
                max_holder: row.get(6),
                reason: row.get(7),
            })
            .collect())
    }
}

/// The resource name a shard's failure budget is recorded under, as shard 0 names it: shard S
/// appends `#S` ([`ShardId::resource`]), so its failures fall in its own fence domain
/// (`leadership#S`) and are counted apart from every other shard's.
pub const FAILURE_BUDGET_RESOURCE: &str = "failure-budget";

/// A shard's fleet-wide failure budget as the resource counts it (`sql/0004_failure_budget.sql`),
/// from one snapshot: the failed terms within the window (and after the latest operator reset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetState {
    /// Failed terms counted.
    pub failed_terms: u32,
    /// Whether they reach the limit: no node campaigns for this shard.
    pub exhausted: bool,
    /// While exhausted: how long until the count falls below the limit, by the resource's clock.
    pub reopens_in: Option<Duration>,
    /// The latest failed term counted: `term T on NODE: ERROR` (a program's exit status, a job's
    /// error chain).
    pub last_failure: Option<String>,
}

impl BudgetState {
    fn from_row(row: &tokio_postgres::Row) -> BudgetState {
        BudgetState {
            failed_terms: u32::try_from(row.get::<_, i32>("failed_terms")).unwrap_or(0),
            exhausted: row.get("exhausted"),
            reopens_in: row
                .get::<_, Option<i64>>("reopens_in_ms")
                .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            last_failure: row.get("last_failure"),
        }
    }
}

/// `(window_ms, limit)` as the budget's SQL functions take them.
fn budget_args(budget: &FailureBudgetConfig) -> (i64, i32) {
    (
        i64::try_from(budget.window_ms).unwrap_or(i64::MAX),
        i32::try_from(budget.failed_terms).unwrap_or(i32::MAX),
    )
}

impl Fence {
    /// Records that the leader work of this node's term `token` failed with `detail`, in this
    /// handle's shard, and returns the budget after it. Fenced like every write: a token the
    /// resource has moved past (or the current one under another holder) is refused as
    /// [`FenceError::Rejected`] (op `failed-term`), so a stale node cannot spend the budget. A
    /// second record of the same term counts once.
    pub async fn record_failed_term(
        &self,
        token: FenceToken,
        detail: &str,
        budget: &FailureBudgetConfig,
    ) -> Result<BudgetState, FenceError> {
        let resource = &*self.named(FAILURE_BUDGET_RESOURCE);
        let (window_ms, limit) = budget_args(budget);
        let row = self
            .call(
                resource,
                "failed-term",
                token,
                "SELECT * FROM baton.record_failed_term($1, $2, $3, $4, $5, $6)",
                &[
                    &resource,
                    &token.0,
                    &self.holder,
                    &detail,
                    &window_ms,
                    &limit,
                ],
            )
            .await?;
        Ok(BudgetState::from_row(&row))
    }

    /// This handle's shard's failure budget now: one read, no lock taken, nothing written.
    pub async fn failure_budget(
        &self,
        budget: &FailureBudgetConfig,
    ) -> Result<BudgetState, FenceError> {
        let resource = &*self.named(FAILURE_BUDGET_RESOURCE);
        let (window_ms, limit) = budget_args(budget);
        let row = self
            .query_row(
                "SELECT * FROM baton.failure_budget($1, $2, $3)",
                &[&resource, &window_ms, &limit],
            )
            .await?;
        Ok(BudgetState::from_row(&row))
    }
}

/// SQLSTATE raised by `baton.fence_assert` for a refused token.
const SQLSTATE_FENCED: &str = "BF409";

impl Fence {
    /// Opens a fenced transaction for writes to your own tables: `BEGIN`, then
    /// `baton.fence_assert(resource, token, holder)`, which locks the fence row until this
    /// transaction ends and checks the rule. Every statement you then run through the returned
    /// [`FencedTransaction`] commits together with that check, or not at all; a newer term's
    /// first write cannot interleave with it.
    ///
    /// A stale token is refused before any of your statements run: the transaction is rolled
    /// back, the rejection is recorded in `baton.fence_rejections` (with both tokens), counted
    /// in `baton_fence_rejections_total{op="user"}`, logged, and returned as
    /// [`FenceError::Rejected`].
    ///
    /// A transaction left open does not hold a newer term up: the resource records the token
    /// asserted here, and the first fenced write of any higher token in this fence domain ends
    /// this session (`pg_terminate_backend`) instead of waiting for its lock. Its statements
    /// roll back, [`FencedTransaction::commit`] fails, and `baton.fence_rejections` has a row
    /// with reason `preempted` (this token, and the token that ended it as `max_token`). So a
    /// process paused (SIGSTOP, a GC pause) between `begin` and `commit` delays the next leader
    /// by no more than the lease, and its commit can never land after a newer term's write.
    /// Sessions under an equal or higher token are waited for (up to the role's
    /// `lock_timeout`), as are superusers'; the resource's owner can switch the preemption off
    /// (`UPDATE baton.settings SET preempt_lower_tokens = false`, `sql/0003_preempt.sql`).
    ///
    /// Your tables must be writable by the role in `resource.database_url` (by default
    /// `baton_app`: `GRANT INSERT, SELECT ON my_table TO baton_app`). Writes made outside such a
    /// transaction are **not** protected.
    ///
    /// `begin`, [`FencedTransaction::commit`] and [`FencedTransaction::rollback`] give up after
    /// the statement timeout plus a second without an answer, as every fenced call does:
    /// [`FenceError::Unavailable`], and that connection is closed (the server rolls back an
    /// open transaction when it notices; a commit's outcome is then unknown). Your own
    /// statements run under the server's `statement_timeout`, and the connection's
    /// `TCP_USER_TIMEOUT` ends them when the network loses them. A server that is stopped
    /// outright (SIGSTOP, a frozen VM) still acknowledges the bytes and answers nothing, so
    /// bound your statements with your own `tokio::time::timeout` where that matters.
    pub async fn begin(
        &self,
        resource: &str,
        token: FenceToken,
    ) -> Result<FencedTransaction, FenceError> {
        let resource = &*self.named(resource);
        let client = Conn::new(self.pool.get().await?);
        let asked = async {
            client.batch_execute("BEGIN").await?;
            client
                .query_one(
                    "SELECT baton.fence_assert($1, $2, $3)",
                    &[&resource, &token.0, &self.holder],
                )
                .await
        };
        let asserted = self.ask(&client, asked).await;
        // From here a dropped `tx` closes the connection: its BEGIN may have run.
        let tx = FencedTransaction {
            client: Some(client),
            answer_bound: self.answer_bound,
            resource: resource.to_owned(),
            token,
            holder: self.holder.clone(),
        };
        match asserted? {
            Ok(_) => Ok(tx),
            Err(e) if e.code().map(|c| c.code()) == Some(SQLSTATE_FENCED) => {
                tx.rollback().await;
                Err(self.record_rejection(resource, token).await)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// After a refused user write rolled back: records it (the resource re-checks that it is
    /// refused), counts and logs it, and returns the error to hand back.
    async fn record_rejection(&self, resource: &str, token: FenceToken) -> FenceError {
        let recorded = async {
            let client = Conn::new(self.pool.get().await?);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&resource, &token.0, &self.holder];
            let asked = client.query_one(
                "SELECT * FROM baton.fence_record_rejection($1, $2, $3)",
                &params,
            );
            let row = self.ask(&client, asked).await??;
            Ok::<_, FenceError>(Verdict {
                max_token: row.get(1),
                max_holder: row.get(2),
                reason: None,
            })
        }
        .await;
        let verdict = match recorded {
            Ok(v) => v,
            // The refusal stands (the transaction rolled back); only its record is missing.
            Err(e) => {
                tracing::warn!(resource, token = token.0, error = %e, "could not record a refused user write");
                Verdict {
                    max_token: -1,
                    max_holder: String::new(),
                    reason: Some("stale-token (not recorded)".into()),
                }
            }
        };
        self.rejected(resource, "user", token, verdict)
    }

    fn rejected(
        &self,
        resource: &str,
        op: &'static str,
        token: FenceToken,
        verdict: Verdict,
    ) -> FenceError {
        let reason = verdict.reason(token);
        metrics::counter!(m::FENCE_REJECTIONS, "op" => op, "shard" => self.shard.0.to_string())
            .increment(1);
        tracing::warn!(resource, op, %reason, token = token.0, holder = %self.holder, max_token = verdict.max_token,
            max_holder = %verdict.max_holder, "fenced write rejected by the resource");
        FenceError::Rejected {
            resource: resource.to_owned(),
            op,
            token,
            max_token: verdict.max_token,
            max_holder: verdict.max_holder,
            reason,
        }
    }
}

/// One PostgreSQL transaction whose commit is fenced (see [`Fence::begin`]). Run your statements
/// with [`FencedTransaction::client`], then [`FencedTransaction::commit`]. Dropped without a
/// commit, it rolls back (its connection is closed rather than returned to the pool).
pub struct FencedTransaction {
    client: Option<Conn>,
    /// How long its `COMMIT` or `ROLLBACK` may go unanswered (the fence's bound).
    answer_bound: Duration,
    /// The fenced resource (in its shard's domain), the term's token and this node: what a
    /// failed commit's WARN names.
    resource: String,
    token: FenceToken,
    holder: String,
}

impl FencedTransaction {
    /// The connection inside the transaction: `execute`, `query`, `prepare_cached`, ...
    pub fn client(&self) -> &deadpool_postgres::Client {
        self.client.as_ref().expect("a live transaction")
    }

    /// Commits your statements together with the fence check. An error here means the outcome
    /// is unknown if the connection broke mid-commit: treat it as "may or may not have landed".
    ///
    /// A transaction a newer term ended while it was open (see [`Fence::begin`]) fails here as
    /// [`FenceError::Unavailable`]: `57P01: terminating connection due to administrator
    /// command`, or a closed connection when the client read the server's goodbye first.
    /// Nothing of it landed; the resource has it in `baton.fence_rejections` (`preempted`).
    ///
    /// Every failed commit is logged at WARN with the resource, the token, the holder and why:
    /// `preempted` (the server ended the transaction, SQLSTATE 57P01: a newer term's preemption,
    /// or a server shutdown; nothing landed), `connection-ended`
    /// (the connection closed under it, which is also how a preemption reads when the client
    /// saw the server's goodbye first), `unanswered`, or `refused` (the server's own error).
    pub async fn commit(mut self) -> Result<(), FenceError> {
        let client = self.client.take().expect("a live transaction");
        let committed = client
            .within(self.answer_bound, client.batch_execute("COMMIT"))
            .await;
        let (why, result) = match committed {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => (commit_failure(&e), Err(FenceError::from(e))),
            Err(e) => ("unanswered", Err(unanswered(e))),
        };
        if let Err(e) = &result {
            tracing::warn!(
                resource = %self.resource,
                token = self.token.0,
                holder = %self.holder,
                reason = %why,
                error = %e,
                "a fenced commit failed: {}",
                match why {
                    "preempted" => "the server ended this transaction (a newer term's preemption, or a server shutdown); nothing of it landed",
                    "refused" => "the resource refused it; nothing of it landed",
                    _ => "its outcome is unknown (a newer term's preemption also reads this way: see baton.fence_rejections)",
                }
            );
        }
        result
    }

    /// Rolls back; the connection goes back to the pool, or is closed if the rollback failed
    /// or went unanswered.
    pub async fn rollback(mut self) {
        if let Some(client) = self.client.take() {
            let rolled_back = client
                .within(self.answer_bound, client.batch_execute("ROLLBACK"))
                .await;
            if !matches!(rolled_back, Ok(Ok(()))) {
                client.discard();
            }
        }
    }
}

/// Why a `COMMIT` failed, as [`FencedTransaction::commit`]'s WARN says it.
fn commit_failure(e: &tokio_postgres::Error) -> &'static str {
    if e.code() == Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN) {
        // 57P01: `pg_terminate_backend`, which is how a newer term ends an open transaction.
        "preempted"
    } else if e.is_closed()
        || e.as_db_error().is_none_or(|d| d.severity() == "FATAL")
    {
        // Closed under it, or ended by the server another way (an idle-in-transaction timeout).
        "connection-ended"
    } else {
        "refused"
    }
}

impl Drop for FencedTransaction {
    fn drop(&mut self) {
        // No async here: detach the connection from the pool and close it; the server rolls back.
        if let Some(client) = self.client.take() {
            client.discard();
        }
    }
}

/// Applies the roles and the schema as a superuser (`admin_url`), then optionally sets the
/// resource-side fencing switch. Idempotent and safe to run concurrently.
pub async fn migrate(admin_url: &str, fencing: Option<bool>) -> Result<(), FenceError> {
    let (client, conn_task) = admin_session(admin_url).await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    client.batch_execute(ROLES_SQL).await?;
    client.batch_execute(&role_timeouts_sql(APP_ROLE)).await?;
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .await?
        .get(0);
    client
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE \"{}\" TO baton_owner",
            db.replace('"', "\"\"")
        ))
        .await?;
    // Existing objects created before ownership was settled belong to the owner too.
    client
        .batch_execute("DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'baton') THEN ALTER SCHEMA baton OWNER TO baton_owner; END IF; END $$;")
        .await?;
    apply_schema(&client).await?;
    if let Some(on) = fencing {
        client
            .execute("UPDATE baton.settings SET fencing = $1", &[&on])
            .await?;
    }
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    drop(client);
    let _ = conn_task.await;
    Ok(())
}

/// Applies [`SCHEMA_FILES`] in order as `baton_owner`, in one transaction: all of them, or (on
/// an error, which names the file) none.
async fn apply_schema(client: &tokio_postgres::Client) -> Result<(), FenceError> {
    client
        .batch_execute("BEGIN; SET LOCAL ROLE baton_owner")
        .await?;
    for (file, sql) in SCHEMA_FILES {
        if let Err(e) = client.batch_execute(sql).await {
            // The session stays usable for the migration lock's release.
            client.batch_execute("ROLLBACK").await?;
            return Err(match FenceError::from(e) {
                FenceError::Unavailable(why) => FenceError::Unavailable(format!("{file}: {why}")),
                other => other,
            });
        }
    }
    Ok(client.batch_execute("COMMIT").await?)
}

/// `ALTER ROLE ... SET` statements applying [`ROLE_TIMEOUTS`] to `role`.
fn role_timeouts_sql(role: &str) -> String {
    ROLE_TIMEOUTS
        .iter()
        .map(|(k, v)| format!("ALTER ROLE {} SET {k} = '{v}';", quote_ident(role)))
        .collect()
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The per-node role of `node_id`: a session of it may write only as holder `node_id`.
pub fn node_role(node_id: &str) -> String {
    format!("baton_node_{node_id}")
}

/// Creates (or updates) the per-node role of `node_id` with `password`, as a superuser
/// (`admin_url`): a member of the application role, with its session timeouts. A node that
/// connects as it writes only as holder `node_id`, whatever it claims. Run [`migrate`] first.
/// Node ids are 1 to 40 characters of `[A-Za-z0-9_-]`.
pub async fn provision_node_role(
    admin_url: &str,
    node_id: &str,
    password: &str,
) -> Result<String, FenceError> {
    let (role, sql) = node_role_sql(node_id, password)?;
    admin_batch(admin_url, &sql).await?;
    Ok(role)
}

/// The role of `node_id` and the statements that create or update it with `password` (plain, or
/// a SCRAM verifier, which the server stores as it is); refuses a node id that cannot name one.
pub(crate) fn node_role_sql(node_id: &str, password: &str) -> Result<(String, String), FenceError> {
    let valid = (1..=40).contains(&node_id.len())
        && node_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(FenceError::Schema(format!(
            "node id {node_id:?} cannot name a role: 1 to 40 of [A-Za-z0-9_-]"
        )));
    }
    let role = node_role(node_id);
    let (ident, name) = (quote_ident(&role), quote_literal(&role));
    let sql = format!(
        "DO $$ BEGIN
           IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {name}) THEN CREATE ROLE {ident}; END IF;
         END $$;
         ALTER ROLE {ident} LOGIN PASSWORD {password};
         GRANT {APP_ROLE} TO {ident};
         {timeouts}",
        password = quote_literal(password),
        timeouts = role_timeouts_sql(&role),
    );
    Ok((role, sql))
}

/// `ALTER ROLE role LOGIN PASSWORD password`, quoted.
pub(crate) fn login_password_sql(role: &str, password: &str) -> String {
    format!(
        "ALTER ROLE {} LOGIN PASSWORD {};",
        quote_ident(role),
        quote_literal(password)
    )
}

/// Sets the fence's `max_token` to `max_token` (holder `operator`), as a superuser
/// (`admin_url`), in one transaction with its `fence_log` record (op `operator-reset`); returns
/// the `(max_token, holder)` it replaced. `baton fence reset` runs it.
///
/// Two uses. Recovery from a poisoned `max_token` (a holder of the application role's
/// credentials, or a bug, claimed a token far above any real term: the fence then refuses every
/// new term, safely and forever). And switching the election backend on the same database:
/// tokens of different backends are not comparable (pg-lease's epoch may be at 77 when raft's
/// terms start again at 1, and the fence would refuse raft's terms until one passed 77).
///
/// Stop every node's leader work first (the whole fleet, when switching backends), and pick
/// `max_token` at or above the highest token any still-running node could hold: a stale node
/// holding a token above it could write again. A negative `max_token` is refused, nothing changed.
pub async fn reset(admin_url: &str, max_token: i64) -> Result<(i64, String), FenceError> {
    if max_token < 0 {
        return Err(FenceError::Invalid(format!(
            "max_token must be >= 0, got {max_token}"
        )));
    }
    let (client, conn_task) = admin_session(admin_url).await?;
    let replaced = async {
        client.batch_execute("BEGIN").await?;
        let before = client
            .query_one(
                "SELECT max_token, holder FROM baton.fenced_resource WHERE name = baton.fence_domain() FOR UPDATE",
                &[],
            )
            .await?;
        client
            .execute(
                "UPDATE baton.fenced_resource SET max_token = $1, holder = 'operator', updated_at = clock_timestamp()
                  WHERE name = baton.fence_domain()",
                &[&max_token],
            )
            .await?;
        client
            .execute(
                "INSERT INTO baton.fence_log (resource, token, holder, op) VALUES (baton.fence_domain(), $1, 'operator', 'operator-reset')",
                &[&max_token],
            )
            .await?;
        client.batch_execute("COMMIT").await?;
        Ok::<_, tokio_postgres::Error>((before.get(0), before.get(1)))
    }
    .await;
    // On an error the session ends here, and the server rolls the transaction back.
    drop(client);
    let _ = conn_task.await;
    Ok(replaced?)
}

/// Resets `shard`'s fleet-wide failure budget, as a superuser (`admin_url`): the failed terms
/// recorded so far no longer count, and the nodes campaign again at their next look (within
/// `[failure_budget] recheck_ms`). Logged in `baton.failure_budget_resets` (when, by whom, how
/// many). Returns how many failed terms counted since the previous reset (whatever their age,
/// up to the 7 days the resource keeps). `baton budget reset` runs it. Fix what made the work
/// fail first: a budget reset over a work that still fails only buys another round of failures.
pub async fn reset_failure_budget(admin_url: &str, shard: ShardId) -> Result<u32, FenceError> {
    let (client, conn_task) = admin_session(admin_url).await?;
    let cleared = client
        .query_one(
            "SELECT cleared_terms FROM baton.failure_budget_reset($1)",
            &[&shard.resource(FAILURE_BUDGET_RESOURCE)],
        )
        .await;
    drop(client);
    let _ = conn_task.await;
    Ok(u32::try_from(cleared?.get::<_, i32>(0)).unwrap_or(0))
}

/// Sets whether the resource refuses sessions of the shared application role (only per-node
/// roles may write), as a superuser.
pub async fn set_require_node_roles(admin_url: &str, on: bool) -> Result<(), FenceError> {
    admin_batch(
        admin_url,
        &format!("UPDATE baton.settings SET require_node_roles = {on};"),
    )
    .await
}

async fn admin_batch(admin_url: &str, sql: &str) -> Result<(), FenceError> {
    let (client, conn_task) = admin_session(admin_url).await?;
    let done = client.batch_execute(sql).await;
    drop(client);
    let _ = conn_task.await;
    Ok(done?)
}
