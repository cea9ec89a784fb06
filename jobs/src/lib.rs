//! sexton's retention logic: what is pruned and why. One module per job, each with serde
//! arguments and a `run` that reports what it did. No queue types here: the worker crate wires
//! these jobs to apalis, the schedule, metrics and the CLI.

pub mod clock;
pub mod payload;
pub mod prune_execution_details;
