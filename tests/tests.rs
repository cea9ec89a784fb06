// One integration binary; each module proves a group of rules against a real PostgreSQL.
// The worker's modules depend on each other one way.
mod architecture;
// AT-1: attachment bytes expire by the file's age.
mod attachments;
mod common;
// EX-8 for real: workers killed with SIGKILL mid-pass.
mod crash;
// ER-2, ER-6: the database down, restarted, refusing the worker's role, or read-only.
mod database_faults;
// FL-8: discovery reads the candidates, and holds each account to its own window.
mod discovery;
// OP-7: `sexton doctor`, each finding caused for real.
mod doctor;
// RQ-1 … RQ-8: erasure on request, judged against a snapshot of every table.
mod erasure;
// EX-1 … EX-9: PruneExecutionDetails, one module per group of its rules.
mod execution_details;
// TTL-1 … TTL-5, FL-7: short-lived records and the queue's own rows expire.
mod expiry;
// `sexton explain`: what it says of a row or file is what the next pass does.
mod explain;
// EX-8: what a retry may cure is retried; what the database refuses fails for good.
mod failures;
// FL-8: a night costs what is due.
mod fanout;
// FL-2 … FL-6: real worker processes on one database.
mod fleet;
// FL-6, OP-1, OP-5: what the docs and deploy files repeat from the code is generated from it.
mod generated;
// HL-1 … HL-4: hops throttled by the database's health.
mod health;
// HD-2 … HD-4: what a hold covers stays, in every job kind and its files.
mod holds;
// HD-1, HD-5: holds placed, released and listed by the operator, in status and the gauge.
mod holds_cli;
// HD-3, HD-4: holds without gaps — in force from `holds place` on, whatever rows are gone.
mod holds_gaps;
// ER-7: sexton's backends terminated mid-pass.
mod lost_backends;
// Adding a job kind: one written in the tests alone runs through the worker and the owner loop.
mod kind;
// OS-3, OS-4: what only an object store can do — keys refused, batched deletes, per-key failures.
mod objects;
// DC-1 … DC-5: derivative cleanup, files no row owns.
mod orphans;
// OP-1 … OP-5: configuration, the CLI's output, metrics, logs and the deploy.
mod operations;
// ER-5: through a real PgBouncer: session mode as a direct connection, transaction mode refused.
mod poolers;
// FL-1: each queue's jobs run, and bad rows, payloads and panics fail alone.
mod queue;
// RQ-6: erasure receipts chained, verified, exported and found, and never removed.
mod receipts;
// FL-6, OP-1, OP-3 for every registered job kind: connections, the pass ledger, status.
mod registry;
// SPEC §1: migrations and the data contract.
mod schema;
// OP-6: the status page in a real headless browser, its JSON, and bad requests.
mod status_page;
// `sexton seed`: deterministic data, real files.
mod seed;
// SS-1 … SS-6: SessionRetention.
mod sessions;
// FL-5 for every row-owning kind: a stopping worker takes nothing and hands its pass over.
mod shutdown;
// ER-2, OS-1: the object store down at start.
mod store_faults;
// OS-2, OS-4 behind a store that throttles (PF-7): the window shrinks and grows, no key lost.
mod throttling;
// TR-1 … TR-4: trace cleanup.
mod traces;
