//! The Detector actor: one SWIM member ([`foca`]) per node, its UDP socket and its timers
//! (see [`crate::detector`] for what it decides and why).
//!
//! * A reader task owns the socket's receiving side and the [`Opener`]: it drops every datagram
//!   that is malformed, from a stranger, stale, forged or replayed *before* anything is decoded,
//!   counts the drop, and casts only authenticated payloads to the actor, at most
//!   [`MAX_QUEUED`] at a time (more are dropped as `overload`): memory stays bounded however
//!   fast datagrams arrive, and a flood cannot queue work ahead of the member's timers.
//! * The actor owns the member: every datagram, timer and announce goes through it, and after
//!   each it sends what foca asked to send (non-blocking: a full socket drops the datagram, as
//!   the network could), schedules its timers with `send_after`, and turns its notifications
//!   into [`PeerEvent`]s and the shared view.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use foca::{AccumulatingRuntime, BincodeCodec, Foca, NoCustomBroadcast, OwnedNotification, Timer};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use rand09::SeedableRng;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

use crate::actors::{PeerEvent, PeerEvents};
use crate::config::{DetectorConfig, NodeConfig, Secret};
use crate::detector::wire::{Dropped, Opener, Sealer, MAX_DATAGRAM};
use crate::detector::{DetectorError, DetectorView, MemberId, MemberView, SharedView};
use crate::metrics as m;
use crate::peer_auth::{now_unix_ms, PeerAuth, MIN_SECRET_BYTES};

/// Authenticated datagrams waiting for the actor, at most.
pub const MAX_QUEUED: usize = 256;
/// How often members not (or no longer) in the group are announced to: a late starter, a
/// restarted member or a healed partition joins within this.
const REANNOUNCE: Duration = Duration::from_secs(1);

/// bincode as foca's codec, capped: no datagram decodes to more than a datagram's size.
type Codec = BincodeCodec<
    bincode::config::Configuration<
        bincode::config::LittleEndian,
        bincode::config::Varint,
        bincode::config::Limit<MAX_DATAGRAM>,
    >,
>;
type Member = Foca<MemberId, Codec, rand09::rngs::SmallRng, NoCustomBroadcast>;

/// The detector actor's mailbox.
pub enum DetectorMsg {
    /// An authenticated payload from the reader task.
    Datagram(Vec<u8>),
    /// A timer foca asked for.
    Timer(Timer<MemberId>),
    /// Announce to the configured members not in the group.
    Announce,
}

/// What the detector starts with (built by [`start`]).
pub struct DetectorArgs {
    me: MemberId,
    peers: BTreeMap<String, SocketAddr>,
    socket: Arc<UdpSocket>,
    sealer: Sealer,
    opener: Opener,
    config: foca::Config,
    view: SharedView,
    events: PeerEvents,
}

/// The SWIM member and everything it sends through.
pub struct DetectorState {
    member: Member,
    runtime: AccumulatingRuntime<MemberId>,
    peers: BTreeMap<String, SocketAddr>,
    socket: Arc<UdpSocket>,
    sealer: Sealer,
    view: SharedView,
    events: PeerEvents,
    queued: Arc<AtomicUsize>,
    reader: JoinHandle<()>,
    confirmed_dead: BTreeSet<String>,
}

/// The actor that owns the SWIM member.
pub struct DetectorActor;

