//! The shipped Prometheus scrape config and alert rules are valid, and the alert provably fires
//! when the fleet's `sum(leaders_acting)` is not 1 (promtool's rule unit tests, config/alerts_test.yml).

use std::process::Command;

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("promtool (Debian package prometheus) must be installed: scripts/ensure-deps.sh");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn scrape_config_is_valid() {
    promtool(&["check", "config", "config/prometheus.yml"]);
}

#[test]
fn alert_rules_are_valid_and_fire_when_leaders_acting_is_not_one() {
    promtool(&["check", "rules", "config/alerts.yml"]);
    promtool(&["test", "rules", "config/alerts_test.yml"]);
}
