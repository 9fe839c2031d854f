//! Taking over from a dead etcd leader without waiting for etcd's lease sweep.
//!
//! etcd 3.4 removes expired leases in a loop that runs every 500 ms, so a dead leader's
//! candidacy outlives its lease by up to half a second and failover takes up to TTL + 500 ms
//! (`experiments/FINDINGS.md`). Once etcd considers a lease expired it can never be renewed (a
//! keepalive for it waits for the revocation, then fails), so revoking it ourselves is exactly
//! the sweep's own next step, taken sooner. Nothing here decides who leads: the revocation
//! deletes the dead candidacy, and etcd's Campaign lets the next one in as it always does.
//!
//! The hard part is knowing the lease *has* expired. `LeaseTimeToLive` answers in whole
//! seconds, truncated: 0 means "under a second left" as well as "expired, not yet swept". The rule
//! ([`proves_expired`]) is two readings:
//!
//! 1. a 0 (under a second left when etcd answered), then
//! 2. another 0, asked at least one second after the first answer arrived. Without a renewal in
//!    between, the lease has now expired. A renewal resets the lease to its granted TTL and
//!    would read at least 1, provided the second answer arrives within `granted - 1` seconds of
//!    the first question.
//!
//! Both bounds are stretched by twice the configured clock-rate error (ours and etcd's).
//!
//! Cost: only the candidate directly behind the leader reads the leader's lease. That is one
//! request a second while the leader renews, then one per [`LAST_SECOND_POLL`] once its lease
//! reads 1 (the leader missed a renewal). The other candidates wait for a deletion.
//!
//! A sharded node has a candidacy in many elections, and the leaders of those elections share a
//! few leases (one per node, `etcd.rs`): a node queued directly behind another in 200 shards would
//! otherwise read that one lease 200 times a second. Its reapers read through one
//! [`LeaseTtlReader`] instead, which asks etcd once for every reaper of the same lease. A reaper
//! names the earliest send time it can use; its next look is counted from the send time of the
//! reading it acted on, and while the lease still has time left a reading from the second half of
//! the wait will do, so reapers that started out of step fall into step and then share each
//! reading. The second reading of the proof is always asked afresh after the full second.
//! Sharing changes no proof: a reading is a fact about the lease, stamped with when it was really
//! asked and answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use tokio::sync::Notify;

use super::etcd_rpc::{bounded, revoke_lease};
use super::{count_request, BackendKind, ElectorResult};

/// How often the lease is read once it has under two seconds left: the takeover lands at most
/// this long (plus one round trip and the rate-error margin) after the lease expires.
pub const LAST_SECOND_POLL: Duration = Duration::from_millis(50);

/// One `LeaseTimeToLive` answer and when it was asked and answered (on our monotonic clock).
#[derive(Clone, Copy, Debug)]
pub struct TtlReading {
    /// When the request was sent.
    pub sent: Instant,
    /// When its answer arrived.
    pub received: Instant,
    /// Whole seconds left, truncated; negative if the lease is gone.
    pub ttl_secs: i64,
}

/// Whether `later` proves the lease expired, given an earlier reading of 0 (see the module doc).
/// `granted_secs`: the lease's granted TTL, what a renewal resets it to.
pub fn proves_expired(
    first_zero: TtlReading,
    later: TtlReading,
    granted_secs: i64,
    clock_rate_error: f64,
) -> bool {
    if first_zero.ttl_secs != 0 || later.ttl_secs != 0 {
        return false;
    }
    let (slow, fast) = (1.0 - 2.0 * clock_rate_error, 1.0 + 2.0 * clock_rate_error);
    // etcd's two evaluations were at least this far apart...
    let apart_at_least = secs_between(first_zero.received, later.sent) * slow;
    // ...and at most this far.
    let apart_at_most = secs_between(first_zero.sent, later.received) * fast;
    apart_at_least >= 1.0 && apart_at_most <= (granted_secs - 1) as f64
}

fn secs_between(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

/// How a watched lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    /// We proved it expired and revoked it.
    Revoked,
    /// It was gone when we looked (revoked by its holder or swept by etcd).
    Gone,
    /// Its granted TTL is under 3 s: no pair of readings can rule out a renewal, so only etcd's
    /// own sweep ends it.
    TooShort,
}

