//! Redis: a single lock key taken with `SET key value NX PX ttl`, kept by a compare-and-`PEXPIRE`
//! renew, released by a compare-and-`DEL`, all by the candidacy's unique value. Two variants:
//!
//! * **`redis-naive`** — the lock alone: the instructive wrong default. Redis gives the
//!   holder nothing the protected resource could check, so this backend has **no fencing token**.
//!   The `Elector` seam still needs a [`FenceToken`], so it presents what people reach for when they
//!   have none: the acquiring node's **wall-clock milliseconds** (through the node's possibly
//!   skewed [`NodeClock`]) — a timestamp-as-version. It is not derived from
//!   the lock in any way: it orders holders only as well as the nodes' clocks agree, so under clock
//!   skew a paused ex-leader whose clock runs ahead out-ranks its successor, the fence accepts the
//!   stale writes and refuses the real leader's; and under a plain pause both nodes act as leader
//!   (`leaders_acting` sums to 2) until the paused one's watchdog fires. The conformance suite's
//!   token-order check is skipped for it, on purpose.
//!
//! * **`redis`** — the same lock plus a token: `INCR <key>:token`, taken in the **same Lua script**
//!   as the lock (`GET`, then `SET .. PX` only if empty: the script's atomicity is the `NX`), so no
//!   other acquisition can interleave. Tokens strictly increase for as long as
//!   the counter survives. **A Redis restart without persistence** (`--save '' --appendonly no`, or a
//!   failover to a replica that had not seen the last `INCR`) loses the counter: the next acquisition
//!   gets token 1 again, i.e. the token *regresses*. The lock key is lost too, so the next candidate
//!   wins at once while the old leader still believes it leads until its next renew says
//!   `LeaseLost`. The fenced resource then refuses the new leader (its token is below the resource's
//!   `max_token`, `src/work/fence.rs` logs every refusal with both tokens and records it in
//!   `baton.fence_rejections`): **safety is kept, liveness is lost** — no protected write succeeds
//!   while the counter is below `max_token` (or at it, for any node but its holder). Each refused term ends in a demotion and a new
//!   acquisition whose `INCR` is one higher, so the counter climbs back by one per refused term:
//!   the fleet serves again after about `max_token` refused terms: milliseconds for a young
//!   resource (`tests/backends_fleet.rs`), effectively never for one at token 10⁶. If the winner
//!   is the node that held `max_token`, it serves at `max_token` itself: the fence accepts a
//!   holder's own token, and `seq_commit` still only moves forward. It also serves at once
//!   when an operator sets the counter above the resource's `max_token` (`SET <key>:token
//!   <max_token>`). Run Redis with AOF `appendfsync always` if that matters; it is the price of a
//!   token kept in a cache.
//!
//! **Behind Sentinel** (`[redis] sentinels`, `master_name`) both variants talk to whichever
//! server the Sentinels name as the primary, and ask them again after any failed request (see
//! `Link::failed`): a failover needs no restart. Sentinel replication is asynchronous, so a
//! promoted replica can lack the last `INCR`s: the token regresses exactly as after a restart
//! without persistence, and the fence refuses it the same way (`lab/tests/redis_sentinel.rs`).
//!
//! Neither variant queues waiters: they poll with a jittered `retry_interval`, so a release is seen
//! within about one retry interval, and a lapsed lock by whoever polls first.
//!
//! Cancel safety: the candidacy value is recorded *before* the `SET` is sent, so `close()` can
//! withdraw a lock whose acquisition answer was lost with a dropped campaign future.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{IntoConnectionInfo, Script};
use async_trait::async_trait;
use serde::Serialize;

use super::polling::{
    checked_token, election_names, HeldLease, LeaseStore, Poll, PollingElector, Shards, StoreError,
};
use super::renew_batch::SharedLeaderRead;
use super::{count_request, BackendKind, ElectorError, ElectorResult, FenceToken, LeaderInfo};
use crate::clock::NodeClock;
use crate::config::NodeConfig;

