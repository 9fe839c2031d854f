//! Placement: which shards this node seeks (K > 1 only; at K = 1 every node seeks the one term).
//!
//! One task per node. Every `probe_interval_ms` it probes each member's `GET /healthz`, keeps
//! the set of live members, computes the balanced rendezvous assignment ([`crate::shard::assign`])
//! and tells each shard's supervisor whether this node should hold that shard
//! (`SupervisorMsg::Placement`). The supervisor owns what follows: a shard that stops being ours
//! while we lead it is handed over (checkpoint → stop → release) and the new owner, already
//! campaigning, claims at once; a shard that becomes ours is campaigned for.
//!
//! Placement only decides who *campaigns*. Who leads is still the backend's election, and what a
//! leader may write is still the fence's decision, so two nodes whose views disagree for a moment
//! can at worst both campaign for a shard: one wins, the other waits in line.
//!
//! * **Live**: a member whose last `200` is less than `down_after_ms` old (a probe may take up
//!   to `down_after_ms` to answer: see `Prober`), and that has answered for at
//!   least `down_after_ms` (and two probe intervals): a member that just came up seeks no shard
//!   for its own warm-up (below), which is that long from its start, so a holder that handed it
//!   a shard any sooner would leave the shard dark until the warm-up ended. Counted this way, the
//!   new owner is already campaigning when the holder hands over, and claims at once. A member that answers `503`
//!   (draining: shutting down) is not live at once, so a planned stop moves its shards before
//!   it releases them. This node counts itself live until it drains.
//! * **Warm-up**: for its first `down_after_ms` a node seeks no shard (it has not heard from
//!   every member yet); orphans are counted from its end.
//! * **Orphans**: a shard with no known leader is sought by the live members in their rendezvous
//!   order for it, one more every `orphan_grace_ms`: the member ranked r seeks it after
//!   `r x orphan_grace_ms` (the owner, r = 0, always does). So a wrong view leaves a shard dark for
//!   at most about one grace per member that also fails to win it, and a fleet that starts, or a
//!   backend that is slow, does not draw every member into every election at once (with 9 nodes
//!   and K = 256 on two cores that stampede, 2,304 candidacies, starved ZooKeeper's session
//!   renewals and never settled).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use ractor::ActorRef;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::actors::messages::SupervisorMsg;
use crate::config::{MemberSpec, ShardsConfig};
use crate::leadership::Leadership;
use crate::shard::{assign, rank, ShardId};
use crate::trace::ActorTrace;

/// What placement currently believes (for `/status` and `baton fleet status`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PlacementView {
    /// The members counted live, sorted.
    pub live: Vec<String>,
    /// `owners[s]`: the member placement assigns shard `s` to.
    pub owners: Vec<String>,
}

/// Shared between the placement task, the node handle and HTTP.
#[derive(Default)]
pub struct PlacementState {
    view: RwLock<PlacementView>,
    /// Set when this node is shutting down: `/healthz` answers 503 so peers take its shards.
    draining: AtomicBool,
}

impl PlacementState {
    /// A snapshot of the current view.
    pub fn view(&self) -> PlacementView {
        self.view.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// Whether this node is draining (shutting down; its shards are moving away).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }
}

pub(crate) struct PlacementArgs {
    pub node_id: String,
    pub members: Vec<MemberSpec>,
    pub cfg: ShardsConfig,
    pub supervisors: Vec<ActorRef<SupervisorMsg>>,
    pub leaderships: Vec<Arc<Leadership>>,
    pub trace: ActorTrace,
    pub state: Arc<PlacementState>,
    /// How the members are asked (plain HTTP or HTTPS).
    pub client: MemberClient,
    /// The failure detector's events (`None`: no detector; probes alone decide).
    pub peer_events: Option<tokio::sync::broadcast::Receiver<crate::actors::PeerEvent>>,
}

/// How a probe went.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Probe {
    Up,
    Draining,
    Down,
}

#[derive(Default, Clone, Copy)]
struct MemberHealth {
    /// Whether any probe of this member has been answered (or timed out) yet.
    answered: bool,
    /// The start of the current run of successful probes.
    up_since: Option<Instant>,
    last_up: Option<Instant>,
}

/// A probe in flight: which member, and how it went.
type ProbeAnswer = Pin<Box<dyn Future<Output = (usize, Probe)> + Send>>;

