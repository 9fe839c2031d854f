//! Which node to send to: a shared hint, set from 409 `x-baton-leader` headers and refreshed
//! from the nodes' `/status` after a 503 or a connection error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::fleet::client::NodeClient;

/// Minimum spacing of `/status` sweeps, so a leaderless fleet is not hammered.
const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(25);

pub struct LeaderTracker {
    targets: Vec<String>,
    /// The shard whose leader this tracks (`None`: the unsharded fleet's).
    shard: Option<u32>,
    hint: RwLock<Option<String>>,
    /// Bumped on every change of the hint; a refresh requested for an older generation is
    /// already answered.
    generation: AtomicU64,
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    /// A background sweep is running.
    sweeping: AtomicBool,
    client: NodeClient,
    /// The runtime the tracker was made on: background sweeps run there, not on a load
    /// thread's runtime, which may finish (and drop its tasks) before the others.
    home: tokio::runtime::Handle,
}

impl LeaderTracker {
    /// Must be called inside a tokio runtime (the one background sweeps will run on).
    /// `shard`: follow that shard's leader (from `/status`'s `shards`), or the fleet's.
    pub fn new(
        targets: Vec<String>,
        status_timeout: Duration,
        shard: Option<u32>,
    ) -> LeaderTracker {
        LeaderTracker {
            targets,
            shard,
            hint: RwLock::new(None),
            generation: AtomicU64::new(0),
            refreshing: tokio::sync::Mutex::new(None),
            sweeping: AtomicBool::new(false),
            client: NodeClient::new(status_timeout),
            home: tokio::runtime::Handle::current(),
        }
    }

    pub fn targets(&self) -> &[String] {
        &self.targets
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Where to send now: the hint, else target `fallback % len` (it will redirect or refuse).
    pub fn current(&self, fallback: usize) -> String {
        if let Some(h) = self.hint.read().ok().and_then(|h| h.clone()) {
            return h;
        }
        self.targets[fallback % self.targets.len()].clone()
    }

    /// A node named the leader (a 409's header).
    pub fn set(&self, addr: &str) {
        if let Ok(mut h) = self.hint.write() {
            if h.as_deref() != Some(addr) {
                *h = Some(addr.to_owned());
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// [`LeaderTracker::refresh`] in a background task, unless one is already running: the
    /// caller goes on to its next slot instead of queueing behind `/status` sweeps (which would
    /// turn a leaderless period into client-side backlog).
    pub fn refresh_soon(self: &Arc<Self>, seen_generation: u64) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        self.home.spawn(async move {
            me.refresh(seen_generation).await;
            me.sweeping.store(false, Ordering::Release);
        });
    }

    /// Asks every node who leads, unless someone already did since `seen_generation`.
    pub async fn refresh(&self, seen_generation: u64) {
        let mut last = self.refreshing.lock().await;
        if self.generation() != seen_generation {
            return;
        }
        if let Some(t) = *last {
            let next = t + MIN_REFRESH_INTERVAL;
            if Instant::now() < next {
                tokio::time::sleep_until(next).await;
            }
        }
        let found = self.ask().await;
        *last = Some(Instant::now());
        if let Ok(mut h) = self.hint.write() {
            *h = found;
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The node that says it leads with the highest token; else the address most followers name.
    async fn ask(&self) -> Option<String> {
        let replies = futures::future::join_all(
            self.targets
                .iter()
                .map(|t| async move { (t.clone(), self.client.get(t, "/status").await) }),
        )
        .await;
        let mut best: Option<(i64, String)> = None;
        let mut named: Vec<String> = Vec::new();
        for (addr, r) in replies {
            let Ok(r) = r else { continue };
            let all = r.json();
            let v = match self.shard {
                Some(s) => {
                    let mut v = all["shards"][s as usize].clone();
                    v["fence_token"] = v["token"].clone();
                    v
                }
                None => all,
            };
            if v["role"] == "leader" {
                let tok = v["fence_token"].as_i64().unwrap_or(i64::MIN);
                if best.as_ref().is_none_or(|(b, _)| tok > *b) {
                    best = Some((tok, addr.clone()));
                }
            } else if let Some(a) = v["leader"]["http_addr"].as_str() {
                named.push(a.to_owned());
            }
        }
        if let Some((_, a)) = best {
            return Some(a);
        }
        named.sort();
        let mut top: Option<(usize, String)> = None;
        for chunk in named.chunk_by(|a, b| a == b) {
            if top.as_ref().is_none_or(|(n, _)| chunk.len() > *n) {
                top = Some((chunk.len(), chunk[0].clone()));
            }
        }
        top.map(|(_, a)| a)
    }
}
