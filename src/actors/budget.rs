//! The fleet-wide failure budget (`[failure_budget]`), the node's side of it.
//!
//! [`TermFailures`](super::backoff::TermFailures) slows one node down; this stops the fleet. The
//! count lives in the fenced resource, per shard (`sql/0004_failure_budget.sql`), so every node
//! sees the same one:
//! * a term whose leader work failed is **recorded** by its leader after the work stopped and
//!   before the lease is released (while it still holds the term: the record is fenced, and a
//!   stale node's is refused, so it cannot spend the budget);
//! * before each **campaign** the elector waits here while the budget is spent, asking again
//!   every `recheck_ms` (sooner when the resource says it reopens sooner), so the node campaigns
//!   again once enough failures have left the window or an operator reset the budget;
//! * **while a campaign waits** (a raft follower's waits until its node leads the raft group,
//!   which may never happen) the budget is read every `recheck_ms` too, so every node of the
//!   fleet says when it is spent, not only those whose campaigns win;
//! * at each **term's start**, before any work starts, the supervisor asks once more: a campaign
//!   that was already under way when the last allowed failure was recorded wins right after it,
//!   and that term gives up without running the work.
//!
//! Each exhaustion is said once per node: a WARN with the last failure (the program's exit
//! status, a job's error chain) and when the budget reopens, `failure_budget` in `/status`, the
//! `baton_failure_budget_exhausted` gauge (alert `FailureBudgetExhausted`), and the actor trace.
//!
//! The budget is best effort where the resource is not there: a read or a record that fails
//! (unreachable, or a resource whose schema predates the budget: `baton migrate`) is logged at
//! WARN once per outage, and the node goes on with its local backoff only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::FailureBudgetConfig;
use crate::elector::FenceToken;
use crate::leadership::{FailureBudgetStatus, Leadership};
use crate::metrics as m;
use crate::shard::ShardId;
use crate::trace::ActorTrace;
use crate::work::fence::BudgetState;
use crate::work::{Fence, FenceError};

/// The shortest wait between two looks at a spent budget (the resource's "reopens in" is
/// rounded to the millisecond and may land just before the reopening).
const MIN_RECHECK: Duration = Duration::from_millis(20);

/// One shard's failure budget, shared by its supervisor and elector.
pub(crate) struct FailureBudget {
    cfg: FailureBudgetConfig,
    fence: Fence,
    shared: Arc<Leadership>,
    trace: ActorTrace,
    shard: ShardId,
    said: Mutex<Said>,
}

/// What this node last said, so that it says each change once.
#[derive(Default)]
struct Said {
    exhausted: bool,
    unreadable: bool,
}

impl FailureBudget {
    /// `None` when the budget is off (`failed_terms = 0`).
    pub(crate) fn new(
        cfg: &FailureBudgetConfig,
        fence: Fence,
        shared: Arc<Leadership>,
        trace: ActorTrace,
        shard: ShardId,
    ) -> Option<Arc<FailureBudget>> {
        cfg.enabled().then(|| {
            Arc::new(FailureBudget {
                cfg: cfg.clone(),
                fence,
                shared,
                trace,
                shard,
                said: Mutex::default(),
            })
        })
    }

    /// Before a campaign: returns once the budget is not spent (or cannot be read).
    pub(crate) async fn wait_until_open(&self) {
        while let Some(reopens_in) = self.spent_for().await {
            tokio::time::sleep(reopens_in.min(self.cfg.recheck()).max(MIN_RECHECK)).await;
        }
    }

    /// While a campaign waits: reads the budget every `recheck_ms`, saying (WARN, `/status`,
    /// the gauge) when the fleet has spent it. Never returns; the campaign goes on (a term it
    /// wins while the budget is spent gives up at its start).
    pub(crate) async fn watch(&self) -> std::convert::Infallible {
        loop {
            tokio::time::sleep(self.cfg.recheck()).await;
            let _ = self.spent_for().await;
        }
    }

    /// At a term's start, before its work: whether the budget is spent.
    pub(crate) async fn spent_now(&self) -> bool {
        self.spent_for().await.is_some()
    }

    /// Records that term `token`'s leader work failed with `error`; best effort.
    pub(crate) async fn record(&self, token: FenceToken, error: &str) {
        match self.fence.record_failed_term(token, error, &self.cfg).await {
            Ok(state) => self.note(&state),
            Err(e) => tracing::warn!(
                shard = self.shard.0,
                token = token.0,
                error = %e,
                "the failed term could not be recorded in the fleet-wide failure budget; this node backs off locally only"
            ),
        }
    }

    /// How long until the budget reopens, if it is spent; `None` when it is not, or when the
    /// resource cannot say.
    async fn spent_for(&self) -> Option<Duration> {
        match self.fence.failure_budget(&self.cfg).await {
            Ok(state) => {
                self.note(&state);
                state
                    .exhausted
                    .then(|| state.reopens_in.unwrap_or_default())
            }
            Err(e) => {
                self.unreadable(&e);
                None
            }
        }
    }

    /// Publishes an answer of the resource, and says what changed.
    fn note(&self, state: &BudgetState) {
        self.shared.set_failure_budget(FailureBudgetStatus {
            exhausted: state.exhausted,
            failed_terms: state.failed_terms,
            limit: self.cfg.failed_terms,
            window_ms: self.cfg.window_ms,
            reopens_in_ms: state.reopens_in.map(|d| d.as_millis() as u64),
            last_failure: state.last_failure.clone(),
            checked_ms_ago: 0,
        });
        let shard = self.shard.0.to_string();
        metrics::gauge!(m::FAILURE_BUDGET_EXHAUSTED, "shard" => shard.clone())
            .set(if state.exhausted { 1.0 } else { 0.0 });
        metrics::gauge!(m::FAILURE_BUDGET_FAILED_TERMS, "shard" => shard)
            .set(f64::from(state.failed_terms));
        let was_exhausted = {
            let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
            said.unreadable = false;
            std::mem::replace(&mut said.exhausted, state.exhausted)
        };
        match (was_exhausted, state.exhausted) {
            (false, true) => self.say_exhausted(state),
            (true, false) => {
                tracing::info!(
                    shard = self.shard.0,
                    failed_terms = state.failed_terms,
                    "the fleet-wide failure budget has reopened; this node campaigns again"
                );
                self.trace.step("budget", "reopened", None, "");
            }
            _ => {}
        }
    }

    fn say_exhausted(&self, state: &BudgetState) {
        let reopens_in_ms = state.reopens_in.unwrap_or_default().as_millis() as u64;
        let last_failure = state.last_failure.as_deref().unwrap_or("unknown");
        tracing::warn!(
            node = %self.shared.node_id(),
            shard = self.shard.0,
            failed_terms = state.failed_terms,
            limit = self.cfg.failed_terms,
            window_ms = self.cfg.window_ms,
            reopens_in_ms,
            last_failure,
            "the fleet-wide failure budget is spent: this node stops campaigning for this work until the window passes or an operator runs `baton budget reset`"
        );
        self.trace.step(
            "budget",
            "exhausted",
            None,
            &format!(
                "failed_terms={} reopens_in_ms={reopens_in_ms} last_failure={last_failure}",
                state.failed_terms
            ),
        );
    }

    fn unreadable(&self, e: &FenceError) {
        let first = {
            let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
            !std::mem::replace(&mut said.unreadable, true)
        };
        if first {
            tracing::warn!(
                shard = self.shard.0,
                error = %e,
                "the fleet-wide failure budget cannot be read; this node campaigns on its local backoff only until it can"
            );
        }
    }
}