/// The other members' health, from their `GET /healthz`: at most one probe in flight per
/// member, each given `down_after_ms` to answer. A probe is asked every `probe_interval_ms`, but
/// is *not* bounded by it: on a loaded machine `/healthz` (served at nice 5, behind the timers)
/// can take several intervals, and a member that answers late is alive. Bounding each probe by
/// the interval (as this did before) counted such members dead on a saturated 2-core host, moved
/// their shards, which loaded the host more: the etcd fleet at K = 256 (`experiments/FINDINGS.md`) churned
/// that way without end.
struct Prober {
    client: MemberClient,
    others: Vec<MemberSpec>,
    down_after: Duration,
    live_after: Duration,
    health: Vec<MemberHealth>,
    asking: Vec<bool>,
    answers: FuturesUnordered<ProbeAnswer>,
}

impl Prober {
    fn new(
        client: MemberClient,
        others: Vec<MemberSpec>,
        down_after: Duration,
        live_after: Duration,
    ) -> Prober {
        let n = others.len();
        Prober {
            client,
            others,
            down_after,
            live_after,
            health: vec![MemberHealth::default(); n],
            asking: vec![false; n],
            answers: FuturesUnordered::new(),
        }
    }

    /// Asks every member that has no probe in flight.
    fn ask_all(&mut self) {
        for (i, m) in self.others.iter().enumerate() {
            if std::mem::replace(&mut self.asking[i], true) {
                continue;
            }
            let (client, addr, bound) = (self.client.clone(), m.addr.clone(), self.down_after);
            self.answers.push(Box::pin(
                async move { (i, probe(&client, &addr, bound).await) },
            ));
        }
    }

