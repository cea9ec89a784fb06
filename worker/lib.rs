//! sexton's worker side: how retention jobs are run — configuration, database, queue, schedule,
//! CLI, seed data and demo. What is pruned, and why, lives in the `sexton-jobs` crate.

pub mod cli;
pub mod config;
pub mod db;
pub mod demo;
pub mod execution_details;
pub mod http;
pub mod queue;
pub mod schedule;
pub mod seed;
pub mod telemetry;
pub mod tick;
pub mod worker;
