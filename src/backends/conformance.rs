//! The backend conformance suite: the behaviour every [`Elector`] must show, written once and run
//! against each backend on real servers (`tests/conformance.rs`).
//!
//! A backend is given as a factory `make(election, node_id)` that builds one candidate on the
//! election (lock key, lease row, ...) named `election`. Each check uses fresh election names, so
//! checks cannot see each other's leftovers, and closes every candidate it built, also on failure.
//! Every candidate keeps its own liveness (session) alive the way the node's elector actor does:
//! a renew loop calling [`Elector::renew`] every `ttl / 3`, while waiting as well as while leading
//! (etcd's candidacy keys ride on the session's lease).
//!
//! Each check returns `Err(description)` on a violation; none of them panics on a backend's answer.
//!
//! | check | what must hold |
//! | --- | --- |
//! | [`single_winner`] | of 3 candidates exactly one wins; the others stay waiting for 2 TTLs while it renews |
//! | [`waiters_take_over_after_lease_ends`] | the winner stops renewing (no resign): a waiter wins, not before the winner's last grant ran out, within about a TTL after, with a higher token |
//! | [`resign_hands_over`] | resign releases at once: a waiter wins in less than a TTL, with a higher token |
//! | [`tokens_strictly_increase_across_holders`] | over 6 hand-overs (resign, lease expiry, re-candidacy of the old leader) the tokens strictly increase and no win completes before the previous leader let go |
//! | [`lease_loss_surfaces_as_event`] | a holder that stopped renewing past its TTL gets `Err(LeaseLost)` from `renew`, whether or not someone else took over |
//! | [`campaign_is_cancellable`] | a waiting campaign dropped and followed by `close()` leaves no candidacy: it never becomes leader, the next candidate does |
//! | [`expiring_a_dead_holder_ends_only_its_lease`] | [`Elector::expire_dead_holder`] naming a node that does not hold the lease changes nothing (the holder keeps its term, its renewals succeed); naming the (silent) holder ends its lease: a waiter wins before that lease would have run out, with a higher token, and the old holder's renew says `LeaseLost` |
//!
//! With [`Options::ordered_tokens`] off (`redis-naive`, which has no fencing token) the token
//! comparisons are not made and the token check is skipped; everything else still applies.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{DeadHolderExpiry, Elector, ElectorError, ElectorResult, FenceToken, Grant, Win};

/// How a backend is expected to behave.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The lease TTL the factory configures (the granted TTL may be longer; etcd rounds up).
    pub ttl: Duration,
    /// Whether tokens strictly increase across holders (false only for `redis-naive`).
    pub ordered_tokens: bool,
}

impl Options {
    /// Options for a backend configured with lease TTL `ttl`, with ordered tokens required.
    pub fn new(ttl: Duration) -> Options {
        Options {
            ttl,
            ordered_tokens: true,
        }
    }
}

/// The checks, by name (for reports and selective runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// See [`single_winner`].
    SingleWinner,
    /// See [`waiters_take_over_after_lease_ends`].
    WaitersTakeOverAfterLeaseEnds,
    /// See [`resign_hands_over`].
    ResignHandsOver,
    /// See [`tokens_strictly_increase_across_holders`].
    TokensStrictlyIncreaseAcrossHolders,
    /// See [`lease_loss_surfaces_as_event`].
    LeaseLossSurfacesAsEvent,
    /// See [`campaign_is_cancellable`].
    CampaignIsCancellable,
    /// See [`expiring_a_dead_holder_ends_only_its_lease`].
    ExpiringADeadHolderEndsOnlyItsLease,
}

impl Check {
    /// Every check, in the order [`run_all`] runs them.
    pub const ALL: [Check; 7] = [
        Check::SingleWinner,
        Check::WaitersTakeOverAfterLeaseEnds,
        Check::ResignHandsOver,
        Check::TokensStrictlyIncreaseAcrossHolders,
        Check::LeaseLossSurfacesAsEvent,
        Check::CampaignIsCancellable,
        Check::ExpiringADeadHolderEndsOnlyItsLease,
    ];

