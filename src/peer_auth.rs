//! Peer-request authentication: HMAC-SHA256 with the cluster secret. Raft's peer requests use
//! it as below; the SWIM detector's datagrams (`crate::detector::wire`) use the same MAC over a
//! method and path of their own, with a replay check on top.
//!
//! Every peer request carries three headers: [`FROM_HEADER`] (the sender's node id),
//! [`TS_HEADER`] (the sender's wall clock, Unix ms) and [`MAC_HEADER`] (lower-case hex of
//! `HMAC-SHA256(secret, "baton-peer-v1\n" method "\n" path "\n" from "\n" ts_ms "\n" body)`).
//! The receiver recomputes the MAC and compares it in constant time ([`hmac::Mac::verify_slice`]),
//! and refuses a timestamp more than [`DEFAULT_WINDOW_MS`] away from its own clock, *before* the
//! body is decoded or openraft sees it.
//!
//! What this gives: only holders of the secret can make a node vote, append, install a snapshot
//! or transfer leadership. What it does not: confidentiality (peer traffic is plain HTTP; raft
//! messages carry no secrets), and replay protection *inside* the window — there is no nonce
//! cache. A replay can only repeat a message a member really sent in the last 30 s, and raft is
//! built to tolerate duplicated, delayed and reordered messages (votes and appends carry their
//! term and are idempotent; a transfer names the leader's vote, which is stale once the term
//! moved). The trust boundary is "holds the cluster secret": any member can still misbehave.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The sender's node id on every peer request (covered by the MAC).
pub const FROM_HEADER: &str = "x-baton-peer-from";
/// The sender's wall clock when it signed, Unix milliseconds (covered by the MAC).
pub const TS_HEADER: &str = "x-baton-peer-ts";
/// Hex HMAC-SHA256 over method, path, sender, timestamp and body.
pub const MAC_HEADER: &str = "x-baton-peer-mac";
/// How far a request's timestamp may be from the receiver's clock, either way.
pub const DEFAULT_WINDOW_MS: u64 = 30_000;
/// A secret shorter than this is refused at start-up (`baton fleet` writes 64 hex characters).
pub const MIN_SECRET_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// Why a peer request was refused. `reason()` is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A header is absent (HTTP 401).
    #[error("missing peer authentication headers")]
    Missing,
    /// The MAC does not match the request under the cluster secret (HTTP 403).
    #[error("peer request MAC does not verify")]
    BadMac,
    /// The timestamp is further from this node's clock than the window (HTTP 403).
    #[error("peer request timestamp outside the accepted window")]
    Stale,
    /// The sender is not in this node's peer list (HTTP 403).
    #[error("peer request from a node that is not a member")]
    UnknownSender,
}

impl AuthError {
    /// The `reason` label of `baton_peer_auth_failures_total`.
    pub fn reason(self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::BadMac => "bad_mac",
            AuthError::Stale => "stale",
            AuthError::UnknownSender => "unknown_sender",
        }
    }
}

/// The three authentication headers of one request, as received.
#[derive(Debug, Clone, Copy)]
pub struct Credentials<'a> {
    /// The sender's node id (`x-baton-peer-from`).
    pub from: &'a str,
    /// Unix time of signing, ms (`x-baton-peer-ts`).
    pub ts_ms: &'a str,
    /// HMAC-SHA256, hex (`x-baton-peer-mac`).
    pub mac_hex: &'a str,
}

/// Signs and verifies peer requests with the cluster secret. `Debug` never shows the secret.
#[derive(Clone)]
pub struct PeerAuth {
    key: Vec<u8>,
    window_ms: u64,
}

impl std::fmt::Debug for PeerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerAuth")
            .field("key", &"<redacted>")
            .field("window_ms", &self.window_ms)
            .finish()
    }
}

