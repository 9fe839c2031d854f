//! The sequencer actor: a term's lifecycle (the claim, checkpoint, stop) and window mode's
//! extensions; durable mode's commits run in its commit loop.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc;

use super::commit_loop::{CommitLoop, LoopMsg};
use super::intake::Intake;
use super::outcome::{log_unavailable_edge, outcome_of};
use super::window::{Window, EXTEND_RETRY};
use super::{CommitLimits, CommitOutcome, SequencerMsg, SEQUENCE_RESOURCE, SEQ_IDLE_CLOSE};
use crate::metrics as m;
use crate::work::WorkContext;

pub struct SequencerState {
    ctx: WorkContext,
    intake: Arc<Intake>,
    /// Durable mode: the commit loop's line (see `commit_loop`); dropped when the term ends,
    /// which is how the loop learns it.
    commit_loop: Option<mpsc::UnboundedSender<LoopMsg>>,
    /// Window mode's shared state (`None` in durable mode).
    window: Option<Arc<Window>>,
    /// Window mode: the bound being written (at most one at a time).
    extending: Option<i64>,
    /// Window mode: a retry of a failed extension is armed.
    extend_retry_armed: bool,
    /// Window mode: this term holds one of the node's warm slots
    /// ([`crate::work::Fence::take_warm_slot`]): its connection stays open while idle. Without
    /// one it closes after [`SEQ_IDLE_CLOSE`] idle. (In durable mode the commit loop holds it.)
    warm: bool,
    /// Window mode: when the last extension was answered.
    last_answered: Instant,
    /// An [`SequencerMsg::IdleCheck`] is on its way (at most one at a time).
    idle_check_armed: bool,
    /// Window mode: since when extensions have failed for want of the database (logged once at
    /// the first failure and once when one succeeds again, not once per write).
    failing_since: Option<Instant>,
    /// Window mode: checkpoints waiting for the extension in flight.
    draining: Option<Vec<RpcReplyPort<()>>>,
}

pub struct Sequencer;

#[async_trait]
impl Actor for Sequencer {
    type Msg = SequencerMsg;
    type State = SequencerState;
    type Arguments = (WorkContext, CommitLimits, Arc<Intake>, Option<Arc<Window>>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, limits, intake, window): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if let Some(w) = &window {
            let _ = w.actor.set(myself.clone());
        }
        let (fence, token) = (ctx.fence.clone(), ctx.token);
        // A warm slot: the node's first WARM_SEQ_PIPES (8) terms take one, so an unsharded node
        // (and any node leading at most 8 shards) behaves as it always did, failover included;
        // beyond that a node's idle shards hold no connection each (at K = 1024 they held
        // 1024 and exhausted PostgreSQL's max_connections). A bound per node rather than a
        // rule on K: K is not what costs connections, the shards a node leads at once are.
        let mut warm = fence.take_warm_slot();
        let commit_loop = window.is_none().then(|| {
            // Spawned from here, its connection's I/O runs where the actor does (see the module
            // doc). It holds the warm slot from now on.
            let (tx, rx) = mpsc::unbounded_channel();
            let me = myself.clone();
            CommitLoop::new(ctx.clone(), limits, intake.clone(), me, rx, warm).spawn();
            warm = false;
            tx
        });
        tokio::spawn(async move {
            let res = fence.seq_claim(SEQUENCE_RESOURCE, token).await;
            let _ = myself.cast(SequencerMsg::Claimed(res));
        });
        ctx.trace.step(
            "sequencer",
            "started",
            Some(ctx.token),
            if window.is_some() { "mode=window" } else { "" },
        );
        Ok(SequencerState {
            ctx,
            intake,
            commit_loop,
            window,
            extending: None,
            extend_retry_armed: false,
            warm,
            last_answered: Instant::now(),
            idle_check_armed: false,
            failing_since: None,
            draining: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.intake.close();
        if let Some(w) = &state.window {
            w.close();
        }
        // The term's connection does not outlive it: the commit loop's closes when its last
        // commit is answered (dropping its line tells it), one idle in the pool closes now. (A
        // node that kept one per shard it had ever led held up to K connections whatever it
        // led now.)
        state.commit_loop = None;
        state.ctx.fence.close_idle_seq_pipe();
        if state.warm {
            state.warm = false;
            state.ctx.fence.release_warm_slot();
        }
        state
            .ctx
            .trace
            .step("sequencer", "stopped", Some(state.ctx.token), "");
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SequencerMsg::Claimed(Ok(last_seq)) => state.claimed(&myself, last_seq),
            SequencerMsg::Claimed(Err(e)) => {
                // Without a claim this term can never issue an ID: end it, the supervisor demotes.
                tracing::warn!(token = state.ctx.token.0, error = %e, "sequencer: claiming the sequence failed; ending the term");
                state.ctx.trace.step(
                    "sequencer",
                    "claim-failed",
                    Some(state.ctx.token),
                    &e.to_string(),
                );
                myself.stop(Some(format!("sequence claim failed: {e}")));
            }
            SequencerMsg::IdleCheck => state.idle_check(&myself),
            SequencerMsg::Extend => {
                state.extend_retry_armed = false;
                state.maybe_extend(&myself);
            }
            SequencerMsg::Extended { outcome, hi } => state.extended(&myself, outcome, hi),
            SequencerMsg::Checkpoint(reply) => state.checkpoint(reply),
        }
        Ok(())
    }
}

