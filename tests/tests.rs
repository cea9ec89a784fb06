// One integration binary; each module proves a group of rules against a real PostgreSQL.
mod architecture;
mod attachments;
mod common;
mod crash;
mod execution_details;
mod expiry;
mod explain;
mod failures;
mod fanout;
mod fleet;
mod foundation;
mod health;
mod hostile;
mod registry;
mod sessions;
mod shutdown;
mod traces;
