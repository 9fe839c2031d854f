//! The raft backend's own peer client: HTTP/1 POSTs to the other members, keep-alive pooled.
//! It belongs to the backend (not to the lab's fleet client), so the core never imports tooling.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

#[derive(Clone)]
pub(crate) struct PeerClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

pub(crate) struct PeerReply {
    pub status: StatusCode,
    pub body: Bytes,
}

impl PeerClient {
    pub fn new() -> PeerClient {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            // Below the peer listener's 5 s header-read timeout, which also closes idle
            // keep-alive connections: the pool drops them first instead of racing the server.
            .pool_idle_timeout(Duration::from_secs(4))
            .build(conn);
        PeerClient { inner }
    }

    /// One POST to `http://{addr}{path}`; the caller bounds it in time.
    pub async fn post(
        &self,
        addr: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<PeerReply, String> {
        let url = format!("http://{addr}{path}");
        let mut req = Request::builder().method(Method::POST).uri(&url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| format!("{url}: {e}"))?;
        let resp = self
            .inner
            .request(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{url}: {e}"))?
            .to_bytes();
        Ok(PeerReply { status, body })
    }
}
