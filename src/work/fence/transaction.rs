//! Fenced writes to the user's own tables: a transaction whose first statement asserts the
//! term's token under the fence row's lock (`Fence::begin`, [`FencedTransaction`]).

use std::time::Duration;

use crate::backends::FenceToken;
use crate::metrics as m;
use crate::pg::Conn;

use super::*;

/// SQLSTATE raised by `baton.fence_assert` for a refused token.
const SQLSTATE_FENCED: &str = "BF409";

impl Fence {
    /// Opens a fenced transaction for writes to your own tables: `BEGIN`, then
    /// `baton.fence_assert(resource, token, holder)`, which locks the fence row until this
    /// transaction ends and checks the rule. Every statement you then run through the returned
    /// [`FencedTransaction`] commits together with that check, or not at all; a newer term's
    /// first write cannot interleave with it.
    ///
    /// A stale token is refused before any of your statements run: the transaction is rolled
    /// back, the rejection is recorded in `baton.fence_rejections` (with both tokens), counted
    /// in `baton_fence_rejections_total{op="user"}`, logged, and returned as
    /// [`FenceError::Rejected`].
    ///
    /// A transaction left open does not hold a newer term up: the resource records the token
    /// asserted here, and the first fenced write of any higher token in this fence domain ends
    /// this session (`pg_terminate_backend`) instead of waiting for its lock. Its statements
    /// roll back, [`FencedTransaction::commit`] fails, and `baton.fence_rejections` has a row
    /// with reason `preempted` (this token, and the token that ended it as `max_token`). So a
    /// process paused (SIGSTOP, a GC pause) between `begin` and `commit` delays the next leader
    /// by no more than the lease, and its commit can never land after a newer term's write.
    /// Sessions under an equal or higher token are waited for (up to the role's
    /// `lock_timeout`), as are superusers'; the resource's owner can switch the preemption off
    /// (`UPDATE baton.settings SET preempt_lower_tokens = false`, `sql/0003_preempt.sql`).
    ///
    /// Your tables must be writable by the role in `resource.database_url` (by default
    /// `baton_app`: `GRANT INSERT, SELECT ON my_table TO baton_app`). Writes made outside such a
    /// transaction are **not** protected.
    ///
    /// `begin`, [`FencedTransaction::commit`] and [`FencedTransaction::rollback`] give up after
    /// the statement timeout plus a second without an answer, as every fenced call does:
    /// [`FenceError::Unavailable`], and that connection is closed (the server rolls back an
    /// open transaction when it notices; a commit's outcome is then unknown). Your own
    /// statements run under the server's `statement_timeout`, and the connection's
    /// `TCP_USER_TIMEOUT` ends them when the network loses them. A server that is stopped
    /// outright (SIGSTOP, a frozen VM) still acknowledges the bytes and answers nothing, so
    /// bound your statements with your own `tokio::time::timeout` where that matters.
    pub async fn begin(
        &self,
        resource: &str,
        token: FenceToken,
    ) -> Result<FencedTransaction, FenceError> {
        let resource = &*self.named(resource);
        let client = Conn::new(self.pool.get().await?);
        let asked = async {
            client.batch_execute("BEGIN").await?;
            client
                .query_one(
                    "SELECT baton.fence_assert($1, $2, $3)",
                    &[&resource, &token.0, &self.holder],
                )
                .await
        };
        let asserted = self.ask(&client, asked).await;
        // From here a dropped `tx` closes the connection: its BEGIN may have run.
        let tx = FencedTransaction {
            client: Some(client),
            answer_bound: self.answer_bound,
            resource: resource.to_owned(),
            token,
            holder: self.holder.clone(),
        };
        match asserted? {
            Ok(_) => Ok(tx),
            Err(e) if e.code().map(|c| c.code()) == Some(SQLSTATE_FENCED) => {
                tx.rollback().await;
                Err(self.record_rejection(resource, token).await)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// After a refused user write rolled back: records it (the resource re-checks that it is
    /// refused), counts and logs it, and returns the error to hand back.
    async fn record_rejection(&self, resource: &str, token: FenceToken) -> FenceError {
        let recorded = async {
            let client = Conn::new(self.pool.get().await?);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&resource, &token.0, &self.holder];
            let asked = client.query_one(
                "SELECT * FROM baton.fence_record_rejection($1, $2, $3)",
                &params,
            );
            let row = self.ask(&client, asked).await??;
            Ok::<_, FenceError>(Verdict {
                max_token: row.get(1),
                max_holder: row.get(2),
                reason: None,
            })
        }
        .await;
        let verdict = match recorded {
            Ok(v) => v,
            // The refusal stands (the transaction rolled back); only its record is missing.
            Err(e) => {
                tracing::warn!(resource, token = token.0, error = %e, "could not record a refused user write");
                Verdict {
                    max_token: -1,
                    max_holder: String::new(),
                    reason: Some("stale-token (not recorded)".into()),
                }
            }
        };
        self.rejected(resource, "user", token, verdict)
    }

    pub(super) fn rejected(
        &self,
        resource: &str,
        op: &'static str,
        token: FenceToken,
        verdict: Verdict,
    ) -> FenceError {
        let reason = verdict.reason(token);
        metrics::counter!(m::FENCE_REJECTIONS, "op" => op, "shard" => self.shard.0.to_string())
            .increment(1);
        tracing::warn!(resource, op, %reason, token = token.0, holder = %self.holder, max_token = verdict.max_token,
            max_holder = %verdict.max_holder, "fenced write rejected by the resource");
        FenceError::Rejected {
            resource: resource.to_owned(),
            op,
            token,
            max_token: verdict.max_token,
            max_holder: verdict.max_holder,
            reason,
        }
    }
}

/// One PostgreSQL transaction whose commit is fenced (see [`Fence::begin`]). Run your statements
/// with [`FencedTransaction::client`], then [`FencedTransaction::commit`]. Dropped without a
/// commit, it rolls back (its connection is closed rather than returned to the pool).
pub struct FencedTransaction {
    client: Option<Conn>,
    /// How long its `COMMIT` or `ROLLBACK` may go unanswered (the fence's bound).
    answer_bound: Duration,
    /// The fenced resource (in its shard's domain), the term's token and this node: what a
    /// failed commit's WARN names.
    resource: String,
    token: FenceToken,
    holder: String,
}

impl FencedTransaction {
    /// The connection inside the transaction: `execute`, `query`, `prepare_cached`, ...
    pub fn client(&self) -> &deadpool_postgres::Client {
        self.client.as_ref().expect("a live transaction")
    }

    /// Commits your statements together with the fence check. An error here means the outcome
    /// is unknown if the connection broke mid-commit: treat it as "may or may not have landed".
    ///
    /// A transaction a newer term ended while it was open (see [`Fence::begin`]) fails here as
    /// [`FenceError::Unavailable`]: `57P01: terminating connection due to administrator
    /// command`, or a closed connection when the client read the server's goodbye first.
    /// Nothing of it landed; the resource has it in `baton.fence_rejections` (`preempted`).
    ///
    /// Every failed commit is logged at WARN with the resource, the token, the holder and why:
    /// `preempted` (the server ended the transaction, SQLSTATE 57P01: a newer term's preemption,
    /// or a server shutdown; nothing landed), `connection-ended`
    /// (the connection closed under it, which is also how a preemption reads when the client
    /// saw the server's goodbye first), `unanswered`, or `refused` (the server's own error).
    pub async fn commit(mut self) -> Result<(), FenceError> {
        let client = self.client.take().expect("a live transaction");
        let committed = client
            .within(self.answer_bound, client.batch_execute("COMMIT"))
            .await;
        let (why, result) = match committed {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => (commit_failure(&e), Err(FenceError::from(e))),
            Err(e) => ("unanswered", Err(unanswered(e))),
        };
        if let Err(e) = &result {
            tracing::warn!(
                resource = %self.resource,
                token = self.token.0,
                holder = %self.holder,
                reason = %why,
                error = %e,
                "a fenced commit failed: {}",
                match why {
                    "preempted" => "the server ended this transaction (a newer term's preemption, or a server shutdown); nothing of it landed",
                    "refused" => "the resource refused it; nothing of it landed",
                    _ => "its outcome is unknown (a newer term's preemption also reads this way: see baton.fence_rejections)",
                }
            );
        }
        result
    }

    /// Rolls back; the connection goes back to the pool, or is closed if the rollback failed
    /// or went unanswered.
    pub async fn rollback(mut self) {
        if let Some(client) = self.client.take() {
            let rolled_back = client
                .within(self.answer_bound, client.batch_execute("ROLLBACK"))
                .await;
            if !matches!(rolled_back, Ok(Ok(()))) {
                client.discard();
            }
        }
    }
}

/// Why a `COMMIT` failed, as [`FencedTransaction::commit`]'s WARN says it.
fn commit_failure(e: &tokio_postgres::Error) -> &'static str {
    if e.code() == Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN) {
        // 57P01: `pg_terminate_backend`, which is how a newer term ends an open transaction.
        "preempted"
    } else if e.is_closed() || e.as_db_error().is_none_or(|d| d.severity() == "FATAL") {
        // Closed under it, or ended by the server another way (an idle-in-transaction timeout).
        "connection-ended"
    } else {
        "refused"
    }
}

impl Drop for FencedTransaction {
    fn drop(&mut self) {
        // No async here: detach the connection from the pool and close it; the server rolls back.
        if let Some(client) = self.client.take() {
            client.discard();
        }
    }
}