#[async_trait]
impl Actor for DetectorActor {
    type Msg = DetectorMsg;
    type State = DetectorState;
    type Arguments = DetectorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: DetectorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let queued = Arc::new(AtomicUsize::new(0));
        let reader = tokio::spawn(read_loop(
            args.socket.clone(),
            args.opener,
            myself.clone(),
            queued.clone(),
            args.view.clone(),
        ));
        let rng = rand09::rngs::SmallRng::seed_from_u64(rand::random());
        let codec = BincodeCodec(bincode::config::standard().with_limit::<MAX_DATAGRAM>());
        let member = Foca::new(args.me, args.config, rng, codec);
        myself.send_interval(REANNOUNCE, || DetectorMsg::Announce);
        let _ = myself.cast(DetectorMsg::Announce);
        Ok(DetectorState {
            member,
            runtime: AccumulatingRuntime::new(),
            peers: args.peers,
            socket: args.socket,
            sealer: args.sealer,
            view: args.view,
            events: args.events,
            queued,
            reader,
            confirmed_dead: BTreeSet::new(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.reader.abort();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let result = match msg {
            DetectorMsg::Datagram(payload) => {
                state.queued.fetch_sub(1, Ordering::Relaxed);
                state.member.handle_data(&payload, &mut state.runtime)
            }
            DetectorMsg::Timer(timer) => state.member.handle_timer(timer, &mut state.runtime),
            DetectorMsg::Announce => state.announce(),
        };
        if let Err(e) = result {
            // An authenticated member sent something foca refuses (e.g. a newer version): the
            // datagram is ignored, the member goes on.
            tracing::debug!(error = %e, "detector: foca refused an event");
        }
        state.drain(&myself);
        Ok(())
    }
}

impl DetectorState {
    fn announce(&mut self) -> Result<(), foca::Error> {
        let known: BTreeSet<String> = self
            .member
            .iter_members()
            .map(|m| m.id().id.clone())
            .collect();
        let me = self.member.identity().id.clone();
        let targets: Vec<String> = self
            .peers
            .keys()
            .filter(|id| **id != me && !known.contains(*id))
            .cloned()
            .collect();
        for id in targets {
            // The boot is unknown until it answers; the transport addresses by node id.
            self.member
                .announce(MemberId { id, boot: 0 }, &mut self.runtime)?;
        }
        Ok(())
    }

    /// Carries out what foca asked for: sends, timers, notifications; then refreshes the view.
    fn drain(&mut self, myself: &ActorRef<DetectorMsg>) {
        while let Some((to, data)) = self.runtime.to_send() {
            let Some(addr) = self.peers.get(&to.id) else {
                continue; // never talk to an address the config does not name
            };
            let datagram = self.sealer.seal(&data, now_unix_ms());
            if self.socket.try_send_to(&datagram, *addr).is_err() {
                metrics::counter!(m::DETECTOR_SEND_FAILURES).increment(1);
            }
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            myself.send_after(after, move || DetectorMsg::Timer(timer));
        }
        while let Some(n) = self.runtime.to_notify() {
            self.on_notification(n);
        }
        self.refresh_view();
    }

    fn on_notification(&mut self, n: OwnedNotification<MemberId>) {
        let me = self.member.identity().id.clone();
        match n {
            OwnedNotification::MemberDown(m) if m.id != me => {
                metrics::counter!(m::DETECTOR_CONFIRMED_DEAD).increment(1);
                tracing::warn!(member = %m.id, "the failure detector confirmed a member dead");
                self.confirmed_dead.insert(m.id.clone());
                self.view_mut().confirmations += 1;
                let _ = self.events.send(PeerEvent::ConfirmedDead(m.id));
            }
            OwnedNotification::MemberUp(m) if self.confirmed_dead.remove(&m.id) => {
                tracing::info!(member = %m.id, "a member confirmed dead is back");
            }
            OwnedNotification::Rejoin(_) | OwnedNotification::Defunct => {
                metrics::counter!(m::DETECTOR_DECLARED_DEAD).increment(1);
                tracing::warn!("the other members declared this node dead; rejoining");
                self.view_mut().declared_self_dead += 1;
                let _ = self.events.send(PeerEvent::DeclaredMeDead);
                if matches!(n, OwnedNotification::Defunct) {
                    // Not expected (identities renew), but never stay out of the group.
                    let _ = self.member.reuse_down_identity();
                }
            }
            OwnedNotification::Active => tracing::info!("the detector joined its group"),
            OwnedNotification::Idle => tracing::warn!("the detector sees no other live member"),
            _ => {}
        }
    }

    fn view_mut(&self) -> std::sync::MutexGuard<'_, DetectorView> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refresh_view(&self) {
        let me = self.member.identity().id.clone();
        let mut counts: BTreeMap<&'static str, u64> =
            [("alive", 0), ("suspect", 0), ("down", 0)].into();
        let members: Vec<MemberView> = self
            .member
            .iter_membership_state()
            .filter(|m| m.id().id != me)
            .map(|m| {
                let state = match m.state() {
                    foca::State::Alive => "alive",
                    foca::State::Suspect => "suspect",
                    foca::State::Down => "down",
                };
                *counts.entry(state).or_default() += 1;
                MemberView {
                    id: m.id().id.clone(),
                    state,
                    incarnation: m.incarnation(),
                }
            })
            .collect();
        for (state, n) in counts {
            metrics::gauge!(m::DETECTOR_MEMBERS, "state" => state).set(n as f64);
        }
        let active = self.member.num_members() > 0;
        let mut v = self.view_mut();
        v.members = members;
        v.active = active;
        v.confirmed_dead = self.confirmed_dead.iter().cloned().collect();
    }
}

/// Receives, authenticates and forwards datagrams (see the module docs).
async fn read_loop(
    socket: Arc<UdpSocket>,
    mut opener: Opener,
    actor: ActorRef<DetectorMsg>,
    queued: Arc<AtomicUsize>,
    view: SharedView,
) {
    // One byte more than the largest datagram: a longer one is seen as too long, not truncated.
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let drop = |reason: &'static str| {
        metrics::counter!(m::DETECTOR_DROPPED, "reason" => reason).increment(1);
        let mut v = view.lock().unwrap_or_else(|p| p.into_inner());
        *v.dropped.entry(reason).or_default() += 1;
    };
    loop {
        let n = match socket.recv_from(&mut buf).await {
            Ok((n, _from)) => n,
            Err(e) => {
                // E.g. ICMP port unreachable surfacing on Linux: not fatal for UDP. A short
                // pause so that an error that persists cannot spin this task.
                tracing::debug!(error = %e, "detector socket receive error");
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let opened = match opener.open(&buf[..n], now_unix_ms()) {
            Ok(o) => o,
            Err(d) => {
                drop(d.reason());
                if d != Dropped::Malformed {
                    tracing::debug!(reason = d.reason(), "detector datagram dropped");
                }
                continue;
            }
        };
        if queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED {
            queued.fetch_sub(1, Ordering::Relaxed);
            drop("overload");
            continue;
        }
        if actor
            .cast(DetectorMsg::Datagram(opened.payload.to_vec()))
            .is_err()
        {
            return;
        }
    }
}

/// A running detector: the actor, its events and view (its address is in the view's `listen`).
#[derive(Clone)]
pub struct Detector {
    actor: ActorRef<DetectorMsg>,
    events: PeerEvents,
    view: SharedView,
}

impl Detector {
    /// The events every elector of this node subscribes to.
    pub fn events(&self) -> PeerEvents {
        self.events.clone()
    }

    /// The shared view (for the HTTP server).
    pub fn shared_view(&self) -> SharedView {
        self.view.clone()
    }

    /// Stops the member (it stops answering probes: the others will find it dead).
    pub fn stop(&self) {
        self.actor.stop(Some("node stopping".into()));
    }
}

/// The cluster secret the detector's datagrams are authenticated with (`[raft]
/// cluster_secret` or `cluster_secret_file`): required, and long enough.
fn cluster_secret(cfg: &NodeConfig) -> Result<Secret, DetectorError> {
    let secret = cfg
        .raft
        .secret()
        .map_err(|e| DetectorError::Config(e.to_string()))?
        .ok_or_else(|| {
            DetectorError::Config(
                "[detector] kind = \"swim\" needs the cluster secret ([raft] cluster_secret or cluster_secret_file) to authenticate its datagrams".into(),
            )
        })?;
    if secret.expose().len() < MIN_SECRET_BYTES {
        return Err(DetectorError::Config(format!(
            "the cluster secret is shorter than {MIN_SECRET_BYTES} bytes"
        )));
    }
    Ok(secret)
}

/// SWIM's settings: `[detector]`'s probe period, round trip and suspicion timeout, and fixed
/// choices (3 indirect probes, 10 transmissions, 1,400-byte packets, periodic gossip).
fn foca_config(dc: &DetectorConfig) -> foca::Config {
    let period = Duration::from_millis(dc.probe_period_ms);
    let mut config = foca::Config::simple();
    config.probe_period = period;
    config.probe_rtt = Duration::from_millis(dc.probe_rtt_ms);
    config.num_indirect_probes = NonZeroUsize::new(3).expect("3 > 0");
    config.max_transmissions = NonZeroU8::new(10).expect("10 > 0");
    config.suspect_to_down_after = Duration::from_millis(dc.suspect_ms);
    config.max_packet_size = NonZeroUsize::new(1400).expect("1400 > 0");
    config.notify_down_members = true;
    // Spread updates (a suspicion, its refutation) every period, not only on probes: a
    // confirmation reaches every member about as soon as the first one makes it.
    config.periodic_gossip = Some(foca::PeriodicParams {
        frequency: period,
        num_members: NonZeroUsize::new(3).expect("3 > 0"),
    });
    config
}

/// Binds the socket and starts the detector of `cfg` (`[detector] kind = "swim"`).
pub async fn start(cfg: &NodeConfig) -> Result<Detector, DetectorError> {
    let dc = &cfg.detector;
    let secret = cluster_secret(cfg)?;
    let mut peers = BTreeMap::new();
    for p in &dc.peers {
        let addr: SocketAddr = p.addr.parse().map_err(|_| {
            DetectorError::Config(format!("peer {:?}: bad addr {:?}", p.id, p.addr))
        })?;
        peers.insert(p.id.clone(), addr);
    }
    let bind = dc
        .bind
        .or_else(|| peers.get(&cfg.node_id).copied())
        .ok_or_else(|| DetectorError::Config("no bind address".into()))?;
    let socket = UdpSocket::bind(bind)
        .await
        .map_err(|source| DetectorError::Bind { addr: bind, source })?;
    let local_addr = socket
        .local_addr()
        .map_err(|source| DetectorError::Bind { addr: bind, source })?;
    let auth = PeerAuth::new(secret.expose().as_bytes(), dc.window_ms);
    let boot = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(1);
    let me = MemberId {
        id: cfg.node_id.clone(),
        boot,
    };
    let config = foca_config(dc);
    let view: SharedView = Arc::new(std::sync::Mutex::new(DetectorView {
        kind: "swim",
        listen: Some(local_addr),
        boot,
        ..DetectorView::default()
    }));
    let (events, _) = tokio::sync::broadcast::channel(64);
    let args = DetectorArgs {
        sealer: Sealer::new(auth.clone(), &cfg.node_id, boot),
        opener: Opener::new(auth, peers.keys().filter(|id| **id != cfg.node_id).cloned()),
        me,
        peers,
        socket: Arc::new(socket),
        config,
        view: view.clone(),
        events: events.clone(),
    };
    let (actor, _) = Actor::spawn(None, DetectorActor, args)
        .await
        .map_err(|e| DetectorError::Spawn(e.to_string()))?;
    tracing::info!(listen = %local_addr, "SWIM failure detector started");
    Ok(Detector {
        actor,
        events,
        view,
    })
}
