//! baton inside a service that already has its own HTTP server: baton's server is not started;
//! the service answers `/leader` itself by reading the node handle.
//!
//! ```sh
//! BATON_DATABASE_URL=postgres://baton_app@127.0.0.1:5432/baton \
//! BATON_LEASE_URL=postgres://baton_lease@127.0.0.1:5432/baton \
//!   cargo run --example embedded_http --features pg-lease
//! ```

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // baton's events (see fenced_job.rs): RUST_LOG=baton=info, to stderr.
    let logs = tracing_subscriber::EnvFilter::from_default_env();
    tracing_subscriber::fmt()
        .with_env_filter(logs)
        .with_writer(std::io::stderr)
        .init();
    let state = std::env::temp_dir().join(format!("baton-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&state)?;
    let mut cfg = baton::config::NodeConfig {
        node_id: "web1".into(),
        state_dir: state.clone(),
        // The defaults are raft's; this is the pg-lease backend's timing.
        ..baton::config::NodeConfig::for_backend(baton::elector::BackendKind::PgLease)
    };
    cfg.resource.database_url = std::env::var("BATON_DATABASE_URL")?;
    cfg.pg_lease.database_url = std::env::var("BATON_LEASE_URL")?;
    cfg.sequencer.enabled = false;
    cfg.scheduler.enabled = false;

    // No serve_http(): the node runs without baton's own server.
    let node = baton::node::NodeBuilder::new(cfg)
        .with_job("noop", |mut term| async move {
            term.stopping().await;
            Ok(())
        })
        .start()
        .await?;

    // The service's own server, with its own route reading the handle.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let handle = node.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let node = handle.clone();
            let svc = hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                let st = node.status();
                let body = serde_json::json!({
                    "i_lead": node.is_leading(),
                    "token": node.token(),
                    "lease_ms_left": st.lease_ttl_remaining_ms,
                    "leader": st.leader.map(|l| l.node_id),
                });
                async move {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body.to_string()))))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });

    // Wait until this node leads, then ask the service's own route.
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while !node.is_leading() {
        anyhow::ensure!(tokio::time::Instant::now() < until, "never became leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /leader HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).await?;
    println!("GET /leader -> {}", reply.lines().last().unwrap_or(""));

    node.shutdown().await?;
    let _ = std::fs::remove_dir_all(state);
    Ok(())
}
