//! A small HTTP/1 client for talking to nodes (fleet status, tests, load runs). Keep-alive pooled.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

#[derive(Clone)]
pub struct NodeClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    /// Sent as a bearer token to the admin routes only (`/stepdown`), never to the others.
    admin_token: Option<Arc<str>>,
}

/// Paths that need the node's admin token.
fn is_admin_path(path: &str) -> bool {
    path == "/stepdown" || path.starts_with("/stepdown?")
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request to {0} failed: {1}")]
    Request(String, String),
    #[error("request to {0} timed out")]
    Timeout(String),
}

/// A response: status, headers we care about, and the body.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub leader_header: Option<String>,
    pub allow: Option<String>,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl NodeClient {
    pub fn new(timeout: Duration) -> NodeClient {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(conn);
        NodeClient {
            inner,
            timeout,
            admin_token: None,
        }
    }

    /// This client with the fleet's admin token (`FleetState::admin_token`) for `/stepdown`.
    pub fn with_admin_token(mut self, token: Option<&str>) -> NodeClient {
        self.admin_token = token.map(Arc::from);
        self
    }

    /// `addr` is `host:port`; `path` includes any query.
    pub async fn send(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Reply, ClientError> {
        let url = format!("http://{addr}{path}");
        let mut req = Request::builder().method(method).uri(&url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let explicit_auth = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
        if let Some(token) = self.admin_token.as_deref() {
            if is_admin_path(path) && !explicit_auth {
                req = req.header("authorization", format!("Bearer {token}"));
            }
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| ClientError::Request(url.clone(), e.to_string()))?;
        let fut = async {
            let resp = self
                .inner
                .request(req)
                .await
                .map_err(|e| ClientError::Request(url.clone(), e.to_string()))?;
            let status = resp.status();
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let leader_header = header(baton::http::LEADER_HEADER);
            let allow = header("allow");
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| ClientError::Request(url.clone(), e.to_string()))?
                .to_bytes();
            Ok(Reply {
                status,
                leader_header,
                allow,
                body,
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout(url.clone()))?
    }

    pub async fn get(&self, addr: &str, path: &str) -> Result<Reply, ClientError> {
        self.send(Method::GET, addr, path, &[], Bytes::new()).await
    }

    pub async fn post(&self, addr: &str, path: &str) -> Result<Reply, ClientError> {
        self.send(Method::POST, addr, path, &[], Bytes::new()).await
    }
}
