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

/// How long this process was not running: SIGSTOP, a frozen VM, or a machine too loaded to
/// schedule it. A thread wakes every [`STALL_TICK`]; whatever part of the time between two of its
/// wake-ups exceeds the tick by more than [`STALL_SLACK`] is counted as stalled. A timer that
/// expires while the process is stopped fires the moment it runs again, so a bound measured on
/// the monotonic clock alone blames the wrong party: this says how much of a wait was our own.
pub(crate) mod stall {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Duration;

    /// How often the meter's thread wakes.
    pub(crate) const STALL_TICK: Duration = Duration::from_millis(20);
    /// Lateness of a wake-up that is still normal scheduling, not a stall.
    pub(crate) const STALL_SLACK: Duration = Duration::from_millis(30);

    struct Meter {
        /// Every stall recorded so far, ns.
        stalled_ns: AtomicU64,
        /// [`super::monotonic_ns`] at the thread's latest wake-up.
        last_tick_ns: AtomicU64,
    }

    fn meter() -> &'static Meter {
        static METER: OnceLock<&'static Meter> = OnceLock::new();
        METER.get_or_init(|| {
            let m: &'static Meter = Box::leak(Box::new(Meter {
                stalled_ns: AtomicU64::new(0),
                last_tick_ns: AtomicU64::new(super::monotonic_ns()),
            }));
            // A plain thread, not a task: it must not stop with whichever runtime started it.
            let spawned = std::thread::Builder::new()
                .name("baton-stall-meter".into())
                .spawn(move || loop {
                    std::thread::sleep(STALL_TICK);
                    let now = super::monotonic_ns();
                    let gap = now.saturating_sub(m.last_tick_ns.swap(now, Ordering::AcqRel));
                    m.stalled_ns.fetch_add(beyond_normal(gap), Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no stall meter: waits cannot tell a local pause");
            }
            m
        })
    }

    /// The part of a gap between wake-ups that normal scheduling does not explain, ns.
    fn beyond_normal(gap_ns: u64) -> u64 {
        gap_ns.saturating_sub((STALL_TICK + STALL_SLACK).as_nanos() as u64)
    }

    /// A point to measure stalls from ([`stalled_since`]); starts the meter on first use.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct StallMark {
        stalled_ns: u64,
    }

    /// Now, as a [`StallMark`].
    pub(crate) fn mark() -> StallMark {
        StallMark {
            stalled_ns: meter().stalled_ns.load(Ordering::Acquire),
        }
    }

    /// How long this process was stalled since `mark`, the stall going on right now included (the
    /// meter's thread may not have run yet since the process was continued). A stall that began
    /// just before `mark` may be counted whole: callers clamp it to the time they waited.
    pub(crate) fn stalled_since(mark: StallMark) -> Duration {
        let m = meter();
        let recorded = m.stalled_ns.load(Ordering::Acquire) - mark.stalled_ns;
        let ongoing = beyond_normal(
            super::monotonic_ns().saturating_sub(m.last_tick_ns.load(Ordering::Acquire)),
        );
        Duration::from_nanos(recorded + ongoing)
    }

    /// Taken by every test that stops this process or pretends it was stopped: the meter is one
    /// per process, so such tests would see each other's stalls.
    #[cfg(test)]
    pub(crate) fn one_test_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        TESTS.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `d` as stalled, as if the process had been stopped that long (tests of callers).
    #[cfg(test)]
    pub(crate) fn pretend_stalled(d: Duration) {
        meter()
            .stalled_ns
            .fetch_add(d.as_nanos() as u64, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real stop: a helper process stops this whole process (SIGSTOP) for 400 ms and continues
    /// it. The meter counts about that much, and nothing like it when the process just sleeps.
    #[test]
    fn the_stall_meter_sees_a_sigstop() {
        let _one = stall::one_test_at_a_time();
        let quiet = stall::mark();
        std::thread::sleep(Duration::from_millis(300));
        let idle = stall::stalled_since(quiet);
        assert!(
            idle < Duration::from_millis(150),
            "sleeping is not a stall: {idle:?}"
        );

        let mark = stall::mark();
        let pid = std::process::id();
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("kill -STOP {pid}; sleep 0.4; kill -CONT {pid}"))
            .status()
            .expect("run sh");
        assert!(st.success());
        let stalled = stall::stalled_since(mark);
        assert!(
            stalled >= Duration::from_millis(250) && stalled < Duration::from_secs(3),
            "a 400 ms SIGSTOP measured as {stalled:?}"
        );
    }

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