impl SequencerState {
    /// The claim landed: everything up to `last_seq` is committed. Window mode serves above it
    /// once its own bound is accepted; durable mode's commit loop starts cutting ranges there.
    fn claimed(&mut self, myself: &ActorRef<SequencerMsg>, last_seq: i64) {
        self.ctx.trace.step(
            "sequencer",
            "claimed",
            Some(self.ctx.token),
            &format!("last_seq={last_seq}"),
        );
        // Everything up to last_seq is committed (the claim itself went through the fence).
        self.ctx
            .leadership
            .set_committed_seq(self.ctx.token, last_seq);
        if let Some(w) = &self.window {
            // In window mode last_seq is the highest bound any term persisted: this
            // term serves nothing at or below it, and nothing above it until its own
            // bound is accepted.
            w.next.store(last_seq + 1, Ordering::SeqCst);
            w.bound.store(last_seq, Ordering::SeqCst);
            w.claimed.store(true, Ordering::SeqCst);
            w.moved.notify_waiters();
            self.maybe_extend(myself);
        } else if let Some(commit_loop) = &self.commit_loop {
            let _ = commit_loop.send(LoopMsg::Claimed(last_seq));
        }
    }

    /// [`SequencerMsg::IdleCheck`]: closes the idle connection if nothing was answered for
    /// [`SEQ_IDLE_CLOSE`], else looks again later.
    fn idle_check(&mut self, myself: &ActorRef<SequencerMsg>) {
        self.idle_check_armed = false;
        if self.warm || self.extending.is_some() {
            // Busy: the commit's answer looks again when it goes idle.
            return;
        }
        if self.last_answered.elapsed() >= SEQ_IDLE_CLOSE {
            if self.ctx.fence.close_idle_seq_pipe() {
                self.ctx
                    .trace
                    .step("sequencer", "idle-close", Some(self.ctx.token), "");
            }
        } else {
            self.idle(myself);
        }
    }

