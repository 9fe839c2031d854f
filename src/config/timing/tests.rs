//! The timing rules, on every backend's defaults, the shipped configs and the errors' advice.

use std::time::Duration;

use crate::config::*;
use crate::elector::BackendKind;

#[test]
fn default_timing_is_valid() {
    NodeConfig::default().validate().unwrap();
}

const EVERY_BACKEND: [BackendKind; 6] = [
    BackendKind::Etcd,
    BackendKind::Redis,
    BackendKind::RedisNaive,
    BackendKind::Zk,
    BackendKind::PgLease,
    BackendKind::Raft,
];

/// The usable lease the watchdog gets after each renewal, computed here from the parts
/// (granted lease minus the clock-rate share, the deadline margin and the stop margin),
/// not through `lease_safety_margin`.
fn usable_after_renewal_ms(c: &NodeConfig) -> f64 {
    let granted = c.granted_lease_ttl_ms() as f64;
    granted * (1.0 - c.clock_rate_error)
        - c.deadline_margin_ms as f64
        - c.work_stop_margin_ms as f64
}

/// Issue 43: the timing derived for `baton run --child-stop-margin` (what `baton config
/// init --child-stop-margin` writes) left the watchdog 76 ms after each 40 ms renewal, and
/// a busy host demoted the leader 4 times in 3.5 minutes. Every derived timing, on every
/// backend, must leave at least 3 renewal intervals + 5 ms after each renewal, and validate
/// as `baton run` will run it.
#[test]
fn derived_timing_leaves_the_watchdog_three_renewals_and_slack() {
    for backend in EVERY_BACKEND {
        for margin_ms in [0, 700, 1250, 3300, 5250, 30_000] {
            let mut c = NodeConfig::for_backend(backend);
            c.fit_stop_margin(margin_ms);
            c.work_stop_margin_ms = margin_ms;
            let usable = usable_after_renewal_ms(&c);
            let need = (3 * c.renew_interval_ms + 5) as f64;
            assert!(
                    usable >= need,
                    "{backend} with a {margin_ms} ms stop margin: lease {} ms, election timeout {}, {usable} ms after each {} ms renewal, need {need}",
                    c.lease_ttl_ms,
                    c.election_timeout_ms,
                    c.renew_interval_ms
                );
            c.validate().unwrap();
        }
    }
    // deploy/baton-run.service's unit (--stop-timeout 5s --child-stop-margin 5250ms) on
    // raft: a 5.5 s lease (not 5.4) and a 200 ms election spread (not 5400-10800), so
    // failover takes ~5.7 s, not ~11.
    let mut c = NodeConfig::default();
    c.fit_stop_margin(5250);
    assert_eq!(
        (c.lease_ttl_ms, c.election_timeout_ms.as_str()),
        (5500, "5500-5700")
    );
}

/// Validation refuses a usable lease below 3 renewals + 5 ms, and the error's suggestions
/// (a longer lease, or a shorter renewal) are values that pass.
#[test]
fn validation_refuses_less_than_three_renewals_of_headroom() {
    // The raft defaults with a 25 ms deadline margin: 150 x 0.99 - 25 = 123.5 ms < 125.
    let c = NodeConfig {
        deadline_margin_ms: 25,
        election_timeout_ms: "300-500".into(),
        lease_ttl_ms: 150,
        ..NodeConfig::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("renew_interval_ms (40) needs a usable lease of at least 125 ms"),
        "{err}"
    );
    let mut longer = c.clone();
    longer.lease_ttl_ms = parse_duration_ms(suggested(&err, "--lease-ttl").unwrap()).unwrap();
    longer.validate().unwrap();
    let mut shorter = c.clone();
    shorter.renew_interval_ms =
        parse_duration_ms(suggested(&err, "--renew-interval").unwrap()).unwrap();
    shorter.validate().unwrap();
    assert!(usable_after_renewal_ms(&shorter) >= (3 * shorter.renew_interval_ms + 5) as f64);
    // Exactly 3 renewals + 5 ms passes; a millisecond less does not.
    let mut edge = NodeConfig {
        lease_ttl_ms: 1000,
        renew_interval_ms: 200,
        retry_interval_ms: 50,
        deadline_margin_ms: 395,
        clock_rate_error: 0.0,
        election_timeout_ms: "1000-1200".into(),
        ..NodeConfig::default()
    };
    edge.validate().unwrap();
    edge.deadline_margin_ms = 396;
    assert!(matches!(edge.validate(), Err(ConfigError::Timing(_))));
}