/// One node's readings of other nodes' leases, shared by its reapers (see the module docs).
pub struct LeaseTtlReader {
    client: Client,
    timeout: Duration,
    /// `LeaseTimeToLive` requests this reader sent.
    sent: std::sync::atomic::AtomicU64,
    /// Per lease: the newest reading (and its granted TTL), behind an async lock that makes the
    /// reapers of one lease wait for the read in flight instead of sending their own.
    leases: StdMutex<HashMap<i64, Arc<NewestReading>>>,
}

/// One lease's newest reading and its granted TTL (`None` before the first).
type NewestReading = tokio::sync::Mutex<Option<(TtlReading, i64)>>;

impl LeaseTtlReader {
    /// A reader on `client`, each request bounded by `timeout`.
    pub fn new(client: Client, timeout: Duration) -> LeaseTtlReader {
        LeaseTtlReader {
            client,
            timeout,
            sent: Default::default(),
            leases: StdMutex::default(),
        }
    }

    /// How many `LeaseTimeToLive` requests this reader has sent.
    pub fn requests_sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A reading of `lease` sent no earlier than `sent_since`, and its granted TTL: the newest one
    /// if it qualifies, else a new one (one request however many reapers ask at once).
    pub async fn read(&self, lease: i64, sent_since: Instant) -> ElectorResult<(TtlReading, i64)> {
        let slot = {
            let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            // Readings of leases nobody watches any more go (a lease id is never reused).
            if leases.len() > 64 {
                leases.retain(|_, slot| Arc::strong_count(slot) > 1);
            }
            leases.entry(lease).or_default().clone()
        };
        let mut newest = slot.lock().await;
        if let Some(got) = *newest {
            if got.0.sent >= sent_since {
                return Ok(got);
            }
        }
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let got = read_ttl(&self.client, lease, self.timeout).await?;
        *newest = Some(got);
        Ok(got)
    }
}

/// Reads `lease` until it has provably expired, then revokes it. Never returns while the lease is
/// being renewed. An error is etcd's (unreachable, timed out); the caller retries.
pub async fn revoke_when_expired(
    client: &Client,
    lease: i64,
    clock_rate_error: f64,
    timeout: Duration,
) -> ElectorResult<LeaseEnd> {
    let reader = LeaseTtlReader::new(client.clone(), timeout);
    revoke_when_expired_via(&reader, lease, clock_rate_error).await
}

/// [`revoke_when_expired`] through a reader shared with other reapers.
pub async fn revoke_when_expired_via(
    reader: &LeaseTtlReader,
    lease: i64,
    clock_rate_error: f64,
) -> ElectorResult<LeaseEnd> {
    let mut first_zero: Option<TtlReading> = None;
    let one_second = Duration::from_secs_f64(1.0 / (1.0 - 2.0 * clock_rate_error));
    // The first look may take a reading another reaper got a moment ago.
    let mut sent_since = Instant::now() - LAST_SECOND_POLL;
    loop {
        let (now, granted) = reader.read(lease, sent_since).await?;
        if now.ttl_secs < 0 {
            return Ok(LeaseEnd::Gone);
        }
        if granted < 3 {
            return Ok(LeaseEnd::TooShort);
        }
        if now.ttl_secs > 0 {
            first_zero = None;
            // Under two seconds left: the leader missed a renewal. Watch its last second closely.
            let wait = match now.ttl_secs {
                1 => LAST_SECOND_POLL,
                k => Duration::from_secs((k - 1) as u64),
            };
            // Counted from when the reading was asked, the same for every reaper that shares it;
            // a reading from the second half of the wait will do, so reapers that started out of
            // step take each other's readings and fall into step.
            sent_since = now.sent + wait / 2;
            tokio::time::sleep_until((now.sent + wait).into()).await;
            continue;
        }
        match first_zero {
            Some(a) if proves_expired(a, now, granted, clock_rate_error) => {
                return revoke(&reader.client, lease, reader.timeout).await;
            }
            // Asked too soon: wait out the rest of the second.
            Some(a) if now.sent < a.received + one_second => {}
            // Too long since the first 0 to rule out a renewal: this reading starts afresh.
            _ => first_zero = Some(now),
        }
        sent_since = first_zero.map_or(now.received, |a| a.received) + one_second;
        tokio::time::sleep_until(sent_since.into()).await;
    }
}