    /// The snake_case name of the check's function, as printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            Check::SingleWinner => "single_winner",
            Check::WaitersTakeOverAfterLeaseEnds => "waiters_take_over_after_lease_ends",
            Check::ResignHandsOver => "resign_hands_over",
            Check::TokensStrictlyIncreaseAcrossHolders => "tokens_strictly_increase_across_holders",
            Check::LeaseLossSurfacesAsEvent => "lease_loss_surfaces_as_event",
            Check::CampaignIsCancellable => "campaign_is_cancellable",
            Check::ExpiringADeadHolderEndsOnlyItsLease => {
                "expiring_a_dead_holder_ends_only_its_lease"
            }
        }
    }
}

/// Runs every check in order; `Err` lists each failed check with its reason.
pub async fn run_all<F, Fut>(make: F, ttl: Duration) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    run_selected(&make, Options::new(ttl), &Check::ALL)
        .await
        .map(drop)
}

/// Runs the given checks in order (all of them, even after a failure). `Ok` has each check's
/// duration; `Err` names every failed check and why.
pub async fn run_selected<F, Fut>(
    make: &F,
    opts: Options,
    checks: &[Check],
) -> Result<Vec<(Check, Duration)>, String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    let mut done = Vec::new();
    let mut failures = Vec::new();
    for &check in checks {
        let t0 = Instant::now();
        let r = match check {
            Check::SingleWinner => single_winner(make, opts).await,
            Check::WaitersTakeOverAfterLeaseEnds => {
                waiters_take_over_after_lease_ends(make, opts).await
            }
            Check::ResignHandsOver => resign_hands_over(make, opts).await,
            Check::TokensStrictlyIncreaseAcrossHolders => {
                tokens_strictly_increase_across_holders(make, opts).await
            }
            Check::LeaseLossSurfacesAsEvent => lease_loss_surfaces_as_event(make, opts).await,
            Check::CampaignIsCancellable => campaign_is_cancellable(make, opts).await,
            Check::ExpiringADeadHolderEndsOnlyItsLease => {
                expiring_a_dead_holder_ends_only_its_lease(make, opts).await
            }
        };
        let took = t0.elapsed();
        match r {
            Ok(()) => {
                eprintln!("conformance: {} ok ({:.1?})", check.name(), took);
                done.push((check, took));
            }
            Err(e) => {
                eprintln!("conformance: {} FAILED ({:.1?}): {e}", check.name(), took);
                failures.push(format!("{}: {e}", check.name()));
            }
        }
    }
    if failures.is_empty() {
        Ok(done)
    } else {
        Err(failures.join("\n"))
    }
}

// ---------------------------------------------------------------------------------------------
// The harness: candidates with their own renew loops, campaigns as tasks reporting wins.

/// A campaign that returned.
struct Outcome {
    idx: usize,
    result: ElectorResult<Win>,
    /// When the campaign call returned (the earliest the candidate could act as leader).
    at: Instant,
}

struct Cand {
    id: String,
    e: Arc<dyn Elector>,
    renewer: Option<JoinHandle<()>>,
    /// The newest grant seen (from a win or a renewal): what the backend owes this candidate.
    last_grant: Arc<Mutex<Option<Grant>>>,
    /// Renewal failures, in order.
    renew_errors: Arc<Mutex<Vec<String>>>,
    campaign: Option<JoinHandle<()>>,
}

fn note_grant(slot: &Mutex<Option<Grant>>, g: Grant) {
    let mut cur = slot.lock().unwrap_or_else(|p| p.into_inner());
    if cur.is_none_or(|c| g.sent_at >= c.sent_at) {
        *cur = Some(g);
    }
}

/// A set of candidates on one election.
struct Field {
    check: &'static str,
    opts: Options,
    cands: Vec<Cand>,
    tx: mpsc::UnboundedSender<Outcome>,
    rx: mpsc::UnboundedReceiver<Outcome>,
}

