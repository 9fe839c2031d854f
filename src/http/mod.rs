//! HTTP (SPEC §5), hyper 1. [`serve`] takes a bound listener and a shutdown future, so tests bind
//! port 0 and stop the server when they are done.

mod routes;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ractor::ActorRef;
use tokio::net::TcpListener;

use crate::actors::leadership::Leadership;
use crate::actors::supervisor::SupervisorMsg;
use crate::work::sequencer::SequencerHandle;

pub use routes::LEADER_HEADER;

/// Everything a request handler may touch.
pub(crate) struct HttpApp {
    pub shared: Arc<Leadership>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub sequencer: SequencerHandle,
    /// baton's own Prometheus recorder, when it installed one (feature `prometheus`, and no
    /// recorder installed before it); `/metrics` answers 404 otherwise.
    #[cfg(feature = "prometheus")]
    pub prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    pub admin_token: Option<String>,
    pub max_block: u32,
}

/// Accepts connections until `shutdown` resolves, then lets in-flight requests finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Arc<HttpApp>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let svc = service_fn(move |req| {
                    let app = app.clone();
                    async move { Ok::<_, Infallible>(routes::route(&app, req).await) }
                });
                let conn = http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), svc);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = &mut shutdown => break,
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), graceful.shutdown()).await;
}
