//! The detector's datagram: a SWIM payload sealed with the cluster secret.
//!
//! ```text
//! "bsw1" | from_len u8 | from | ts_ms u64 | mac (64 hex) | boot u64 | seq u64 | payload
//! ```
//!
//! The MAC is [`PeerAuth::sign`] (the raft peer requests' HMAC-SHA256, the same key) over
//! method `SWIM`, path [`MAC_PATH`], the sender, the timestamp and `boot | seq | payload`: a raft
//! request's MAC can never pass for a datagram's, nor the other way round. A datagram is dropped
//! unread unless, in this order: it parses; its sender is a configured member; its timestamp is
//! within the window of this node's clock; its MAC verifies (constant time); and its
//! `(boot, seq)` was not seen before. `boot` is the sender's start time (µs), `seq` counts its
//! datagrams: per sender the receiver keeps the highest `seq` of the newest `boot` and a 64-wide
//! bitmap below it (IPsec's anti-replay window), so a datagram replayed inside the time window is
//! caught, and one from an older boot too. Memory is one small record per configured member.

use std::collections::HashMap;

use crate::peer_auth::{Credentials, PeerAuth};

/// What every datagram starts with (a version: a future format gets a new magic).
pub const MAGIC: &[u8; 4] = b"bsw1";
/// The path the MAC covers (fixed: keeps datagram MACs apart from raft's request MACs).
pub const MAC_PATH: &str = "/detector/v1";
/// The largest datagram accepted or sent; SWIM payloads are kept under 1400 bytes.
pub const MAX_DATAGRAM: usize = 1600;
const MAC_HEX: usize = 64;
/// How far below the highest sequence number a late datagram is still accepted.
const REPLAY_WINDOW: u64 = 64;

/// Why a datagram was dropped; [`Dropped::reason`] is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    /// Not a detector datagram of this version (or truncated, or too long).
    #[error("malformed detector datagram")]
    Malformed,
    /// The sender is not a configured member.
    #[error("detector datagram from a node that is not a member")]
    UnknownSender,
    /// The MAC does not verify under the cluster secret.
    #[error("detector datagram MAC does not verify")]
    BadMac,
    /// The timestamp is outside the window.
    #[error("detector datagram timestamp outside the accepted window")]
    Stale,
    /// Seen before (or from an older boot of its sender, or too far behind its newest).
    #[error("detector datagram replayed")]
    Replay,
}

impl Dropped {
    /// The `reason` label of `baton_detector_dropped_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Dropped::Malformed => "malformed",
            Dropped::UnknownSender => "unknown_sender",
            Dropped::BadMac => "bad_mac",
            Dropped::Stale => "stale",
            Dropped::Replay => "replay",
        }
    }
}

/// Seals this node's datagrams.
#[derive(Debug)]
pub struct Sealer {
    auth: PeerAuth,
    from: String,
    boot: u64,
    seq: u64,
}

impl Sealer {
    /// Seals as `from` (this node's id, at most 255 bytes), this boot being `boot`.
    pub fn new(auth: PeerAuth, from: &str, boot: u64) -> Sealer {
        Sealer {
            auth,
            from: from.to_owned(),
            boot,
            seq: 0,
        }
    }

    /// The datagram carrying `payload`, signed at `now_ms`.
    pub fn seal(&mut self, payload: &[u8], now_ms: u64) -> Vec<u8> {
        self.seq += 1;
        let mut signed = Vec::with_capacity(16 + payload.len());
        signed.extend_from_slice(&self.boot.to_be_bytes());
        signed.extend_from_slice(&self.seq.to_be_bytes());
        signed.extend_from_slice(payload);
        let mac = self
            .auth
            .sign("SWIM", MAC_PATH, &self.from, now_ms, &signed);
        let from = self.from.as_bytes();
        let mut out = Vec::with_capacity(4 + 1 + from.len() + 8 + MAC_HEX + signed.len());
        out.extend_from_slice(MAGIC);
        out.push(from.len() as u8);
        out.extend_from_slice(from);
        out.extend_from_slice(&now_ms.to_be_bytes());
        out.extend_from_slice(mac.as_bytes());
        out.extend_from_slice(&signed);
        out
    }
}