impl Field {
    async fn new<F, Fut>(
        make: &F,
        check: &'static str,
        n: usize,
        opts: Options,
    ) -> Result<Field, String>
    where
        F: Fn(&str, &str) -> Fut,
        Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
    {
        let election = format!(
            "conformance-{check}-{:08x}",
            rand::thread_rng().gen::<u32>()
        );
        let (tx, rx) = mpsc::unbounded_channel();
        let mut field = Field {
            check,
            opts,
            cands: Vec::new(),
            tx,
            rx,
        };
        for i in 0..n {
            let id = format!("c{}", i + 1);
            match make(&election, &id).await {
                Ok(e) => {
                    field.cands.push(Cand {
                        id,
                        e,
                        renewer: None,
                        last_grant: Arc::new(Mutex::new(None)),
                        renew_errors: Arc::new(Mutex::new(Vec::new())),
                        campaign: None,
                    });
                    field.start_renewing(i);
                }
                Err(e) => {
                    field.teardown().await;
                    return Err(format!("building candidate {id} on {election}: {e}"));
                }
            }
        }
        Ok(field)
    }

    fn renew_every(&self) -> Duration {
        self.opts.ttl / 3
    }

    fn start_renewing(&mut self, i: usize) {
        let every = self.renew_every();
        let c = &mut self.cands[i];
        if let Some(h) = c.renewer.take() {
            h.abort();
        }
        let (e, grant, errors) = (c.e.clone(), c.last_grant.clone(), c.renew_errors.clone());
        c.renewer = Some(tokio::spawn(async move {
            loop {
                match e.renew().await {
                    Ok(Some(g)) => note_grant(&grant, g),
                    Ok(None) => {}
                    Err(err) => errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(err.to_string()),
                }
                tokio::time::sleep(every).await;
            }
        }));
    }

    /// Stops the renew loop (the candidate goes silent, as if paused or partitioned).
    fn stop_renewing(&mut self, i: usize) {
        if let Some(h) = self.cands[i].renewer.take() {
            h.abort();
        }
    }

    fn campaign(&mut self, i: usize) {
        self.campaign_after(i, Duration::ZERO)
    }