/// The wall clock in Unix ms (0 if the clock is before 1970, which then fails every window).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl PeerAuth {
    /// Signs and verifies with `secret`; accepts timestamps within ±`window_ms` of this clock.
    pub fn new(secret: &[u8], window_ms: u64) -> PeerAuth {
        PeerAuth {
            key: secret.to_vec(),
            window_ms,
        }
    }

    fn mac(&self, method: &str, path: &str, from: &str, ts_ms: &str, body: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        // Fields are newline-separated; none can contain a newline (HTTP method and path, a
        // validated node id, digits), so the encoding is unambiguous.
        for part in ["baton-peer-v1", method, path, from, ts_ms] {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        mac.update(body);
        mac
    }

    /// The [`MAC_HEADER`] value for a request signed at `ts_ms`.
    pub fn sign(&self, method: &str, path: &str, from: &str, ts_ms: u64, body: &[u8]) -> String {
        let tag = self
            .mac(method, path, from, &ts_ms.to_string(), body)
            .finalize()
            .into_bytes();
        hex_encode(&tag)
    }

    /// The cheap check, before the body is read: the timestamp is a number inside the window.
    pub fn check_fresh(&self, creds: &Credentials<'_>, now_ms: u64) -> Result<(), AuthError> {
        let ts: u64 = creds.ts_ms.parse().map_err(|_| AuthError::Stale)?;
        if ts.abs_diff(now_ms) > self.window_ms {
            return Err(AuthError::Stale);
        }
        Ok(())
    }

    /// The full check: fresh, and the MAC over exactly these bytes verifies (constant time).
    pub fn verify(
        &self,
        method: &str,
        path: &str,
        creds: &Credentials<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<(), AuthError> {
        self.check_fresh(creds, now_ms)?;
        let given = hex_decode(creds.mac_hex).ok_or(AuthError::BadMac)?;
        self.mac(method, path, creds.from, creds.ts_ms, body)
            .verify_slice(&given)
            .map_err(|_| AuthError::BadMac)
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// `None` unless `text` is an even number of hex digits.
fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 1_800_000_000_000;

    /// `(ts_ms, mac_hex)` of a vote request from n1 signed at [`NOW_MS`].
    fn signed(auth: &PeerAuth, body: &[u8]) -> (String, String) {
        (
            NOW_MS.to_string(),
            auth.sign("POST", "/peer/vote", "n1", NOW_MS, body),
        )
    }

    fn creds<'a>(ts: &'a str, mac: &'a str) -> Credentials<'a> {
        Credentials {
            from: "n1",
            ts_ms: ts,
            mac_hex: mac,
        }
    }

    #[test]
    fn a_good_request_verifies() {
        let auth = PeerAuth::new(b"0123456789abcdef0123", DEFAULT_WINDOW_MS);
        let (ts, mac) = signed(&auth, b"{}");
        let c = creds(&ts, &mac);
        assert_eq!(auth.verify("POST", "/peer/vote", &c, b"{}", NOW_MS), Ok(()));
        // Inside the window either way.
        assert_eq!(
            auth.verify("POST", "/peer/vote", &c, b"{}", NOW_MS + 29_000),
            Ok(())
        );
        assert_eq!(
            auth.verify("POST", "/peer/vote", &c, b"{}", NOW_MS - 29_000),
            Ok(())
        );
    }

    #[test]
    fn a_wrong_secret_is_refused() {
        let good = PeerAuth::new(b"0123456789abcdef0123", DEFAULT_WINDOW_MS);
        let evil = PeerAuth::new(b"0123456789abcdef0124", DEFAULT_WINDOW_MS);
        let (ts, mac) = signed(&evil, b"{}");
        let c = creds(&ts, &mac);
        assert_eq!(
            good.verify("POST", "/peer/vote", &c, b"{}", NOW_MS),
            Err(AuthError::BadMac)
        );
    }

    #[test]
    fn tampering_with_any_covered_field_is_refused() {
        let auth = PeerAuth::new(b"0123456789abcdef0123", DEFAULT_WINDOW_MS);
        let (ts, mac) = signed(&auth, b"{\"term\":1}");
        let c = creds(&ts, &mac);
        let bad = Err(AuthError::BadMac);
        assert_eq!(
            auth.verify("POST", "/peer/vote", &c, b"{\"term\":9}", NOW_MS),
            bad
        );
        assert_eq!(
            auth.verify("POST", "/peer/append", &c, b"{\"term\":1}", NOW_MS),
            bad
        );
        let other_sender = Credentials { from: "n2", ..c };
        assert_eq!(
            auth.verify("POST", "/peer/vote", &other_sender, b"{\"term\":1}", NOW_MS),
            bad
        );
        let later = (NOW_MS + 1).to_string();
        let moved = Credentials { ts_ms: &later, ..c };
        assert_eq!(
            auth.verify("POST", "/peer/vote", &moved, b"{\"term\":1}", NOW_MS),
            bad
        );
        for junk in ["", "zz", "abc", &mac[..mac.len() - 2]] {
            let j = Credentials { mac_hex: junk, ..c };
            assert_eq!(
                auth.verify("POST", "/peer/vote", &j, b"{\"term\":1}", NOW_MS),
                bad
            );
        }
    }

    #[test]
    fn a_stale_or_future_timestamp_is_refused_even_with_a_good_mac() {
        let auth = PeerAuth::new(b"0123456789abcdef0123", DEFAULT_WINDOW_MS);
        let (ts, mac) = signed(&auth, b"{}");
        let c = creds(&ts, &mac);
        let stale = Err(AuthError::Stale);
        assert_eq!(
            auth.verify("POST", "/peer/vote", &c, b"{}", NOW_MS + 30_001),
            stale
        );
        assert_eq!(
            auth.verify("POST", "/peer/vote", &c, b"{}", NOW_MS - 30_001),
            stale
        );
        let nan = Credentials { ts_ms: "soon", ..c };
        assert_eq!(auth.check_fresh(&nan, NOW_MS), stale);
    }

    #[test]
    fn debug_never_shows_the_key() {
        let auth = PeerAuth::new(b"super-secret-cluster-key", DEFAULT_WINDOW_MS);
        assert!(!format!("{auth:?}").contains("super-secret"));
    }
}