/// Extends each key's expiry (`ARGV[#KEYS + 1]` ms) only if it still holds its candidacy value
/// (`ARGV[i]` for `KEYS[i]`); answers 1 or 0 per key. One call renews every lock a sharded node
/// holds (`super::renew_batch`).
const RENEW_LUA: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then
    out[i] = redis.call('PEXPIRE', key, ARGV[#KEYS + 1])
  else
    out[i] = 0
  end
end
return out
";

/// Deletes the key only if it still holds our candidacy value.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Ends the lock of a node the failure detector confirmed dead (`ARGV[1]`, a node id): deletes
/// the key only if, at that moment, its value is a candidacy of that node. Atomic (one script),
/// so a lock another node took meanwhile is never touched. The token counter is left alone: the
/// next acquisition's `INCR` gives the next holder a higher token. A value that is not our JSON
/// (a foreign holder) is never deleted.
const EXPIRE_DEAD_LUA: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
local ok, v = pcall(cjson.decode, cur)
if ok and type(v) == 'table' and v['node_id'] == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The fenced acquisition: lock and token in one atomic step (nil when the lock is taken). A lock
/// that already holds our candidacy (an acquisition whose answer was lost) is re-taken with a new
/// token.
const ACQUIRE_FENCED_LUA: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return redis.call('INCR', KEYS[2])
elseif cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return redis.call('INCR', KEYS[2])
end
return false
";

/// What the lock key holds: readable as a [`LeaderInfo`] (extra fields are ignored) and unique per
/// candidacy, so compare-and-renew / compare-and-delete can never touch another's lock.
#[derive(Serialize)]
struct Candidacy<'a> {
    node_id: &'a str,
    http_addr: Option<&'a str>,
    candidacy: String,
}

/// The `redis` and `redis-naive` backends (see the module docs); which one is chosen at
/// [`RedisElector::connect`]. The elector is the polling one ([`PollingElector`]).
pub type RedisElector = PollingElector<RedisStore>;

/// One election's lock key (see the module docs): the [`LeaseStore`] of [`RedisElector`].
pub struct RedisStore {
    kind: BackendKind,
    /// The way to the server (shared by the node's shards): one address, or through Sentinel.
    link: Arc<Link>,
    /// This store's shard: its slot in the node's shared leader read.
    shard: u32,
    /// The node's coalesced leader reads, shared by its shards.
    leaders: Arc<SharedLeaderRead>,
    key: String,
    token_key: String,
    node_id: String,
    http_addr: Option<String>,
    ttl: Duration,
    timeout: Duration,
    clock: NodeClock,
    renew_script: Script,
    release_script: Script,
    expire_dead_script: Script,
    acquire_script: Script,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis: {e}"))
}

/// `url` with its user and password (if any) replaced: what an error message may show.
fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://<credentials>@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

fn bad_url(cfg: &crate::config::RedisConfig) -> impl Fn(::redis::RedisError) -> ElectorError {
    let url = redacted_url(&cfg.url);
    move |e| ElectorError::Config(format!("redis url {url:?}: {e}"))
}

/// The redis client's CA bundle type; none exists in a build without TLS.
#[cfg(feature = "tls")]
type Certificates = ::redis::TlsCertificates;
#[cfg(not(feature = "tls"))]
type Certificates = std::convert::Infallible;

/// The CA bundle of `cfg.tls_ca_file` as the redis client takes it; `None` without one. The URL
/// is then `rediss://` (checked by the config).
fn tls_certificates(cfg: &crate::config::RedisConfig) -> ElectorResult<Option<Certificates>> {
    let Some(ca) = &cfg.tls_ca_file else {
        return Ok(None);
    };
    #[cfg(feature = "tls")]
    {
        // The redis client builds its rustls config with the process-default provider.
        crate::tls::install_default_provider();
        let ca = crate::tls::CaBundle::read(ca)
            .map_err(|e| ElectorError::Config(format!("redis: {e}")))?;
        Ok(Some(::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.pem().to_vec()),
        }))
    }
    #[cfg(not(feature = "tls"))]
    Err(ElectorError::Config(format!(
        "redis: tls_ca_file {} is set, but this build of baton has no TLS (cargo feature `tls`)",
        ca.display()
    )))
}