    /// Campaigns after `delay` (the elector actor's back-off after a voluntary hand-over, which
    /// keeps a polling backend from handing leadership straight back to the resigner).
    fn campaign_after(&mut self, i: usize, delay: Duration) {
        let (e, tx) = (self.cands[i].e.clone(), self.tx.clone());
        let grant = self.cands[i].last_grant.clone();
        if let Some(h) = self.cands[i].campaign.take() {
            h.abort();
        }
        self.cands[i].campaign = Some(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let result = e.campaign().await;
            let at = Instant::now();
            if let Ok(w) = &result {
                note_grant(&grant, w.grant);
            }
            let _ = tx.send(Outcome { idx: i, result, at });
        }));
    }

    /// Drops a campaign future (as the elector actor does when it gives up a candidacy).
    fn cancel_campaign(&mut self, i: usize) {
        if let Some(h) = self.cands[i].campaign.take() {
            h.abort();
        }
    }

    fn id(&self, i: usize) -> &str {
        &self.cands[i].id
    }

    /// Lets leader `w`'s lease lapse (silent, no resign), then rejoins it in the background as
    /// the actor would once the lease is surely gone (renew says `LeaseLost`, close, new
    /// session, campaign), its renew loop restarting with it. Returns when its last grant ran
    /// out: when it let go.
    async fn lapse_and_rejoin(&mut self, w: usize, opts: Options) -> Result<Instant, String> {
        tokio::time::sleep(opts.ttl / 3).await;
        self.stop_renewing(w);
        let g = self
            .last_grant(w)
            .ok_or_else(|| format!("{} has no grant", self.id(w)))?;
        let released_at = g.sent_at + g.ttl;
        let (e, until) = (self.cands[w].e.clone(), g.sent_at + g.ttl);
        let tx = self.tx.clone();
        let grant_slot = self.cands[w].last_grant.clone();
        // Rejoin in the background once the lease is surely gone, so the others'
        // takeover is what we observe next.
        self.cands[w].campaign = Some(tokio::spawn(async move {
            tokio::time::sleep_until((until + opts.ttl).into()).await;
            let _ = e.renew().await; // expected: LeaseLost
            let _ = e.close().await;
            let result = e.campaign().await;
            let at = Instant::now();
            if let Ok(w) = &result {
                note_grant(&grant_slot, w.grant);
            }
            let _ = tx.send(Outcome { idx: w, result, at });
        }));
        // Its renew loop restarts with the rejoin (waiters keep their session).
        let every = self.renew_every();
        let (e2, gs, errs) = (
            self.cands[w].e.clone(),
            self.cands[w].last_grant.clone(),
            self.cands[w].renew_errors.clone(),
        );
        self.cands[w].renewer = Some(tokio::spawn(async move {
            tokio::time::sleep_until((until + opts.ttl + every).into()).await;
            loop {
                match e2.renew().await {
                    Ok(Some(g)) => note_grant(&gs, g),
                    Ok(None) => {}
                    Err(err) => errs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(err.to_string()),
                }
                tokio::time::sleep(every).await;
            }
        }));
        Ok(released_at)
    }

    /// `asker` names `other` and a node that does not exist as dead while `w` holds the lease
    /// at `token`: nothing ends, nobody else wins, `w` still leads and its renewals go on.
    /// Returns `w`'s grant from a renewal since.
    async fn expire_non_holders(
        &mut self,
        w: usize,
        token: FenceToken,
        asker: usize,
        other: usize,
    ) -> Result<Grant, String> {
        let asked_at = Instant::now();
        let other_id = self.id(other).to_owned();
        for named in [other_id.as_str(), "no-such-node"] {
            match bounded(self.cands[asker].e.expire_dead_holder(named)).await {
                Ok(DeadHolderExpiry::NotEnded) => {}
                Ok(ended) => {
                    return Err(format!(
                        "{} holds the lease, yet expiring {named:?} (not the holder) answered {ended:?}",
                        self.id(w)
                    ))
                }
                Err(e) => return Err(format!("expiring {named:?} (not the holder) failed: {e}")),
            }
        }
        self.no_win(self.renew_every() * 2, "after expiring non-holders")
            .await?;
        match bounded(self.cands[w].e.confirm_leadership(self.id(w), token)).await {
            Ok(true) => {}
            other => {
                return Err(format!(
                    "after expiring non-holders, {} no longer leads at token {}: {other:?}",
                    self.id(w),
                    token
                ))
            }
        }
        let errs = self.renew_errors(w);
        if !errs.is_empty() {
            return Err(format!(
                "after expiring non-holders, the holder {}'s renewals failed: {errs:?}",
                self.id(w)
            ));
        }
        match self.last_grant(w) {
            Some(g) if g.sent_at > asked_at => Ok(g),
            _ => Err(format!(
                "after expiring non-holders, the holder {} got no renewal grant",
                self.id(w)
            )),
        }
    }

    fn last_grant(&self, i: usize) -> Option<Grant> {
        *self.cands[i]
            .last_grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn renew_errors(&self, i: usize) -> Vec<String> {
        self.cands[i]
            .renew_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The next win, within `within`. A failed campaign is a violation too (the servers are up).
    async fn next_win(
        &mut self,
        within: Duration,
        what: &str,
    ) -> Result<(usize, Win, Instant), String> {
        match tokio::time::timeout(within, self.rx.recv()).await {
            Ok(Some(Outcome { idx, result, at })) => match result {
                Ok(win) => Ok((idx, win, at)),
                Err(e) => Err(format!(
                    "{what}: the campaign of {} failed: {e}",
                    self.cands[idx].id
                )),
            },
            Ok(None) => Err(format!("{what}: campaign channel closed")),
            Err(_) => {
                let leader = self.leader_seen_by(0).await;
                Err(format!(
                    "{what}: nobody won within {within:.1?} (leader() says {leader})"
                ))
            }
        }
    }

    /// No campaign may return for `quiet`.
    async fn no_win(&mut self, quiet: Duration, what: &str) -> Result<(), String> {
        match tokio::time::timeout(quiet, self.rx.recv()).await {
            Err(_) => Ok(()),
            Ok(Some(Outcome { idx, result, .. })) => Err(format!(
                "{what}: {} returned from campaign while it should still wait: {}",
                self.cands[idx].id,
                match result {
                    Ok(w) => format!("won with token {}", w.token),
                    Err(e) => format!("error {e}"),
                }
            )),
            Ok(None) => Err(format!("{what}: campaign channel closed")),
        }
    }

    async fn leader_seen_by(&self, i: usize) -> String {
        match self.cands[i].e.leader().await {
            Ok(Some(l)) => format!("{:?}", l.node_id),
            Ok(None) => "no leader".into(),
            Err(e) => format!("error {e}"),
        }
    }

    /// Strictly-higher check, unless tokens are not ordered on this backend.
    fn check_higher(&self, new: FenceToken, old: FenceToken, what: &str) -> Result<(), String> {
        if self.opts.ordered_tokens && new <= old {
            return Err(format!(
                "{what}: the new holder's token {new} is not above the previous holder's {old}"
            ));
        }
        Ok(())
    }

    /// Stops every task and closes every candidate (bounded, so a dead backend cannot hang us).
    async fn teardown(&mut self) {
        for c in &mut self.cands {
            if let Some(h) = c.campaign.take() {
                h.abort();
            }
            if let Some(h) = c.renewer.take() {
                h.abort();
            }
        }
        for c in &self.cands {
            if let Err(e) = bounded(c.e.close()).await {
                eprintln!("conformance {}: closing {}: {e}", self.check, c.id);
            }
        }
    }
}

async fn bounded<T>(f: impl Future<Output = ElectorResult<T>>) -> ElectorResult<T> {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .unwrap_or_else(|_| Err(ElectorError::Unavailable("no answer within 5 s".into())))
}

/// Runs `body` on a fresh field and always tears it down.
async fn with_field<F, Fut, B>(
    make: &F,
    check: &'static str,
    n: usize,
    opts: Options,
    body: B,
) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
    B: for<'a> FnOnce(&'a mut Field) -> futures::future::BoxFuture<'a, Result<(), String>>,
{
    let mut field = Field::new(make, check, n, opts).await?;
    let r = body(&mut field).await;
    field.teardown().await;
    r
}

