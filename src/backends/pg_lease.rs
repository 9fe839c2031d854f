//! pg-lease: a lease row in PostgreSQL, expiry judged by the **database's** clock — the cheapest
//! correct recipe.
//!
//! One row per election in `baton_lease.leases(name PK, holder, info, epoch, valid_until)`, in its
//! own schema (never the fenced resource's), created by the backend on first use.
//!
//! * **acquire** — one `INSERT .. ON CONFLICT (name) DO UPDATE .. WHERE leases.valid_until <
//!   clock_timestamp() RETURNING epoch`: the holder changes and the epoch is bumped in the same
//!   statement, and only when the database's own clock says the current lease has run out.
//!   Concurrent acquirers serialize on the row lock; the losers re-check the `WHERE` against the
//!   winner's row and return nothing. A row already holding *our* candidacy id (an acquisition
//!   whose answer was lost with a failed or dropped campaign) is re-taken at once, with a new epoch.
//! * **renew** — `UPDATE .. SET valid_until = clock_timestamp() + ttl WHERE name, holder, epoch`
//!   match and the lease has not run out yet: the epoch is kept; no row means the lease is gone
//!   (`LeaseLost`), whether or not someone else has taken it yet — a lapsed lease is never revived.
//!   A sharded node renews every row its shards hold in one such `UPDATE` (see
//!   `super::renew_batch`): one round trip per node about twice per renew interval, not one per
//!   shard; its shards also share one connection pool.
//! * **resign / close** — `valid_until = '-infinity'` for our holder and epoch: the next poller wins.
//! * **token** — the epoch. It strictly increases across holders (and across re-wins by the same
//!   node) because it only ever grows in the row, and it survives database restarts with the row.
//!
//! The node's clock is never consulted for expiry: `valid_until` is written and compared with
//! `clock_timestamp()` inside PostgreSQL. The node's own deadline counts from the moment its
//! request was *sent*, which is before the database read its clock, so the node always believes
//! in its lease for less time than the database grants it. Waiters poll with a jittered
//! `retry_interval` (no queue: after a lapse, whichever poller comes first wins).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Config as PoolConfig, Pool, PoolConfig as PoolSize, Timeouts};
use tokio::sync::OnceCell;

use super::polling::{
    checked_token, election_names, HeldLease, LeaseStore, Poll, PollingElector, Shards, StoreError,
};
use super::renew_batch::SharedLeaderRead;
use super::{count_request, BackendKind, ElectorError, ElectorResult, LeaderInfo};
use crate::config::NodeConfig;

/// Why a config without `[pg_lease] database_url` (it has no default) cannot start this backend.
const MISSING_URL: &str = "the pg-lease backend needs [pg_lease] database_url, the lease store's URL as the baton_lease role: `baton db init --backend pg-lease --out DIR` writes it to DIR/baton_lease.url, and `baton config init --backend pg-lease --lease-url-file DIR/baton_lease.url` puts it in the config";

/// Serializes the schema creation of concurrent first connections (CREATE .. IF NOT EXISTS races).
const SCHEMA_LOCK_KEY: i64 = 0x6261_746f_6e4c;

/// The schema check is explicit: `CREATE SCHEMA IF NOT EXISTS` needs CREATE on the database even
/// when the schema exists, and the lease role (see [`provision`]) has no such right.
const SCHEMA_SQL: &str = "
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'baton_lease') THEN
    CREATE SCHEMA baton_lease;
  END IF;
END $$;
CREATE TABLE IF NOT EXISTS baton_lease.leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    info        TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    valid_until TIMESTAMPTZ NOT NULL
);";