async fn read_ttl(
    client: &Client,
    lease: i64,
    timeout: Duration,
) -> ElectorResult<(TtlReading, i64)> {
    let mut c = client.clone();
    let sent = Instant::now();
    count_request(BackendKind::Etcd, "lease-ttl");
    let resp = bounded(timeout, c.lease_time_to_live(lease, None)).await?;
    let reading = TtlReading {
        sent,
        received: Instant::now(),
        ttl_secs: resp.ttl(),
    };
    Ok((reading, resp.granted_ttl()))
}

async fn revoke(client: &Client, lease: i64, timeout: Duration) -> ElectorResult<LeaseEnd> {
    if !revoke_lease(client, lease, timeout, "lease-revoke-expired").await? {
        // etcd's sweep got there first.
        return Ok(LeaseEnd::Gone);
    }
    tracing::info!(
        lease = format!("{lease:x}"),
        "revoked the expired lease of the candidacy ahead before etcd swept it"
    );
    Ok(LeaseEnd::Revoked)
}

/// Where our candidacy stands in the queue.
enum Place {
    /// Not created yet (the Campaign RPC is on its way).
    Absent,
    /// We lead: nothing to watch.
    Head,
    /// Directly behind the leader, whose candidacy is bound to this lease.
    Behind(i64),
    /// Further back (or behind a candidacy without a lease): wait for a deletion.
    Queued,
}

/// Runs beside one campaign (aborted when it ends): while our candidacy is directly behind the
/// leader, revokes the leader's lease as soon as it has provably expired.
pub(super) struct ExpiryReaper {
    pub client: Client,
    /// The node's shared lease readings.
    pub ttl_reads: Arc<LeaseTtlReader>,
    /// The election's key prefix (`name/`).
    pub prefix: String,
    pub our_lease: i64,
    pub clock_rate_error: f64,
    pub timeout: Duration,
    /// Woken on every deletion under the prefix (the vacancy watch's); `None` if that watch is
    /// down, and the queue is then re-read once a lease TTL.
    pub deletions: Option<Arc<Notify>>,
    pub lease_ttl: Duration,
}

impl ExpiryReaper {
    pub(super) async fn run(self) {
        let mut absent_reads = 0;
        loop {
            // Created before the queue is read, so a deletion in between is not missed.
            let notify = self.deletions.clone();
            let notified = notify.as_ref().map(|n| n.notified());
            let deleted = async {
                match notified {
                    Some(n) => n.await,
                    None => tokio::time::sleep(self.lease_ttl).await,
                }
            };
            tokio::pin!(deleted);
            match self.place().await {
                Ok(Place::Head) => return,
                // The Campaign RPC creates our candidacy at once; if it still is not there after a
                // second, our own session has lapsed: look again only when something changes.
                Ok(Place::Absent) if absent_reads < 20 => {
                    absent_reads += 1;
                    tokio::time::sleep(LAST_SECOND_POLL).await
                }
                Ok(Place::Absent) => deleted.await,
                Ok(Place::Behind(lease)) => {
                    let watched =
                        revoke_when_expired_via(&self.ttl_reads, lease, self.clock_rate_error);
                    tokio::select! {
                        _ = &mut deleted => {}
                        ended = watched => match ended {
                            Ok(LeaseEnd::TooShort) => deleted.await,
                            Ok(_) => {}
                            Err(e) => {
                                tracing::debug!(error = %e, "reading the leader's lease failed");
                                tokio::time::sleep(self.timeout).await;
                            }
                        }
                    }
                }
                Ok(Place::Queued) => deleted.await,
                Err(e) => {
                    tracing::debug!(error = %e, "reading the candidacy queue failed");
                    tokio::time::sleep(self.timeout).await;
                }
            }
        }
    }

    async fn place(&self) -> ElectorResult<Place> {
        let mut c = self.client.clone();
        let opts = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        count_request(BackendKind::Etcd, "candidates");
        let resp = bounded(self.timeout, c.get(self.prefix.as_str(), Some(opts))).await?;
        let kvs = resp.kvs();
        Ok(
            match kvs.iter().position(|kv| kv.lease() == self.our_lease) {
                None => Place::Absent,
                Some(0) => Place::Head,
                Some(1) if kvs[0].lease() != 0 => Place::Behind(kvs[0].lease()),
                Some(_) => Place::Queued,
            },
        )
    }
}
