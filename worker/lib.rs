//! sexton's worker side: how retention jobs are run — configuration, database, queue, schedule,
//! CLI, seed data and demo. What is pruned, and why, lives in the `sexton-jobs` crate.
//!
//! Dependencies run one way, in layers (checked by `tests/architecture.rs`); a module uses its
//! own layer's modules (without a cycle) or lower ones':
//! 1. configuration, and what needs nothing above it: config, clock, context, db, doctor (a
//!    deployment checked before its first night), event (the
//!    names of logged events), holds (placed, released and listed), http, ledger, receipts
//!    (erasure receipts verified, exported and found), schedule (the slot arithmetic), restarts
//!    (the consumers' restart pacing), seed, telemetry, text, wakeups;
//! 2. the queue and one hop off it: queue, hop;
//! 3. the job kinds: registry;
//! 4. what runs over the kinds: tick (slots and their fan-out), status, status_page (`/status`
//!    and `/status.json`), explain, gauges (kept current between scrapes), generated (the facts
//!    the docs and deploy files repeat, rendered into them), orphans (`sexton orphans scan`),
//!    preview, sessions, traces;
//! 5. the runtime: worker;
//! 6. the CLI: demo, cli.

pub mod cli;
pub mod clock;
pub mod config;
pub mod context;
pub mod db;
pub mod demo;
pub mod doctor;
pub mod erase;
pub mod event;
pub mod explain;
pub mod gauges;
pub mod generated;
pub mod holds;
pub mod hop;
pub mod http;
pub mod ledger;
pub mod orphans;
pub mod preview;
pub mod queue;
pub mod receipts;
pub mod registry;
pub mod restarts;
pub mod schedule;
pub mod seed;
pub mod sessions;
pub mod status;
pub mod status_page;
pub mod telemetry;
pub mod text;
pub mod tick;
pub mod traces;
pub mod wakeups;
pub mod worker;