const ACQUIRE_SQL: &str = "
INSERT INTO baton_lease.leases AS l (name, holder, info, epoch, valid_until)
VALUES ($1, $2, $3, 1, clock_timestamp() + $4::float8 * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder,
       info = EXCLUDED.info,
       epoch = l.epoch + 1,
       valid_until = clock_timestamp() + $4::float8 * interval '1 millisecond'
 WHERE l.valid_until < clock_timestamp() OR l.holder = EXCLUDED.holder
RETURNING l.epoch";

/// Every lease of the batch (`$1` names, `$2` holders, `$3` epochs, in step) that still holds
/// and has not run out is extended; the rows extended are returned.
const RENEW_SQL: &str = "
UPDATE baton_lease.leases AS l
   SET valid_until = clock_timestamp() + $4::float8 * interval '1 millisecond'
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(name, holder, epoch)
 WHERE l.name = r.name AND l.holder = r.holder AND l.epoch = r.epoch
   AND l.valid_until >= clock_timestamp()
RETURNING l.name, l.epoch";

const RELEASE_SQL: &str = "
UPDATE baton_lease.leases SET valid_until = '-infinity'
 WHERE name = $1 AND holder = $2 AND ($3::bigint IS NULL OR epoch = $3)";

/// Ends the lease of a node the failure detector confirmed dead (`$2`, a node id): only while
/// the row still names a candidacy of that node (holder ids are `<node id>-<16 hex digits>`) and
/// has not run out. One statement: PostgreSQL re-checks the `WHERE` against a row another
/// transaction changed meanwhile, so a lease re-taken (a new holder, or a new epoch) between the
/// detector's verdict and this update is never ended. The epoch is kept: the next acquisition
/// bumps it, so the next holder's token is higher.
const EXPIRE_DEAD_SQL: &str = "
UPDATE baton_lease.leases SET valid_until = '-infinity'
 WHERE name = $1 AND valid_until >= clock_timestamp()
   AND length(holder) > 17 AND left(holder, length(holder) - 17) = $2
RETURNING epoch";

const CONFIRM_SQL: &str = "
SELECT 1 FROM baton_lease.leases
 WHERE name = $1 AND holder = $2 AND epoch = $3 AND valid_until >= clock_timestamp()";

/// The holders of every named lease that has not run out (one read for all of a node's shards).
const LEADER_SQL: &str = "SELECT name, info FROM baton_lease.leases
 WHERE name = ANY($1) AND valid_until >= clock_timestamp()";

/// The login role `baton fleet` gives pg-lease nodes: it owns the lease schema and nothing else,
/// so a node's lease credentials cannot touch the fenced resource (only its app role can, through
/// the fence functions).
pub const LEASE_ROLE: &str = "baton_lease";

/// Creates [`LEASE_ROLE`] and its schema (idempotent), connected as a superuser.
pub async fn provision(admin_url: &str) -> ElectorResult<()> {
    let (client, conn_task) = crate::pg::admin_session(admin_url)
        .await
        .map_err(|e| unavailable(chain(&e)))?;
    let sql = format!(
        "BEGIN;
         SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY});
         DO $$ BEGIN
           IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{LEASE_ROLE}') THEN
             CREATE ROLE {LEASE_ROLE} LOGIN;
           END IF;
         END $$;
         CREATE SCHEMA IF NOT EXISTS baton_lease AUTHORIZATION {LEASE_ROLE};
         COMMIT;"
    );
    let r = client
        .batch_execute(&sql)
        .await
        .map_err(|e| unavailable(chain(&e)));
    drop(client);
    let _ = conn_task.await;
    Ok(r?)
}

/// The `pg-lease` backend (see the module docs): one lease row per election, judged by the
/// database's clock; the elector is the polling one ([`PollingElector`]).
pub type PgLeaseElector = PollingElector<PgLeaseStore>;

/// One election's lease row (see the module docs): the [`LeaseStore`] of [`PgLeaseElector`].
pub struct PgLeaseStore {
    pool: Pool,
    /// This store's shard: its slot in the node's shared leader read.
    shard: u32,
    /// The node's coalesced leader reads, shared by its shards.
    leaders: Arc<SharedLeaderRead>,
    name: String,
    info: String,
    ttl: Duration,
    timeout: Duration,
    schema: Arc<OnceCell<()>>,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("pg-lease: {e}"))
}

use crate::pg::{error_chain as chain, Conn};

impl PgLeaseElector {
    /// Builds the pool; connects lazily (a database that is down at start shows up as failed,
    /// retried campaigns). The schema is created on first use.
    pub async fn connect(cfg: &NodeConfig) -> ElectorResult<PgLeaseElector> {
        let mut one = PgLeaseElector::connect_shards(std::slice::from_ref(cfg)).await?;
        Ok(one.remove(0))
    }