/// The replay record of one sender.
#[derive(Debug, Clone, Copy)]
struct Seen {
    boot: u64,
    max_seq: u64,
    /// Bit `i` set: `max_seq - i` was accepted.
    bits: u64,
}

/// Opens datagrams from the configured members. Its memory is bounded by their number.
#[derive(Debug)]
pub struct Opener {
    auth: PeerAuth,
    seen: HashMap<String, Option<Seen>>,
}

/// An accepted datagram.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    /// The sender's node id.
    pub from: &'a str,
    /// The SWIM payload.
    pub payload: &'a [u8],
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], Dropped> {
    if buf.len() < n {
        return Err(Dropped::Malformed);
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

fn u64_at(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(b)
}

impl Opener {
    /// Accepts datagrams from `members` (node ids) only.
    pub fn new(auth: PeerAuth, members: impl IntoIterator<Item = String>) -> Opener {
        Opener {
            auth,
            seen: members.into_iter().map(|m| (m, None)).collect(),
        }
    }

    /// Checks `datagram` (see the module docs); an accepted one is remembered as seen.
    pub fn open<'a>(&mut self, datagram: &'a [u8], now_ms: u64) -> Result<Opened<'a>, Dropped> {
        if datagram.len() > MAX_DATAGRAM {
            return Err(Dropped::Malformed);
        }
        let mut buf = datagram;
        if take(&mut buf, 4)? != MAGIC {
            return Err(Dropped::Malformed);
        }
        let from_len = take(&mut buf, 1)?[0] as usize;
        let from =
            std::str::from_utf8(take(&mut buf, from_len)?).map_err(|_| Dropped::Malformed)?;
        let ts_ms = u64_at(take(&mut buf, 8)?);
        let mac_hex =
            std::str::from_utf8(take(&mut buf, MAC_HEX)?).map_err(|_| Dropped::Malformed)?;
        let signed = buf;
        if signed.len() < 16 {
            return Err(Dropped::Malformed);
        }
        let Some(slot) = self.seen.get_mut(from) else {
            return Err(Dropped::UnknownSender);
        };
        let ts = ts_ms.to_string();
        let creds = Credentials {
            from,
            ts_ms: &ts,
            mac_hex,
        };
        self.auth
            .verify("SWIM", MAC_PATH, &creds, signed, now_ms)
            .map_err(|e| match e {
                crate::peer_auth::AuthError::Stale => Dropped::Stale,
                _ => Dropped::BadMac,
            })?;
        let (boot, seq) = (u64_at(&signed[..8]), u64_at(&signed[8..16]));
        *slot = Some(accept(*slot, boot, seq)?);
        Ok(Opened {
            from,
            payload: &signed[16..],
        })
    }
}

