//! `[scheduler]`: the built-in scheduler job.

use serde::{Deserialize, Serialize};

use super::Section;

/// `[scheduler]`: the built-in scheduler job (works through a fenced work-set).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Whether the leader runs it.
    pub enabled: bool,
    /// Time between ticks.
    pub tick_interval_ms: u64,
    /// Jobs taken from the work-set per tick.
    pub jobs_per_tick: i64,
    /// Publish the cursor through the fence every this many ticks (and always on demotion).
    pub checkpoint_every_ticks: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: true,
            tick_interval_ms: 1000,
            jobs_per_tick: 1000,
            checkpoint_every_ticks: 10,
        }
    }
}

impl Section for SchedulerConfig {
    fn name(&self) -> &'static str {
        "scheduler"
    }
}