    /// One elector per shard config (`NodeConfig::for_shard`, which names each shard's lease
    /// row), sharing one pool and one renewal batch (the first config's database and timing).
    pub async fn connect_shards(cfgs: &[NodeConfig]) -> ElectorResult<Vec<PgLeaseElector>> {
        Ok(PgLeaseStore::connect_shards(cfgs)?.electors())
    }
}

impl PgLeaseStore {
    /// One store per shard config, sharing one pool (see [`PgLeaseElector::connect_shards`]).
    pub fn connect_shards(cfgs: &[NodeConfig]) -> ElectorResult<Shards<PgLeaseStore>> {
        let cfg = super::session_config(cfgs)?;
        if cfg.pg_lease.lease_name.is_empty() {
            return Err(ElectorError::Config("pg_lease.lease_name is empty".into()));
        }
        if cfg.pg_lease.database_url.trim().is_empty() {
            return Err(ElectorError::Config(MISSING_URL.into()));
        }
        // A request must be answered well inside the lease, or its grant is worth little.
        let timeout = Duration::from_millis((cfg.lease_ttl_ms / 3).clamp(200, 2000));
        let mut pc = PoolConfig::new();
        pc.url = Some(cfg.pg_lease.database_url.clone());
        pc.options = Some(format!("-c statement_timeout={}", timeout.as_millis()));
        pc.pool = Some(PoolSize {
            // Two for one election (a renewal never waits behind a poll); a few more for a
            // sharded node's campaigns, which poll one statement at a time.
            max_size: (cfgs.len() + 1).clamp(2, 4),
            timeouts: Timeouts {
                wait: Some(timeout),
                create: Some(timeout),
                recycle: Some(timeout),
            },
            ..PoolSize::default()
        });
        let pool = crate::pg::create_pool(pc, cfg.pg_lease.tls_ca_file.as_deref(), timeout)
            .map_err(|e| ElectorError::Config(format!("pg_lease: {e}")))?;
        let me = LeaderInfo {
            node_id: cfg.node_id.clone(),
            http_addr: cfg.advertise_addr.clone(),
        };
        let info = String::from_utf8(me.encode()).expect("JSON is UTF-8");
        let leaders = Arc::new(SharedLeaderRead::new(
            cfg.retry_interval() / 2,
            cfgs.iter().map(|c| c.pg_lease.lease_name.clone()).collect(),
        ));
        let schema = Arc::new(OnceCell::new());
        let stores = (0u32..)
            .zip(cfgs)
            .map(|(shard, shard_cfg)| PgLeaseStore {
                pool: pool.clone(),
                shard,
                leaders: leaders.clone(),
                name: shard_cfg.pg_lease.lease_name.clone(),
                info: info.clone(),
                ttl: cfg.lease_ttl(),
                timeout,
                schema: schema.clone(),
            })
            .collect();
        Ok(Shards::new(stores, cfg))
    }

