//! Bring your own `Elector`: an in-process lease table (a stand-in for whatever lock service you
//! have), checked by baton's conformance suite, then driving a real node whose job writes
//! through the fence.
//!
//! ```sh
//! cargo run --example custom_elector --features conformance
//! BATON_DATABASE_URL=postgres://baton_app@127.0.0.1:5432/baton cargo run --example custom_elector --features conformance
//! ```
//! Without `BATON_DATABASE_URL` it runs the conformance suite only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use baton::elector::{
    BackendKind, DeadHolderExpiry, Elector, ElectorError, ElectorResult, FenceToken, Grant,
    LeaderInfo, Win,
};

/// One lease per election name: who holds it, until when, and the last token handed out.
#[derive(Default)]
struct Table {
    leases: HashMap<String, (Option<(String, Instant)>, i64)>,
}

/// A candidate in one election of a shared [`Table`].
struct InProcessElector {
    table: Arc<Mutex<Table>>,
    election: String,
    node_id: String,
    ttl: Duration,
    /// Whether this candidate won and has not resigned: a renew then either extends the lease or
    /// reports it lost (the conformance suite checks that a loss is never reported as "no session").
    holding: Mutex<bool>,
}

#[async_trait]
impl Elector for InProcessElector {
    fn kind(&self) -> BackendKind {
        BackendKind::Custom
    }

    async fn campaign(&self) -> ElectorResult<Win> {
        loop {
            let sent_at = Instant::now();
            {
                let mut t = self.table.lock().unwrap();
                let (holder, last_token) = t.leases.entry(self.election.clone()).or_default();
                let free = holder.as_ref().is_none_or(|(_, until)| *until <= sent_at);
                if free {
                    *last_token += 1;
                    *holder = Some((self.node_id.clone(), sent_at + self.ttl));
                    *self.holding.lock().unwrap() = true;
                    return Ok(Win {
                        token: FenceToken(*last_token),
                        grant: Grant {
                            sent_at,
                            ttl: self.ttl,
                        },
                        vacant_since: None,
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn renew(&self) -> ElectorResult<Option<Grant>> {
        let sent_at = Instant::now();
        let mut t = self.table.lock().unwrap();
        let (holder, _) = t.leases.entry(self.election.clone()).or_default();
        match holder {
            Some((who, until)) if *who == self.node_id && *until > sent_at => {
                *until = sent_at + self.ttl;
                Ok(Some(Grant {
                    sent_at,
                    ttl: self.ttl,
                }))
            }
            _ if *self.holding.lock().unwrap() => Err(ElectorError::LeaseLost(
                "the lease expired or was taken".into(),
            )),
            _ => Ok(None),
        }
    }

    async fn resign(&self, _successor: Option<&str>) -> ElectorResult<()> {
        *self.holding.lock().unwrap() = false;
        let mut t = self.table.lock().unwrap();
        let (holder, _) = t.leases.entry(self.election.clone()).or_default();
        if holder.as_ref().is_some_and(|(who, _)| *who == self.node_id) {
            *holder = None;
        }
        Ok(())
    }

    async fn leader(&self) -> ElectorResult<Option<LeaderInfo>> {
        let t = self.table.lock().unwrap();
        let now = Instant::now();
        Ok(t.leases
            .get(&self.election)
            .and_then(|(h, _)| h.clone())
            .filter(|(_, until)| *until > now)
            .map(|(node_id, _)| LeaderInfo {
                node_id,
                http_addr: None,
            }))
    }

    /// A failure detector confirmed `dead` dead: end its lease if it still holds it (checked
    /// and ended under one lock, so a lease someone else took meanwhile is left alone).
    async fn expire_dead_holder(&self, dead: &str) -> ElectorResult<DeadHolderExpiry> {
        let mut t = self.table.lock().unwrap();
        let (holder, _) = t.leases.entry(self.election.clone()).or_default();
        if dead == self.node_id || holder.as_ref().is_none_or(|(who, _)| who != dead) {
            return Ok(DeadHolderExpiry::NotEnded);
        }
        *holder = None;
        // Our campaign polls every 10 ms: it sees the free seat by itself, no restart needed.
        Ok(DeadHolderExpiry::EndedCampaignWakes)
    }

    async fn close(&self) -> ElectorResult<()> {
        self.resign(None).await
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // baton's events (see fenced_job.rs): RUST_LOG=baton=info, to stderr.
    let logs = tracing_subscriber::EnvFilter::from_default_env();
    tracing_subscriber::fmt()
        .with_env_filter(logs)
        .with_writer(std::io::stderr)
        .init();
    let table = Arc::new(Mutex::new(Table::default()));
    let ttl = Duration::from_millis(600);

    // 1. The conformance suite every backend passes, run on this one.
    let make = |election: &str, node_id: &str| {
        let e: Arc<dyn Elector> = Arc::new(InProcessElector {
            table: table.clone(),
            election: election.to_owned(),
            node_id: node_id.to_owned(),
            ttl,
            holding: Mutex::new(false),
        });
        async move { Ok(e) }
    };
    baton::backends::conformance::run_all(make, ttl)
        .await
        .map_err(|e| anyhow::anyhow!("conformance failed: {e}"))?;
    println!("conformance: all checks passed");

    // 2. A node elected by it, with a job that claims the term at the fence.
    let Ok(url) = std::env::var("BATON_DATABASE_URL") else {
        return Ok(());
    };
    let state = std::env::temp_dir().join(format!("baton-custom-{}", std::process::id()));
    let mut cfg = baton::config::NodeConfig {
        node_id: "c1".into(),
        state_dir: state.clone(),
        // A lease-style elector: a 3 s lease renewed every second (the defaults are raft's).
        ..baton::config::NodeConfig::for_backend(BackendKind::Custom)
    };
    cfg.resource.database_url = url;
    cfg.sequencer.enabled = false;
    cfg.scheduler.enabled = false;
    std::fs::create_dir_all(&state)?;
    let elector = Arc::new(InProcessElector {
        table,
        election: "demo".into(),
        node_id: "c1".into(),
        ttl: Duration::from_secs(3),
        holding: Mutex::new(false),
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let node = baton::node::NodeBuilder::new(cfg)
        .with_elector(elector)
        .with_job("claim", move |mut term| {
            let tx = tx.clone();
            async move {
                let seq = term.fence().seq_claim("custom-demo", term.token()).await?;
                let _ = tx.send((term.token(), seq)).await;
                term.stopping().await;
                Ok(())
            }
        })
        .start()
        .await?;
    let (token, seq) = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the job never ran"))?;
    println!("custom elector: node c1 leads with token {token}; the fence accepted its claim (seq at {seq})");
    node.shutdown().await?;
    let _ = std::fs::remove_dir_all(state);
    Ok(())
}
