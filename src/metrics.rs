//! Metric names, their help text, and (feature `prometheus`) the Prometheus recorder. Rendered by
//! our own hyper handler (`GET /metrics`), so the exporter's HTTP listener is not used.
//!
//! baton records through the `metrics` facade. If the embedding process already installed a
//! recorder, baton's metrics go to it and baton does not install its own (never a panic).
//!
//! baton's own recorder adds a global `node` label to every metric; "no labels" below means none
//! besides that one.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// 1 while this node's leader work for a shard runs (label `shard`, `"0"` on an unsharded
/// fleet); the fleet's sum per shard must be exactly 1.
pub const LEADERS_ACTING: &str = "leaders_acting";
/// 1 for this node's current role in a shard, 0 for the others (labels `role`, `shard`).
pub const ROLE: &str = "baton_role";
/// Gauge: how many shards this node leads (updated at each scrape); no labels.
pub const SHARDS_LED: &str = "baton_shards_led";
/// Counter of this node's leadership transitions, labels `to` and `shard`: `leader` when a term's leader work
/// has started, `follower` when it has fully stopped after a demotion. A term whose work failed to
/// start counts only `to="follower"`, so the two need not pair up.
pub const TRANSITIONS: &str = "baton_leadership_transitions_total";
/// Histogram, seconds: from the start of a campaign to winning it, including the time queued
/// behind a live leader. Only won campaigns are recorded; no labels.
pub const CAMPAIGN_SECONDS: &str = "baton_campaign_duration_seconds";
/// Histogram, seconds: from the moment this node saw the seat fall vacant (never earlier than its
/// campaign began) to winning it. Recorded only for wins whose backend reports
/// [`Win::vacant_since`](crate::elector::Win::vacant_since); no labels.
pub const ELECTION_SECONDS: &str = "baton_election_duration_seconds";
/// Counter of successful lease renewals that returned a grant (a renewal with no session to renew
/// is not counted); no labels.
pub const RENEWALS: &str = "baton_lease_renewals_total";
/// Counter of failed lease renewals, both transient errors and lost leases; no labels.
pub const RENEWAL_FAILURES: &str = "baton_lease_renewal_failures_total";
/// Gauge: the fencing token of the term whose leader work runs on this node, set when the work has
/// started and reset to 0 when it has fully stopped; label `shard`.
pub const FENCE_TOKEN: &str = "baton_fence_token";
/// Counter of this node's writes refused by the fenced resource, label `op`: `claim`, `next`,
/// `tick`, `checkpoint`, `user` (a [`Fence::begin`](crate::work::Fence::begin) transaction), or
/// `failed-term` (a failed term recorded for the failure budget by a node no longer its leader).
pub const FENCE_REJECTIONS: &str = "baton_fence_rejections_total";
/// Gauge: how many of this node's terms in a row had their first write (the claim) refused by the
/// fenced resource; reset to 0 by an accepted claim; no labels. A value that keeps climbing means
/// the resource refuses every new term (a token source that regressed, or a poisoned
/// `max_token`): see `baton fence status` and the `FenceRefusesNewTerms` alert.
pub const FENCE_REFUSED_CLAIMS_IN_A_ROW: &str = "baton_fence_refused_claims_in_a_row";
/// Histogram: the number of IDs in one sequencer group commit (in window mode: in one extension
/// of the persisted bound, `[sequencer] window_ids`), recorded whether or not the commit was
/// accepted; no labels. baton's own recorder uses power-of-two buckets from 1 to 4096.
pub const SEQ_BATCH_IDS: &str = "baton_sequencer_batch_ids";
/// Histogram, seconds: the duration of one sequencer group commit (one fenced round trip),
/// including refused and failed ones; no labels.
pub const SEQ_COMMIT_SECONDS: &str = "baton_sequencer_commit_duration_seconds";
/// Histogram, seconds: one ID request from its arrival at the leader's sequencer to its answer
/// (IDs or error). Requests refused before they join a group commit (e.g. while demoting) are not
/// recorded, nor is HTTP handling time; no labels. In window mode only the requests that waited
/// (over 100 µs, for an extension of the bound or for the lease window) are recorded: the rest are
/// answered in place.
pub const NEXT_SECONDS: &str = "baton_next_request_duration_seconds";
/// Counter: window mode's `POST /next` requests that found the leader's lease-read window shut
/// and waited for a renewal to reopen it (counted once per look); no labels.
pub const SEQ_WINDOW_LEASE_WAITS: &str = "baton_sequencer_window_lease_waits_total";
/// Counter of scheduler ticks accepted by the fenced resource (refused or failed ticks are not
/// counted); no labels.
pub const SCHED_TICKS: &str = "baton_scheduler_ticks_total";
/// Counter of work-set jobs run, as reported by the resource for each accepted scheduler tick; no
/// labels.
pub const SCHED_JOBS: &str = "baton_scheduler_jobs_run_total";
/// Histogram, seconds: one demotion from its start (checkpoint of the leader work) to the
/// lease-release answer, whether the release succeeded or not; no labels.
pub const DEMOTION_SECONDS: &str = "baton_demotion_duration_seconds";
/// Counter of restarts of leader work inside a term under a `Restart` supervision policy (label
/// `work`, e.g. `child` for `baton run`'s program), counted when the restart is attempted (after
/// its backoff, in a term that still runs); the one restart counter.
pub const WORK_RESTARTS: &str = "baton_work_restarts_total";
/// Counter of this node's terms that ended because their leader work failed (a term whose claim
/// the fenced resource refused is not counted: see `FENCE_REFUSED_CLAIMS_IN_A_ROW`); no labels.
pub const FAILED_TERMS: &str = "baton_failed_terms_total";
/// Gauge: this node's failed terms in a row (reset by a term that ends any other way); no labels.
pub const FAILED_TERMS_IN_A_ROW: &str = "baton_failed_terms_in_a_row";
/// Gauge, seconds: how long this node waits after its last failed term before campaigning
/// again (0 once a term ends otherwise); no labels.
pub const CAMPAIGN_BACKOFF_SECONDS: &str = "baton_campaign_backoff_seconds";
/// Gauge: 1 while this node finds the fleet-wide failure budget of a shard spent (label
/// `shard`): it does not campaign for that shard until the budget reopens (`[failure_budget]`).
pub const FAILURE_BUDGET_EXHAUSTED: &str = "baton_failure_budget_exhausted";
/// Gauge: the failed terms of a shard the fenced resource counted within the failure budget's
/// window at this node's last look (label `shard`).
pub const FAILURE_BUDGET_FAILED_TERMS: &str = "baton_failure_budget_failed_terms";
/// Gauge: the pid of the external program `baton run` runs as leader work (see
/// [`ChildWork`](crate::work::child::ChildWork)), 0 while none runs; no labels.
pub const CHILD_PID: &str = "baton_child_pid";
/// Raft peer requests refused by authentication (label `reason`: missing, bad_mac, stale,
/// unknown_sender); a refused request changes nothing.
pub const PEER_AUTH_FAILURES: &str = "baton_peer_auth_failures_total";
/// Raft peer connections dropped at the peer listener's connection cap.
pub const PEER_CONNECTIONS_REFUSED: &str = "baton_peer_connections_refused_total";
/// Client connections answered 503 and closed because every slot was serving a request.
pub const HTTP_CONNECTIONS_REFUSED: &str = "baton_http_connections_refused_total";
/// Client connections closed to give their slot to a new one (they had made no progress longest).
pub const HTTP_CONNECTIONS_EVICTED: &str = "baton_http_connections_evicted_total";
/// Failed `accept(2)` calls on the client listener (e.g. out of descriptors).
pub const HTTP_ACCEPT_FAILURES: &str = "baton_http_accept_failures_total";
/// Client connections that failed or timed out in the TLS handshake (HTTPS servers only).
pub const HTTP_TLS_HANDSHAKE_FAILURES: &str = "baton_http_tls_handshake_failures_total";
/// Step-downs because the client listener could not accept for too long.
pub const HTTP_UNSERVICEABLE_STEPDOWNS: &str = "baton_http_unserviceable_stepdowns_total";
/// `GET /read` answers (labels `mode`: the mode actually used, `outcome`: ok or the refusal).
pub const READS: &str = "baton_reads_total";
/// `lease` reads asked outside the lease window, answered by a `quorum` read instead.
pub const READ_LEASE_FALLBACKS: &str = "baton_read_lease_fallbacks_total";
/// `quorum` reads answered by a leadership confirmation another read started after they
/// arrived, instead of one of their own.
pub const READ_CONFIRMS_SHARED_TOTAL: &str = "baton_read_confirms_shared_total";
/// Detector datagrams dropped before the SWIM member saw them (label `reason`: `malformed`,
/// `unknown_sender`, `bad_mac`, `stale`, `replay`, `overload`).
pub const DETECTOR_DROPPED: &str = "baton_detector_dropped_total";
/// Detector datagrams this node could not send (the socket's buffer was full).
pub const DETECTOR_SEND_FAILURES: &str = "baton_detector_send_failures_total";
/// Members of the detector's group by state (label `state`: `alive`, `suspect`, `down`).
pub const DETECTOR_MEMBERS: &str = "baton_detector_members";
/// Members the detector confirmed dead (suspected, unrefuted for the suspicion timeout).
pub const DETECTOR_CONFIRMED_DEAD: &str = "baton_detector_confirmed_dead_total";
/// Times this node learnt that the others had declared it dead (and rejoined).
pub const DETECTOR_DECLARED_DEAD: &str = "baton_detector_declared_self_dead_total";
/// A dead holder's lease ended in the backend by this node on the detector's word.
pub const DETECTOR_TAKEOVERS: &str = "baton_detector_lease_takeovers_total";

