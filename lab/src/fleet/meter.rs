//! Backend requests counted from a fleet's own `/metrics`: what `baton exp` and `baton bench
//! cost` report as each backend's request rate, summed over nodes and across their restarts.

use std::collections::BTreeMap;

use super::client::NodeClient;
use super::servers::pid_alive;
use super::FleetState;

/// Sums `baton_backend_requests_total` by `op` across nodes, across restarts (a counter that went
/// down restarted from zero).
#[derive(Default)]
pub(crate) struct RequestMeter {
    last: BTreeMap<(String, String), f64>,
    total: BTreeMap<String, f64>,
    /// The same for the unlabelled [`DETECTOR_COUNTERS`], by metric name.
    detector_last: BTreeMap<(String, &'static str), f64>,
    detector_total: BTreeMap<&'static str, f64>,
}

/// The failure detector's counters the meter sums besides the backend's requests.
const DETECTOR_COUNTERS: [&str; 2] = [
    baton::metrics::DETECTOR_CONFIRMED_DEAD,
    baton::metrics::DETECTOR_DECLARED_DEAD,
];

/// `(name, value)` of a line of one of the [`DETECTOR_COUNTERS`].
fn detector_counter(line: &str) -> Option<(&'static str, f64)> {
    DETECTOR_COUNTERS.iter().find_map(|name| {
        let rest = line.strip_prefix(name)?;
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            return None;
        }
        let v = rest.rsplit(' ').next()?.trim().parse().ok()?;
        Some((*name, v))
    })
}

impl RequestMeter {
    /// Scrapes every live node; a node's counters are keyed by its pid, so a restarted node's
    /// fresh counters add up instead of looking like no change.
    pub(crate) async fn scrape(&mut self, client: &NodeClient, state: &FleetState) {
        for n in &state.nodes {
            if !pid_alive(n.pid) {
                continue;
            }
            let Ok(r) = client.get(&n.http_addr, "/metrics").await else {
                continue;
            };
            let text = String::from_utf8_lossy(&r.body).into_owned();
            for line in text.lines() {
                if let Some((name, v)) = detector_counter(line) {
                    let key = (format!("{}#{}", n.id, n.pid), name);
                    let prev = self.detector_last.get(&key).copied().unwrap_or(0.0);
                    let delta = if v >= prev { v - prev } else { v };
                    *self.detector_total.entry(name).or_default() += delta;
                    self.detector_last.insert(key, v);
                    continue;
                }
                let Some(rest) = line.strip_prefix("baton_backend_requests_total{") else {
                    continue;
                };
                let Some((labels, value)) = rest.rsplit_once('}') else {
                    continue;
                };
                let Ok(v) = value.trim().parse::<f64>() else {
                    continue;
                };
                let op = labels
                    .split(',')
                    .find_map(|kv| kv.trim().strip_prefix("op=\""))
                    .map(|s| s.trim_end_matches('"').to_owned())
                    .unwrap_or_default();
                let key = (format!("{}#{}", n.id, n.pid), op.clone());
                let prev = self.last.get(&key).copied().unwrap_or(0.0);
                let delta = if v >= prev { v - prev } else { v };
                *self.total.entry(op).or_default() += delta;
                self.last.insert(key, v);
            }
        }
    }

    pub(crate) fn baseline(&mut self) {
        self.total.clear();
        self.detector_total.clear();
    }

    /// The detector's counters since the last [`RequestMeter::baseline`], by metric name.
    pub(crate) fn detector_total(&self) -> BTreeMap<String, u64> {
        self.detector_total
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.round() as u64))
            .collect()
    }

    /// Requests by `op`, summed over nodes, since the last [`RequestMeter::baseline`].
    pub(crate) fn total(&self) -> &BTreeMap<String, f64> {
        &self.total
    }

    /// Everything one node process (`id`, `pid`) had counted at the last scrape, all ops together.
    pub(crate) fn node_count(&self, id: &str, pid: u32) -> f64 {
        let key = format!("{id}#{pid}");
        self.last
            .iter()
            .filter(|((node, _), _)| *node == key)
            .map(|(_, v)| v)
            .sum::<f64>()
            // An empty f64 sum is -0.0.
            + 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detector_counters_are_read_by_exact_name() {
        assert_eq!(
            detector_counter("baton_detector_confirmed_dead_total 3"),
            Some((baton::metrics::DETECTOR_CONFIRMED_DEAD, 3.0))
        );
        assert_eq!(
            detector_counter("baton_detector_declared_self_dead_total{node=\"n1\"} 2"),
            Some((baton::metrics::DETECTOR_DECLARED_DEAD, 2.0))
        );
        // Another counter sharing the prefix, and the HELP / TYPE lines, are not these.
        assert_eq!(
            detector_counter("baton_detector_confirmed_dead_totals 9"),
            None
        );
        assert_eq!(
            detector_counter("# TYPE baton_detector_confirmed_dead_total counter"),
            None
        );
        assert_eq!(
            detector_counter("baton_backend_requests_total{op=\"renew\"} 4"),
            None
        );
    }
}