/// The client for `cfg.url`: over TLS verified against exactly `cfg.tls_ca_file` when set, as
/// the URL says otherwise.
fn open_client(cfg: &crate::config::RedisConfig) -> ElectorResult<::redis::Client> {
    match tls_certificates(cfg)? {
        None => ::redis::Client::open(cfg.url.as_str()).map_err(bad_url(cfg)),
        #[cfg(feature = "tls")]
        Some(certs) => {
            ::redis::Client::build_with_tls(cfg.url.as_str(), certs).map_err(bad_url(cfg))
        }
        #[cfg(not(feature = "tls"))]
        Some(never) => match never {},
    }
}

/// The Sentinel client of `cfg.sentinels` for `cfg.master_name`'s primary: the primary's user,
/// password, database and TLS come from `cfg.url` (its host and port are not used), and with
/// `rediss://` the Sentinels are spoken to over TLS too, against the same CA; the Sentinels'
/// own password is `cfg.sentinel_password`.
fn open_sentinel(cfg: &crate::config::RedisConfig) -> ElectorResult<SentinelClient> {
    let master = cfg
        .master_name
        .as_deref()
        .ok_or_else(|| ElectorError::Config("redis: sentinels need master_name".into()))?;
    let primary = cfg
        .url
        .as_str()
        .into_connection_info()
        .map_err(bad_url(cfg))?;
    let tls = cfg.url.starts_with("rediss://");
    let scheme = if tls { "rediss" } else { "redis" };
    let sentinels = cfg
        .sentinels
        .iter()
        .map(|s| {
            format!("{scheme}://{s}/")
                .into_connection_info()
                .map(|i| i.addr().clone())
                .map_err(|e| ElectorError::Config(format!("redis: sentinel {s:?}: {e}")))
        })
        .collect::<ElectorResult<Vec<_>>>()?;
    let failed = |e: ::redis::RedisError| ElectorError::Config(format!("redis sentinel: {e}"));
    let mut b = SentinelClientBuilder::new(sentinels, master, SentinelServerType::Master)
        .map_err(failed)?;
    let settings = primary.redis_settings();
    if let Some(user) = settings.username() {
        b = b.set_client_to_redis_username(user);
    }
    if let Some(password) = settings.password() {
        b = b.set_client_to_redis_password(password);
    }
    if settings.db() != 0 {
        b = b.set_client_to_redis_db(settings.db());
    }
    if let Some(password) = &cfg.sentinel_password {
        b = b.set_client_to_sentinel_password(password.expose());
    }
    if tls {
        b = b
            .set_client_to_redis_tls_mode(::redis::TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(::redis::TlsMode::Secure);
    }
    #[cfg(feature = "tls")]
    if let Some(certs) = tls_certificates(cfg)? {
        b = b
            .set_client_to_redis_certificates(certs.clone())
            .set_client_to_sentinel_certificates(certs);
    }
    #[cfg(not(feature = "tls"))]
    if tls {
        return Err(ElectorError::Config(
            "redis: a rediss:// url, but this build of baton has no TLS (cargo feature `tls`)"
                .into(),
        ));
    }
    b.build().map_err(failed)
}

/// How the electors of one node reach Redis.
enum Link {
    /// One server at `url`: the connection manager reconnects to it by itself.
    Direct(ConnectionManager),
    /// Whichever primary the Sentinels name, asked again after any failure.
    Sentinel(Box<SentinelLink>),
}

struct SentinelLink {
    master_name: String,
    /// Asks the Sentinels (one lookup at a time: the client keeps its Sentinel connections).
    resolver: tokio::sync::Mutex<SentinelClient>,
    mcfg: ConnectionManagerConfig,
    /// The primary in use: a generation, bumped by each lookup, and its connection; `None` after
    /// a failure, until the next request asks the Sentinels again.
    current: StdMutex<(u64, Option<ConnectionManager>)>,
    /// The primary last named (`host:port`), to log a change once.
    named: StdMutex<Option<String>>,
}

impl Link {
    /// The connection to use now, and its generation (for [`Link::failed`]).
    async fn get(&self) -> Result<(u64, ConnectionManager), StoreError> {
        let s = match self {
            Link::Direct(c) => return Ok((0, c.clone())),
            Link::Sentinel(s) => s,
        };
        let cached = || {
            let cur = s.current.lock().unwrap_or_else(|p| p.into_inner());
            cur.1.clone().map(|c| (cur.0, c))
        };
        if let Some(c) = cached() {
            return Ok(c);
        }
        let mut resolver = s.resolver.lock().await;
        // Another request may have asked while this one waited for the resolver.
        if let Some(c) = cached() {
            return Ok(c);
        }
        // Asks the Sentinels for the primary, then that server whether it is one (`ROLE`): a
        // demoted old primary that a Sentinel has not yet forgotten is not taken.
        // A failed lookup says it was the Sentinels' (and which master): a TLS handshake they
        // refuse (a CA that did not issue their certificate) or a wrong `sentinel_password`
        // would otherwise read like the data server's error, and the two are configured apart.
        let client = resolver.async_get_client().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "redis: asking the Sentinels for master {:?}: {e}",
                s.master_name
            ))
        })?;
        let addr = client.get_connection_info().addr().to_string();
        let conn =
            ConnectionManager::new_lazy_with_config(client, s.mcfg.clone()).map_err(unavailable)?;
        {
            let mut named = s.named.lock().unwrap_or_else(|p| p.into_inner());
            if named.as_deref() != Some(addr.as_str()) {
                tracing::info!(master = %s.master_name, primary = %addr, previous = ?*named, "redis: the Sentinels name a primary");
                *named = Some(addr);
            }
        }
        let mut cur = s.current.lock().unwrap_or_else(|p| p.into_inner());
        cur.0 += 1;
        cur.1 = Some(conn.clone());
        Ok((cur.0, conn))
    }

    /// A request on generation `generation`'s connection failed. Through Sentinel the next
    /// request asks the Sentinels again: a refused or dropped connection, a timeout, or a
    /// `READONLY` answer (the server was demoted to a replica) all may mean a failover, and one
    /// lookup per failed request is cheap next to a term lost to a dead primary. A direct
    /// connection reconnects by itself.
    fn failed(&self, generation: u64) {
        if let Link::Sentinel(s) = self {
            let mut cur = s.current.lock().unwrap_or_else(|p| p.into_inner());
            if cur.0 == generation {
                cur.1 = None;
            }
        }
    }
}