/// How long the first win may take (a cold connection, a first session grant).
fn first_win_within(opts: Options) -> Duration {
    opts.ttl * 3 + Duration::from_secs(10)
}

/// How long after the holder's last grant ran out a waiter may take to win: the backend's expiry
/// granularity (etcd checks leases every 500 ms), plus a waiter's poll interval, plus slack.
fn takeover_slack(opts: Options) -> Duration {
    opts.ttl + Duration::from_secs(3)
}

/// How early, by our monotonic clock, a waiter's win may complete before the holder's last grant
/// ran out: zero in principle (the backend starts its timer after we sent), a few ms for clocks.
const EARLY_TOLERANCE: Duration = Duration::from_millis(25);

// ---------------------------------------------------------------------------------------------
// The checks.

/// Three candidates: exactly one wins; the others keep waiting for two TTLs while the winner
/// renews (its renewals succeed), and the waiters see it as the leader.
pub async fn single_winner<F, Fut>(make: &F, opts: Options) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    with_field(make, "single_winner", 3, opts, |f| {
        Box::pin(async move {
            for i in 0..3 {
                f.campaign(i);
            }
            let (w, win, at) = f.next_win(first_win_within(opts), "first election").await?;
            f.no_win(opts.ttl * 2, "while the winner renews").await?;
            let errs = f.renew_errors(w);
            if !errs.is_empty() {
                return Err(format!(
                    "the winner {} had renewal failures while leading: {errs:?}",
                    f.id(w)
                ));
            }
            match f.last_grant(w) {
                Some(g) if g.sent_at > at => {}
                _ => {
                    return Err(format!(
                        "the winner {} (token {}) got no renewal grant in 2 TTLs of leading",
                        f.id(w),
                        win.token
                    ))
                }
            }
            for i in (0..3).filter(|&i| i != w) {
                let errs = f.renew_errors(i);
                if !errs.is_empty() {
                    return Err(format!(
                        "waiter {} could not keep its session: {errs:?}",
                        f.id(i)
                    ));
                }
                match f.cands[i].e.leader().await {
                    Ok(Some(l)) if l.node_id == f.id(w) => {}
                    other => {
                        return Err(format!(
                            "waiter {} sees leader {other:?}, expected {}",
                            f.id(i),
                            f.id(w)
                        ))
                    }
                }
            }
            Ok(())
        })
    })
    .await
}

