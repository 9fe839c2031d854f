//! `[term_backoff]` and `[failure_budget]`: how a node slows down after terms whose leader work
//! failed, on its own and fleet-wide.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Section};

/// `[term_backoff]`: after a term whose leader work failed, this node waits before campaigning
/// again, `base_ms x 2^(failed terms in a row - 1)` up to `max_ms`, stretched by up to 20% at
/// random (see `actors::backoff`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TermBackoffConfig {
    /// The wait after one failed term; 0 turns the wait off (failures are still logged and
    /// counted).
    pub base_ms: u64,
    /// The longest wait.
    pub max_ms: u64,
    /// A failed term that had run at least this long starts a new streak instead of extending
    /// the last one (work that fails once a day is not crash-looping).
    pub reset_after_ms: u64,
}

impl Default for TermBackoffConfig {
    fn default() -> Self {
        TermBackoffConfig {
            base_ms: 1000,
            max_ms: 60_000,
            reset_after_ms: 60_000,
        }
    }
}

impl Section for TermBackoffConfig {
    fn name(&self) -> &'static str {
        "term_backoff"
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.base_ms > 0 && self.max_ms < self.base_ms {
            return Err(ConfigError::Invalid(format!(
                "[term_backoff] max_ms ({}) must be at least base_ms ({}), e.g. max_ms = {}",
                self.max_ms,
                self.base_ms,
                self.base_ms * 60
            )));
        }
        Ok(())
    }
}

/// `[failure_budget]`: a fleet-wide limit on failed terms, counted per shard in the fenced
/// resource so every node sees the same count. Once `failed_terms` terms of a shard have failed
/// (its leader work failed, see `[term_backoff]`) within `window_ms` by the resource's clock, no
/// node campaigns for that shard, and each says so (WARN with the last failure, `/status`,
/// `baton_failure_budget_exhausted`), until enough of them have left the window or an operator
/// runs `baton budget reset`. Only the term's own leader can record its failure (the record is
/// fenced). A node that cannot reach the resource, or whose resource lacks the budget's schema
/// (`baton migrate`), backs off locally only.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailureBudgetConfig {
    /// Failed terms within the window that exhaust the budget; 0 turns the budget off
    /// (`[term_backoff]` alone then slows a failing work down).
    pub failed_terms: u32,
    /// The window the failed terms are counted in (1 s to 7 days).
    pub window_ms: u64,
    /// How often a node that holds off asks the resource again (and at the latest when the
    /// budget should reopen): how soon a reset takes effect.
    pub recheck_ms: u64,
}

impl Default for FailureBudgetConfig {
    fn default() -> Self {
        FailureBudgetConfig {
            failed_terms: 5,
            window_ms: 600_000,
            recheck_ms: 5_000,
        }
    }
}

/// The longest `[failure_budget] window_ms` (the resource keeps failed terms this long).
pub const MAX_FAILURE_BUDGET_WINDOW_MS: u64 = 7 * 24 * 3600 * 1000;
/// The most `[failure_budget] failed_terms` (the resource's own bound).
pub const MAX_FAILURE_BUDGET_TERMS: u32 = 10_000;

impl FailureBudgetConfig {
    /// Whether the budget is on (`failed_terms > 0`).
    pub fn enabled(&self) -> bool {
        self.failed_terms > 0
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The recheck interval.
    pub fn recheck(&self) -> Duration {
        Duration::from_millis(self.recheck_ms)
    }
}

impl Section for FailureBudgetConfig {
    fn name(&self) -> &'static str {
        "failure_budget"
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        let d = FailureBudgetConfig::default();
        if self.failed_terms > MAX_FAILURE_BUDGET_TERMS {
            return Err(ConfigError::Invalid(format!(
                "[failure_budget] failed_terms ({}) must be at most {MAX_FAILURE_BUDGET_TERMS} (0 turns the budget off), e.g. failed_terms = {}",
                self.failed_terms, d.failed_terms
            )));
        }
        if !(1000..=MAX_FAILURE_BUDGET_WINDOW_MS).contains(&self.window_ms) {
            return Err(ConfigError::Invalid(format!(
                "[failure_budget] window_ms ({}) must be from 1000 (1 s) to {MAX_FAILURE_BUDGET_WINDOW_MS} (7 days), e.g. window_ms = {}",
                self.window_ms, d.window_ms
            )));
        }
        if !(100..=self.window_ms).contains(&self.recheck_ms) {
            return Err(ConfigError::Invalid(format!(
                "[failure_budget] recheck_ms ({}) must be from 100 to window_ms ({}), e.g. recheck_ms = {}",
                self.recheck_ms,
                self.window_ms,
                d.recheck_ms.min(self.window_ms)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;

    #[test]
    fn the_failure_budget_is_on_by_default_and_its_errors_name_a_working_value() {
        let c = NodeConfig::default();
        assert!(c.failure_budget.enabled());
        c.validate().unwrap();
        let refused = |b: FailureBudgetConfig| {
            let c = NodeConfig {
                failure_budget: b,
                ..NodeConfig::default()
            };
            c.validate().unwrap_err().to_string()
        };
        let e = refused(FailureBudgetConfig {
            window_ms: 10,
            ..FailureBudgetConfig::default()
        });
        assert!(
            e.contains("[failure_budget] window_ms (10)") && e.contains("window_ms = 600000"),
            "{e}"
        );
        let e = refused(FailureBudgetConfig {
            recheck_ms: 0,
            ..FailureBudgetConfig::default()
        });
        assert!(e.contains("recheck_ms = 5000"), "{e}");
        let e = refused(FailureBudgetConfig {
            window_ms: 2000,
            recheck_ms: 5000,
            ..FailureBudgetConfig::default()
        });
        assert!(e.contains("recheck_ms = 2000"), "{e}");
        let e = refused(FailureBudgetConfig {
            failed_terms: 20_000,
            ..FailureBudgetConfig::default()
        });
        assert!(e.contains("failed_terms = 5"), "{e}");
        // Off: the other settings are not looked at.
        let off = NodeConfig {
            failure_budget: FailureBudgetConfig {
                failed_terms: 0,
                window_ms: 0,
                recheck_ms: 0,
            },
            ..NodeConfig::default()
        };
        off.validate().unwrap();
    }
}
