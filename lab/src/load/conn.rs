//! One keep-alive HTTP/1.1 connection to one node, and what a request over it can end as.
//!
//! Its own connection (not a pool) so the load generator knows, for every failure, whether the
//! request could have reached the server: that is the difference between a definite rejection
//! and an unknown outcome.
//!
//! The exchange is written on the socket by the caller's task itself, not through hyper's client.
//! The generator shares the machine with the server it measures, and hyper's client hands every
//! request to a connection task of its own through a channel and back through a oneshot: two
//! task wake-ups and a channel round trip per request. Doing without them took a quarter off the
//! generator's CPU per request (16.0 -> 12.2 us at 40k/s, `scripts/bench/perf.sh gen`, FINDINGS
//! §11.5). Here a request is one `write` and its
//! reply is parsed in place with `httparse` (the parser hyper itself uses). Only what a baton
//! node sends is accepted: a response framed by `Content-Length` (or one that has no body by its
//! status). Anything else ends the exchange as unknown and the connection is not used again.

use std::io::ErrorKind;
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Headers a response may carry (a node sends a handful).
const MAX_HEADERS: usize = 32;
/// Bytes a response may take, head and body (a node's answers are a few hundred).
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// A live connection to `addr`.
pub struct Conn {
    pub addr: String,
    stream: TcpStream,
    /// What was read from the socket and not yet consumed by a response.
    buf: Vec<u8>,
    /// The request being written (kept to reuse its allocation).
    req: Vec<u8>,
    /// No further request may go on this connection: the server said `Connection: close`, or
    /// an exchange on it failed.
    closed: bool,
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

/// A response's head, as far as the generator needs it.
struct Head {
    len: usize,
    status: StatusCode,
    leader_header: Option<String>,
    body_len: usize,
    close: bool,
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
        Ok(Conn {
            addr: addr.to_owned(),
            stream,
            buf: Vec::with_capacity(1024),
            req: Vec::with_capacity(256),
            closed: false,
        })
    }

    /// True once no further request may be sent on this connection: open a new one.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// One request; the caller drops the connection after anything but a `Reply`.
    pub async fn exchange(&mut self, method: &Method, path: &str, timeout: Duration) -> Exchange {
        match tokio::time::timeout(timeout, self.send_and_read(method, path)).await {
            Ok(x) => x,
            Err(_) => {
                self.closed = true;
                Exchange::Unknown(format!("timed out after {timeout:?}"))
            }
        }
    }

    async fn send_and_read(&mut self, method: &Method, path: &str) -> Exchange {
        if let Some(why) = self.unusable() {
            self.closed = true;
            return Exchange::NotSent(why);
        }
        self.req.clear();
        self.req.extend_from_slice(method.as_str().as_bytes());
        self.req.push(b' ');
        self.req.extend_from_slice(path.as_bytes());
        self.req.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        self.req.extend_from_slice(self.addr.as_bytes());
        if method == Method::POST {
            self.req.extend_from_slice(b"\r\ncontent-length: 0");
        }
        self.req.extend_from_slice(b"\r\n\r\n");
        let mut written = 0;
        while written < self.req.len() {
            match self.stream.write(&self.req[written..]).await {
                Ok(n) if n > 0 => written += n,
                Ok(_) => return self.failed(written, "connection closed while writing".into()),
                Err(e) => return self.failed(written, format!("writing the request: {e}")),
            }
        }
        self.read_reply().await
    }

