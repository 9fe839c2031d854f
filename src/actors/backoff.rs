//! Backing off from leader work that keeps failing, the way a process supervisor does.
//!
//! Without it a program (or job) that fails at once bounced between nodes forever: each node won,
//! failed, released, and the next won within milliseconds, a new token every ~1.3 s. Two waits
//! now grow with repeated failure:
//! * **inside a term**, a `Restart` policy's restarts: the n-th restart within the policy's window
//!   waits `backoff x 2^(n-1)`, capped at [`RESTART_BACKOFF_CAP`] (never below `backoff`);
//! * **across terms**, after a term whose leader work failed, the node waits before campaigning
//!   again: `[term_backoff] base_ms x 2^(failed terms in a row - 1)`, capped at `max_ms`. Each
//!   such failure is logged at WARN with the whole error (the program's exit status, a job's
//!   error chain) and counted ([`FAILED_TERMS`](crate::metrics::FAILED_TERMS)). A term counts as
//!   failed however it ended: its work failed and ended it, or its work failed during the term
//!   (a `Restart` policy restarted it) no more than `reset_after_ms` before the term ended some
//!   other way (a lease-deadline demotion, a lost lease, a step-down). A term that ends any
//!   other way, or that ran `reset_after_ms` before its work failed, ends the streak.
//!
//! A term whose claim the fenced resource refused is not counted: that is the token source
//! (a regressed Redis counter, a poisoned `max_token`), it is only cured by newer terms, and it
//! has its own gauge and alert (`baton_fence_refused_claims_in_a_row`, `FenceRefusesNewTerms`).
//!
//! Every wait is stretched by a random 0-20% ([`JITTER`]), never shortened: nodes that failed
//! together do not come back together, and no wait is below what was configured.
//!
//! This is one node's patience. The fleet's is the failure budget (`actors::budget`): each
//! failed term is also recorded in the fenced resource, and once the fleet has spent its
//! `[failure_budget]` every node stops campaigning.

use std::time::{Duration, Instant};

use rand::Rng;

use crate::actors::DemotionReason;
use crate::config::TermBackoffConfig;
use crate::elector::FenceToken;
use crate::metrics as m;

/// The longest wait between two restarts of a `Restart` policy (unless its own `backoff` is
/// longer).
pub const RESTART_BACKOFF_CAP: Duration = Duration::from_secs(30);
/// Waits are stretched by a random factor in `[1, 1 + JITTER)`.
pub const JITTER: f64 = 0.2;

/// `base x 2^doublings`, at most `cap` (but never below `base`), stretched by the jitter.
fn grown(base: Duration, cap: Duration, doublings: u32) -> Duration {
    let factor = 2f64.powi(doublings.min(62) as i32);
    let unjittered = base.mul_f64(factor).min(cap.max(base));
    unjittered.mul_f64(1.0 + rand::thread_rng().gen_range(0.0..JITTER))
}

/// The wait before a `Restart` policy's next restart, when `earlier` restarts already happened
/// within its window: `backoff`, `2 x backoff`, `4 x backoff`, ... capped, jittered.
pub(crate) fn restart_delay(backoff: Duration, earlier: usize) -> Duration {
    grown(
        backoff,
        RESTART_BACKOFF_CAP,
        u32::try_from(earlier).unwrap_or(u32::MAX),
    )
}

/// How a term ended, as far as backing off goes.
#[derive(Debug, PartialEq)]
pub(crate) struct TermEnd {
    /// How long to wait before campaigning again.
    pub(crate) pause: Duration,
    /// The error of a failed term (its leader work failed, the claim was not refused): what
    /// the fleet-wide failure budget records (`actors::budget`).
    pub(crate) failure: Option<String>,
}

/// This node's streak of failed terms, and the wait it earns.
pub(crate) struct TermFailures {
    cfg: TermBackoffConfig,
    /// This node's id: the holder named in the WARN of a failed term.
    holder: String,
    in_a_row: u32,
    term_began: Option<Instant>,
    /// The latest failure of the current term's work (when, and why), if any: a term that then
    /// ends another way still failed.
    failed_in_term: Option<(Instant, String)>,
}

impl TermFailures {
    pub(crate) fn new(cfg: &TermBackoffConfig, holder: &str) -> TermFailures {
        TermFailures {
            cfg: cfg.clone(),
            holder: holder.to_owned(),
            in_a_row: 0,
            term_began: None,
            failed_in_term: None,
        }
    }

    /// A term was won (its work is about to start).
    pub(crate) fn term_began(&mut self) {
        self.term_began = Some(Instant::now());
        self.failed_in_term = None;
    }

