//! baton: exactly one node of a fleet does the singleton work, and that work stays correct when a
//! node's belief "I am the leader" is wrong. A lease says who *should* lead; a fencing token,
//! checked by the protected resource itself, makes a stale leader harmless.
//!
//! # Layout
//!
//! ```text
//! config.rs          NodeConfig: TOML + flags, timing validated at construction
//! node.rs            NodeBuilder: assemble and run one fleet member (library entry point)
//! actors/            the supervision tree: NodeSupervisor, Elector loop, LeaseWatchdog
//! backends/          the `Elector` seam, one module per backend, the conformance suite
//! work/              leader-only work: the fence client + SQL, Sequencer, Scheduler
//! http/              hyper 1 server: /status /next /metrics /stepdown /healthz
//! metrics.rs         metric names and the Prometheus recorder
//! trace.rs           the actor-trace log (JSON lines)
//! clock.rs           monotonic time; skew and drift knobs for experiments
//! tasks.rs           AbortOnDrop: a spawned helper ends with its owner
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
//!   the fenced resource are exactly-once. Side effects must go through the fence to be safe.

pub mod actors;
pub mod backends;
pub mod clock;
pub mod config;
pub mod elector;
#[cfg(feature = "http")]
pub mod http;
pub mod metrics;
pub mod node;
pub mod rlimit;
pub mod tasks;
pub mod trace;
pub mod work;
