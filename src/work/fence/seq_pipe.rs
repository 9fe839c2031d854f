//! The sequencer's pipe: one connection that commits ID ranges through the fence, pipelined.

use std::future::Future;
use std::sync::Arc;

use crate::backends::FenceToken;
use crate::pg::Conn;

use super::*;

pub(super) const SEQ_COMMIT_SQL: &str = "SELECT * FROM baton.seq_commit($1, $2, $3, $4, $5)";

/// One connection kept for consecutive group commits of the sequence, `seq_commit` prepared on
/// it. Commits sent on one pipe run in PostgreSQL in the order they were sent: tokio-postgres
/// writes a client's requests in the order their futures are first polled (its documented
/// rule), [`SeqPipe::send_commit`] polls once before it returns, and one backend executes what
/// it reads one statement after another. So a second commit can wait in the backend's socket
/// while the first is being flushed, and the backend goes from one to the next without a round
/// trip to the node in between, yet the later range never reaches the fence row first (which
/// the resource would refuse as `seq-not-forward`, ending the term).
pub struct SeqPipe {
    /// Closed, not returned to the pool, once a commit on it went unanswered.
    pub(super) client: Conn,
    pub(super) stmt: tokio_postgres::Statement,
    /// The sequence's resource name as this shard writes it, built once per pipe rather than
    /// once per commit.
    pub(super) resource: Arc<str>,
    pub(super) fence: Fence,
}

impl SeqPipe {
    /// Sends the commit of `[lo, hi]` of the pipe's sequence under `token` before it returns,
    /// behind every commit sent on this pipe before; what it returns resolves with that
    /// commit's outcome. Commits sent after a failed one still run (each is its own transaction).
    pub fn send_commit(
        self: &Arc<Self>,
        token: FenceToken,
        lo: i64,
        hi: i64,
    ) -> impl Future<Output = Result<(), FenceError>> + Send + 'static {
        let pipe = self.clone();
        let mut outcome = Box::pin(async move {
            let resource: &str = &pipe.resource;
            let row = pipe
                .client
                .query_one(
                    &pipe.stmt,
                    &[&resource, &token.0, &pipe.fence.holder, &lo, &hi],
                )
                .await?;
            pipe.fence.judge(resource, "next", token, row).map(drop)
        });
        // The first poll encodes the call and hands it to the connection (the statement is
        // already prepared, so nothing is awaited before that). Nothing is woken by this poll;
        // the caller's await polls again with its own waker.
        let mut noop = std::task::Context::from_waker(std::task::Waker::noop());
        let first = outcome.as_mut().poll(&mut noop);
        let pipe = self.clone();
        async move {
            match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => pipe.fence.ask(&pipe.client, outcome).await?,
            }
        }
    }

    /// Closes the connection once the last holder of this pipe drops it, instead of giving it
    /// back to the pool (the term that used it is over); commits already sent are still
    /// answered. Nothing more may be sent on it.
    pub fn retire(&self) {
        self.client.close_on_drop();
    }

    /// Whether the connection is gone, or presumed dead (the next commit needs a new pipe).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}
