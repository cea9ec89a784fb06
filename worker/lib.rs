//! sexton's worker side: how retention jobs are run — configuration, database, queue, schedule,
//! CLI, seed data and demo. What is pruned, and why, lives in the `sexton-jobs` crate.
//!
//! Dependencies run one way (checked by `tests/architecture.rs`):
//! config ← clock, db, queue ← context, ledger, telemetry ← hop ← registry ← tick, schedule, status
//! ← worker (the runtime) ← demo, sessions, cli.

pub mod cli;
pub mod clock;
pub mod config;
pub mod context;
pub mod db;
pub mod demo;
pub mod explain;
pub mod hop;
pub mod http;
pub mod ledger;
pub mod preview;
pub mod queue;
pub mod registry;
pub mod schedule;
pub mod seed;
pub mod sessions;
pub mod status;
pub mod telemetry;
pub mod text;
pub mod tick;
pub mod traces;
pub mod wakeups;
pub mod worker;