/// Every backend's defaults pass the headroom rule, and `for_backend` differs from the
/// raft defaults only in the keys a config file inherits from its backend.
#[test]
fn every_backends_defaults_have_headroom_and_only_timing_differs() {
    let raft = toml::Table::try_from(NodeConfig::default()).unwrap();
    for backend in EVERY_BACKEND {
        let c = NodeConfig::for_backend(backend);
        assert!(
            usable_after_renewal_ms(&c) >= (3 * c.renew_interval_ms + 5) as f64,
            "{backend}"
        );
        let t = toml::Table::try_from(&c).unwrap();
        for (key, value) in &t {
            if raft.get(key) != Some(value) {
                assert!(
                    key == "backend" || BACKEND_TIMING_KEYS.contains(&key.as_str()),
                    "{backend}: {key} differs from raft's default but is not a backend timing key"
                );
            }
        }
    }
}

/// config/<backend>.toml (what `baton config init` and the lab fleets start from) has the
/// same timing as `for_backend`, which a file that names the backend inherits.
#[test]
fn the_shipped_configs_have_their_backends_timing() {
    for (backend, text) in [
        (BackendKind::Raft, include_str!("../../../config/raft.toml")),
        (BackendKind::Etcd, include_str!("../../../config/etcd.toml")),
        (
            BackendKind::Redis,
            include_str!("../../../config/redis.toml"),
        ),
        (
            BackendKind::RedisNaive,
            include_str!("../../../config/redis-naive.toml"),
        ),
        (BackendKind::Zk, include_str!("../../../config/zk.toml")),
        (
            BackendKind::PgLease,
            include_str!("../../../config/pg-lease.toml"),
        ),
    ] {
        let shipped: NodeConfig = toml::from_str(text).unwrap();
        let d = NodeConfig::for_backend(backend);
        assert_eq!(shipped.backend, backend);
        assert_eq!(
            (
                shipped.lease_ttl_ms,
                shipped.renew_interval_ms,
                shipped.retry_interval_ms,
                shipped.deadline_margin_ms,
                shipped.clock_rate_error
            ),
            (
                d.lease_ttl_ms,
                d.renew_interval_ms,
                d.retry_interval_ms,
                d.deadline_margin_ms,
                d.clock_rate_error
            ),
            "config/{backend}.toml"
        );
    }
    let mut shards: NodeConfig =
        toml::from_str(include_str!("../../../config/raft-shards.toml")).unwrap();
    // `baton fleet up --shards K` sets the count; each shard's lease is lease_ttl_ms.
    shards.shards.count = 4;
    assert!(
        usable_after_renewal_ms(&shards) >= (3 * shards.renew_interval_ms + 5) as f64,
        "config/raft-shards.toml"
    );
}

/// The default backend is raft, and its default timing is what raft accepts: the check
/// `RaftElector::start` makes (renewal inside the granted lease minus its margin) passes.
#[test]
fn defaults_are_the_default_backends_and_fit_its_lease() {
    let c = NodeConfig::default();
    assert_eq!(c.backend, BackendKind::Raft);
    let (emin, _) = c.election_timeout_range_ms().unwrap();
    let granted = Duration::from_millis(c.lease_ttl_ms.min(emin));
    assert!(
        c.renew_interval() < granted.saturating_sub(c.lease_safety_margin(granted)),
        "raft would refuse the default timing"
    );
    for backend in EVERY_BACKEND {
        let c = NodeConfig::for_backend(backend);
        assert_eq!(c.backend, backend);
        c.validate().unwrap();
    }
    assert_eq!(
        NodeConfig::for_backend(BackendKind::PgLease).lease_ttl_ms,
        3000
    );
}

#[test]
fn ttl_must_exceed_renew_which_must_exceed_retry() {
    let mut c = NodeConfig {
        renew_interval_ms: 3000,
        ..NodeConfig::for_backend(BackendKind::Etcd)
    };
    assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
    c.renew_interval_ms = 200;
    assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
    c.renew_interval_ms = 1000;
    c.retry_interval_ms = 0;
    assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
}

#[test]
fn renew_must_fit_inside_the_usable_lease() {
    // 3 s TTL, 1% + 100 ms margin -> 2.87 s usable; renewing every 2.9 s cannot keep it.
    let c = NodeConfig {
        renew_interval_ms: 2900,
        ..NodeConfig::for_backend(BackendKind::Etcd)
    };
    assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
}

/// The value a timing error suggests for `flag` (`--lease-ttl 1327ms` -> "1327ms").
fn suggested<'a>(err: &'a str, flag: &str) -> Option<&'a str> {
    let at = err.find(&format!("{flag} "))? + flag.len() + 1;
    err[at..].split([')', ' ', ',', ';']).next()
}

