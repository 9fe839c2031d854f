//! `[sequencer]`: the built-in ID sequencer behind `POST /next`, and its mode.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Section};

/// How the sequencer makes an ID safe to answer (`[sequencer] mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SequencerMode {
    /// Every ID is durable in PostgreSQL (a fenced group commit) before its answer; real-time
    /// order across leaders holds whatever the clocks do.
    #[default]
    Durable,
    /// The leader persists an upper bound a window ahead through the fence and serves IDs from
    /// memory below it, only inside its lease-read window; real-time order across leaders holds
    /// only while the clock-rate bound does.
    Window,
}

impl SequencerMode {
    /// `durable` or `window`.
    pub fn as_str(self) -> &'static str {
        match self {
            SequencerMode::Durable => "durable",
            SequencerMode::Window => "window",
        }
    }
}

/// The most IDs one window-mode extension may persist ahead: the fence's own default bound on
/// one sequence write (`baton.settings.max_seq_advance`, 2^24).
pub const MAX_WINDOW_IDS: u64 = 16_777_216;

/// `[sequencer]`: the built-in ID sequencer (`POST /next`), group-committed through the fence.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SequencerConfig {
    /// Whether the leader runs it.
    pub enabled: bool,
    /// Upper bound on IDs committed in one group commit.
    pub max_batch_ids: usize,
    /// Largest `?n=` a client may ask for.
    pub max_block: u32,
    /// Group commits sent and not yet answered at once (1..=8), all on one connection so
    /// PostgreSQL runs them in order. With 2 or more, a batch can wait in the database's socket
    /// while the one before it is flushed (one goes behind another only once it carries at
    /// least as many IDs): more IDs/s where commits, not CPU, are the limit (few clients, or
    /// cores to spare). 1, the default: each commit waits for the answer to the last, which on
    /// a saturated 2-core machine is the faster of the two (`experiments/FINDINGS.md`).
    pub commits_in_flight: usize,
    /// The least time between the starts of two group commits sent one after the other
    /// (0..=20). 0, the default: the next commit goes as soon as the last is answered. Above
    /// that, requests arriving sooner wait for the interval to pass and go in one commit: fewer
    /// commits per second under load, each costing PostgreSQL about the same whatever it
    /// carries, for at most this much more latency. An idle sequencer answers at once.
    pub min_commit_interval_ms: u64,
    /// `durable` (the default) or `window`. Durable: every ID is committed through the fence
    /// (a group commit) before its answer, and real-time order across leaders holds whatever the
    /// clocks do. Window (the timestamp oracle of Percolator and TiDB PD): the leader persists an
    /// upper bound `window_ids` ahead through the fence, then answers IDs from memory below it,
    /// only while its lease-read window is open (the bound `GET /read?mode=lease` uses);
    /// unique and increasing per leader unconditionally (a new leader claims above the highest
    /// bound persisted), but real-time order across a change of leader holds only while the
    /// clock-rate bound (`clock_rate_error`) holds. A leader change burns what was left below the
    /// old bound.
    pub mode: SequencerMode,
    /// Window mode: how far ahead of the IDs served the bound is persisted (1..=16777216, and
    /// at most the resource's `max_seq_advance`, 16777216 unless its owner lowered it). The
    /// bound is extended in the background once fewer than half of these are left.
    pub window_ids: u64,
}

impl Default for SequencerConfig {
    fn default() -> Self {
        SequencerConfig {
            enabled: true,
            max_batch_ids: 4096,
            max_block: 1000,
            commits_in_flight: 1,
            min_commit_interval_ms: 0,
            mode: SequencerMode::Durable,
            window_ids: 1_000_000,
        }
    }
}

impl Section for SequencerConfig {
    fn name(&self) -> &'static str {
        "sequencer"
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_batch_ids == 0 || self.max_block == 0 {
            return Err(ConfigError::Invalid("sequencer limits must be > 0".into()));
        }
        if !(1..=8).contains(&self.commits_in_flight) {
            return Err(ConfigError::Invalid(format!(
                "[sequencer] commits_in_flight must be in 1..=8, got {}",
                self.commits_in_flight
            )));
        }
        if !(1..=MAX_WINDOW_IDS).contains(&self.window_ids) {
            return Err(ConfigError::Invalid(format!(
                "[sequencer] window_ids must be in 1..={MAX_WINDOW_IDS} (one fenced write may move the sequence at most that far), got {}",
                self.window_ids
            )));
        }
        if self.min_commit_interval_ms > 20 {
            return Err(ConfigError::Invalid(format!(
                "[sequencer] min_commit_interval_ms must be in 0..=20 (it adds to every answer's latency), got {}",
                self.min_commit_interval_ms
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;

    #[test]
    fn commits_in_flight_is_bounded() {
        let mut c = NodeConfig::default();
        for (n, ok) in [(0, false), (1, true), (2, true), (8, true), (9, false)] {
            c.sequencer.commits_in_flight = n;
            assert_eq!(c.validate().is_ok(), ok, "commits_in_flight = {n}");
        }
    }

    #[test]
    fn sequencer_mode_is_durable_by_default_and_the_window_is_bounded() {
        let c = NodeConfig::default();
        assert_eq!(c.sequencer.mode, SequencerMode::Durable);
        let c: NodeConfig =
            toml::from_str("[sequencer]\nmode = \"window\"\nwindow_ids = 5000\n").unwrap();
        assert_eq!(
            (c.sequencer.mode, c.sequencer.window_ids),
            (SequencerMode::Window, 5000)
        );
        assert!(toml::from_str::<NodeConfig>("[sequencer]\nmode = \"fast\"\n").is_err());
        let mut c = NodeConfig::default();
        for (ids, ok) in [
            (0, false),
            (1, true),
            (MAX_WINDOW_IDS, true),
            (MAX_WINDOW_IDS + 1, false),
        ] {
            c.sequencer.window_ids = ids;
            assert_eq!(c.validate().is_ok(), ok, "window_ids = {ids}");
        }
    }

    #[test]
    fn min_commit_interval_is_bounded() {
        let mut c = NodeConfig::default();
        for (ms, ok) in [(0, true), (2, true), (20, true), (21, false)] {
            c.sequencer.min_commit_interval_ms = ms;
            assert_eq!(c.validate().is_ok(), ok, "min_commit_interval_ms = {ms}");
        }
    }
}