    /// `request` on `client`, bounded by the request timeout. Unanswered, the connection is
    /// closed as `client` drops (see [`Conn`]), so the next request gets a new one instead of
    /// waiting behind the same lost answer.
    async fn bounded<T, E: std::error::Error>(
        &self,
        client: &Conn,
        request: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, StoreError> {
        match client.within(self.timeout, request).await {
            Ok(r) => r.map_err(|e| unavailable(chain(&e))),
            Err(e) => Err(unavailable(e)),
        }
    }

    fn unanswered(&self) -> StoreError {
        StoreError::Unavailable(format!(
            "pg-lease: database did not answer within {:?}",
            self.timeout
        ))
    }

    /// A pooled connection, with the lease schema in place.
    async fn client(&self) -> Result<Conn, StoreError> {
        let client = match tokio::time::timeout(self.timeout, self.pool.get()).await {
            Ok(got) => Conn::new(got.map_err(|e| unavailable(chain(&e)))?),
            Err(_) => return Err(self.unanswered()),
        };
        if self.schema.initialized() {
            return Ok(client);
        }
        // The schema is made sure of (`IF NOT EXISTS`) on every start: no notices about that.
        let sql = format!(
            "BEGIN; SET LOCAL client_min_messages = warning; \
             SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY}); {SCHEMA_SQL} COMMIT;"
        );
        match self.bounded(&client, client.batch_execute(&sql)).await {
            Ok(()) => {
                let _ = self.schema.set(());
                Ok(client)
            }
            Err(e) => {
                // Possibly mid-transaction: never hand this connection back to the pool.
                client.discard();
                Err(e)
            }
        }
    }

    fn ttl_ms(&self) -> f64 {
        self.ttl.as_secs_f64() * 1000.0
    }

    /// One round trip: who holds each of the node's shards' leases.
    async fn read_leaders(&self) -> Result<BTreeMap<String, LeaderInfo>, StoreError> {
        let client = self.client().await?;
        count_request(BackendKind::PgLease, "leader");
        let rows = self
            .bounded(&client, client.query(LEADER_SQL, &[&self.leaders.names]))
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let info = LeaderInfo::decode(r.get::<_, &str>(1).as_bytes());
                (r.get::<_, String>(0), info)
            })
            .collect())
    }

    /// One statement on a pooled connection, counted as `op`: the row it returns, if any.
    async fn query_opt(
        &self,
        op: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        count_request(BackendKind::PgLease, op);
        self.bounded(&client, client.query_opt(sql, params)).await
    }
}

#[async_trait]
impl LeaseStore for PgLeaseStore {
    fn kind(&self) -> BackendKind {
        BackendKind::PgLease
    }

    fn lease_lost(&self, epoch: i64) -> String {
        format!(
            "pg lease {:?} epoch {epoch} expired or taken over",
            self.name
        )
    }

    async fn acquire(&self, holder: &str) -> Result<Poll, StoreError> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&self.name, &holder, &self.info, &self.ttl_ms()];
        Ok(
            match self.query_opt("acquire", ACQUIRE_SQL, &params).await? {
                Some(row) => Poll::Won {
                    token: checked_token("lease epoch", row.get::<_, i64>(0))?,
                    ttl: self.ttl,
                },
                None => Poll::Held,
            },
        )
    }

    /// One round trip: extends every lease of `leases` that still holds; says which did.
    async fn renew_all(&self, leases: Vec<HeldLease>) -> Result<Vec<bool>, StoreError> {
        let names = election_names(&self.leaders.names, &leases)?;
        let holders: Vec<&str> = leases.iter().map(|l| l.holder.as_str()).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| l.epoch).collect();
        let client = self.client().await?;
        count_request(BackendKind::PgLease, "renew");
        let rows = self
            .bounded(
                &client,
                client.query(RENEW_SQL, &[&names, &holders, &epochs, &self.ttl_ms()]),
            )
            .await?;
        let renewed: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(names
            .iter()
            .zip(&epochs)
            .map(|(name, epoch)| renewed.iter().any(|(n, e)| n == name && e == epoch))
            .collect())
    }

    async fn release(&self, holder: &str, epoch: Option<i64>) -> Result<(), StoreError> {
        let client = self.client().await?;
        count_request(BackendKind::PgLease, "release");
        self.bounded(
            &client,
            client.execute(RELEASE_SQL, &[&self.name, &holder, &epoch]),
        )
        .await
        .map(drop)
    }

    async fn expire_dead(&self, dead: &str) -> Result<bool, StoreError> {
        let row = self
            .query_opt("expire_dead", EXPIRE_DEAD_SQL, &[&self.name, &dead])
            .await?;
        if let Some(row) = &row {
            let epoch: i64 = row.get(0);
            tracing::info!(lease = %self.name, dead, epoch, "ended a dead holder's lease");
        }
        Ok(row.is_some())
    }

    /// Ours while the row names this candidacy's holder at `epoch` and has not expired.
    async fn confirm(&self, holder: &str, epoch: i64) -> Result<bool, StoreError> {
        let row = self
            .query_opt("confirm", CONFIRM_SQL, &[&self.name, &holder, &epoch])
            .await?;
        Ok(row.is_some())
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        self.leaders
            .leader(self.shard, &self.name, || self.read_leaders())
            .await
    }
}