    /// Why the connection cannot carry a request, if it cannot: closed before, closed by the
    /// server since (its FIN is already here), or bytes nobody asked for. Costs no system call
    /// unless the socket has become readable since the last reply.
    fn unusable(&mut self) -> Option<String> {
        if self.closed {
            return Some("connection closed".into());
        }
        if !self.buf.is_empty() {
            return Some("the server sent bytes between requests".into());
        }
        let mut probe = [0u8; 1];
        match self.stream.try_read(&mut probe) {
            Ok(0) => Some("connection closed by the server".into()),
            Ok(_) => Some("the server sent bytes between requests".into()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => None,
            Err(e) => Some(format!("connection closed: {e}")),
        }
    }

    /// A write failed: nothing left this host if no byte was written, so the request was not
    /// sent; otherwise the server may have it.
    fn failed(&mut self, written: usize, why: String) -> Exchange {
        self.closed = true;
        if written == 0 {
            Exchange::NotSent(why)
        } else {
            Exchange::Unknown(why)
        }
    }

    /// Reads one response: its head, then `Content-Length` bytes of body.
    async fn read_reply(&mut self) -> Exchange {
        let head = loop {
            match parse_head(&self.buf) {
                Ok(Some(head)) => break head,
                Ok(None) => {}
                Err(why) => {
                    self.closed = true;
                    return Exchange::Unknown(why);
                }
            }
            if let Err(why) = self.read_more().await {
                return Exchange::Unknown(why);
            }
        };
        let end = head.len + head.body_len;
        if end > MAX_RESPONSE_BYTES {
            self.closed = true;
            return Exchange::Unknown(format!("response of {end} bytes, over the limit"));
        }
        while self.buf.len() < end {
            if let Err(why) = self.read_more().await {
                return Exchange::Unknown(why);
            }
        }
        let body = Bytes::copy_from_slice(&self.buf[head.len..end]);
        self.buf.drain(..end);
        self.closed |= head.close;
        Exchange::Reply {
            status: head.status,
            leader_header: head.leader_header,
            body,
        }
    }

    /// Appends what the socket has to `buf`; the end of the stream (or an error) mid-response
    /// closes the connection.
    async fn read_more(&mut self) -> Result<(), String> {
        if self.buf.len() >= MAX_RESPONSE_BYTES {
            self.closed = true;
            return Err("response head over the limit".into());
        }
        self.buf.reserve(4096);
        match self.stream.read_buf(&mut self.buf).await {
            Ok(0) => {
                self.closed = true;
                Err("connection closed before the response was complete".into())
            }
            Ok(_) => Ok(()),
            Err(e) => {
                self.closed = true;
                Err(format!("reading the response: {e}"))
            }
        }
    }
}

/// The response head at the start of `buf`: `None` until it is all there.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let code = resp.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| format!("bad status {code}"))?;
    let mut head = Head {
        len,
        status,
        leader_header: None,
        body_len: 0,
        close: resp.version == Some(0),
    };
    let mut content_length = None;
    for h in resp.headers.iter() {
        let value = || String::from_utf8_lossy(h.value).trim().to_owned();
        if h.name.eq_ignore_ascii_case(baton::http::LEADER_HEADER) {
            head.leader_header = Some(value());
        } else if h.name.eq_ignore_ascii_case("content-length") {
            content_length = Some(
                value()
                    .parse::<usize>()
                    .map_err(|_| format!("bad content-length {:?}", value()))?,
            );
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!("unsupported transfer-encoding {:?}", value()));
        } else if h.name.eq_ignore_ascii_case("connection") {
            head.close |= value().eq_ignore_ascii_case("close");
        }
    }
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    head.body_len = match content_length {
        Some(n) => n,
        None if bodiless => 0,
        None => return Err(format!("{code} response without content-length")),
    };
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers each request (read up to its blank line) with the next of
    /// `replies`, written in two pieces so the client must read more than once, then closes.
    async fn scripted(replies: Vec<&'static str>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for reply in replies {
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    let mut chunk = [0u8; 512];
                    let n = s.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&chunk[..n]);
                }
                let at = seen.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                seen.drain(..at + 4);
                let (a, b) = reply.split_at(reply.len() / 2);
                s.write_all(a.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                s.write_all(b.as_bytes()).await.unwrap();
            }
        });
        addr
    }

    const T: Duration = Duration::from_secs(2);

    #[tokio::test]
    async fn replies_in_pieces_are_read_whole_and_the_connection_is_kept() {
        let addr = scripted(vec![
            "HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n{\"token\":1,\"seq\":1}\n",
            "HTTP/1.1 409 Conflict\r\nX-Baton-Leader: 10.0.0.1:80\r\ncontent-length: 2\r\n\r\n{}",
        ])
        .await;
        let mut c = Conn::open(&addr, T).await.unwrap();
        match c.exchange(&Method::POST, "/next", T).await {
            Exchange::Reply { status, body, .. } => {
                assert_eq!(status, StatusCode::OK);
                assert_eq!(&body[..], b"{\"token\":1,\"seq\":1}\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(!c.is_closed());
        match c.exchange(&Method::GET, "/read", T).await {
            Exchange::Reply {
                status,
                leader_header,
                body,
            } => {
                assert_eq!(status, StatusCode::CONFLICT);
                assert_eq!(leader_header.as_deref(), Some("10.0.0.1:80"));
                assert_eq!(&body[..], b"{}");
            }
            other => panic!("{other:?}"),
        }
        // The server has closed since: the next request is provably not sent.
        tokio::time::sleep(Duration::from_millis(50)).await;
        match c.exchange(&Method::POST, "/next", T).await {
            Exchange::NotSent(_) => {}
            other => panic!("{other:?}"),
        }
        assert!(c.is_closed());
    }

    #[tokio::test]
    async fn connection_close_ends_the_connection_after_the_reply() {
        let addr = scripted(vec![
            "HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        ])
        .await;
        let mut c = Conn::open(&addr, T).await.unwrap();
        assert!(matches!(
            c.exchange(&Method::POST, "/next", T).await,
            Exchange::Reply { status, .. } if status == StatusCode::REQUEST_TIMEOUT
        ));
        assert!(c.is_closed());
    }

    #[tokio::test]
    async fn a_reply_cut_short_or_framed_otherwise_is_unknown() {
        // The server closes halfway through the body: the request reached it.
        let addr = scripted(vec!["HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{\"tok"]).await;
        let mut c = Conn::open(&addr, T).await.unwrap();
        assert!(matches!(
            c.exchange(&Method::POST, "/next", T).await,
            Exchange::Unknown(_)
        ));
        assert!(c.is_closed());
        let addr = scripted(vec![
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ])
        .await;
        let mut c = Conn::open(&addr, T).await.unwrap();
        match c.exchange(&Method::POST, "/next", T).await {
            Exchange::Unknown(why) => assert!(why.contains("transfer-encoding"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(c.is_closed());
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out_as_unknown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let _held = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
            drop(s);
        });
        let mut c = Conn::open(&addr, T).await.unwrap();
        match c
            .exchange(&Method::POST, "/next", Duration::from_millis(100))
            .await
        {
            Exchange::Unknown(why) => assert!(why.contains("timed out"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(c.is_closed());
    }
}
