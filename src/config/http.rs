//! `[http]`: the client HTTP server's limits, threads and TLS.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{tls, ConfigError, NodeConfig, Section};

/// Most client-serving threads `[http] threads` may ask for.
const MAX_HTTP_THREADS: usize = 64;

/// Bounds on what one client may hold of the node's HTTP server: a client that
/// trickles headers or a body, or never sends one, is cut off instead of holding a descriptor.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Client connections served at once; past it a new connection is answered 503 and closed.
    /// The node also keeps it below half the descriptor soft limit (see `http::connection_cap`).
    pub max_connections: usize,
    /// Time to receive a whole request head. hyper starts this clock whenever a connection waits
    /// for a request, so it is also the idle keep-alive bound.
    pub header_read_timeout_ms: u64,
    /// Time to receive a whole request body once the head is in.
    pub body_read_timeout_ms: u64,
    /// Largest request body a client route accepts (413 past it).
    pub max_body_bytes: usize,
    /// Bound on one request from head to response (a stalled handler answers 503 and closes).
    /// Must exceed the step-down bound, which `POST /stepdown` waits for.
    pub request_timeout_ms: u64,
    /// A leader whose accept loop fails (e.g. out of descriptors) for this long steps down:
    /// it cannot serve its clients, and its followers would otherwise keep following it.
    pub accept_failure_stepdown_ms: u64,
    /// The nice value of the thread that serves clients (0..=19; higher yields more). Above the
    /// node's own threads by default, so when clients saturate the machine the kernel runs this
    /// node's heartbeats, renewals and watchdog, and its peers' (in this or another process),
    /// before more client requests: overload slows clients down instead of moving leadership.
    pub thread_nice: i32,
    /// Threads that serve clients, each with its own single-threaded runtime accepting on the
    /// same listener (they share `max_connections`). 0, the default, means half the cores this
    /// process may use, at least 1: one thread on a 2-core machine, where a second would take
    /// the core PostgreSQL and the node's own runtime need; more where there are cores to
    /// spare, since one thread tops out near 100k requests/s. At most 64.
    pub threads: usize,
    /// Threads of their own for the sequencers' group commits (0..=64). Unset, the default: one
    /// when the node runs one shard and the server has 4 or more client threads (8 cores or
    /// more), else none (K > 1 shards' commit paths spread over the client threads, the layout
    /// `experiments/FINDINGS.md` measured scaling with K; one thread for all of them was not). None (0): a
    /// shard's commit path (its sequencer, commit loop and database connection) runs on one of
    /// the client threads, shard s on thread s mod `threads`, so on a one-thread server a
    /// request crosses no thread inside the node. N > 0: N more threads, `baton-commit-i`,
    /// shard s on commit thread s mod N. A commit loop on a client thread waits, after each
    /// commit, behind that thread's own requests, a wait that grows with the load: on 16 cores
    /// a thread of its own halved the commit cycle and took durable `/next` at 500k offered
    /// from 477k IDs/s (p99 382 ms) to 499k (p99 6.8 ms) (`experiments/FINDINGS.md`).
    pub commit_threads: Option<usize>,
    /// PEM certificate chain to serve HTTPS with (feature `tls`); with `tls_key_file`, the
    /// server speaks HTTPS only. The TLS handshake must complete within `header_read_timeout_ms`.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (PKCS#8, PKCS#1 or SEC1). Keep it 0600; never logged.
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA bundle that the other members' HTTPS certificates must chain to (feature `tls`),
    /// for what this node asks them over their client API: placement's `/healthz` probes
    /// (needed with `tls_cert_file` when `[shards] count` > 1) and the fleet page's `/status`
    /// sweep. A member's certificate must name the host of its address in `[shards] members`
    /// (or the raft peers' `http_addr`).
    pub member_ca_file: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_connections: 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 10_000,
            max_body_bytes: 1024,
            request_timeout_ms: 60_000,
            accept_failure_stepdown_ms: 5_000,
            thread_nice: 5,
            threads: 0,
            commit_threads: None,
            tls_cert_file: None,
            tls_key_file: None,
            member_ca_file: None,
        }
    }
}

impl HttpConfig {
    /// [`HttpConfig::header_read_timeout_ms`] (also the TLS handshake bound).
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }
    /// [`HttpConfig::body_read_timeout_ms`].
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }
    /// [`HttpConfig::request_timeout_ms`].
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
    /// [`HttpConfig::accept_failure_stepdown_ms`].
    pub fn accept_failure_stepdown(&self) -> Duration {
        Duration::from_millis(self.accept_failure_stepdown_ms)
    }
    /// [`HttpConfig::threads`] resolved against the cores available (`cores`): the setting if
    /// it is not 0, else half of them, at least 1.
    pub fn server_threads(&self, cores: usize) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            (cores / 2).max(1)
        }
    }

    /// [`HttpConfig::commit_threads`] resolved against the cores available (`cores`) and the
    /// node's shard count (`shards`).
    pub fn commit_threads(&self, cores: usize, shards: usize) -> usize {
        let auto = shards == 1 && self.server_threads(cores) >= 4;
        self.commit_threads.unwrap_or(usize::from(auto))
    }

    /// The limits and thread counts.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("[http] {m}")));
        if self.max_connections == 0 {
            return bad("max_connections must be > 0".into());
        }
        for (name, v) in [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            (
                "accept_failure_stepdown_ms",
                self.accept_failure_stepdown_ms,
            ),
        ] {
            if v == 0 {
                return bad(format!("{name} must be > 0"));
            }
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > 1024 * 1024 {
            return bad("max_body_bytes must be in 1..=1048576".into());
        }
        if !(0..=19).contains(&self.thread_nice) {
            return bad(format!(
                "thread_nice must be in 0..=19 (a client thread never runs above the node's own), got {}",
                self.thread_nice
            ));
        }
        if self.threads > MAX_HTTP_THREADS {
            return bad(format!(
                "threads must be in 0..={MAX_HTTP_THREADS} (0: half the cores), got {}",
                self.threads
            ));
        }
        if let Some(n) = self.commit_threads.filter(|n| *n > MAX_HTTP_THREADS) {
            return bad(format!(
                "commit_threads must be in 0..={MAX_HTTP_THREADS} (0: on the client threads), got {n}"
            ));
        }
        Ok(())
    }

    /// The server's certificate and key together or not at all, and a member CA only for a
    /// node that serves HTTPS.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(ConfigError::Invalid(
                "[http] set tls_cert_file and tls_key_file together, or neither".into(),
            ));
        }
        if self.member_ca_file.is_some() && self.tls_cert_file.is_none() {
            return Err(ConfigError::Invalid(
                "[http] member_ca_file is for a fleet that serves HTTPS; this node serves plain HTTP (no tls_cert_file)".into(),
            ));
        }
        Ok(())
    }
}

