//! How a fenced sequence write ended: the outcome the actor and the commit loop act on, the
//! refusal its callers get, and the log lines at the edges of a run of unavailable writes.

use std::time::Instant;

use super::{CommitOutcome, NextError};
use crate::backends::FenceToken;
use crate::work::FenceError;

/// Logs the edges of a run of fenced writes (group commits, or window mode's extensions) that
/// failed for want of the database (see [`unavailable_edge`]).
pub(super) fn log_unavailable_edge(
    failing_since: &mut Option<Instant>,
    token: FenceToken,
    outcome: &CommitOutcome,
    window: bool,
) {
    let token = token.0;
    match unavailable_edge(failing_since, outcome) {
        Some(UnavailableEdge::Began(why)) if window => tracing::warn!(
            token,
            error = why,
            "sequencer: writing the window's next bound failed for want of the database; the IDs left below the bound are still served, and it is tried again every 100 ms"
        ),
        Some(UnavailableEdge::Began(why)) => tracing::warn!(
            token,
            error = why,
            "sequencer: a group commit failed for want of the database; its callers were answered unavailable, the next commit takes a new connection"
        ),
        // At warn too: whoever reads the warnings sees where the outage ended.
        Some(UnavailableEdge::Ended { failing_ms }) => tracing::warn!(
            token,
            failing_ms,
            "sequencer: group commits go through again"
        ),
        None => {}
    }
}

/// How a fenced sequence write ended, as the actor needs to know it.
pub(super) fn outcome_of(res: &Result<(), FenceError>) -> CommitOutcome {
    match res {
        Ok(()) => CommitOutcome::Durable,
        Err(e @ FenceError::Rejected { .. }) => CommitOutcome::FencedOut(e.to_string()),
        Err(e) => CommitOutcome::Unavailable(e.to_string()),
    }
}

/// A change in whether group commits reach the database.
#[derive(Debug, PartialEq, Eq)]
enum UnavailableEdge<'a> {
    /// The first commit of a run failed for want of the database (why).
    Began(&'a str),
    /// A commit went through after such a run, which lasted this long.
    Ended { failing_ms: u64 },
}

/// Tracks a run of commits that failed for want of the database in `failing_since`, and says
/// when one begins or ends: that is what gets logged, one line each. A line per commit would be
/// up to a thousand a second against a database that is down; no line at all left a term that
/// served nothing but 503s with nothing in its log to say why.
fn unavailable_edge<'a>(
    failing_since: &mut Option<Instant>,
    outcome: &'a CommitOutcome,
) -> Option<UnavailableEdge<'a>> {
    match (outcome, *failing_since) {
        (CommitOutcome::Unavailable(why), None) => {
            *failing_since = Some(Instant::now());
            Some(UnavailableEdge::Began(why))
        }
        (CommitOutcome::Durable, Some(since)) => {
            *failing_since = None;
            Some(UnavailableEdge::Ended {
                failing_ms: since.elapsed().as_millis() as u64,
            })
        }
        _ => None,
    }
}

/// Why a group commit's callers are refused (`None`: its IDs are durable).
pub(super) fn next_error_of(res: &Result<(), FenceError>) -> Option<NextError> {
    match res {
        Ok(()) => None,
        Err(e @ FenceError::Rejected { .. }) => Some(NextError::Fenced(e.to_string())),
        Err(e) => Some(NextError::Unavailable(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_unavailable_commits_is_reported_at_its_edges_only() {
        let down = CommitOutcome::Unavailable("connection refused".into());
        let fenced = CommitOutcome::FencedOut("stale-token".into());
        let mut since = None;
        assert_eq!(
            unavailable_edge(&mut since, &CommitOutcome::Durable),
            None,
            "healthy stays quiet"
        );
        assert_eq!(
            unavailable_edge(&mut since, &down),
            Some(UnavailableEdge::Began("connection refused"))
        );
        assert!(since.is_some());
        assert_eq!(
            unavailable_edge(&mut since, &down),
            None,
            "the second failure in a row is not reported again"
        );
        assert_eq!(
            unavailable_edge(&mut since, &fenced),
            None,
            "a fenced-out commit is not a recovery"
        );
        assert!(matches!(
            unavailable_edge(&mut since, &CommitOutcome::Durable),
            Some(UnavailableEdge::Ended { .. })
        ));
        assert_eq!(since, None);
        assert_eq!(
            unavailable_edge(&mut since, &down),
            Some(UnavailableEdge::Began("connection refused")),
            "a new run is reported again"
        );
    }
}