    /// Window mode: the fenced write of the bound `hi` ended. Durable: the bound moves and the
    /// callers waiting above the old one are woken; fenced out: the term ends; unavailable: the
    /// write is tried again after [`EXTEND_RETRY`].
    fn extended(&mut self, myself: &ActorRef<SequencerMsg>, outcome: CommitOutcome, hi: i64) {
        self.extending = None;
        log_unavailable_edge(&mut self.failing_since, self.ctx.token, &outcome, true);
        match outcome {
            CommitOutcome::Durable => {
                if let Some(w) = &self.window {
                    // Published before any ID under it is answered, like a group
                    // commit's end: a read never trails an acknowledged ID.
                    self.ctx.leadership.set_committed_seq(self.ctx.token, hi);
                    w.bound.store(hi, Ordering::SeqCst);
                    w.moved.notify_waiters();
                }
            }
            CommitOutcome::FencedOut(why) => {
                myself.stop(Some(why));
                return;
            }
            CommitOutcome::Unavailable(_) => {
                // The IDs left below the bound are still served; try again shortly.
                if !self.extend_retry_armed {
                    self.extend_retry_armed = true;
                    let me = myself.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(EXTEND_RETRY).await;
                        let _ = me.cast(SequencerMsg::Extend);
                    });
                }
            }
        }
        self.last_answered = Instant::now();
        if self.drained() {
            return;
        }
        self.maybe_extend(myself);
        if self.extending.is_none() {
            self.idle(myself);
        }
    }

    /// A checkpoint: stop taking requests, and reply once nothing is in flight.
    fn checkpoint(&mut self, reply: RpcReplyPort<()>) {
        // Every issued ID is already durable (window mode: below a durable bound);
        // quiescing is all a checkpoint needs here.
        self.intake.close();
        if let Some(w) = &self.window {
            w.close();
        }
        if let Some(commit_loop) = &self.commit_loop {
            // Durable mode: the loop replies once its commits in flight are answered.
            if let Err(mpsc::error::SendError(LoopMsg::Drain(reply))) =
                commit_loop.send(LoopMsg::Drain(reply))
            {
                let _ = reply.send(());
            }
            return;
        }
        let busy = self.extending.is_some();
        let waiters = self.draining.get_or_insert_with(Vec::new);
        if busy {
            waiters.push(reply);
        } else {
            let _ = reply.send(());
        }
    }

    /// Window mode, nothing in flight, the connection back in its pool: a sequencer with a warm
    /// slot keeps it there, one without takes a slot if one has come free since, or else looks
    /// again [`SEQ_IDLE_CLOSE`] after the last answer whether it is still idle, and closes it
    /// then.
    fn idle(&mut self, myself: &ActorRef<SequencerMsg>) {
        if self.warm || self.idle_check_armed {
            return;
        }
        if self.ctx.fence.take_warm_slot() {
            self.warm = true;
            return;
        }
        self.idle_check_armed = true;
        let (me, at) = (myself.clone(), self.last_answered + SEQ_IDLE_CLOSE);
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let _ = me.cast(SequencerMsg::IdleCheck);
        });
    }

    /// While draining (a checkpoint came): answers the checkpoint once nothing is in flight.
    /// True when draining, so the caller starts nothing new.
    fn drained(&mut self) -> bool {
        let idle = self.extending.is_none();
        match self.draining.as_mut() {
            Some(waiters) => {
                if idle {
                    for w in waiters.drain(..) {
                        let _ = w.send(());
                    }
                }
                true
            }
            None => false,
        }
    }

    /// Window mode: writes the next bound through the fence if fewer than half a window of IDs
    /// is left below the current one (or callers already wait above it), unless a write or its
    /// retry is pending. When there is nothing to do it lets callers ask again.
    fn maybe_extend(&mut self, myself: &ActorRef<SequencerMsg>) {
        let Some(w) = self.window.clone() else { return };
        if !w.claimed.load(Ordering::SeqCst)
            || self.extending.is_some()
            || self.extend_retry_armed
            || self.draining.is_some()
        {
            // What is pending brings the actor back here; callers need not ask meanwhile.
            return;
        }
        let bound = w.bound.load(Ordering::SeqCst);
        let low = |w: &Window| bound - (w.next.load(Ordering::SeqCst) - 1) < w.low_water();
        if !low(&w) {
            w.extend_asked.store(false, Ordering::SeqCst);
            // A caller may have taken IDs between the look and the store, and seen the flag
            // still set: look once more now that callers will ask again.
            if !low(&w) {
                return;
            }
            w.extend_asked.store(true, Ordering::SeqCst);
        }
        let (lo, hi) = (bound + 1, bound + w.settings.ids);
        self.extending = Some(hi);
        let (fence, token, me) = (self.ctx.fence.clone(), self.ctx.token, myself.clone());
        let sent = Instant::now();
        tokio::spawn(async move {
            let res = match fence.seq_pipe(SEQUENCE_RESOURCE).await {
                Ok(pipe) => Arc::new(pipe).send_commit(token, lo, hi).await,
                Err(e) => Err(e),
            };
            metrics::histogram!(m::SEQ_COMMIT_SECONDS).record(sent.elapsed().as_secs_f64());
            metrics::histogram!(m::SEQ_BATCH_IDS).record((hi - lo + 1) as f64);
            let outcome = outcome_of(&res);
            let _ = me.cast(SequencerMsg::Extended { outcome, hi });
        });
    }
}
