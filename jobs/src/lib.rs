//! sexton's retention logic: what is pruned and why. One module per job kind, each implementing
//! [`job::Job`]: serde arguments, a settings section, and a `run` that does one hop and reports
//! what it did. No queue types here: the worker crate wires these jobs to apalis, the schedule,
//! metrics and the CLI.

pub mod attachment_expiry;
pub mod clock;
pub mod cutoff;
pub mod erasure;
pub mod estimate;
pub mod explain;
pub mod files;
pub mod gate;
#[cfg(test)]
mod golden;
pub mod health;
pub mod job;
pub mod orphans;
pub mod owner_loop;
pub mod pass;
pub mod payload;
pub mod prune_execution_details;
pub mod queue_retention;
pub mod receipts;
pub mod record_expiry;
pub mod report;
pub mod rows;
pub mod session_retention;
pub mod settings;
pub mod shown;
pub mod trace_cleanup;
