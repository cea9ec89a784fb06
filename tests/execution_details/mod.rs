//! PruneExecutionDetails (SPEC §2), hop by hop against a real PostgreSQL: one module per group
//! of its rules.

// EX-1, EX-2: which owners are old enough, by the account's window and the owner's own age.
mod windows;
// EX-3, EX-4, EX-5: what goes with an owner, what stays, and what holds an owner back.
mod owners;
// EX-3, ER-3, OP-3: the owners' output files — which are unlinked, which never are, and when.
mod files;
// EX-6, EX-9: the lock order shared with the platform, and readers and forks beside a pass.
mod locks;
// EX-7, EX-8, ER-4, FL-6, OP-1: a pass as a chain of hops, its cursors, budget and connections.
mod hops;
