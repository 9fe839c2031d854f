//! Clocks. Lease decisions use only the monotonic clock; the wall clock (optionally skewed for
//! experiments) only labels log lines.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `CLOCK_MONOTONIC` in nanoseconds. Unlike `Instant`, the raw value is comparable across the
/// processes of one machine, so actor-trace lines from different nodes can be merged and the
/// stop-before-start gap audited.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This node's view of time, with the experiment knobs applied.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeClock {
    /// Offset of this node's wall clock, ms.
    pub skew_ms: i64,
    /// Rate error of this node's clock: +0.01 means it runs 1% fast.
    pub drift: f64,
}

impl NodeClock {
    /// Wall-clock milliseconds since the epoch, as this (possibly skewed) node reads them.
    pub fn wall_ms(&self) -> i64 {
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64;
        real + self.skew_ms
    }

    /// The real instant at which this node's clock will have advanced by `local` past `from`.
    /// A slow clock (negative drift) reaches a local deadline *later* in real time: that is the
    /// hazard the lease safety margin must cover.
    pub fn real_deadline(&self, from: Instant, local: Duration) -> Instant {
        from + local.div_f64(1.0 + self.drift)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_is_monotonic() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a);
    }

    #[test]
    fn slow_clock_deadline_lands_later() {
        let t0 = Instant::now();
        let slow = NodeClock {
            skew_ms: 0,
            drift: -0.1,
        };
        let fast = NodeClock {
            skew_ms: 0,
            drift: 0.1,
        };
        let d = Duration::from_secs(1);
        assert!(slow.real_deadline(t0, d) > t0 + d);
        assert!(fast.real_deadline(t0, d) < t0 + d);
    }
}