impl RedisElector {
    /// Builds the client; connects lazily (a Redis that is down at start shows up as failed
    /// campaigns, retried, not as a crash). `fenced` selects `redis` over `redis-naive`.
    pub async fn connect(cfg: &NodeConfig, fenced: bool) -> ElectorResult<RedisElector> {
        let mut one = RedisElector::connect_shards(std::slice::from_ref(cfg), fenced).await?;
        Ok(one.remove(0))
    }

    /// One elector per shard config (`NodeConfig::for_shard`, which names each shard's key),
    /// sharing one connection and one renewal batch (the first config's server and timing).
    pub async fn connect_shards(
        cfgs: &[NodeConfig],
        fenced: bool,
    ) -> ElectorResult<Vec<RedisElector>> {
        Ok(RedisStore::connect_shards(cfgs, fenced)?.electors())
    }
}

/// The way to the server for `cfg`: one address, or through its Sentinels.
fn open_link(cfg: &crate::config::RedisConfig, timeout: Duration) -> ElectorResult<Link> {
    let mcfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(timeout);
    Ok(if cfg.sentinels.is_empty() {
        let client = open_client(cfg)?;
        Link::Direct(ConnectionManager::new_lazy_with_config(client, mcfg).map_err(unavailable)?)
    } else {
        Link::Sentinel(Box::new(SentinelLink {
            master_name: cfg.master_name.clone().unwrap_or_default(),
            resolver: tokio::sync::Mutex::new(open_sentinel(cfg)?),
            mcfg,
            current: StdMutex::new((0, None)),
            named: StdMutex::new(None),
        }))
    })
}

