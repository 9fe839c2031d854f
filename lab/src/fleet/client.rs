//! A small HTTP/1 client for talking to nodes (fleet status, tests, load runs). Keep-alive pooled.
//! Speaks HTTPS to nodes that serve it ([`NodeClient::with_tls_ca`]), verifying them against a
//! CA file.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

#[derive(Clone)]
pub struct NodeClient {
    inner: Client<NodeConnector, Full<Bytes>>,
    /// `http`, or `https` once a CA is set.
    scheme: &'static str,
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
        NodeClient {
            inner: pooled(NodeConnector::new(None)),
            scheme: "http",
            timeout,
            admin_token: None,
        }
    }

    /// This client speaking HTTPS only, trusting exactly the CAs in `ca_file` (PEM).
    pub fn with_tls_ca(mut self, ca_file: &Path) -> Result<NodeClient, baton::tls::TlsError> {
        let cfg = baton::tls::client_config(ca_file)?;
        self.inner = pooled(NodeConnector::new(Some(Arc::new(cfg))));
        self.scheme = "https";
        Ok(self)
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
        let url = format!("{}://{addr}{path}", self.scheme);
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

fn pooled(conn: NodeConnector) -> Client<NodeConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// TCP, then TLS for `https` URLs (the server's certificate checked against the CA, for the
/// URL's host name or IP address).
#[derive(Clone)]
struct NodeConnector {
    tcp: HttpConnector,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl NodeConnector {
    fn new(tls: Option<Arc<rustls::ClientConfig>>) -> NodeConnector {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        // It hands us the TCP stream for `https` URLs too; the TLS is ours.
        tcp.enforce_http(false);
        NodeConnector {
            tcp,
            tls: tls.map(tokio_rustls::TlsConnector::from),
        }
    }
}

impl tower_service::Service<Uri> for NodeConnector {
    type Response = NodeStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<NodeStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tcp = self.tcp.call(uri.clone());
        let tls = self.tls.clone();
        Box::pin(async move {
            let tcp = tcp.await?;
            if uri.scheme_str() != Some("https") {
                return Ok(NodeStream::Plain(tcp));
            }
            let tls = tls.ok_or("an https URL needs a client with a CA (with_tls_ca)")?;
            let host = uri.host().ok_or("URL without a host")?;
            // IPv6 literals come bracketed in URLs, bare in certificates.
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(NodeStream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection to a node: plain TCP or TLS over it.
enum NodeStream {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>),
}

impl Connection for NodeStream {
    fn connected(&self) -> Connected {
        match self {
            NodeStream::Plain(s) => s.connected(),
            NodeStream::Tls(s) => s.inner().get_ref().0.connected(),
        }
    }
}

impl hyper::rt::Read for NodeStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for NodeStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_flush(cx),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// `POST /stepdown` to `node`; `client` carries the fleet's admin token
/// ([`FleetState::admin_client`]).
pub async fn post_stepdown(
    client: &NodeClient,
    node: &super::FleetNode,
    successor: Option<&str>,
) -> anyhow::Result<Reply> {
    let path = match successor {
        Some(s) => format!("/stepdown?to={s}"),
        None => "/stepdown".to_owned(),
    };
    client
        .send(
            hyper::Method::POST,
            &node.http_addr,
            &path,
            &[],
            Default::default(),
        )
        .await
        .with_context(|| format!("POST {path} to {}", node.id))
}
