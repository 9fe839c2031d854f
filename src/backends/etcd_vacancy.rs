//! When did the seat fall vacant? etcd's Campaign RPC waits on the server until every older
//! candidacy is deleted and does not say when that happened. To measure election latency
//! (vacancy → won, as opposed to the time spent queued behind a live leader), a campaign opens
//! this watch on the election prefix first and notes when each deletion arrives.
//!
//! After the win it reads the store's current revision (the Campaign answer carries the revision
//! of our key's creation, not of the win) and waits until the watch has caught up with it, so the
//! deletion that let us in cannot still be in flight. That sits between the win and the first
//! write, so all of it is bounded by 100 ms. Best effort: any failure or overrun yields `None`,
//! never an error for the campaign.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, EventType, GetOptions, WatchFilterType, WatchOptions, WatchRequestSender,
    WatchResponseStream,
};
use tokio::sync::Notify;

use super::{count_request, BackendKind};
use crate::tasks::AbortOnDrop;

/// The most a won campaign spends on this measurement (a revision read, a progress request and
/// the watch catching up) before giving up on the figure: it sits between the win and the new
/// leader's first write, so it must stay small even when etcd is slow.
const MEASURE_BUDGET: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Seen {
    /// `(create_revision of the deleted key, delete revision, arrival)`.
    deletes: Vec<(i64, i64, Instant)>,
    /// The highest store revision a watch response has reported.
    revision: i64,
}

pub(super) struct VacancyWatch {
    client: Client,
    prefix: String,
    seen: Arc<Mutex<Seen>>,
    progressed: Arc<Notify>,
    requests: WatchRequestSender,
    /// Dropping the watch's reader (and its stream) ends the watch on the server.
    _reader: AbortOnDrop,
}

impl VacancyWatch {
    /// Opens the watch (deletions only, with the deleted key's previous value for its create
    /// revision). `None` if etcd does not answer within `timeout`.
    pub(super) async fn open(client: &Client, prefix: &str, timeout: Duration) -> Option<Self> {
        let mut c = client.clone();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_filters([WatchFilterType::NoPut]);
        count_request(BackendKind::Etcd, "watch-vacancy");
        let stream = tokio::time::timeout(timeout, c.watch(prefix, Some(opts)))
            .await
            .ok()?
            .ok()?;
        let (requests, responses) = stream.split();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let progressed = Arc::new(Notify::new());
        let reader = tokio::spawn(read(responses, seen.clone(), progressed.clone()));
        Some(VacancyWatch {
            client: client.clone(),
            prefix: prefix.to_owned(),
            seen,
            progressed,
            requests,
            _reader: AbortOnDrop(reader),
        })
    }

    /// When the last candidacy older than ours (`our_create_rev`) was deleted, as it arrived
    /// here; `campaign_start` if none was deleted while we waited (the seat was free). `None`
    /// if the watch could not be brought up to the store's revision after the win.
    pub(super) async fn vacant_since(
        mut self,
        our_create_rev: i64,
        campaign_start: Instant,
    ) -> Option<Instant> {
        tokio::time::timeout(MEASURE_BUDGET, self.measure(our_create_rev, campaign_start))
            .await
            .ok()
            .flatten()
    }

    async fn measure(&mut self, our_create_rev: i64, campaign_start: Instant) -> Option<Instant> {
        let mut c = self.client.clone();
        count_request(BackendKind::Etcd, "revision");
        let won_at_rev = c
            .get(
                self.prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .ok()?
            .header()?
            .revision();
        count_request(BackendKind::Etcd, "watch-progress");
        self.requests.request_progress().await.ok()?;
        loop {
            let notified = self.progressed.notified();
            if self.revision() >= won_at_rev {
                break;
            }
            notified.await;
        }
        let seen = self.seen.lock().ok()?;
        let last_ahead_deleted = seen
            .deletes
            .iter()
            .filter(|(created, deleted, _)| *created < our_create_rev && *deleted <= won_at_rev)
            .map(|(_, _, at)| *at)
            .max();
        Some(last_ahead_deleted.unwrap_or(campaign_start))
    }

    /// Notified on every message the watch delivers (each deletion under the prefix among them).
    pub(super) fn deletions(&self) -> Arc<Notify> {
        self.progressed.clone()
    }

    fn revision(&self) -> i64 {
        self.seen.lock().map(|s| s.revision).unwrap_or(0)
    }
}

async fn read(mut responses: WatchResponseStream, seen: Arc<Mutex<Seen>>, progressed: Arc<Notify>) {
    while let Ok(Some(resp)) = responses.message().await {
        let now = Instant::now();
        if let Ok(mut s) = seen.lock() {
            for ev in resp.events() {
                if ev.event_type() != EventType::Delete {
                    continue;
                }
                let created = ev.prev_kv().map(|kv| kv.create_revision()).unwrap_or(0);
                let deleted = ev.kv().map(|kv| kv.mod_revision()).unwrap_or(0);
                s.deletes.push((created, deleted, now));
            }
            if let Some(h) = resp.header() {
                s.revision = s.revision.max(h.revision());
            }
        }
        progressed.notify_waiters();
    }
}
