//! The thin loader: the ledger and refusals from PostgreSQL, the acknowledged IDs from history
//! files. Everything else in `check` works on the structs this returns.

use std::path::PathBuf;

use anyhow::Context;
use tokio_postgres::NoTls;

use super::reads::ReadObs;
use super::{Ack, CheckInput, LedgerRow, Rejection};
use crate::load::{read_history, Op, Outcome};

/// Reads `baton.fence_log` (in `pos` order) and `baton.fence_rejections`, optionally only one
/// resource's rows. `url` must be a role that may read those tables (the fleet's admin URL).
pub async fn from_database(url: &str, resource: Option<&str>) -> anyhow::Result<CheckInput> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let conn_task = tokio::spawn(async move {
        let _ = conn.await;
    });
    let input = read(&client, resource).await;
    drop(client);
    let _ = conn_task.await;
    input
}

/// Like [`from_database`] over an existing connection.
pub async fn read(
    client: &tokio_postgres::Client,
    resource: Option<&str>,
) -> anyhow::Result<CheckInput> {
    let rows = client
        .query(
            "SELECT pos, resource, token, holder, op, seq_lo, seq_hi,
                    (extract(epoch FROM committed_at) * 1000000)::bigint
               FROM baton.fence_log
              WHERE $1::text IS NULL OR resource = $1
              ORDER BY pos",
            &[&resource],
        )
        .await
        .context("reading baton.fence_log")?;
    let ledger = rows
        .iter()
        .map(|r| LedgerRow {
            pos: r.get(0),
            resource: r.get(1),
            token: r.get(2),
            holder: r.get(3),
            op: r.get(4),
            seq_lo: r.get(5),
            seq_hi: r.get(6),
            committed_us: r.get(7),
        })
        .collect();
    let rows = client
        .query(
            "SELECT id, resource, token, max_token, holder, max_holder, op, reason,
                    (extract(epoch FROM at) * 1000000)::bigint
               FROM baton.fence_rejections
              WHERE $1::text IS NULL OR resource = $1
              ORDER BY id",
            &[&resource],
        )
        .await
        .context("reading baton.fence_rejections")?;
    let rejections = rows
        .iter()
        .map(|r| Rejection {
            id: r.get(0),
            resource: r.get(1),
            token: r.get(2),
            max_token: r.get(3),
            holder: r.get(4),
            max_holder: r.get(5),
            op: r.get(6),
            reason: r.get(7),
            at_us: r.get(8),
        })
        .collect();
    Ok(CheckInput {
        ledger,
        rejections,
        acks: Vec::new(),
        reads: Vec::new(),
        accepted: Vec::new(),
    })
}

/// The `ok` outcomes of a history as acks; `label` names the source in counterexamples.
pub fn acks_from_ops(label: &str, ops: &[Op]) -> Vec<Ack> {
    ops.iter()
        .filter(|o| o.outcome == Outcome::Ok && !o.is_read())
        .filter_map(|o| {
            Some(Ack {
                source: format!("{label}#{}", o.id),
                token: o.token?,
                seq: o.seq?,
                invoke_ns: o.invoke_ns,
                complete_ns: o.complete_ns,
                node: o.node.clone(),
            })
        })
        .collect()
}

/// The answered reads of a history (`GET /read` with a 200).
pub fn reads_from_ops(label: &str, ops: &[Op]) -> Vec<ReadObs> {
    ops.iter()
        .filter(|o| o.outcome == Outcome::Ok && o.is_read())
        .filter_map(|o| {
            Some(ReadObs {
                source: format!("{label}#{}", o.id),
                node: o.node.clone(),
                mode: o.mode.clone()?,
                fell_back: o.fell_back.unwrap_or(false),
                token: o.token?,
                seq: o.seq?,
                invoke_ns: o.invoke_ns,
                complete_ns: o.complete_ns,
            })
        })
        .collect()
}

/// `per_file(label, ops)` over every history file, concatenated; a file's label is its name.
fn over_histories<T>(
    paths: &[PathBuf],
    per_file: impl Fn(&str, &[Op]) -> Vec<T>,
) -> anyhow::Result<Vec<T>> {
    let mut all = Vec::new();
    for p in paths {
        let ops = read_history(p)?;
        let label = p
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string());
        all.extend(per_file(&label, &ops));
    }
    Ok(all)
}

/// Every answered read of every history file.
pub fn reads_from_histories(paths: &[PathBuf]) -> anyhow::Result<Vec<ReadObs>> {
    over_histories(paths, reads_from_ops)
}

/// Every `ok` outcome of every history file.
/// The acks of every history; with `shard`, only those of requests sent to that shard.
pub fn acks_from_histories(paths: &[PathBuf], shard: Option<u32>) -> anyhow::Result<Vec<Ack>> {
    over_histories(paths, |label, ops| {
        let ops: Vec<Op> = ops
            .iter()
            .filter(|o| shard.is_none() || o.shard.unwrap_or(0) == shard.unwrap_or(0))
            .cloned()
            .collect();
        acks_from_ops(label, &ops)
    })
}
