//! baton: exactly one node of a fleet does the singleton work, and that work stays correct when a
//! node's belief "I am the leader" is wrong. A lease says who *should* lead; a fencing token,
//! checked by the protected resource itself, makes a stale leader harmless.
//!
//! # Guide
//!
//! **Pick a backend** (one cargo feature each; you compile only its client): `raft` (default:
//! the nodes elect among themselves, nothing else to run), `etcd`, `zk`, `redis`, `pg-lease`.
//! Every backend passes one conformance suite ([`backends::conformance`], feature
//! `conformance`); bring your own with [`node::NodeBuilder::with_elector`]. The fenced resource
//! is always PostgreSQL: run `baton migrate` (or [`work::fence::migrate`]) once as its owner.
//! [`config::NodeConfig::default`] is the default backend's (raft) and starts as it is, given a
//! node id, a state dir, the peers and a cluster secret; for another backend start from
//! [`config::NodeConfig::for_backend`].
//!
//! **See what it does**: baton logs through [`tracing`] (elections, demotions, refused writes
//! at WARN) and installs no subscriber; a service installs its own. With `tracing-subscriber`
//! (features `env-filter`, `fmt`): `tracing_subscriber::fmt().with_env_filter(
//! tracing_subscriber::EnvFilter::from_default_env()).init()`, then run with
//! `RUST_LOG=baton=info` (or `baton=debug`; PostgreSQL's notices about idempotent DDL are DEBUG).
//!
//! **Write a job**: a closure given a [`work::Term`], registered with
//! [`node::NodeBuilder::with_job`]. It starts only when this node wins a term, and it must
//! return soon after [`work::Term::stopping`] resolves. Demotion always runs checkpoint (the
//! job returns) → stop (aborted after `work_stop_timeout_ms`) → release, so the lease is never
//! given up while the job may still run. Choose what happens when it fails on its own with a
//! [`work::SupervisionPolicy`]. [`node::NodeBuilder::start`] returns a [`node::NodeHandle`]:
//! status, token, a watch of the leader, step down, shut down.
//!
//! **Fence its writes**: [`work::Fence::begin`] opens a PostgreSQL transaction whose first
//! statement asserts the term's token under the fence row's lock; commit your statements with
//! it. A stale token is refused, rolled back whole, and recorded. From other languages, call
//! `baton.fence_assert(resource, token, holder)` inside your own transaction.
//!
//! ```no_run
//! # async fn demo(cfg: baton::config::NodeConfig) -> anyhow::Result<()> {
//! let node = baton::node::NodeBuilder::new(cfg)
//!     .with_job("ledger", |mut term| async move {
//!         while !term.is_stopping() {
//!             let tx = term.fence().begin("ledger", term.token()).await?;
//!             tx.client().execute("INSERT INTO ledger (token) VALUES ($1)", &[&term.token().0]).await?;
//!             tx.commit().await?;
//!             term.sleep(std::time::Duration::from_millis(100)).await;
//!         }
//!         Ok(())
//!     })
//!     .start()
//!     .await?;
//! # node.shutdown().await }
//! ```
//!
//! # Layout
//!
//! ```text
//! config.rs          NodeConfig: TOML + flags, timing validated at construction
//! elector.rs         the Elector seam's types (the ground floor: imports nothing above it)
//! node.rs            NodeBuilder -> NodeHandle: assemble and run one fleet member (entry point)
//! leadership.rs      the status mirror (role, token, leader, deadline) of one shard's term:
//!                    written by the actors that own each fact, read by the handle, HTTP, work
//! shard.rs           shards: resource and key naming, the key hash, balanced rendezvous placement
//! actors/            the supervision tree: per shard a NodeSupervisor, Elector loop and
//!                    LeaseWatchdog; the Placement task that says which shards this node seeks
//! backends/          the `Elector` seam, one module per backend, the conformance suite
//! detector/          (feature `swim`) the SWIM failure detector: member identity, its view, the
//!                    MACed datagram format; its actor is actors/detector.rs
//! peer_auth.rs       HMAC-SHA256 with the cluster secret: raft peer requests, detector datagrams
//! work/              leader-only work: the fence client + SQL, closure jobs, Sequencer, Scheduler
//! http/              hyper 1 server: /status /next /read /metrics /stepdown /healthz
//! metrics.rs         metric names and the Prometheus recorder
//! trace.rs           the actor-trace log (JSON lines)
//! clock.rs           monotonic time; skew and drift knobs for experiments
//! tasks.rs           AbortOnDrop: a spawned helper ends with its owner
//! pg.rs              PostgreSQL pools (plain or TLS) for the fence and pg-lease, the unanswered-
//!                    call bound and `Conn` (closed when a call on it went unanswered), error chains
//! tls.rs             (feature `tls`) PEM loading and the rustls configs of every TLS endpoint
//! ```
//!
//! # What is guaranteed, and what is not
//!
//! * A write reaches the fenced resource only if its token is the highest the resource has seen
//!   (or equal, from the same holder). This holds whatever the nodes believe.
//! * A node starts leader work only with a token, and stops it before releasing its lease.
//! * A node stops acting when its lease deadline passes on its own monotonic clock, computed from
//!   the *send* time of the last successful renewal minus a margin for clock-rate error.
//! * **Not guaranteed:** that only one node *believes* it leads at any instant (a paused or
//!   partitioned node can believe anything until its watchdog fires), nor that effects outside
//!   the fenced resource are exactly-once. Side effects must go through the fence to be safe: a
//!   write made outside a fenced transaction, or to another system, is not protected.
//! * **The trust boundary:** the fence protects against stale nodes, not against a holder of the
//!   nodes' database credentials, who can call the same functions a node calls.

#![warn(missing_docs)]

pub mod actors;
pub mod backends;
pub mod clock;
pub mod config;
#[cfg(feature = "swim")]
pub mod detector;
pub mod elector;
#[cfg(feature = "http")]
pub mod http;
pub mod leadership;
pub mod metrics;
pub mod node;
#[cfg(any(feature = "raft", feature = "swim"))]
pub mod peer_auth;
mod pg;
pub mod rlimit;
pub mod shard;
pub mod tasks;
#[cfg(feature = "tls")]
pub mod tls;
pub mod trace;
pub mod work;
