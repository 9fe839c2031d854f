//! What the fenced resource says about itself: the fence row, the sequences and cursors, the
//! latest refusals (`baton fence status`, `GET /read?mode=resource`).

use crate::pg::Conn;

use super::*;

/// What the fenced resource holds for a read ([`Fence::read_state`]), from one snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceState {
    /// The sequence's last committed seq (`None`: no sequencer ever claimed it).
    pub last_seq: Option<i64>,
    /// The work-set's published cursor (`None`: no scheduler ever claimed it).
    pub cursor: Option<i64>,
    /// The highest token the resource has accepted.
    pub max_token: i64,
    /// Who wrote under it.
    pub max_holder: String,
}

impl Fence {
    /// One read of the sequence, the work-set cursor and the fence row in one statement
    /// (`baton.read_state`): linearizable, no lock taken, nothing written.
    pub async fn read_state(
        &self,
        seq_resource: &str,
        cursor_resource: &str,
    ) -> Result<ResourceState, FenceError> {
        let (seq_resource, cursor_resource) =
            (&*self.named(seq_resource), &*self.named(cursor_resource));
        let row = self
            .query_row(
                "SELECT * FROM baton.read_state($1, $2)",
                &[&seq_resource, &cursor_resource],
            )
            .await?;
        Ok(ResourceState {
            last_seq: row.get(0),
            cursor: row.get(1),
            max_token: row.get(2),
            max_holder: row.get(3),
        })
    }
}

/// One write the fenced resource refused (`baton.fence_rejections`), as the fleet page lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rejection {
    /// When the resource refused it, on the resource's clock (ms since the Unix epoch).
    pub at_unix_ms: i64,
    /// The resource written to.
    pub resource: String,
    /// What was attempted (`claim`, `next`, `tick`, `checkpoint`, `user`, ...).
    pub op: String,
    /// The refused writer's token.
    pub token: i64,
    /// The refused writer (its node id).
    pub holder: String,
    /// The highest token the resource had accepted then.
    pub max_token: i64,
    /// Who wrote under `max_token`.
    pub max_holder: String,
    /// `stale-token` or `holder-mismatch`.
    pub reason: String,
}

impl Fence {
    /// The newest `limit` refused writes on the whole resource (every fence domain, every
    /// shard), newest first (`baton.recent_fence_rejections`; read-only, at most 100).
    pub async fn recent_rejections(&self, limit: i32) -> Result<Vec<Rejection>, FenceError> {
        let client = Conn::new(self.pool.get().await?);
        let asked = async {
            let stmt = client
                .prepare_cached("SELECT * FROM baton.recent_fence_rejections($1)")
                .await?;
            client.query(&stmt, &[&limit]).await
        };
        let rows = self.ask(&client, asked).await??;
        Ok(rows
            .iter()
            .map(|row| Rejection {
                at_unix_ms: row.get(0),
                resource: row.get(1),
                op: row.get(2),
                token: row.get(3),
                holder: row.get(4),
                max_token: row.get(5),
                max_holder: row.get(6),
                reason: row.get(7),
            })
            .collect())
    }
}
