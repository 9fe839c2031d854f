//! The fleet-wide failure budget, kept in the fenced resource: failed terms recorded through the
//! fence (a stale node cannot spend it), read by every node before it campaigns.

use std::time::Duration;

use crate::backends::FenceToken;
use crate::config::FailureBudgetConfig;

use super::*;

/// The resource name a shard's failure budget is recorded under, as shard 0 names it: shard S
/// appends `#S` ([`ShardId::resource`]), so its failures fall in its own fence domain
/// (`leadership#S`) and are counted apart from every other shard's.
pub const FAILURE_BUDGET_RESOURCE: &str = "failure-budget";

/// A shard's fleet-wide failure budget as the resource counts it (`sql/0004_failure_budget.sql`),
/// from one snapshot: the failed terms within the window (and after the latest operator reset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetState {
    /// Failed terms counted.
    pub failed_terms: u32,
    /// Whether they reach the limit: no node campaigns for this shard.
    pub exhausted: bool,
    /// While exhausted: how long until the count falls below the limit, by the resource's clock.
    pub reopens_in: Option<Duration>,
    /// The latest failed term counted: `term T on NODE: ERROR` (a program's exit status, a job's
    /// error chain).
    pub last_failure: Option<String>,
}

impl BudgetState {
    fn from_row(row: &tokio_postgres::Row) -> BudgetState {
        BudgetState {
            failed_terms: u32::try_from(row.get::<_, i32>("failed_terms")).unwrap_or(0),
            exhausted: row.get("exhausted"),
            reopens_in: row
                .get::<_, Option<i64>>("reopens_in_ms")
                .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            last_failure: row.get("last_failure"),
        }
    }
}

/// `(window_ms, limit)` as the budget's SQL functions take them.
fn budget_args(budget: &FailureBudgetConfig) -> (i64, i32) {
    (
        i64::try_from(budget.window_ms).unwrap_or(i64::MAX),
        i32::try_from(budget.failed_terms).unwrap_or(i32::MAX),
    )
}

impl Fence {
    /// Records that the leader work of this node's term `token` failed with `detail`, in this
    /// handle's shard, and returns the budget after it. Fenced like every write: a token the
    /// resource has moved past (or the current one under another holder) is refused as
    /// [`FenceError::Rejected`] (op `failed-term`), so a stale node cannot spend the budget. A
    /// second record of the same term counts once.
    pub async fn record_failed_term(
        &self,
        token: FenceToken,
        detail: &str,
        budget: &FailureBudgetConfig,
    ) -> Result<BudgetState, FenceError> {
        let resource = &*self.named(FAILURE_BUDGET_RESOURCE);
        let (window_ms, limit) = budget_args(budget);
        let row = self
            .call(
                resource,
                "failed-term",
                token,
                "SELECT * FROM baton.record_failed_term($1, $2, $3, $4, $5, $6)",
                &[
                    &resource,
                    &token.0,
                    &self.holder,
                    &detail,
                    &window_ms,
                    &limit,
                ],
            )
            .await?;
        Ok(BudgetState::from_row(&row))
    }

    /// This handle's shard's failure budget now: one read, no lock taken, nothing written.
    pub async fn failure_budget(
        &self,
        budget: &FailureBudgetConfig,
    ) -> Result<BudgetState, FenceError> {
        let resource = &*self.named(FAILURE_BUDGET_RESOURCE);
        let (window_ms, limit) = budget_args(budget);
        let row = self
            .query_row(
                "SELECT * FROM baton.failure_budget($1, $2, $3)",
                &[&resource, &window_ms, &limit],
            )
            .await?;
        Ok(BudgetState::from_row(&row))
    }
}