/// The winner stops renewing without resigning (a crash, a pause): a waiter wins — not before
/// the winner's last grant ran out, and within about a TTL after it — with a higher token.
pub async fn waiters_take_over_after_lease_ends<F, Fut>(
    make: &F,
    opts: Options,
) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    with_field(make, "waiters_take_over_after_lease_ends", 3, opts, |f| {
        Box::pin(async move {
            for i in 0..3 {
                f.campaign(i);
            }
            let (w, win, _) = f.next_win(first_win_within(opts), "first election").await?;
            // Lead for a while (at least one renewal), then go silent.
            tokio::time::sleep(opts.ttl / 2).await;
            f.stop_renewing(w);
            let last = f
                .last_grant(w)
                .ok_or_else(|| format!("the winner {} has no grant at all", f.id(w)))?;
            let expires = last.sent_at + last.ttl;
            let within = (expires + takeover_slack(opts)).saturating_duration_since(Instant::now());
            let (n, next, at) = f.next_win(within, "takeover after the lease ended").await?;
            if n == w {
                return Err(format!("{} won again although it was not campaigning", f.id(w)));
            }
            if at + EARLY_TOLERANCE < expires {
                return Err(format!(
                    "{} won {:.0?} before the silent holder {}'s granted lease ran out: two leaders",
                    f.id(n),
                    expires - at,
                    f.id(w)
                ));
            }
            f.check_higher(next.token, win.token, "takeover")?;
            Ok(())
        })
    })
    .await
}

/// Resign releases at once: a waiter wins in less than a TTL (no expiry needed), with a higher token.
pub async fn resign_hands_over<F, Fut>(make: &F, opts: Options) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    with_field(make, "resign_hands_over", 3, opts, |f| {
        Box::pin(async move {
            for i in 0..3 {
                f.campaign(i);
            }
            let (w, win, _) = f.next_win(first_win_within(opts), "first election").await?;
            tokio::time::sleep(opts.ttl / 3).await;
            let sent = Instant::now();
            bounded(f.cands[w].e.resign(None))
                .await
                .map_err(|e| format!("{} could not resign: {e}", f.id(w)))?;
            let (n, next, at) = f
                .next_win(opts.ttl, "hand-over after resign")
                .await
                .map_err(|e| {
                    format!("{e} — a resign must release the lease, not leave it to expire")
                })?;
            if n == w {
                return Err(format!(
                    "{} won again although it resigned and was not campaigning",
                    f.id(w)
                ));
            }
            if at < sent {
                return Err(format!(
                    "{} won before {} resigned: two leaders",
                    f.id(n),
                    f.id(w)
                ));
            }
            f.check_higher(next.token, win.token, "hand-over by resign")?;
            Ok(())
        })
    })
    .await
}

/// Six hand-overs among three candidates — by resign, by lease expiry, and with the old leader
/// campaigning again each time — and the tokens strictly increase, with no win completing before
/// the previous leader let go.
pub async fn tokens_strictly_increase_across_holders<F, Fut>(
    make: &F,
    opts: Options,
) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    with_field(make, "tokens_strictly_increase_across_holders", 3, opts, |f| {
        Box::pin(async move {
            for i in 0..3 {
                f.campaign(i);
            }
            let mut history: Vec<(String, FenceToken)> = Vec::new();
            // When the current leader let go: its resign was sent, or its last grant ran out.
            let mut released_at: Option<Instant> = None;
            let rounds = 7;
            for round in 0..rounds {
                let within = if round == 0 {
                    first_win_within(opts)
                } else {
                    opts.ttl + takeover_slack(opts)
                };
                let (w, win, at) = f.next_win(within, &format!("election {}", round + 1)).await?;
                if let Some(r) = released_at {
                    if at + EARLY_TOLERANCE < r {
                        return Err(format!(
                            "round {}: {} won {:.0?} before the previous leader let go",
                            round + 1,
                            f.id(w),
                            r - at
                        ));
                    }
                }
                if let Some((prev_id, prev)) = history.last() {
                    if win.token <= *prev {
                        return Err(format!(
                            "round {}: {} won with token {} after {prev_id} held {prev} (history {history:?})",
                            round + 1,
                            f.id(w),
                            win.token
                        ));
                    }
                }
                history.push((f.id(w).to_owned(), win.token));
                if round + 1 == rounds {
                    break;
                }
                if round == 3 {
                    released_at = Some(f.lapse_and_rejoin(w, opts).await?);
                } else {
                    tokio::time::sleep(opts.ttl / 10).await;
                    released_at = Some(Instant::now());
                    bounded(f.cands[w].e.resign(None))
                        .await
                        .map_err(|e| format!("round {}: {} could not resign: {e}", round + 1, f.id(w)))?;
                    f.campaign_after(w, opts.ttl / 4);
                }
            }
            eprintln!("conformance: token history {history:?}");
            let mut holders: Vec<&str> = history.iter().map(|(h, _)| h.as_str()).collect();
            holders.sort_unstable();
            holders.dedup();
            if holders.len() < 2 {
                return Err(format!(
                    "leadership never changed hands over {rounds} hand-overs: {history:?}"
                ));
            }
            Ok(())
        })
    })
    .await
}

