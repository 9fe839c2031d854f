//! Who leads a shard's election: its lowest child, read (with a watch when observing), and the
//! observe loop's quiet wait, backed by the node's shared re-check.

use std::time::Duration;

use zookeeper_client as zkc;

use super::request::{count, queue, ZkFailure};
use super::ZkElector;
use crate::backends::LeaderInfo;

/// An observe loop whose watch has been quiet this many retry intervals re-checks its election's
/// lowest znode (a backstop for a watch that never fires; a change itself is seen by the watch).
const QUIET_RECHECK_INTERVALS: u32 = 20;

impl ZkElector {
    /// The lowest child's name and data (with a watch on it when `watch`). `None`: no candidate.
    pub(super) async fn lowest(
        &self,
        client: &zkc::Client,
        watch: bool,
    ) -> Result<Option<(String, LeaderInfo, Option<zkc::OneshotWatcher>)>, ZkFailure> {
        let hub = &self.hub;
        for _ in 0..5 {
            count("read-list");
            let children = match hub.bounded(client.list_children(&self.path)).await {
                Ok(c) => c,
                Err(ZkFailure::Other(zkc::Error::NoNode)) => return Ok(None),
                Err(e) => return Err(e),
            };
            let Some((_, first)) = queue(children).into_iter().next() else {
                return Ok(None);
            };
            count("read-get");
            let path = self.child(&first);
            let got = if watch {
                hub.bounded(client.get_and_watch_data(&path))
                    .await
                    .map(|(d, _, w)| (d, Some(w)))
            } else {
                hub.bounded(client.get_data(&path))
                    .await
                    .map(|(d, _)| (d, None))
            };
            match got {
                Ok((data, w)) => return Ok(Some((first, LeaderInfo::decode(&data), w))),
                // Gone between the list and the read: look again.
                Err(ZkFailure::Other(zkc::Error::NoNode)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ZkFailure::Other(zkc::Error::UnexpectedError(
            "the election's lowest child keeps vanishing".into(),
        )))
    }

    /// candidate) to fire. Each time it has been quiet for `QUIET_RECHECK_INTERVALS × every`,
    /// the node's shared re-check (one read for all its shards, [`Hub::read_lowest_children`](super::hub::Hub::read_lowest_children))
    /// says whether the lowest child is still `lowest`: if so the same watch is kept and waited
    /// on again, so a quiet shard sends nothing of its own. Returns when the watch fired, the
    /// re-check saw another lowest child or failed (the caller re-lists and re-watches), or
    /// nobody observes any more.
    pub(super) async fn wait_while_quiet(
        &self,
        lowest: Option<String>,
        watch: zkc::OneshotWatcher,
        every: Duration,
        tx: &tokio::sync::watch::Sender<Option<LeaderInfo>>,
    ) {
        let hub = &self.hub;
        let mut fired = std::pin::pin!(watch.changed());
        loop {
            if tokio::time::timeout(every * QUIET_RECHECK_INTERVALS, &mut fired)
                .await
                .is_ok()
                || tx.is_closed()
            {
                return;
            }
            let now = hub
                .quiet_rechecks
                .leader(self.shard, &self.path, || hub.read_lowest_children())
                .await;
            match now {
                Ok(now) if now == lowest => continue,
                _ => return,
            }
        }
    }
}