    /// The next probe to end (pending while none is in flight).
    async fn next_answer(&mut self) -> (usize, Probe) {
        match self.answers.next().await {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }

    /// Takes in how member `i`'s probe went, at `now`.
    fn record(&mut self, i: usize, p: Probe, now: Instant) {
        self.asking[i] = false;
        let h = &mut self.health[i];
        let first = !std::mem::replace(&mut h.answered, true);
        match p {
            Probe::Up => {
                // A member up at its first answer was up when this node started: it is not
                // "just joined", and need not wait out `live_after`.
                h.up_since.get_or_insert(if first {
                    now.checked_sub(self.live_after).unwrap_or(now)
                } else {
                    now
                });
                h.last_up = Some(now);
            }
            Probe::Draining => {
                h.up_since = None;
                h.last_up = None;
            }
            Probe::Down => {
                // Down for `down_after`: when it answers again it has just joined. One probe
                // that failed on a loaded machine is not that (it stays live, and keeps its
                // shards, until `down_after` has passed without an answer).
                if h.last_up
                    .is_none_or(|t| now.duration_since(t) >= self.down_after)
                {
                    h.up_since = None;
                }
            }
        }
    }

    /// The failure detector confirmed `dead`: down at once; its next answer is a join.
    fn confirmed_dead(&mut self, dead: &str) {
        if let Some(i) = self.others.iter().position(|m| m.id == dead) {
            self.health[i] = MemberHealth {
                answered: true,
                ..MemberHealth::default()
            };
        }
    }

    /// The other members live at `now` (see the module docs), in member order.
    fn live(&self, now: Instant) -> Vec<&str> {
        self.others
            .iter()
            .zip(&self.health)
            .filter(|(_, h)| {
                h.last_up
                    .is_some_and(|t| now.duration_since(t) < self.down_after)
                    && h.up_since
                        .is_some_and(|t| now.duration_since(t) >= self.live_after)
            })
            .map(|(m, _)| m.id.as_str())
            .collect()
    }
}

/// Runs until the owning node drops the returned handle's task (see `tasks::AbortOnDrop`).
pub(crate) async fn run(mut args: PlacementArgs) {
    let every = Duration::from_millis(args.cfg.probe_interval_ms);
    let down_after = Duration::from_millis(args.cfg.down_after_ms);
    // How long a member must have answered before it is handed shards (see "Live" above).
    let live_after = down_after.max(2 * every);
    let orphan_grace = Duration::from_millis(args.cfg.orphan_grace_ms);
    let k = args.supervisors.len() as u32;
    let others: Vec<MemberSpec> = args
        .members
        .iter()
        .filter(|m| m.id != args.node_id)
        .cloned()
        .collect();
    let mut prober = Prober::new(
        args.client.clone(),
        others,
        down_after.max(every),
        live_after,
    );
    let mut memory = Memory {
        sent: vec![None; k as usize],
        leaderless_since: vec![None; k as usize],
    };
    let started = Instant::now();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut peer_events = args.peer_events.take();
    loop {
        // A member the failure detector confirmed dead is down at once, not after
        // `down_after_ms` of failed probes: its shards' new owners start campaigning now, and
        // their electors end its leases (see `actors::elector`). When it answers again it has
        // just joined, like any member that was down. A false confirmation costs moves, never
        // safety: placement only decides who campaigns.
        tokio::select! {
            _ = tick.tick() => prober.ask_all(),
            (i, p) = prober.next_answer() => {
                prober.record(i, p, Instant::now());
                continue;
            }
            ev = next_peer_event(&mut peer_events) => match ev {
                Ok(crate::actors::PeerEvent::ConfirmedDead(dead)) => {
                    args.trace.step("placement", "peer-dead", None, &dead);
                    prober.confirmed_dead(&dead);
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    peer_events = None;
                    continue;
                }
            },
        }
        let now = Instant::now();
        // Warm-up: a node that just started has not heard from every member yet and would
        // otherwise claim everything for a moment (then hand most of it straight back). It says
        // nothing until `down_after` has passed; a shard nobody holds by then is an orphan.
        if now.duration_since(started) < down_after {
            continue;
        }
        let draining = args.state.is_draining();
        let mut live = prober.live(now);
        if !draining {
            live.push(&args.node_id);
        }
        live.sort_unstable();
        place(&args, &live, draining, &mut memory, orphan_grace, now);
    }
}

/// What placement remembers between rounds, per shard: what it last told the shard's
/// supervisor, and since when the shard has had no known leader.
struct Memory {
    sent: Vec<Option<bool>>,
    leaderless_since: Vec<Option<Instant>>,
}

/// One round of placement at `now` over the `live` members (this node among them unless it is
/// `draining`): each shard is wanted here if this node owns it, or if it has been leaderless
/// past its orphan grace; a supervisor is told only when that changes. The view is published.
fn place(
    args: &PlacementArgs,
    live: &[&str],
    draining: bool,
    memory: &mut Memory,
    orphan_grace: Duration,
    now: Instant,
) {
    let k = args.supervisors.len() as u32;
    let owners = assign(live, k);
    for s in 0..k as usize {
        let leader_known = args.leaderships[s].status().leader.is_some();
        memory.leaderless_since[s] = if leader_known {
            None
        } else {
            Some(memory.leaderless_since[s].unwrap_or(now))
        };
        let orphaned = memory.leaderless_since[s].is_some_and(|t| {
            let my_rank = rank(live, ShardId(s as u32))
                .iter()
                .position(|m| *m == args.node_id)
                .unwrap_or(live.len()) as u32;
            now.duration_since(t) >= orphan_grace * my_rank.max(1)
        });
        let wanted = !draining && (owners.get(s).is_some_and(|o| *o == args.node_id) || orphaned);
        if memory.sent[s] != Some(wanted) {
            if memory.sent[s].is_some() || wanted {
                args.trace.for_shard(ShardId(s as u32)).step(
                    "placement",
                    if wanted { "assigned" } else { "unassigned" },
                    None,
                    &format!(
                        "live={}{}",
                        live.join(","),
                        if orphaned { " orphaned" } else { "" }
                    ),
                );
            }
            memory.sent[s] = Some(wanted);
            let _ = args.supervisors[s].cast(SupervisorMsg::Placement { wanted });
        }
    }
    if let Ok(mut v) = args.state.view.write() {
        v.live = live.iter().map(|m| (*m).to_owned()).collect();
        v.owners = owners;
    }
}

/// The failure detector's next event (pending for ever without a detector).
async fn next_peer_event(
    rx: &mut Option<tokio::sync::broadcast::Receiver<crate::actors::PeerEvent>>,
) -> Result<crate::actors::PeerEvent, tokio::sync::broadcast::error::RecvError> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// One `GET /healthz`: `Up` on 200, `Draining` on 503, `Down` on anything else or no answer
/// within `bound`.
async fn probe(client: &MemberClient, addr: &str, bound: Duration) -> Probe {
    match tokio::time::timeout(bound, client.get(addr, "/healthz", 1024)).await {
        Ok(Ok(a)) if a.code == 200 => Probe::Up,
        Ok(Ok(a)) if a.code == 503 => Probe::Draining,
        _ => Probe::Down,
    }
}

/// A member's answer to [`MemberClient::get`] (placement reads only the code; the fleet page,
/// feature `http`, the rest).
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) struct MemberAnswer {
    pub(crate) code: u16,
    /// As sent (`HTTP/1.1 503 Service Unavailable`), for messages.
    pub(crate) status_line: String,
    pub(crate) body: Vec<u8>,
}