/// A holder that stopped renewing past its TTL learns it from `renew`: `Err(LeaseLost)` — both
/// when another candidate has taken over and when nobody has.
pub async fn lease_loss_surfaces_as_event<F, Fut>(make: &F, opts: Options) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    // 1. Taken over by a waiter.
    with_field(make, "lease_loss_surfaces_as_event", 2, opts, |f| {
        Box::pin(async move {
            for i in 0..2 {
                f.campaign(i);
            }
            let (w, _, _) = f.next_win(first_win_within(opts), "first election").await?;
            f.stop_renewing(w);
            let g = f.last_grant(w).ok_or("the winner has no grant")?;
            let within = (g.sent_at + g.ttl + takeover_slack(opts))
                .saturating_duration_since(Instant::now());
            f.next_win(within, "takeover").await?;
            expect_lease_lost(&*f.cands[w].e, f.id(w), "after another candidate took over").await
        })
    })
    .await?;
    // 2. Lapsed with nobody waiting.
    with_field(make, "lease_loss_surfaces_as_event", 1, opts, |f| {
        Box::pin(async move {
            f.campaign(0);
            f.next_win(first_win_within(opts), "sole candidate").await?;
            f.stop_renewing(0);
            let g = f.last_grant(0).ok_or("the winner has no grant")?;
            // Past the TTL, plus the backend's expiry granularity.
            tokio::time::sleep_until(
                (g.sent_at + g.ttl + opts.ttl / 2 + Duration::from_secs(1)).into(),
            )
            .await;
            expect_lease_lost(
                &*f.cands[0].e,
                f.id(0),
                "after its lease lapsed with nobody waiting",
            )
            .await
        })
    })
    .await
}

async fn expect_lease_lost(e: &dyn Elector, id: &str, when: &str) -> Result<(), String> {
    match bounded(e.renew()).await {
        Err(ElectorError::LeaseLost(_)) => Ok(()),
        Ok(Some(g)) => Err(format!(
            "{id}'s renew {when} succeeded (ttl {:?}): a lapsed lease was revived",
            g.ttl
        )),
        Ok(None) => Err(format!(
            "{id}'s renew {when} said \"no session\" instead of LeaseLost: the loss is not surfaced"
        )),
        Err(other) => Err(format!(
            "{id}'s renew {when} failed with {other}, not LeaseLost"
        )),
    }
}