    /// A work of the current term ended on its own with `why` (its policy may restart it).
    pub(crate) fn work_failed(&mut self, why: &str) {
        self.failed_in_term = Some((Instant::now(), why.to_owned()));
    }

    /// The term `token` has ended for `reason` (its work has stopped); `claim_refused`: the
    /// fenced resource refused its claim. Returns how long to wait before campaigning again
    /// (zero unless the work failed) and, for a failed term, its error, after logging and
    /// counting the failure.
    pub(crate) fn term_ended(
        &mut self,
        token: FenceToken,
        reason: &DemotionReason,
        claim_refused: bool,
    ) -> TermEnd {
        let ran = self
            .term_began
            .take()
            .map(|t| t.elapsed())
            .unwrap_or_default();
        let no_failure = TermEnd {
            pause: Duration::ZERO,
            failure: None,
        };
        let failed_in_term = self.failed_in_term.take();
        let why = match reason {
            DemotionReason::WorkFailed(why) => why.clone(),
            // The term ran no work: it says nothing about the work, so the streak stands (and
            // the budget keeps this node from campaigning meanwhile).
            DemotionReason::FailureBudgetExhausted => return no_failure,
            // Its work failed during the term (and was restarted), then the term ended another
            // way: a failed term all the same, unless the work has run well since for
            // `reset_after_ms`.
            other => match failed_in_term {
                Some((at, why))
                    if at.elapsed() <= Duration::from_millis(self.cfg.reset_after_ms) =>
                {
                    format!("{why} (then the term ended: {other})")
                }
                _ => {
                    self.reset();
                    return no_failure;
                }
            },
        };
        if claim_refused {
            return no_failure;
        }
        if ran >= Duration::from_millis(self.cfg.reset_after_ms) {
            self.in_a_row = 0;
        }
        self.in_a_row = self.in_a_row.saturating_add(1);
        let pause = if self.cfg.base_ms == 0 {
            Duration::ZERO
        } else {
            grown(
                Duration::from_millis(self.cfg.base_ms),
                Duration::from_millis(self.cfg.max_ms),
                self.in_a_row - 1,
            )
        };
        self.report_failed_term(token, reason, &why, ran, pause);
        TermEnd {
            pause,
            failure: Some(why),
        }
    }

    /// Counts a failed term and logs it (`why`; `ran` long, followed by a campaign `pause`),
    /// saying whether the work's failure ended the term or the term ended another way after it.
    fn report_failed_term(
        &self,
        token: FenceToken,
        reason: &DemotionReason,
        why: &str,
        ran: Duration,
        pause: Duration,
    ) {
        metrics::counter!(m::FAILED_TERMS).increment(1);
        metrics::gauge!(m::FAILED_TERMS_IN_A_ROW).set(f64::from(self.in_a_row));
        metrics::gauge!(m::CAMPAIGN_BACKOFF_SECONDS).set(pause.as_secs_f64());
        let (in_a_row, ran_ms, pause_ms) = (
            self.in_a_row,
            ran.as_millis() as u64,
            pause.as_millis() as u64,
        );
        if matches!(reason, DemotionReason::WorkFailed(_)) {
            tracing::warn!(
                token = token.0,
                holder = %self.holder,
                failed_terms_in_a_row = in_a_row,
                ran_ms,
                campaign_pause_ms = pause_ms,
                error = %why,
                "leader work failed and ended the term; this node waits before campaigning again"
            );
        } else {
            tracing::warn!(
                token = token.0,
                holder = %self.holder,
                failed_terms_in_a_row = in_a_row,
                ran_ms,
                campaign_pause_ms = pause_ms,
                ended_by = %reason,
                error = %why,
                "leader work failed during the term, which then ended: a failed term; this node waits before campaigning again"
            );
        }
    }