impl Section for HttpConfig {
    fn name(&self) -> &'static str {
        "http"
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_limits()?;
        self.validate_tls()
    }

    fn redacted_keys(&self) -> &'static [&'static str] {
        &["tls_cert_file", "tls_key_file", "member_ca_file"]
    }

    fn tls_files(&self) -> Vec<(&'static str, &PathBuf)> {
        tls::named([
            ("[http] tls_cert_file", &self.tls_cert_file),
            ("[http] tls_key_file", &self.tls_key_file),
            ("[http] member_ca_file", &self.member_ca_file),
        ])
    }
}

impl NodeConfig {
    /// `POST /stepdown` must outlive the demotion it waits for: `[http] request_timeout_ms`
    /// above 3 x `work_stop_timeout_ms` + 2 s.
    pub(super) fn check_stepdown_bound(&self) -> Result<(), ConfigError> {
        let stepdown_bound_ms = self.work_stop_timeout_ms.saturating_mul(3) + 2000;
        if self.http.request_timeout_ms <= stepdown_bound_ms {
            return Err(ConfigError::Invalid(format!(
                "[http] request_timeout_ms ({}) must exceed the step-down bound ({stepdown_bound_ms} ms = 3 x work_stop_timeout_ms + 2 s)",
                self.http.request_timeout_ms
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;

    #[test]
    fn the_client_thread_may_only_yield() {
        let mut c = NodeConfig::default();
        for (nice, ok) in [(-1, false), (0, true), (5, true), (19, true), (20, false)] {
            c.http.thread_nice = nice;
            assert_eq!(c.validate().is_ok(), ok, "thread_nice = {nice}");
        }
    }

    #[test]
    fn client_threads_default_to_half_the_cores_and_are_bounded() {
        let mut c = NodeConfig::default();
        assert_eq!(c.http.server_threads(1), 1);
        assert_eq!(c.http.server_threads(2), 1);
        assert_eq!(c.http.server_threads(16), 8);
        // A commit thread of its own from 4 client threads up, unless the config says.
        // One shard only: K shards' commit paths spread over the client threads.
        assert_eq!(c.http.commit_threads(2, 1), 0);
        assert_eq!(c.http.commit_threads(6, 1), 0);
        assert_eq!(c.http.commit_threads(8, 1), 1);
        assert_eq!(c.http.commit_threads(16, 1), 1);
        assert_eq!(c.http.commit_threads(16, 4), 0);
        c.http.commit_threads = Some(0);
        assert_eq!(c.http.commit_threads(16, 1), 0);
        c.http.commit_threads = Some(3);
        assert_eq!(c.http.commit_threads(2, 16), 3);
        c.http.commit_threads = None;
        c.http.threads = 3;
        assert_eq!(c.http.server_threads(16), 3);
        assert_eq!(c.http.commit_threads(16, 1), 0);
        for (threads, ok) in [(0, true), (1, true), (64, true), (65, false)] {
            c.http.threads = threads;
            assert_eq!(c.validate().is_ok(), ok, "threads = {threads}");
            c.http.threads = 0;
            c.http.commit_threads = Some(threads);
            assert_eq!(c.validate().is_ok(), ok, "commit_threads = {threads}");
            c.http.commit_threads = None;
        }
    }

    #[test]
    fn http_limits_are_validated() {
        let zero_cap = NodeConfig {
            http: HttpConfig {
                max_connections: 0,
                ..HttpConfig::default()
            },
            ..NodeConfig::default()
        };
        assert!(zero_cap.validate().is_err());
        let zero_header = NodeConfig {
            http: HttpConfig {
                header_read_timeout_ms: 0,
                ..HttpConfig::default()
            },
            ..NodeConfig::default()
        };
        assert!(zero_header.validate().is_err());
        // A request bound shorter than a step-down would cut every step-down off.
        let short_request = NodeConfig {
            http: HttpConfig {
                request_timeout_ms: 5000,
                ..HttpConfig::default()
            },
            ..NodeConfig::default()
        };
        assert!(short_request.validate().is_err());
        let unknown: Result<NodeConfig, _> = toml::from_str("[http]\nmax_conections = 5\n");
        assert!(unknown.is_err(), "a typo in [http] must not be ignored");
    }
}