#[cfg(feature = "prometheus")]
pub use prom::install;

#[cfg(feature = "prometheus")]
mod prom {
    use std::sync::OnceLock;
    use std::time::Duration;

    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

    use super::*;

    /// `None` when another recorder was already installed by the embedding process.
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

    /// Installs a process-wide Prometheus recorder once (the first node id becomes the `node` label)
    /// and returns its handle; later calls return the same handle. When the process already has a
    /// recorder (the embedding service installed its own), baton uses that one and returns `None`.
    pub fn install(node_id: &str) -> Option<PrometheusHandle> {
        HANDLE
            .get_or_init(|| {
                let recorder = PrometheusBuilder::new()
                    .add_global_label("node", node_id)
                    .set_buckets(&[
                        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                        5.0, 10.0,
                    ])
                    .expect("static bucket list is non-empty")
                    .set_buckets_for_metric(
                        metrics_exporter_prometheus::Matcher::Full(SEQ_BATCH_IDS.into()),
                        &[
                            1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                            4096.0,
                        ],
                    )
                    .expect("static bucket list is non-empty")
                    .build_recorder();
                let handle = recorder.handle();
                if metrics::set_global_recorder(recorder).is_err() {
                    tracing::info!("a metrics recorder is already installed; baton records to it");
                    describe();
                    return None;
                }
                describe();
                let upkeep = handle.clone();
                // Without the exporter's own listener nobody drains histograms: do it ourselves.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        loop {
                            tokio::time::sleep(Duration::from_secs(5)).await;
                            upkeep.run_upkeep();
                        }
                    });
                }
                Some(handle)
            })
            .clone()
    }
}

