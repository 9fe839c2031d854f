//! Prompt elections: a follower asks for a vote as soon as its leader lease has run out.
//!
//! openraft 0.10 keeps a follower from voting for anyone for `leader_lease` (=
//! `election_timeout_max`) after the leader's last append, and from *standing* until
//! `leader_lease + election_timeout` (a fresh random draw in `[min, max)`). After a leader dies the
//! first election therefore starts `max + ~min` after its last heartbeat: with 150–300 ms that is
//! ~450 ms, and failover measured 535 ms median. The second wait buys nothing for safety: what
//! keeps an old leader's lease from overlapping a new term is the *voters'* refusal during
//! `leader_lease`, which this module does not touch.
//!
//! So each follower watches when it last accepted an append ([`LeaderContact`], written by the
//! peer server), and once `leader_lease` plus a random point of a jitter window (20 ms per other
//! voter, at most `max − min`, so two followers seldom stand in the same round trip) has passed
//! without one it triggers a **pre-vote** election (`trigger().elect(true)`): openraft
//! refuses it locally while this node's own lease still holds, and the real election goes ahead
//! only if a quorum would grant it, so a healthy leader is never disturbed and no term is burned
//! by a follower that merely missed a few heartbeats. Retries back off (one heartbeat doubling
//! up to `election_timeout_max`) so an isolated follower does not flood its log or its peers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;
use rand::Rng;

use super::RaftHandle;
use crate::clock::monotonic_ns;

/// When this node last accepted an append (heartbeat or entries) from a leader, on the
/// monotonic clock; 0 = never.
#[derive(Default)]
pub(crate) struct LeaderContact(AtomicU64);

impl LeaderContact {
    pub(crate) fn heard_now(&self) {
        self.0.store(monotonic_ns(), Ordering::Relaxed);
    }

    /// Time since the last accepted append (`None`: never heard from a leader).
    fn silent_for(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_nanos(monotonic_ns().saturating_sub(at))),
        }
    }
}

/// The timing a follower prompts elections with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PromptTiming {
    /// openraft's follower-side leader lease (`election_timeout_max`).
    pub leader_lease: Duration,
    /// How often the follower looks (and the first retry's back-off).
    pub heartbeat: Duration,
    /// Each follower stands at a uniform random point of this window after its lease ends. The
    /// first two of `n` standers are `window / (n + 1)` apart on average, and two that stand
    /// within a round trip of each other split the vote and cost a retry, so the window grows
    /// with the number of followers ([`PromptTiming::jitter_window`]).
    pub jitter_window: Duration,
}

impl PromptTiming {
    /// 20 ms per other voter, capped at openraft's own spread `max − min`: 40 ms among three
    /// voters, the full spread from six on.
    pub(crate) fn jitter_window(
        voters: usize,
        election_min: Duration,
        election_max: Duration,
    ) -> Duration {
        let per_follower = Duration::from_millis(20) * voters.saturating_sub(1).max(1) as u32;
        per_follower.min(election_max.saturating_sub(election_min))
    }

    /// Whether a follower silent for `silent` (with `jitter` of its own) should stand now.
    fn due(&self, silent: Option<Duration>, jitter: Duration) -> bool {
        silent.is_some_and(|s| s >= self.leader_lease + jitter)
    }

    /// The back-off after `attempts` prompts that did not make a leader.
    fn backoff(&self, attempts: u32) -> Duration {
        (self.heartbeat * 2u32.saturating_pow(attempts.min(8))).min(self.leader_lease)
    }
}

/// Runs until `current` finds no raft (closed, or the elector dropped): on a follower whose
/// leader has been silent past the lease, triggers a pre-vote election. Holds no raft handle
/// between looks, so it never keeps a closed raft alive.
pub(crate) async fn prompt_elections(
    current: impl Fn() -> Option<RaftHandle>,
    contact: Arc<LeaderContact>,
    timing: PromptTiming,
) {
    let mut attempts = 0u32;
    // A fine tick (10 ms with 50 ms heartbeats) so the lease's end is noticed promptly.
    let tick = (timing.heartbeat / 5).max(Duration::from_millis(1));
    // Drawn once per silence (re-drawn after each stand), not per look: a draw per look would
    // favour early standers and shrink the spread the window is there to give.
    let mut jitter = draw(timing.jitter_window);
    loop {
        tokio::time::sleep(tick).await;
        let Some(raft) = current() else { return };
        let (state, running) = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            (m.state, m.running_state.is_ok())
        };
        if !running {
            return; // raft died: nothing to prompt
        }
        if state == ServerState::Leader {
            // A leader hears nobody, so without this its silence would count from its last
            // follower days: on handing leadership over (`resign`) it would stand at once against
            // the successor it just named. Its silence starts when it stops leading.
            contact.heard_now();
        }
        if state != ServerState::Follower {
            attempts = 0;
            continue;
        }
        if !timing.due(contact.silent_for(), jitter) {
            attempts = 0;
            continue;
        }
        jitter = draw(timing.jitter_window);
        if raft.trigger().elect(true).await.is_err() {
            return; // raft shut down
        }
        drop(raft);
        attempts += 1;
        tokio::time::sleep(timing.backoff(attempts)).await;
    }
}

fn draw(window: Duration) -> Duration {
    window.mul_f64(rand::thread_rng().gen::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: PromptTiming = PromptTiming {
        leader_lease: Duration::from_millis(300),
        heartbeat: Duration::from_millis(50),
        jitter_window: Duration::from_millis(40),
    };

    #[test]
    fn a_follower_stands_only_once_its_lease_has_run_out() {
        let ms = Duration::from_millis;
        assert!(
            !T.due(None, ms(0)),
            "never heard from a leader: openraft's own timer"
        );
        assert!(!T.due(Some(ms(299)), ms(0)));
        assert!(T.due(Some(ms(300)), ms(0)));
        assert!(!T.due(Some(ms(310)), ms(20)), "jitter delays it");
        assert!(T.due(Some(ms(320)), ms(20)));
    }

    #[test]
    fn the_jitter_window_grows_with_the_followers_up_to_the_election_spread() {
        let ms = Duration::from_millis;
        assert_eq!(PromptTiming::jitter_window(3, ms(150), ms(250)), ms(40));
        assert_eq!(PromptTiming::jitter_window(5, ms(150), ms(250)), ms(80));
        assert_eq!(PromptTiming::jitter_window(9, ms(150), ms(250)), ms(100));
        assert_eq!(PromptTiming::jitter_window(1, ms(150), ms(250)), ms(20));
    }

    #[test]
    fn retries_back_off_to_the_lease() {
        let ms = Duration::from_millis;
        assert_eq!(T.backoff(1), ms(100));
        assert_eq!(T.backoff(2), ms(200));
        assert_eq!(T.backoff(3), ms(300));
        assert_eq!(T.backoff(40), ms(300));
    }
}