impl RedisStore {
    /// One store per shard config, sharing one connection (see
    /// [`RedisElector::connect_shards`]).
    pub fn connect_shards(cfgs: &[NodeConfig], fenced: bool) -> ElectorResult<Shards<RedisStore>> {
        let cfg = super::session_config(cfgs)?;
        let timeout = Duration::from_millis(cfg.redis.request_timeout_ms.max(1));
        let link = Arc::new(open_link(&cfg.redis, timeout)?);
        if cfgs.iter().any(|c| c.redis.key.is_empty()) {
            return Err(ElectorError::Config("redis.key is empty".into()));
        }
        let leaders = Arc::new(SharedLeaderRead::new(
            cfg.retry_interval() / 2,
            cfgs.iter().map(|c| c.redis.key.clone()).collect(),
        ));
        let kind = if fenced {
            BackendKind::Redis
        } else {
            BackendKind::RedisNaive
        };
        let stores = (0u32..)
            .zip(cfgs)
            .map(|(shard, shard_cfg)| RedisStore {
                kind,
                link: link.clone(),
                shard,
                leaders: leaders.clone(),
                key: shard_cfg.redis.key.clone(),
                token_key: format!("{}:token", shard_cfg.redis.key),
                node_id: cfg.node_id.clone(),
                http_addr: cfg.advertise_addr.clone(),
                ttl: cfg.lease_ttl(),
                timeout,
                clock: NodeClock {
                    skew_ms: cfg.clock_skew_ms,
                    drift: cfg.clock_drift,
                },
                renew_script: Script::new(RENEW_LUA),
                release_script: Script::new(RELEASE_LUA),
                expire_dead_script: Script::new(EXPIRE_DEAD_LUA),
                acquire_script: Script::new(ACQUIRE_FENCED_LUA),
            })
            .collect();
        Ok(Shards::new(stores, cfg))
    }

    /// One round trip (`MGET`): who holds each of the node's shards' locks.
    async fn read_leaders(&self) -> Result<BTreeMap<String, LeaderInfo>, StoreError> {
        count_request(self.kind, "leader");
        let (generation, mut conn) = self.conn().await?;
        let values: Vec<Option<Vec<u8>>> = self
            .bounded(
                generation,
                ::redis::cmd("MGET")
                    .arg(&self.leaders.names)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(self
            .leaders
            .names
            .iter()
            .zip(values)
            .filter_map(|(key, v)| Some((key.clone(), LeaderInfo::decode(&v?))))
            .collect())
    }

    /// The value the lock key holds for candidacy `holder` (a holder id): readable as this
    /// node's [`LeaderInfo`], unique to the candidacy.
    fn value(&self, holder: &str) -> String {
        let c = Candidacy {
            node_id: &self.node_id,
            http_addr: self.http_addr.as_deref(),
            candidacy: holder.to_owned(),
        };
        serde_json::to_string(&c).expect("candidacy serializes")
    }

    /// The connection to send on (through Sentinel: asking the Sentinels first if the last
    /// request failed), within the request timeout.
    async fn conn(&self) -> Result<(u64, ConnectionManager), StoreError> {
        match tokio::time::timeout(self.timeout, self.link.get()).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis: no primary reached within {:?}",
                self.timeout
            ))),
        }
    }

    /// Runs one request on generation `generation`'s connection within the request timeout; a
    /// failure tells the link (see [`Link::failed`]).
    async fn bounded<T>(
        &self,
        generation: u64,
        f: impl std::future::Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let r = match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r.map_err(unavailable),
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis did not answer within {:?}",
                self.timeout
            ))),
        };
        if r.is_err() {
            self.link.failed(generation);
        }
        r
    }

    /// `script` on this store's key with `args`, counted as `op`: its answer.
    async fn run_script<T: ::redis::FromRedisValue>(
        &self,
        op: &'static str,
        script: &Script,
        args: &[&str],
    ) -> Result<T, StoreError> {
        count_request(self.kind, op);
        let (generation, mut conn) = self.conn().await?;
        let mut inv = script.prepare_invoke();
        inv.key(&self.key);
        for a in args {
            inv.arg(*a);
        }
        self.bounded(generation, inv.invoke_async(&mut conn)).await
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis().max(1) as u64
    }

    /// The fenced acquisition: the token when the lock is ours now.
    async fn acquire_fenced(&self, value: &str) -> Result<Option<FenceToken>, StoreError> {
        count_request(self.kind, "acquire");
        let (generation, mut conn) = self.conn().await?;
        let mut inv = self.acquire_script.prepare_invoke();
        inv.key(&self.key)
            .key(&self.token_key)
            .arg(value)
            .arg(self.ttl_ms());
        let token: Option<i64> = self
            .bounded(generation, inv.invoke_async(&mut conn))
            .await?;
        token
            .map(|t| checked_token("redis token counter", t))
            .transpose()
    }

    /// The naive acquisition (`SET NX PX`): the wall clock's "token" when the lock is ours now.
    async fn acquire_naive(&self, value: &str) -> Result<Option<FenceToken>, StoreError> {
        count_request(self.kind, "acquire");
        let (generation, mut conn) = self.conn().await?;
        let set: Option<String> = self
            .bounded(
                generation,
                ::redis::cmd("SET")
                    .arg(&self.key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(self.ttl_ms())
                    .query_async(&mut conn),
            )
            .await?;
        // No fencing token (see the module doc): the wall clock at acquisition.
        set.map(|_| checked_token("wall clock (ms)", self.clock.wall_ms()))
            .transpose()
    }
}

