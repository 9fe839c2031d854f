//! The lease timing (top-level keys): each backend's defaults, the safety margin taken off every
//! lease, and the rule a config's timing must keep, that the usable lease hold three renewal
//! intervals plus slack. Raft's election timeout, which caps a single raft group's lease, is
//! `raft.rs`'s.

use std::time::Duration;

use super::{ConfigError, NodeConfig};
use crate::elector::BackendKind;

/// How many renewal intervals the usable part of a lease must hold (see
/// [`NodeConfig::min_usable_lease_ms`]): after each renewal the watchdog outlasts two more
/// renewals that fail or come late (a busy host, a slow store) before it demotes the leader.
pub const RENEWALS_PER_USABLE_LEASE: u64 = 3;

/// What the usable part of a lease must hold beyond [`RENEWALS_PER_USABLE_LEASE`] renewal
/// intervals: time for the third renewal's answer to come back.
pub const RENEWAL_SLACK_MS: u64 = 5;

/// The spread of the election timeout [`NodeConfig::fit_stop_margin`] writes (`T-(T+200)`): room
/// for the followers' random stand-off (20 ms per other voter), and no more, since raft's
/// failover waits out the maximum.
pub const STOP_MARGIN_ELECTION_SPREAD_MS: u64 = 200;

/// The keys whose default is the backend's ([`NodeConfig::for_backend`]) rather than raft's.
pub const BACKEND_TIMING_KEYS: [&str; 4] = [
    "lease_ttl_ms",
    "renew_interval_ms",
    "retry_interval_ms",
    "deadline_margin_ms",
];

impl NodeConfig {
    /// This config with the backend's default ([`NodeConfig::for_backend`]) for every key of
    /// [`BACKEND_TIMING_KEYS`] that `is_set` says the source did not set.
    pub(super) fn with_backend_timing(mut self, is_set: impl Fn(&str) -> bool) -> NodeConfig {
        let b = NodeConfig::for_backend(self.backend);
        for key in BACKEND_TIMING_KEYS.into_iter().filter(|k| !is_set(k)) {
            match key {
                "lease_ttl_ms" => self.lease_ttl_ms = b.lease_ttl_ms,
                "renew_interval_ms" => self.renew_interval_ms = b.renew_interval_ms,
                "retry_interval_ms" => self.retry_interval_ms = b.retry_interval_ms,
                "deadline_margin_ms" => self.deadline_margin_ms = b.deadline_margin_ms,
                _ => unreachable!("every backend timing key is handled"),
            }
        }
        self
    }

    /// The defaults with `backend` and the timing that suits it (the committed
    /// `config/<backend>.toml` use the same, and a config file or TOML text that names a
    /// backend gets this timing for every timing key it does not set): raft's is
    /// [`NodeConfig::default`]; a lease backend (etcd, redis, redis-naive, pg-lease, zk) gets a
    /// 3 s lease renewed every 800 ms (ZooKeeper every 600 ms: each renewal grants only 2/3 of
    /// the session timeout), retried every 250 ms, with a 100 ms margin. Every backend's timing
    /// leaves the watchdog at least 3 renewal intervals + 5 ms after each renewal (see
    /// [`NodeConfig::min_usable_lease_ms`]): 2,870 ms of usable lease for 3 x 800 ms.
    pub fn for_backend(backend: BackendKind) -> NodeConfig {
        let raft = NodeConfig::default();
        if backend == BackendKind::Raft {
            return raft;
        }
        NodeConfig {
            backend,
            lease_ttl_ms: 3000,
            renew_interval_ms: if backend == BackendKind::Zk { 600 } else { 800 },
            retry_interval_ms: 250,
            deadline_margin_ms: 100,
            ..raft
        }
    }