/// The sender's record after accepting `(boot, seq)`, or `Replay`.
fn accept(seen: Option<Seen>, boot: u64, seq: u64) -> Result<Seen, Dropped> {
    let fresh = Seen {
        boot,
        max_seq: seq,
        bits: 1,
    };
    let Some(s) = seen else {
        return Ok(fresh);
    };
    if boot != s.boot {
        // A restarted sender has a later boot; an earlier one is a replay from before.
        return if boot > s.boot {
            Ok(fresh)
        } else {
            Err(Dropped::Replay)
        };
    }
    if seq > s.max_seq {
        let shift = seq - s.max_seq;
        let bits = if shift >= REPLAY_WINDOW {
            1
        } else {
            (s.bits << shift) | 1
        };
        return Ok(Seen {
            boot,
            max_seq: seq,
            bits,
        });
    }
    let behind = s.max_seq - seq;
    if behind >= REPLAY_WINDOW || s.bits & (1 << behind) != 0 {
        return Err(Dropped::Replay);
    }
    Ok(Seen {
        bits: s.bits | (1 << behind),
        ..s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;
    const KEY: &[u8] = b"0123456789abcdef0123";

    fn pair() -> (Sealer, Opener) {
        let auth = PeerAuth::new(KEY, 10_000);
        (
            Sealer::new(auth.clone(), "n1", 7),
            Opener::new(auth, ["n1".to_string(), "n2".to_string()]),
        )
    }

    #[test]
    fn a_sealed_datagram_opens_once() {
        let (mut s, mut o) = pair();
        let d = s.seal(b"hello", NOW);
        assert_eq!(
            o.open(&d, NOW + 5),
            Ok(Opened {
                from: "n1",
                payload: b"hello"
            })
        );
        assert_eq!(o.open(&d, NOW + 6), Err(Dropped::Replay));
    }

    #[test]
    fn reordered_datagrams_open_and_old_ones_do_not() {
        let (mut s, mut o) = pair();
        let ds: Vec<Vec<u8>> = (0..100).map(|i| s.seal(&[i as u8], NOW)).collect();
        assert!(o.open(&ds[50], NOW).is_ok());
        assert!(o.open(&ds[49], NOW).is_ok(), "late but inside the window");
        assert_eq!(o.open(&ds[49], NOW), Err(Dropped::Replay));
        assert!(o.open(&ds[99], NOW).is_ok());
        assert_eq!(
            o.open(&ds[10], NOW),
            Err(Dropped::Replay),
            "below the window"
        );
    }

    #[test]
    fn an_older_boot_is_a_replay_and_a_newer_one_a_restart() {
        let auth = PeerAuth::new(KEY, 10_000);
        let mut o = Opener::new(auth.clone(), ["n1".to_string()]);
        let old = Sealer::new(auth.clone(), "n1", 5).seal(b"x", NOW);
        let mut new = Sealer::new(auth.clone(), "n1", 6);
        assert!(o.open(&new.seal(b"y", NOW), NOW).is_ok());
        assert_eq!(o.open(&old, NOW), Err(Dropped::Replay));
        let mut newer = Sealer::new(auth, "n1", 9);
        assert!(o.open(&newer.seal(b"z", NOW), NOW).is_ok());
    }

    #[test]
    fn forged_stale_foreign_and_junk_datagrams_are_dropped() {
        let (mut s, mut o) = pair();
        let evil = PeerAuth::new(b"another-secret-of-20b", 10_000);
        let forged = Sealer::new(evil, "n1", 7).seal(b"x", NOW);
        assert_eq!(o.open(&forged, NOW), Err(Dropped::BadMac));
        let d = s.seal(b"x", NOW);
        assert_eq!(o.open(&d, NOW + 10_001), Err(Dropped::Stale));
        let mut tampered = s.seal(b"x", NOW);
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert_eq!(o.open(&tampered, NOW), Err(Dropped::BadMac));
        let auth = PeerAuth::new(KEY, 10_000);
        let stranger = Sealer::new(auth, "n9", 1).seal(b"x", NOW);
        assert_eq!(o.open(&stranger, NOW), Err(Dropped::UnknownSender));
        for junk in [
            &b""[..],
            b"bsw1",
            b"bsw1\xff",
            &[0u8; 2000],
            b"nope and more bytes",
        ] {
            assert_eq!(o.open(junk, NOW), Err(Dropped::Malformed));
        }
        // Every truncation of a good datagram is refused, none panics.
        let good = s.seal(b"payload", NOW);
        for n in 0..good.len() {
            assert!(o.open(&good[..n], NOW).is_err());
        }
        // The good one was not spent by its truncations.
        assert!(o.open(&good, NOW).is_ok());
    }
}