/// How this node asks the other members over their client API (placement's probes, the fleet
/// page's sweep): plain HTTP, or HTTPS verified against `[http] member_ca_file` when the fleet
/// serves HTTPS. One connection per question, closed after the answer.
#[derive(Clone, Default)]
pub(crate) struct MemberClient {
    #[cfg(feature = "tls")]
    tls: Option<tokio_rustls::TlsConnector>,
}

impl MemberClient {
    /// The client for `http`: HTTPS when it names a member CA (the config requires one for a
    /// sharded fleet that serves HTTPS), plain HTTP otherwise.
    pub(crate) fn for_config(http: &crate::config::HttpConfig) -> anyhow::Result<MemberClient> {
        #[cfg(feature = "tls")]
        if let Some(ca) = &http.member_ca_file {
            let cfg = crate::tls::client_config(ca)?;
            return Ok(MemberClient {
                tls: Some(tokio_rustls::TlsConnector::from(Arc::new(cfg))),
            });
        }
        #[cfg(not(feature = "tls"))]
        if http.member_ca_file.is_some() {
            anyhow::bail!(
                "[http] member_ca_file is set, but this build has no TLS (feature `tls`)"
            );
        }
        Ok(MemberClient::default())
    }

    /// Whether the members are asked over HTTPS.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn speaks_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// One `GET path` to the member at `addr` (`host:port`), read to its end (at most
    /// `max_bytes`); unbounded in time (callers add their bound).
    pub(crate) async fn get(
        &self,
        addr: &str,
        path: &str,
        max_bytes: u64,
    ) -> Result<MemberAnswer, String> {
        let conn = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            let host = addr
                .rsplit_once(':')
                .map_or(addr, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| format!("{host} is no server name: {e}"))?;
            let conn = tls
                .connect(name, conn)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            return exchange(conn, addr, path, max_bytes).await;
        }
        exchange(conn, addr, path, max_bytes).await
    }
}

/// Sends `GET path` on `conn` and reads the answer to its end (at most `max_bytes`).
async fn exchange<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut conn: S,
    addr: &str,
    path: &str,
    max_bytes: u64,
) -> Result<MemberAnswer, String> {
    let ask = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    conn.write_all(ask.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    // A TLS peer that closes without close_notify after a complete answer is not an error here:
    // the answer is checked for completeness below.
    if let Err(e) = (&mut conn).take(max_bytes).read_to_end(&mut raw).await {
        if raw.is_empty() || e.kind() != std::io::ErrorKind::UnexpectedEof {
            return Err(format!("read: {e}"));
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("an incomplete answer")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status_line = head.lines().next().unwrap_or("").to_owned();
    let code = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP/1.1 answer: {status_line}"))?;
    Ok(MemberAnswer {
        code,
        status_line,
        body: raw[split + 4..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A member whose `/healthz` answers `200` after `delay`, or never (`None`: it reads the
    /// question and keeps the connection open).
    async fn member(id: &str, delay: Option<Duration>) -> MemberSpec {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut question = [0u8; 1024];
                    let _ = conn.read(&mut question).await;
                    let Some(delay) = delay else {
                        return std::future::pending().await;
                    };
                    tokio::time::sleep(delay).await;
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                });
            }
        });
        MemberSpec {
            id: id.into(),
            addr,
        }
    }

    /// A loaded member answers late but answers: it is live. One that never answers is not,
    /// once `down_after` has passed. (With each probe bounded by the probe interval, as before
    /// `Prober`, the slow member was never live: every probe of it timed out.)
    #[tokio::test]
    async fn a_member_slower_to_answer_than_the_probe_interval_stays_live() {
        let every = Duration::from_millis(100);
        let down_after = Duration::from_millis(1500);
        let slow = member("slow", Some(Duration::from_millis(400))).await;
        let quick = member("quick", Some(Duration::ZERO)).await;
        let hung = member("hung", None).await;
        let mut prober = Prober::new(
            MemberClient::default(),
            vec![slow, quick, hung],
            down_after,
            down_after,
        );
        let mut tick = tokio::time::interval(every);
        let started = Instant::now();
        let mut live_seen: Vec<Vec<String>> = Vec::new();
        while started.elapsed() < Duration::from_millis(4000) {
            tokio::select! {
                _ = tick.tick() => {
                    prober.ask_all();
                    if started.elapsed() > down_after {
                        let live = prober.live(Instant::now());
                        live_seen.push(live.iter().map(|m| (*m).to_owned()).collect());
                    }
                }
                (i, p) = prober.next_answer() => prober.record(i, p, Instant::now()),
            }
        }
        assert!(!live_seen.is_empty());
        for live in &live_seen {
            assert_eq!(
                live,
                &["slow", "quick"],
                "every look after down_after: {live_seen:?}"
            );
        }
    }
}
