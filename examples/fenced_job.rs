//! A singleton job that writes to its own table through the fence: while this node leads, it
//! appends a row every 100 ms, each in a fenced transaction. A stale leader (paused past its
//! lease, say) is refused by PostgreSQL itself, and nothing it sent lands.
//!
//! ```sh
//! # once, as the database owner:
//! #   CREATE TABLE ledger (token BIGINT, holder TEXT, n BIGINT); GRANT INSERT ON ledger TO baton_app;
//! cargo run --example fenced_job --features pg-lease -- node.toml   # Ctrl-C stops it
//! ```
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // baton logs through `tracing`: without a subscriber its events (refusals, demotions) go
    // nowhere. RUST_LOG picks what is shown, e.g. RUST_LOG=baton=info (the default here).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("baton=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cfg = baton::config::NodeConfig::from_file(std::env::args().nth(1).unwrap().as_ref())?;
    let node = baton::node::NodeBuilder::new(cfg)
        .with_job("ledger", |mut term| async move {
            for n in 0i64.. {
                let fence = term.fence().begin("ledger", term.token()).await;
                let tx = fence.inspect_err(|e| println!("{e}"))?; // a stale term stops here
                let sql = "INSERT INTO ledger (token, holder, n) VALUES ($1, $2, $3)";
                tx.client()
                    .execute(sql, &[&term.token().0, &term.holder(), &n])
                    .await?;
                // Left open while a newer term wrote (this process paused mid-transaction), it
                // was ended by that term: the commit fails and nothing of it lands.
                tx.commit().await.inspect_err(|e| println!("{e}"))?;
                println!("wrote n={n} under token {}", term.token());
                term.sleep(Duration::from_millis(100)).await;
                if term.is_stopping() {
                    return Ok(());
                }
            }
            Ok(())
        })
        .start()
        .await?;
    tokio::signal::ctrl_c().await?;
    node.shutdown().await
}