/// A waiting campaign is dropped and `close()` called: that candidate never becomes leader
/// afterwards; when the leader resigns, the next live candidate wins.
pub async fn campaign_is_cancellable<F, Fut>(make: &F, opts: Options) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    with_field(make, "campaign_is_cancellable", 3, opts, |f| {
        Box::pin(async move {
            let (a, b, c) = (0, 1, 2);
            f.campaign(a);
            let (w, _, _) = f.next_win(first_win_within(opts), "first election").await?;
            if w != a {
                return Err(format!("expected the only candidate {} to win", f.id(a)));
            }
            f.campaign(b);
            tokio::time::sleep(opts.ttl / 2).await; // b is surely queued / polling by now
            f.cancel_campaign(b);
            f.stop_renewing(b);
            bounded(f.cands[b].e.close())
                .await
                .map_err(|e| format!("close() of the cancelled candidate failed: {e}"))?;
            f.campaign(c);
            tokio::time::sleep(opts.ttl / 4).await;
            bounded(f.cands[a].e.resign(None))
                .await
                .map_err(|e| format!("{} could not resign: {e}", f.id(a)))?;
            let (n, _, _) = f
                .next_win(
                    opts.ttl + takeover_slack(opts),
                    "hand-over past a cancelled candidacy",
                )
                .await
                .map_err(|e| format!("{e} — a withdrawn candidacy may still be queued ahead"))?;
            if n != c {
                return Err(format!("{} won, expected {}", f.id(n), f.id(c)));
            }
            // For the next TTL and a half, the cancelled candidate must never show up as leader.
            let until = Instant::now() + opts.ttl + opts.ttl / 2;
            while Instant::now() < until {
                if let Ok(Some(l)) = f.cands[c].e.leader().await {
                    if l.node_id == f.id(b) {
                        return Err(format!(
                            "the cancelled and closed candidate {} became leader",
                            f.id(b)
                        ));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let errs = f.renew_errors(c);
            if !errs.is_empty() {
                return Err(format!(
                    "the new leader {} lost renewals: {errs:?}",
                    f.id(c)
                ));
            }
            Ok(())
        })
    })
    .await
}

/// A failure detector's call ([`Elector::expire_dead_holder`]) is a compare-and-delete on the
/// lease still naming the dead node. Naming a node that does not hold it (a waiter, a stranger)
/// ends nothing: the holder keeps its term (its leadership confirmed at its token) and its
/// renewals go on succeeding, nobody else wins. Naming the holder, once it has gone silent,
/// ends its lease: a waiter wins before that lease would have run out (so not by expiry), with
/// a higher token, and the old holder's next renew says `LeaseLost`. The waiters' campaigns are
/// woken when the backend says a waiting campaign polls, as the elector actor does.
pub async fn expiring_a_dead_holder_ends_only_its_lease<F, Fut>(
    make: &F,
    opts: Options,
) -> Result<(), String>
where
    F: Fn(&str, &str) -> Fut,
    Fut: Future<Output = ElectorResult<Arc<dyn Elector>>>,
{
    with_field(make, "expiring_a_dead_holder_ends_only_its_lease", 3, opts, |f| {
        Box::pin(async move {
            for i in 0..3 {
                f.campaign(i);
            }
            let (w, win, _) = f.next_win(first_win_within(opts), "first election").await?;
            let waiters: Vec<usize> = (0..3).filter(|&i| i != w).collect();
            let (asker, other) = (waiters[0], waiters[1]);
            tokio::time::sleep(opts.ttl / 4).await; // the waiters are surely queued / polling

            // 1. Naming nodes that do not hold the lease changes nothing.
            let g = f.expire_non_holders(w, win.token, asker, other).await?;

            // 2. The holder goes silent (dead, or paused); naming it ends its lease now.
            f.stop_renewing(w);
            let expires = g.sent_at + g.ttl;
            let expiry = bounded(f.cands[asker].e.expire_dead_holder(f.id(w)))
                .await
                .map_err(|e| format!("expiring the holder {} failed: {e}", f.id(w)))?;
            if !expiry.ended() {
                return Err(format!(
                    "expiring the holder {} ended nothing ({expiry:?}): its lease would be waited out",
                    f.id(w)
                ));
            }
            if expiry == DeadHolderExpiry::EndedCampaignPolls {
                for &i in &waiters {
                    f.cands[i].e.wake_campaign();
                }
            }
            let within = expires.saturating_duration_since(Instant::now());
            let (n, next, at) = f
                .next_win(within, "takeover after the holder's lease was ended")
                .await
                .map_err(|e| format!("{e} — the holder's lease was not ended early"))?;
            if n == w {
                return Err(format!("{} won again although it was not campaigning", f.id(w)));
            }
            if at + EARLY_TOLERANCE >= expires {
                return Err(format!(
                    "{} won only when the ended holder's lease would have run out anyway",
                    f.id(n)
                ));
            }
            f.check_higher(next.token, win.token, "takeover after expiring the holder")?;
            expect_lease_lost(&*f.cands[w].e, f.id(w), "after its lease was ended as dead").await
        })
    })
    .await
}