#[async_trait]
impl LeaseStore for RedisStore {
    const ALREADY_HOLDING: &'static str = "campaign while already holding the lock";

    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn lease_lost(&self, _epoch: i64) -> String {
        format!(
            "redis key {} no longer holds our candidacy (expired or taken)",
            self.key
        )
    }

    async fn acquire(&self, holder: &str) -> Result<Poll, StoreError> {
        let value = self.value(holder);
        let token = match self.kind {
            BackendKind::Redis => self.acquire_fenced(&value).await?,
            _ => self.acquire_naive(&value).await?,
        };
        Ok(match token {
            Some(token) => Poll::Won {
                token,
                ttl: self.ttl,
            },
            None => Poll::Held,
        })
    }

    /// One round trip: extends every lock of `locks` that still holds its candidacy (its
    /// value: a lock is named by its candidacy alone, each of which takes one token); says
    /// which did.
    async fn renew_all(&self, locks: Vec<HeldLease>) -> Result<Vec<bool>, StoreError> {
        let keys = election_names(&self.leaders.names, &locks)?;
        let (generation, mut conn) = self.conn().await?;
        let mut inv = self.renew_script.prepare_invoke();
        for key in keys {
            inv.key(key);
        }
        for lock in &locks {
            inv.arg(self.value(&lock.holder));
        }
        inv.arg(self.ttl_ms());
        count_request(self.kind, "renew");
        let answers: Vec<i64> = self
            .bounded(generation, inv.invoke_async(&mut conn))
            .await?;
        Ok(answers.into_iter().map(|n| n == 1).collect())
    }

    /// Compare-and-delete of the candidacy's value (every epoch of a candidacy is its value).
    async fn release(&self, holder: &str, _epoch: Option<i64>) -> Result<(), StoreError> {
        let value = self.value(holder);
        let _: i64 = self
            .run_script("release", &self.release_script, &[&value])
            .await?;
        Ok(())
    }

    async fn expire_dead(&self, dead: &str) -> Result<bool, StoreError> {
        let n: i64 = self
            .run_script("expire_dead", &self.expire_dead_script, &[dead])
            .await?;
        if n == 1 {
            tracing::info!(key = %self.key, dead, "ended a dead holder's lock");
        }
        Ok(n == 1)
    }

    /// One `GET` of the lock key (Redis serves it from its single copy): ours only while it
    /// still holds this candidacy's unique value.
    async fn confirm(&self, holder: &str, _epoch: i64) -> Result<bool, StoreError> {
        let value = self.value(holder);
        count_request(self.kind, "confirm");
        let (generation, mut conn) = self.conn().await?;
        let v: Option<Vec<u8>> = self
            .bounded(
                generation,
                ::redis::cmd("GET").arg(&self.key).query_async(&mut conn),
            )
            .await?;
        Ok(v.as_deref() == Some(value.as_bytes()))
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        self.leaders
            .leader(self.shard, &self.key, || self.read_leaders())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn a_url_in_an_error_shows_no_password() {
        assert_eq!(
            redacted_url("redis://user:hunter2@10.0.0.1:6379/0"),
            "redis://<credentials>@10.0.0.1:6379/0"
        );
        assert_eq!(
            redacted_url("rediss://:p@ss@h:1/"),
            "rediss://<credentials>@h:1/"
        );
        assert_eq!(redacted_url("redis://h:1/x@y"), "redis://h:1/x@y");
        assert_eq!(redacted_url("not a url"), "not a url");
    }
}