/// The trap from issue 30: README's raft advice for `baton run` (election timeout
/// 1500-3000) on top of config/raft.toml's 150 ms lease, with `baton run`'s default stop
/// margin (1 s + 250 ms). The error names lease_ttl_ms and its flag, and the value it
/// suggests is one that validates.
#[test]
fn a_stop_margin_bigger_than_the_lease_names_the_ttl_that_works() {
    let mut c = NodeConfig {
        backend: BackendKind::Raft,
        election_timeout_ms: "1500-3000".into(),
        lease_ttl_ms: 150,
        renew_interval_ms: 40,
        retry_interval_ms: 20,
        deadline_margin_ms: 20,
        work_stop_margin_ms: 1250,
        ..NodeConfig::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(
            err.contains("renew_interval_ms (40) needs a usable lease of at least 125 ms (3 renewal intervals + 5 ms slack"),
            "{err}"
        );
    assert!(err.contains("but the usable lease is 0 ms"), "{err}");
    assert!(
        err.contains("work_stop_margin_ms 1250 (`baton run --child-stop-margin`)"),
        "{err}"
    );
    assert!(!err.contains("--election-timeout"), "1500 is enough: {err}");
    let ttl = suggested(&err, "--lease-ttl").expect("a --lease-ttl to pass");
    c.lease_ttl_ms = parse_duration_ms(ttl).unwrap();
    c.validate().unwrap();
    // One less does not: the suggestion is the least that works.
    c.lease_ttl_ms -= 1;
    assert!(c.validate().is_err());
}

/// On raft the granted lease is capped by the minimum election timeout: raising
/// lease_ttl_ms alone cannot help, and the error says which flags to pass together.
#[test]
fn raft_timing_errors_name_the_election_timeout_too() {
    let mut c = NodeConfig {
        backend: BackendKind::Raft,
        election_timeout_ms: "150-250".into(),
        lease_ttl_ms: 3000,
        work_stop_margin_ms: 700,
        ..NodeConfig::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("raft's lease of 150 ms"), "{err}");
    assert!(
        !err.contains("--lease-ttl"),
        "lease_ttl_ms is already high enough: {err}"
    );
    c.election_timeout_ms = suggested(&err, "--election-timeout")
        .expect("an --election-timeout to pass")
        .into();
    c.validate().unwrap();
}

#[test]
fn lease_timing_errors_offer_a_lower_renewal_that_works() {
    let mut c = NodeConfig {
        renew_interval_ms: 2900,
        // A lease backend's timing (3 s lease, renew 800 ms, retry 250 ms, margin 100 ms).
        ..NodeConfig::for_backend(BackendKind::Etcd)
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("clock_rate_error 0.01 x TTL + deadline_margin_ms 100"),
        "{err}"
    );
    let lower = suggested(&err, "--renew-interval").expect("a --renew-interval");
    let raise = suggested(&err, "--lease-ttl").expect("a --lease-ttl");
    let mut by_renew = c.clone();
    by_renew.renew_interval_ms = parse_duration_ms(lower).unwrap();
    by_renew.validate().unwrap();
    c.lease_ttl_ms = parse_duration_ms(raise).unwrap();
    c.validate().unwrap();
}

#[test]
fn interval_order_errors_name_a_value_that_works() {
    let mut c = NodeConfig {
        retry_interval_ms: 1000,
        // A lease backend's timing (3 s lease, renew 800 ms, retry 250 ms, margin 100 ms).
        ..NodeConfig::for_backend(BackendKind::Etcd)
    };
    let err = c.validate().unwrap_err().to_string();
    c.retry_interval_ms = parse_duration_ms(suggested(&err, "--retry-interval").unwrap()).unwrap();
    c.validate().unwrap();
    let mut c = NodeConfig {
        lease_ttl_ms: 700,
        // A lease backend's timing (3 s lease, renew 800 ms, retry 250 ms, margin 100 ms).
        ..NodeConfig::for_backend(BackendKind::Etcd)
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("need lease_ttl_ms (700) > renew_interval_ms (800)"),
        "{err}"
    );
    c.lease_ttl_ms = parse_duration_ms(suggested(&err, "--lease-ttl").unwrap()).unwrap();
    c.validate().unwrap();
}

#[test]
fn durations_parse_with_units() {
    assert_eq!(parse_duration_ms("3s").unwrap(), 3000);
    assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
    assert_eq!(parse_duration_ms("1.5s").unwrap(), 1500);
    assert_eq!(parse_duration_ms("40").unwrap(), 40);
    assert!(parse_duration_ms("-1s").is_err());
    assert!(parse_duration_ms("soon").is_err());
}
