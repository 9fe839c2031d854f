//! baton: exactly one node of a fleet does the singleton work, and that work stays correct when a
//! node's belief "I am the leader" is wrong. A lease says who *should* lead; a fencing token,
//! checked by the protected resource itself, makes a stale leader harmless.
//!
//! # Guide
//!
//! **Pick a backend** (one cargo feature each; you compile only its client): `raft` (default:
//! the nodes elect among themselves, nothing else to run), `etcd`, `zk`, `redis`, `pg-lease`.
//! Every backend passes one conformance suite (`backends::conformance`, feature
//! `conformance`); bring your own with [`node::NodeBuilder::with_elector`].
//! [`config::NodeConfig::default`] is the default backend's (raft) and starts as it is, given a
//! node id, a state dir, the peers and a cluster secret; for another backend start from
//! [`config::NodeConfig::for_backend`].
//!
//! **Set up the database**, once, before the nodes start. The fenced resource is always
//! PostgreSQL, whatever the backend. The database itself must exist first (`CREATE DATABASE`):
//! setup creates the schema and roles in it, not the database. Then, as its superuser, with the
//! `baton` binary (package `baton-lab`, beside this crate in its repository):
//!
//! ```text
//! baton db init --admin-url postgres://postgres:PW@db:5432/app --nodes n1,n2,n3 --out secrets/
//! baton db grant --admin-url postgres://postgres:PW@db:5432/app ledger
//! ```
//!
//! `db init` creates or upgrades the schema (it runs [`work::fence::migrate`]) and the roles:
//! `baton_app`, which may call the fence, and one login role per node, `baton_node_<id>`, which
//! writes only as holder `<id>` (add `--backend pg-lease` for that backend's store and role).
//! Each new role gets a random password, and its connection URL is written to
//! `secrets/<role>.url` (mode 0600); run again, it keeps the passwords roles already have
//! (`--rotate` replaces them). Each node then sets `resource.database_url` to its own role's URL
//! (node `n1`: the contents of `secrets/baton_node_n1.url`). `db grant` lets those roles read
//! and write one of your tables (and use the sequences it owns); create the table first. From
//! Rust, the same two steps are [`work::db::init`] and [`work::db::grant`].
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
//! A complete program: a node that reads its config from the path given as its argument, runs
//! one job while it leads, and stops on Ctrl-C. Beside `baton` it uses `tokio` (features
//! `macros`, `rt-multi-thread`, `signal`), `anyhow`, and `tracing-subscriber` for its logs. The
//! job appends a row to `ledger` (`CREATE TABLE ledger (id bigserial PRIMARY KEY, token bigint,
//! holder text)`, granted with `baton db grant` as above) every 100 ms, each in a fenced
//! transaction:
//!
//! ```no_run
//! use std::path::PathBuf;
//! use std::time::Duration;
//!
//! use baton::config::NodeConfig;
//! use baton::node::NodeBuilder;
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     // baton logs through `tracing`; RUST_LOG picks what is shown (e.g. RUST_LOG=baton=info).
//!     tracing_subscriber::fmt()
//!         .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
//!         .init();
//!
//!     let path: PathBuf = std::env::args_os()
//!         .nth(1)
//!         .ok_or_else(|| anyhow::anyhow!("usage: ledger NODE.toml"))?
//!         .into();
//!     let cfg = NodeConfig::from_file(&path)?;
//!
//!     let node = NodeBuilder::new(cfg)
//!         .with_job("ledger", |mut term| async move {
//!             // Runs only while this node holds a term; returns once demotion begins.
//!             while !term.is_stopping() {
//!                 // The transaction's first statement asserts the term's token: a stale
//!                 // leader's is refused here, and nothing it sends lands.
//!                 let tx = term.fence().begin("ledger", term.token()).await?;
//!                 tx.client()
//!                     .execute(
//!                         "INSERT INTO ledger (token, holder) VALUES ($1, $2)",
//!                         &[&term.token().0, &term.holder()],
//!                     )
//!                     .await?;
//!                 tx.commit().await?;
//!                 term.sleep(Duration::from_millis(100)).await;
//!             }
//!             Ok(())
//!         })
//!         .start()
//!         .await?;
//!
//!     tokio::signal::ctrl_c().await?;
//!     // Demotes if leading (the job returns, then the lease is released), then stops.
//!     node.shutdown().await
//! }
//! ```
//!
//! # Layout
//!
//! ```text
//! config/            NodeConfig: TOML + flags, timing validated at construction; one file per
//!                    section, each checking itself and saying what to keep out of reports
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
//! work/              leader-only work: the fence client + SQL, closure jobs, child processes,
//!                    Sequencer, Scheduler; db.rs sets the database up (`baton db init`, `grant`)
//! http/              hyper 1 server: /status /next /read /metrics /stepdown /healthz, the fleet
//!                    page /ui
//! metrics.rs         metric names and the Prometheus recorder
//! trace.rs           the actor-trace log (JSON lines)
//! clock.rs           monotonic time; skew and drift knobs for experiments
//! tasks.rs           AbortOnDrop: a spawned helper ends with its owner
//! rlimit.rs          the descriptor limit raised at start-up; the client thread's priority
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
