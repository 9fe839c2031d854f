//! The actor-trace log: one JSON line per lifecycle step (node, actor, event, token, monotonic and
//! wall timestamps). Lifecycle steps are rare (a handful per election), so each line is written and
//! flushed synchronously: a `kill -9` right after a step must not lose it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::clock::{monotonic_ns, NodeClock};
use crate::elector::FenceToken;

#[derive(Serialize)]
struct TraceLine<'a> {
    node: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<u32>,
    actor: &'a str,
    event: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<FenceToken>,
    mono_ns: u64,
    wall_ms: i64,
    #[serde(skip_serializing_if = "str::is_empty")]
    detail: &'a str,
}

/// Cheap to clone; all clones append to the same file.
#[derive(Clone)]
pub struct ActorTrace {
    node: Arc<str>,
    /// Set on a sharded node's per-shard traces (K > 1): every line names its shard.
    shard: Option<u32>,
    clock: NodeClock,
    out: Option<Arc<Mutex<File>>>,
}

impl ActorTrace {
    /// A trace that appends to `path` (creating it and its directory) as well as logging through
    /// `tracing`. Fails only if the directory or file cannot be created or opened.
    pub fn open(node: &str, clock: NodeClock, path: &Path) -> std::io::Result<ActorTrace> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(ActorTrace {
            node: node.into(),
            shard: None,
            clock,
            out: Some(Arc::new(Mutex::new(file))),
        })
    }

    /// A trace that only goes to `tracing` (library users who do not want a file).
    pub fn disabled(node: &str) -> ActorTrace {
        ActorTrace {
            node: node.into(),
            shard: None,
            clock: NodeClock::default(),
            out: None,
        }
    }

    /// The same log, every line tagged with `shard` (a sharded node's per-shard trees).
    pub fn for_shard(&self, shard: crate::shard::ShardId) -> ActorTrace {
        ActorTrace {
            shard: Some(shard.0),
            ..self.clone()
        }
    }

    /// Records one lifecycle step of `actor` (`event`, the term's `token` if any, free-form
    /// `detail`), stamped with monotonic ns and this node's wall-clock ms. The line is written
    /// before this returns; a write error is ignored (the `tracing` event is still emitted).
    pub fn step(&self, actor: &str, event: &str, token: Option<FenceToken>, detail: &str) {
        let line = TraceLine {
            node: &self.node,
            shard: self.shard,
            actor,
            event,
            token,
            mono_ns: monotonic_ns(),
            wall_ms: self.clock.wall_ms(),
            detail,
        };
        tracing::info!(target: "baton::trace", shard = self.shard, actor, event, token = token.map(|t| t.0), detail);
        if let Some(out) = &self.out {
            let mut text = serde_json::to_string(&line).expect("trace line serializes");
            text.push('\n');
            if let Ok(mut f) = out.lock() {
                // A full disk must not take the node down; the tracing line above still exists.
                let _ = f.write_all(text.as_bytes());
            }
        }
    }
}