/// Describes baton's metrics (help text, units) to whatever recorder is installed.
pub fn describe() {
    describe_detector();
    describe_reads_and_http();
    describe_leadership();
    describe_fence_and_work();
    describe_terms();
}

/// The failure detector's metrics.
fn describe_detector() {
    describe_counter!(
        DETECTOR_DROPPED,
        "detector datagrams dropped unread, by reason (malformed, unknown_sender, bad_mac, stale, replay, overload)"
    );
    describe_counter!(
        DETECTOR_SEND_FAILURES,
        "detector datagrams not sent: the socket buffer was full"
    );
    describe_gauge!(
        DETECTOR_MEMBERS,
        "members of the detector's group as this node sees them, by state"
    );
    describe_counter!(
        DETECTOR_CONFIRMED_DEAD,
        "members the failure detector confirmed dead"
    );
    describe_counter!(
        DETECTOR_DECLARED_DEAD,
        "times the others declared this node dead (it rejoined under a new identity)"
    );
    describe_counter!(
        DETECTOR_TAKEOVERS,
        "dead holders' leases this node ended in the backend on the detector's word"
    );
}

/// The read path's and the HTTP server's metrics.
fn describe_reads_and_http() {
    describe_counter!(
        READS,
        "GET /read answers, by the mode actually used and the outcome"
    );
    describe_counter!(
        READ_LEASE_FALLBACKS,
        "lease reads asked outside the lease window and answered by a quorum read"
    );
    describe_counter!(
        READ_CONFIRMS_SHARED_TOTAL,
        "quorum reads answered by a leadership confirmation that started after they arrived, shared with other reads"
    );
    describe_counter!(
        HTTP_CONNECTIONS_REFUSED,
        "Client connections refused (503, closed) because the connection cap was reached"
    );
    describe_counter!(
        HTTP_TLS_HANDSHAKE_FAILURES,
        "Client connections that failed or timed out in the TLS handshake"
    );
    describe_counter!(
        HTTP_CONNECTIONS_EVICTED,
        "Client connections closed at the cap to make room: the ones longest without progress"
    );
    describe_counter!(
        HTTP_ACCEPT_FAILURES,
        "Failed accepts on the client listener (e.g. EMFILE)"
    );
    describe_counter!(
        HTTP_UNSERVICEABLE_STEPDOWNS,
        "Step-downs of a leader whose client listener kept failing to accept"
    );
}

