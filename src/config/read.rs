//! How `GET /read` answers: its modes, and the window in which a lease read may be answered
//! from memory.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How `GET /read` establishes that its answer is not stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    /// From the leader's memory, no round trip, only inside the lease window
    /// ([`lease_read_until`]); outside it, falls back to `quorum`.
    Lease,
    /// A linearizable leadership check with the election backend first, then from memory.
    Quorum,
    /// One read of the fenced resource (PostgreSQL), which is always linearizable.
    Resource,
}

impl ReadMode {
    /// `lease`, `quorum` or `resource`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadMode::Lease => "lease",
            ReadMode::Quorum => "quorum",
            ReadMode::Resource => "resource",
        }
    }
}

impl std::str::FromStr for ReadMode {
    type Err = String;
    fn from_str(s: &str) -> Result<ReadMode, String> {
        match s {
            "lease" => Ok(ReadMode::Lease),
            "quorum" => Ok(ReadMode::Quorum),
            "resource" => Ok(ReadMode::Resource),
            _ => Err(format!(
                "read mode must be lease, quorum or resource, not {s:?}"
            )),
        }
    }
}

impl std::fmt::Display for ReadMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The end of the window in which a leader may answer a `lease` read from memory: the largest
/// `now` with `now < deadline - (rate_bound x (now - sent_at) + margin)`, i.e.
/// `sent_at + (deadline - sent_at - margin) / (1 + rate_bound)`.
///
/// `sent_at` is when the last successful renewal was *sent* and `deadline` the watchdog's deadline
/// for it (both on the monotonic clock), `rate_bound` the configured clock-rate error
/// ([`NodeConfig::clock_rate_error`](super::NodeConfig::clock_rate_error)) and `margin`
/// [`NodeConfig::read_lease_margin_ms`](super::NodeConfig::read_lease_margin_ms). The
/// window is only as good as `rate_bound`: a clock that runs slower than it puts `deadline`
/// past the backend's real expiry, and the window with it (the read-lease experiment shows it).
/// `None` when the window is already empty.
pub fn lease_read_until(
    sent_at: std::time::Instant,
    deadline: std::time::Instant,
    rate_bound: f64,
    margin: Duration,
) -> Option<std::time::Instant> {
    let span = deadline
        .checked_duration_since(sent_at)?
        .checked_sub(margin)?;
    if span.is_zero() {
        return None;
    }
    Some(sent_at + span.div_f64(1.0 + rate_bound.max(0.0)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::*;
    use crate::elector::BackendKind;

    #[test]
    fn lease_read_window_solves_its_inequality() {
        let t0 = std::time::Instant::now();
        let deadline = t0 + Duration::from_millis(2870);
        let (bound, margin) = (0.01, Duration::from_millis(50));
        let until = lease_read_until(t0, deadline, bound, margin).unwrap();
        // At the window's end, now == deadline - (bound x elapsed + margin), to the microsecond.
        let elapsed = until - t0;
        let rhs = deadline - (elapsed.mul_f64(bound) + margin);
        let diff = if until > rhs {
            until - rhs
        } else {
            rhs - until
        };
        assert!(diff < Duration::from_micros(5), "{diff:?}");
        // Just inside it holds, just past it does not.
        let inside = until - Duration::from_millis(1);
        assert!(inside < deadline - ((inside - t0).mul_f64(bound) + margin));
        let past = until + Duration::from_millis(1);
        assert!(past >= deadline - ((past - t0).mul_f64(bound) + margin));
        // Tighter with a bigger bound or margin; empty when the margin eats the lease.
        assert!(lease_read_until(t0, deadline, 0.05, margin).unwrap() < until);
        assert!(lease_read_until(t0, deadline, bound, margin * 2).unwrap() < until);
        assert!(lease_read_until(t0, deadline, bound, Duration::from_secs(3)).is_none());
        assert!(lease_read_until(deadline, t0, bound, margin).is_none());
    }

    /// The read window against the backend's real expiry (`sent_at + ttl`), with the node's
    /// clock running at `1 + drift` (the watchdog's deadline goes through the same clock model):
    /// safe whenever the clock is no slower than the configured bound, and stale when it is
    /// slower than the bound by more than the margins cover. A wrong bound fails this test.
    #[test]
    fn lease_read_window_ends_before_real_expiry_only_within_the_bound() {
        // 3 s TTL, 1% bound, 100 ms + 50 ms margins
        let cfg = NodeConfig::for_backend(BackendKind::Etcd);
        let ttl = cfg.lease_ttl();
        let t0 = std::time::Instant::now();
        let until = |drift: f64| {
            let clock = crate::clock::NodeClock { skew_ms: 0, drift };
            let deadline = clock.real_deadline(t0, ttl - cfg.lease_safety_margin(ttl));
            lease_read_until(
                t0,
                deadline,
                cfg.clock_rate_error,
                Duration::from_millis(cfg.read_lease_margin_ms),
            )
            .unwrap()
        };
        for drift in [0.0, 0.01, -0.01, 0.005, -0.005, 0.3] {
            assert!(until(drift) < t0 + ttl, "drift {drift}: window past expiry");
        }
        // A clock 10% slow against a 1% bound: the window outlives the lease by ~108 ms
        // ((2870 ms / 0.9 - 50 ms) / 1.01 = 3108 ms after the send).
        let late = until(-0.10) - (t0 + ttl);
        assert!(late > Duration::from_millis(80), "{late:?}");
        // With the bound set to the real drift, the same slow clock is safe again.
        let cfg10 = NodeConfig {
            clock_rate_error: 0.10,
            ..NodeConfig::for_backend(BackendKind::Etcd)
        };
        let clock = crate::clock::NodeClock {
            skew_ms: 0,
            drift: -0.10,
        };
        let deadline = clock.real_deadline(t0, ttl - cfg10.lease_safety_margin(ttl));
        let u = lease_read_until(t0, deadline, 0.10, Duration::from_millis(50)).unwrap();
        assert!(u < t0 + ttl);
    }

    #[test]
    fn read_settings_are_validated() {
        let c = NodeConfig {
            read_lease_margin_ms: 5000,
            ..NodeConfig::default()
        };
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
        assert_eq!("quorum".parse::<ReadMode>().unwrap(), ReadMode::Quorum);
        assert!("stale".parse::<ReadMode>().is_err());
        let c: NodeConfig = toml::from_str("read_mode_default = \"resource\"").unwrap();
        assert_eq!(c.read_mode_default, ReadMode::Resource);
        assert!(toml::from_str::<NodeConfig>("read_mode_default = \"fast\"").is_err());
    }
}