    fn reset(&mut self) {
        if self.in_a_row > 0 {
            self.in_a_row = 0;
            metrics::gauge!(m::FAILED_TERMS_IN_A_ROW).set(0.0);
            metrics::gauge!(m::CAMPAIGN_BACKOFF_SECONDS).set(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> DemotionReason {
        DemotionReason::WorkFailed("child: failed: the program exited (exit=3)".into())
    }

    /// Within `[unjittered, unjittered x (1 + JITTER))`.
    fn assert_jittered(got: Duration, unjittered_ms: u64) {
        let lo = Duration::from_millis(unjittered_ms);
        assert!(
            got >= lo && got < lo.mul_f64(1.0 + JITTER),
            "{got:?} not in [{lo:?}, +{JITTER})"
        );
    }

    #[test]
    fn restarts_double_up_to_the_cap_and_never_below_the_backoff() {
        let base = Duration::from_millis(1000);
        for (earlier, want_ms) in [(0, 1000), (1, 2000), (2, 4000), (4, 16_000), (5, 30_000)] {
            assert_jittered(restart_delay(base, earlier), want_ms);
        }
        assert_jittered(restart_delay(base, 1000), 30_000);
        // A backoff above the cap is kept as it is.
        assert_jittered(restart_delay(Duration::from_secs(45), 3), 45_000);
    }

    #[test]
    fn failed_terms_in_a_row_back_off_and_anything_else_resets() {
        let cfg = TermBackoffConfig {
            base_ms: 500,
            max_ms: 3000,
            reset_after_ms: 60_000,
        };
        let mut f = TermFailures::new(&cfg, "n1");
        let t = FenceToken(7);
        for want_ms in [500, 1000, 2000, 3000, 3000] {
            f.term_began();
            assert_jittered(f.term_ended(t, &failed(), false).pause, want_ms);
        }
        // A refused claim is the token source, not the work: no wait, nothing for the budget,
        // and the streak stands; so does a term that gave up because the budget was spent.
        let nothing = TermEnd {
            pause: Duration::ZERO,
            failure: None,
        };
        f.term_began();
        assert_eq!(f.term_ended(t, &failed(), true), nothing);
        f.term_began();
        assert_eq!(
            f.term_ended(t, &DemotionReason::FailureBudgetExhausted, false),
            nothing
        );
        assert_eq!(f.in_a_row, 5);
        // A term that ends any other way ends the streak.
        f.term_began();
        assert_eq!(
            f.term_ended(t, &DemotionReason::StepDown { successor: None }, false),
            nothing
        );
        f.term_began();
        let end = f.term_ended(t, &failed(), false);
        assert_jittered(end.pause, 500);
        assert_eq!(
            end.failure.as_deref(),
            Some("child: failed: the program exited (exit=3)"),
            "a failed term hands its error on, for the budget"
        );
    }

    /// Issue 43: a term counts as failed however it ended. Its work failed (and a `Restart`
    /// policy restarted it), then a lease-deadline demotion ended the term: the budget gets it,
    /// with the work's error and how the term ended. A failure `reset_after_ms` before the end
    /// is forgiven, and the next term starts clean.
    #[test]
    fn a_term_whose_work_failed_counts_however_it_ended() {
        let cfg = TermBackoffConfig {
            base_ms: 500,
            max_ms: 3000,
            reset_after_ms: 60_000,
        };
        let mut f = TermFailures::new(&cfg, "n1");
        let t = FenceToken(9);
        f.term_began();
        f.work_failed("child: failed: the program exited (exit=3)");
        let end = f.term_ended(t, &DemotionReason::LeaseDeadline, false);
        assert_jittered(end.pause, 500);
        assert_eq!(
            end.failure.as_deref(),
            Some(
                "child: failed: the program exited (exit=3) (then the term ended: lease-deadline)"
            )
        );
        assert_eq!(f.in_a_row, 1);
        // The next term starts without the last one's failure: a step-down ends the streak.
        f.term_began();
        let end = f.term_ended(t, &DemotionReason::StepDown { successor: None }, false);
        assert_eq!(end.failure, None);
        assert_eq!(f.in_a_row, 0);
        // A failure long enough before the end is forgiven.
        let mut f = TermFailures::new(
            &TermBackoffConfig {
                reset_after_ms: 0,
                ..cfg
            },
            "n1",
        );
        f.term_began();
        f.work_failed("child: failed: the program exited (exit=3)");
        std::thread::sleep(Duration::from_millis(5));
        let lost = DemotionReason::LeaseLost("gone".into());
        assert_eq!(f.term_ended(t, &lost, false).failure, None);
    }

    #[test]
    fn a_failure_after_a_long_healthy_term_starts_a_new_streak() {
        let cfg = TermBackoffConfig {
            base_ms: 500,
            max_ms: 3000,
            reset_after_ms: 0,
        };
        let mut f = TermFailures::new(&cfg, "n1");
        for _ in 0..4 {
            f.term_began();
            assert_jittered(f.term_ended(FenceToken(1), &failed(), false).pause, 500);
        }
    }

    #[test]
    fn a_zero_base_turns_the_term_backoff_off() {
        let cfg = TermBackoffConfig {
            base_ms: 0,
            max_ms: 0,
            reset_after_ms: 60_000,
        };
        let mut f = TermFailures::new(&cfg, "n1");
        f.term_began();
        assert_eq!(
            f.term_ended(FenceToken(1), &failed(), false).pause,
            Duration::ZERO
        );
        assert_eq!(f.in_a_row, 1, "still counted");
    }
}