/// Leadership: roles, transitions, campaigns, renewals, raft peers.
fn describe_leadership() {
    describe_gauge!(
        LEADERS_ACTING,
        "1 while this node's leader work runs; the fleet sum must be exactly 1"
    );
    describe_gauge!(SHARDS_LED, "Shards this node leads");
    describe_gauge!(
        ROLE,
        "1 for this node's current role (leader, follower, candidate, budget_blocked), 0 otherwise"
    );
    describe_counter!(
        TRANSITIONS,
        "Leadership transitions of this node, by the role entered"
    );
    describe_histogram!(
        CAMPAIGN_SECONDS,
        Unit::Seconds,
        "Campaign call to won, including time queued behind a live leader"
    );
    describe_histogram!(
        ELECTION_SECONDS,
        Unit::Seconds,
        "Seat vacant (as this node saw it) to won: the election itself"
    );
    describe_counter!(RENEWALS, "Successful lease renewals");
    describe_counter!(
        PEER_AUTH_FAILURES,
        "Raft peer requests refused by authentication, by reason"
    );
    describe_counter!(
        PEER_CONNECTIONS_REFUSED,
        "Raft peer connections dropped at the connection cap"
    );
    describe_counter!(RENEWAL_FAILURES, "Failed lease renewals");
}

/// The fenced resource's, the sequencer's and the scheduler's metrics.
fn describe_fence_and_work() {
    describe_gauge!(
        FENCE_TOKEN,
        "Fencing token this node currently holds (0 when not leading)"
    );
    describe_counter!(
        FENCE_REJECTIONS,
        "Writes of this node refused by the fenced resource, by operation"
    );
    describe_gauge!(
        FENCE_REFUSED_CLAIMS_IN_A_ROW,
        "Terms of this node in a row whose claim the fenced resource refused"
    );
    describe_histogram!(SEQ_BATCH_IDS, "IDs committed per sequencer group commit");
    describe_histogram!(
        SEQ_COMMIT_SECONDS,
        Unit::Seconds,
        "Duration of one sequencer group commit"
    );
    describe_histogram!(
        NEXT_SECONDS,
        Unit::Seconds,
        "POST /next from request to response on the leader"
    );
    describe_counter!(
        SEQ_WINDOW_LEASE_WAITS,
        "Window-mode ID requests that waited for the lease window to reopen"
    );
    describe_counter!(SCHED_TICKS, "Scheduler ticks accepted by the resource");
    describe_counter!(SCHED_JOBS, "Work-set jobs run by the scheduler");
}

/// Backend requests, demotions, and failed terms with their backoff and budget.
fn describe_terms() {
    describe_counter!(
        crate::elector::BACKEND_REQUESTS,
        "Requests this node's elector sent to its backend service, by backend and operation"
    );
    describe_histogram!(
        DEMOTION_SECONDS,
        Unit::Seconds,
        "Demotion: checkpoint + stop + release"
    );
    describe_gauge!(
        CHILD_PID,
        "Pid of the program baton run runs as leader work (0 when none runs)"
    );
    describe_counter!(
        FAILED_TERMS,
        "Terms of this node that ended because their leader work failed"
    );
    describe_gauge!(FAILED_TERMS_IN_A_ROW, "Failed terms of this node in a row");
    describe_gauge!(
        CAMPAIGN_BACKOFF_SECONDS,
        Unit::Seconds,
        "Wait after the last failed term before campaigning again"
    );
    describe_gauge!(
        FAILURE_BUDGET_EXHAUSTED,
        "1 while the fleet-wide failure budget of the shard is spent and this node does not campaign for it"
    );
    describe_gauge!(
        FAILURE_BUDGET_FAILED_TERMS,
        "Failed terms of the shard counted in the failure budget's window, at this node's last look"
    );
    describe_counter!(
        WORK_RESTARTS,
        "Restarts of leader work inside a term under a Restart supervision policy, by work"
    );
}
