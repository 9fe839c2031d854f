//! The LeaseWatchdog: holds the deadline by which this node must have stopped acting, on the
//! monotonic clock, and tells the supervisor the moment it passes without a renewal.
//!
//! The deadline comes from the Elector: `sent_at(renewal request) + granted TTL - safety margin`,
//! converted to real time through the node's clock-rate model. Wall time never enters.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::actors::messages::{SupervisorMsg, WatchdogMsg};
use crate::actors::DemotionReason;
use crate::backends::FenceToken;
use crate::leadership::Leadership;
use crate::trace::ActorTrace;

pub struct WatchdogState {
    supervisor: ActorRef<SupervisorMsg>,
    trace: ActorTrace,
    /// Where the deadline is published (this actor is its only writer).
    leadership: Arc<Leadership>,
    term: Option<(FenceToken, Instant, Instant)>,
    generation: u64,
}

pub struct LeaseWatchdog;

#[async_trait]
impl Actor for LeaseWatchdog {
    type Msg = WatchdogMsg;
    type State = WatchdogState;
    type Arguments = (ActorRef<SupervisorMsg>, ActorTrace, Arc<Leadership>);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (supervisor, trace, leadership): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(WatchdogState {
            supervisor,
            trace,
            leadership,
            term: None,
            generation: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WatchdogMsg::Arm {
                token,
                deadline,
                sent_at,
            } => {
                state.trace.step(
                    "watchdog",
                    "armed",
                    Some(token),
                    &format!(
                        "in_ms={}",
                        deadline
                            .saturating_duration_since(Instant::now())
                            .as_millis()
                    ),
                );
                state.set(&myself, token, deadline, sent_at);
            }
            WatchdogMsg::Extend {
                token,
                deadline,
                sent_at,
            } => {
                if state.term.map(|(t, _, _)| t) == Some(token) {
                    state.set(&myself, token, deadline, sent_at);
                }
            }
            WatchdogMsg::Disarm => {
                if let Some((token, _, _)) = state.term {
                    state.leadership.set_deadline(token, None);
                }
                state.term = None;
                state.generation += 1;
            }
            WatchdogMsg::Fire { generation } => {
                if generation != state.generation {
                    return Ok(());
                }
                if let Some((token, deadline, sent_at)) = state.term {
                    if Instant::now() >= deadline {
                        state
                            .trace
                            .step("watchdog", "deadline-passed", Some(token), "");
                        state.term = None;
                        state.leadership.set_deadline(token, None);
                        let _ = state.supervisor.cast(SupervisorMsg::Demoted {
                            token: Some(token),
                            reason: DemotionReason::LeaseDeadline,
                        });
                    } else {
                        state.set(&myself, token, deadline, sent_at);
                    }
                }
            }
        }
        Ok(())
    }
}

impl WatchdogState {
    fn set(
        &mut self,
        myself: &ActorRef<WatchdogMsg>,
        token: FenceToken,
        deadline: Instant,
        sent_at: Instant,
    ) {
        self.generation += 1;
        self.term = Some((token, deadline, sent_at));
        self.leadership
            .set_deadline(token, Some((deadline, sent_at)));
        let (generation, me) = (self.generation, myself.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline.into()).await;
            let _ = me.cast(WatchdogMsg::Fire { generation });
        });
    }
}
