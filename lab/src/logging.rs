//! The `baton` binary's log lines (stderr): plain text unless stderr is a terminal, and
//! openraft's repeated warnings limited to one per call site per [`REPEAT_WINDOW`].
//!
//! With one raft peer down, openraft warns about every failed heartbeat and append to it: ~36
//! lines a second, which buries every other line of a node's log. baton limits its own repeated
//! warnings the same way (e.g. refused raft peer requests): the first line of a call site goes
//! out, the repeats within the window are counted, and the next line that goes out says how many
//! were left out.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// At most one warning per openraft call site in this window.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(5);
/// Targets whose warnings are limited (their modules' paths start with it).
const LIMITED_TARGET: &str = "openraft";

/// What is logged without `RUST_LOG`: baton's INFO and up, openraft's WARN and up (its own
/// INFO, multi-KB state dumps at start among them, only when asked for, e.g.
/// `RUST_LOG=info,openraft=info`).
pub const DEFAULT_FILTER: &str = "info,openraft=warn,baton::trace=info";

/// The filter of the binary's log lines: `RUST_LOG` when set (it wins entirely), else
/// [`DEFAULT_FILTER`].
pub fn filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into())
}

/// Installs the binary's subscriber: [`filter`], to stderr, with colour codes only when stderr
/// is a terminal and `NO_COLOR` is unset (a log file or journald gets plain text).
pub fn init() {
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .event_format(RepeatLimited::new(
            tracing_subscriber::fmt::format(),
            REPEAT_WINDOW,
        ))
        .init();
}

/// Counts repeats per call site: the first event in a window is admitted, the rest are not.
pub struct RepeatLimiter {
    window: Duration,
    /// Per call site: when its last admitted event was, and how many were left out since.
    sites: Mutex<HashMap<Identifier, (Instant, u64)>>,
}

impl RepeatLimiter {
    /// A limiter admitting one event per call site per `window`.
    pub fn new(window: Duration) -> RepeatLimiter {
        RepeatLimiter {
            window,
            sites: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(events left out since the last admitted one)` when an event of `site` may go out
    /// at `now`; `None` (and counted) when it is a repeat within the window.
    pub fn admit(&self, site: Identifier, now: Instant) -> Option<u64> {
        let Ok(mut sites) = self.sites.lock() else {
            return Some(0); // a poisoned map must not swallow logs
        };
        match sites.get_mut(&site) {
            Some((last, skipped)) if now.duration_since(*last) < self.window => {
                *skipped += 1;
                None
            }
            Some((last, skipped)) => {
                *last = now;
                Some(std::mem::take(skipped))
            }
            None => {
                sites.insert(site, (now, 0));
                Some(0)
            }
        }
    }
}

/// An event format that writes openraft's warnings through a [`RepeatLimiter`] and everything
/// else through `inner` unchanged.
pub struct RepeatLimited<F> {
    inner: F,
    limiter: RepeatLimiter,
}

impl<F> RepeatLimited<F> {
    /// Wraps `inner`, limiting openraft's warnings to one per call site per `window`.
    pub fn new(inner: F, window: Duration) -> RepeatLimited<F> {
        RepeatLimited {
            inner,
            limiter: RepeatLimiter::new(window),
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for RepeatLimited<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        if *meta.level() != Level::WARN || !meta.target().starts_with(LIMITED_TARGET) {
            return self.inner.format_event(ctx, writer, event);
        }
        // Nothing written: the fmt layer then writes an empty line-less buffer, i.e. nothing.
        let Some(skipped) = self.limiter.admit(meta.callsite(), Instant::now()) else {
            return Ok(());
        };
        self.inner.format_event(ctx, writer.by_ref(), event)?;
        if skipped > 0 {
            writeln!(
                writer,
                "    ({skipped} more like it left out before this one; openraft's repeated warnings are limited to one per call site per {:?})",
                self.limiter.window
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Collects what the fmt layer writes.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// One openraft call site, as a failing heartbeat loop would hit it.
    fn heartbeat_failed(i: u64) {
        tracing::warn!(target: "openraft::replication", i, "heartbeat to 3 failed");
    }

    fn emit_repeats(window: Duration) -> String {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .event_format(RepeatLimited::new(
                tracing_subscriber::fmt::format(),
                window,
            ))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..100 {
                heartbeat_failed(i);
                tracing::warn!(target: "baton::elector", i, "our own warning");
            }
            tracing::info!(target: "openraft::core", "an info line");
            std::thread::sleep(window);
            heartbeat_failed(100);
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn openraft_warnings_are_limited_per_call_site_and_the_rest_counted() {
        let text = emit_repeats(Duration::from_millis(300));
        let openraft_warns: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("heartbeat to 3 failed"))
            .collect();
        assert_eq!(openraft_warns.len(), 2, "{text}");
        assert!(openraft_warns[0].contains("i=0") && openraft_warns[1].contains("i=100"));
        assert!(text.contains("(99 more like it left out"), "{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.contains("our own warning"))
                .count(),
            100,
            "baton's own lines are untouched"
        );
        assert!(text.contains("an info line"), "{text}");
        assert!(!text.contains('\u{1b}'), "no colour codes with ansi off");
    }

    /// Issue 43: without RUST_LOG, openraft's own INFO is not logged (its WARN is, and baton's
    /// INFO); an explicit filter still shows it.
    #[test]
    fn openraft_info_is_off_by_default_and_on_when_asked_for() {
        let logged = |filter: &str| {
            let buf = Buf::default();
            let writer = buf.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .finish();
            tracing::subscriber::with_default(subscriber, || {
                tracing::info!(target: "openraft::engine", "RaftState dump");
                tracing::warn!(target: "openraft::replication", "heartbeat failed");
                tracing::info!(target: "baton::node", "node started");
                tracing::info!(target: "baton::trace", "a trace step");
            });
            let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            text
        };
        let text = logged(DEFAULT_FILTER);
        assert!(!text.contains("RaftState dump"), "{text}");
        for line in ["heartbeat failed", "node started", "a trace step"] {
            assert!(text.contains(line), "{line}: {text}");
        }
        assert!(logged("info").contains("RaftState dump"));
        assert!(logged("info,openraft=info").contains("RaftState dump"));
    }

    #[test]
    fn the_limiter_counts_what_it_left_out() {
        let lim = RepeatLimiter::new(Duration::from_secs(5));
        let site = tracing::callsite::Identifier(&SITE);
        let t0 = Instant::now();
        assert_eq!(lim.admit(site.clone(), t0), Some(0));
        for k in 1..=35 {
            assert_eq!(
                lim.admit(site.clone(), t0 + Duration::from_millis(k * 100)),
                None
            );
        }
        assert_eq!(
            lim.admit(site.clone(), t0 + Duration::from_secs(5)),
            Some(35)
        );
        assert_eq!(lim.admit(site, t0 + Duration::from_secs(6)), None);
    }

    struct TestSite;
    static SITE: TestSite = TestSite;
    impl tracing::callsite::Callsite for TestSite {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unimplemented!("not needed by the limiter")
        }
    }
}
