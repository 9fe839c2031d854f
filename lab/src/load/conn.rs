//! One keep-alive HTTP/1 connection to one node, and what a request over it can end as.
//!
//! Its own connection (not a pool) so the load generator knows, for every failure, whether the
//! request could have reached the server: that is the difference between a definite rejection
//! and an unknown outcome.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A live connection to `addr`.
pub struct Conn {
    pub addr: String,
    sender: SendRequest<Full<Bytes>>,
}

/// How one HTTP exchange ended.
#[derive(Debug)]
pub enum Exchange {
    /// A complete response.
    Reply {
        status: StatusCode,
        leader_header: Option<String>,
        body: Bytes,
    },
    /// The request was provably never written (the connection was already closed): safe to
    /// retry, nothing can have been issued.
    NotSent(String),
    /// The request may have reached the server: reset, closed mid-response, or timed out.
    Unknown(String),
}

impl Conn {
    /// Opens a connection within `timeout`.
    pub async fn open(addr: &str, timeout: Duration) -> Result<Conn, String> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("connect {addr}: {e}")),
            Err(_) => return Err(format!("connect {addr}: timed out")),
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) =
            match tokio::time::timeout(timeout, http1::handshake(TokioIo::new(stream))).await {
                Ok(Ok(x)) => x,
                Ok(Err(e)) => return Err(format!("handshake {addr}: {e}")),
                Err(_) => return Err(format!("handshake {addr}: timed out")),
            };
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            addr: addr.to_owned(),
            sender,
        })
    }

    /// One request; the caller drops the connection after anything but a `Reply`.
    pub async fn exchange(&mut self, method: Method, path: &str, timeout: Duration) -> Exchange {
        let fut = async {
            if let Err(e) = self.sender.ready().await {
                return Exchange::NotSent(format!("connection closed: {e}"));
            }
            let req = match Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, self.addr.as_str())
                .body(Full::new(Bytes::new()))
            {
                Ok(r) => r,
                Err(e) => return Exchange::NotSent(format!("building request: {e}")),
            };
            let resp = match self.sender.send_request(req).await {
                Ok(r) => r,
                Err(e) if e.is_canceled() => {
                    return Exchange::NotSent(format!("request not sent: {e}"))
                }
                Err(e) => return Exchange::Unknown(format!("request failed: {e}")),
            };
            let status = resp.status();
            let leader_header = resp
                .headers()
                .get(baton::http::LEADER_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            match resp.into_body().collect().await {
                Ok(b) => Exchange::Reply {
                    status,
                    leader_header,
                    body: b.to_bytes(),
                },
                Err(e) => Exchange::Unknown(format!("reading response body: {e}")),
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(x) => x,
            Err(_) => Exchange::Unknown(format!("timed out after {timeout:?}")),
        }
    }
}