    /// [`NodeConfig::lease_ttl_ms`].
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }
    /// [`NodeConfig::renew_interval_ms`].
    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.renew_interval_ms)
    }
    /// [`NodeConfig::retry_interval_ms`].
    pub fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.retry_interval_ms)
    }
    /// [`NodeConfig::work_stop_timeout_ms`].
    pub fn work_stop_timeout(&self) -> Duration {
        Duration::from_millis(self.work_stop_timeout_ms)
    }

    /// How much of a granted TTL the node gives up so it stops before the backend expires it:
    /// the clock-rate error over the whole TTL plus a fixed margin, plus the time leader work is
    /// given to stop ([`NodeConfig::work_stop_margin_ms`]).
    pub fn lease_safety_margin(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.clock_rate_error)
            + Duration::from_millis(self.deadline_margin_ms)
            + self.work_stop_margin()
    }

    /// How long after the watchdog's deadline the lease itself can expire, by this node's clock
    /// with the clock-rate error already allowed for: the watchdog stops `deadline_margin_ms` +
    /// `work_stop_margin_ms` before `sent_at + TTL x (1 - clock_rate_error)` (through the same
    /// clock model as the deadline). What an audit of "gone before the lease could expire" adds
    /// to a time measured against the watchdog's deadline.
    pub fn lease_expiry_after_watchdog_deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_margin_ms + self.work_stop_margin_ms)
            .div_f64(1.0 + self.clock_drift)
    }

    /// [`NodeConfig::work_stop_margin_ms`] as a duration.
    pub fn work_stop_margin(&self) -> Duration {
        Duration::from_millis(self.work_stop_margin_ms)
    }

    /// The lease this config's backend grants: [`NodeConfig::raft_lease_ttl_ms`] on raft with
    /// one shard (the raft leader's own lease), `lease_ttl_ms` elsewhere — sharded raft among
    /// them, whose shard leases are judged by the raft leader's clock and need no election bound
    /// (`backends::raft::shards`).
    fn granted_lease_ttl_ms(&self) -> u64 {
        if self.lease_capped_by_election() {
            self.raft_lease_ttl_ms().unwrap_or(self.lease_ttl_ms)
        } else {
            self.lease_ttl_ms
        }
    }

    /// The least usable lease ([`NodeConfig::check_usable_lease`]) this config's renewal interval
    /// needs: [`RENEWALS_PER_USABLE_LEASE`] renewal intervals plus [`RENEWAL_SLACK_MS`], so that
    /// after each renewal the watchdog waits out two more that fail or come late before it
    /// demotes, and the third still has the slack to be answered in.
    pub fn min_usable_lease_ms(&self) -> u64 {
        self.renew_interval_ms
            .saturating_mul(RENEWALS_PER_USABLE_LEASE)
            .saturating_add(RENEWAL_SLACK_MS)
    }

    /// The smallest granted lease (ms) whose usable part, after this config's safety margin,
    /// still has room for [`NodeConfig::min_usable_lease_ms`] and the lease-read margin.
    pub fn min_working_ttl_ms(&self) -> u64 {
        let need = Duration::from_millis(
            self.min_usable_lease_ms()
                .max(self.read_lease_margin_ms.saturating_add(1)),
        );
        let fixed_ms = self.deadline_margin_ms + self.work_stop_margin_ms;
        let rate = self.clock_rate_error.clamp(0.0, 0.49);
        // The closed form, less a little for rounding, then the exact check upward.
        let mut ttl_ms = ((need.as_millis() as f64 + fixed_ms as f64) / (1.0 - rate)) as u64;
        ttl_ms = ttl_ms.saturating_sub(2);
        let usable = |ms: u64| {
            let ttl = Duration::from_millis(ms);
            ttl.saturating_sub(self.lease_safety_margin(ttl))
        };
        while usable(ttl_ms) < need {
            ttl_ms += 1;
        }
        ttl_ms
    }

    /// Raises this config's lease (and on raft with one shard the election timeout, whose
    /// minimum caps raft's lease) to the least, rounded up to 100 ms, that leaves the watchdog
    /// [`NodeConfig::min_usable_lease_ms`] after a `baton run --child-stop-margin` of
    /// `margin_ms`: what `baton config init --child-stop-margin` writes. A lease that is already
    /// long enough is kept. On raft the election timeout becomes `T-(T+200)` for the lease `T`:
    /// after a leader dies the others wait out openraft's leader lease, the maximum, before one
    /// stands, so failover takes about `T + 200 ms` (a `T-2T` range would double it). The margin
    /// itself is not set: `baton run` sets it from its flag.
    pub fn fit_stop_margin(&mut self, margin_ms: u64) {
        let probe = NodeConfig {
            work_stop_margin_ms: margin_ms,
            ..self.clone()
        };
        let ttl_ms = probe.min_working_ttl_ms().div_ceil(100) * 100;
        self.lease_ttl_ms = self.lease_ttl_ms.max(ttl_ms);
        if self.lease_capped_by_election() {
            let emin = self
                .election_timeout_range_ms()
                .map(|(lo, _)| lo)
                .unwrap_or(0);
            if emin < ttl_ms {
                self.election_timeout_ms =
                    format!("{ttl_ms}-{}", ttl_ms + STOP_MARGIN_ELECTION_SPREAD_MS);
            }
        }
    }

    /// What to raise so the granted lease reaches `ttl_ms`: `lease_ttl_ms` and, on raft, the
    /// minimum election timeout, with the flags that set them.
    fn raise_ttl_advice(&self, ttl_ms: u64) -> String {
        let mut raise = Vec::new();
        if self.lease_ttl_ms < ttl_ms {
            raise.push(format!(
                "lease_ttl_ms to at least {ttl_ms} (--lease-ttl {ttl_ms}ms)"
            ));
        }
        if self.lease_capped_by_election() {
            let emin = self
                .election_timeout_range_ms()
                .map(|(lo, _)| lo)
                .unwrap_or(0);
            if emin < ttl_ms {
                let emax = ttl_ms + STOP_MARGIN_ELECTION_SPREAD_MS;
                raise.push(format!(
                    "the minimum election timeout to at least {ttl_ms} (election_timeout_ms = \"{ttl_ms}-{emax}\", --election-timeout {ttl_ms}-{emax}), since raft grants min(lease_ttl_ms, election timeout min); failover then takes about the maximum, {emax} ms"
                ));
            }
        }
        format!("raise {}", raise.join(" and "))
    }

    /// The usable part of a granted lease of `granted` (what is left after
    /// [`NodeConfig::lease_safety_margin`]) must hold [`NodeConfig::min_usable_lease_ms`] (3
    /// renewal intervals + 5 ms) and leave room for `read_lease_margin_ms`; the error names each
    /// part of the margin and the settings (and flags) that would fix it.
    pub fn check_usable_lease(&self, granted: Duration) -> Result<(), ConfigError> {
        let margin = self.lease_safety_margin(granted);
        let usable = granted.saturating_sub(margin);
        let read_margin = Duration::from_millis(self.read_lease_margin_ms);
        let (what, limit) = if usable < Duration::from_millis(self.min_usable_lease_ms()) {
            ("renew_interval_ms", self.renew_interval_ms)
        } else if read_margin >= usable {
            // A lease read needs a window: the margin must leave some of the usable lease.
            ("read_lease_margin_ms", self.read_lease_margin_ms)
        } else {
            return Ok(());
        };
        let granted_is = if self.lease_capped_by_election() && granted < self.lease_ttl() {
            format!(
                "raft's lease of {} ms (the minimum election timeout, below lease_ttl_ms)",
                granted.as_millis()
            )
        } else {
            format!("lease_ttl_ms {}", granted.as_millis())
        };
        let stop_margin = if self.work_stop_margin_ms > 0 {
            format!(
                " + work_stop_margin_ms {} (`baton run --child-stop-margin`)",
                self.work_stop_margin_ms
            )
        } else {
            String::new()
        };
        let mut fixes = vec![self.raise_ttl_advice(self.min_working_ttl_ms())];
        let usable_ms = usable.as_millis() as u64;
        let renew_fits = usable_ms.saturating_sub(RENEWAL_SLACK_MS) / RENEWALS_PER_USABLE_LEASE;
        if what == "renew_interval_ms" && renew_fits > self.retry_interval_ms {
            fixes.push(format!(
                "lower renew_interval_ms to at most {renew_fits} (--renew-interval {renew_fits}ms)"
            ));
        }
        if what == "read_lease_margin_ms" && usable_ms > 0 {
            fixes.push(format!(
                "lower read_lease_margin_ms to at most {} (--read-lease-margin {}ms)",
                usable_ms - 1,
                usable_ms - 1
            ));
        }
        if self.work_stop_margin_ms > 0 {
            fixes.push(
                "give the program less time to stop (a smaller --stop-timeout and --child-stop-margin)"
                    .into(),
            );
        }
        let rule = if what == "renew_interval_ms" {
            format!(
                "{what} ({limit}) needs a usable lease of at least {} ms ({RENEWALS_PER_USABLE_LEASE} renewal intervals + {RENEWAL_SLACK_MS} ms slack, so that two renewals may fail or come late before the watchdog demotes), but the usable lease is",
                self.min_usable_lease_ms()
            )
        } else {
            format!("{what} ({limit}) must be below the usable lease:")
        };
        Err(ConfigError::Timing(format!(
            "{rule} {usable_ms} ms = {granted_is} minus the safety margin of {} ms (clock_rate_error {} x TTL + deadline_margin_ms {}{stop_margin}). To fix: {}",
            margin.as_millis(),
            self.clock_rate_error,
            self.deadline_margin_ms,
            fixes.join("; or ")
        )))
    }

    /// The timing checks: `lease_ttl_ms > renew_interval_ms > retry_interval_ms > 0`, a
    /// clock-rate error below 50%, and a granted lease whose usable part holds 3 renewals + 5 ms
    /// ([`NodeConfig::check_usable_lease`]).
    pub(super) fn validate_timing(&self) -> Result<(), ConfigError> {
        let (ttl, renew, retry) = (
            self.lease_ttl_ms,
            self.renew_interval_ms,
            self.retry_interval_ms,
        );
        if retry == 0 {
            return Err(ConfigError::Timing(
                "retry_interval_ms must be > 0 (--retry-interval), e.g. a quarter of renew_interval_ms".into(),
            ));
        }
        if !(0.0..0.5).contains(&self.clock_rate_error) {
            return Err(ConfigError::Timing(format!(
                "clock_rate_error ({}) must be in [0, 0.5), e.g. 0.01 (1%)",
                self.clock_rate_error
            )));
        }
        if renew <= retry {
            return Err(ConfigError::Timing(format!(
                "need renew_interval_ms ({renew}) > retry_interval_ms ({retry}): lower retry_interval_ms below {renew}, e.g. --retry-interval {}ms, or raise renew_interval_ms (--renew-interval)",
                (renew / 4).max(1)
            )));
        }
        if ttl <= renew {
            return Err(ConfigError::Timing(format!(
                "need lease_ttl_ms ({ttl}) > renew_interval_ms ({renew}): {}, or lower renew_interval_ms (--renew-interval)",
                self.raise_ttl_advice(self.min_working_ttl_ms())
            )));
        }
        self.check_usable_lease(Duration::from_millis(self.granted_lease_ttl_ms()))?;
        Ok(())
    }
}

/// Parses `3s`, `250ms`, `1.5s`, `2m` or a plain number of milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, ConfigError> {
    let t = text.trim();
    let err = || ConfigError::Duration(text.to_owned());
    let (num, scale) = if let Some(v) = t.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1000.0)
    } else if let Some(v) = t.strip_suffix('m') {
        (v, 60_000.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v < 0.0 {
        return Err(err());
    }
    Ok((v * scale).round() as u64)
}

#[cfg(test)]
mod tests;
