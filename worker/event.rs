//! The names of the events the worker logs, each as the `event` field of its line (OP-4): what a
//! log pipeline or a test matches on, so that a message can be reworded for the people who read
//! it. A name, once given, stays.

/// The worker consumes its queues.
pub const WORKER_STARTED: &str = "worker_started";

/// A hop ended: its counts, duration and lock interval, in the hop's span.
pub const HOP_DONE: &str = "hop_done";

/// A hop met its scope's lock held by another hop and was pushed again for later (FL-3).
pub const HOP_DEFERRED: &str = "hop_deferred";

/// On start, the last missed nightly slot was pushed (FL-2), with the push's `outcome`.
pub const SLOT_CAUGHT_UP: &str = "slot_caught_up";

/// A kind on a cadence of its own had its current period pushed (TR-4), with the push's
/// `outcome`: enqueued, or a duplicate of another replica's.
pub const PERIOD_PUSHED: &str = "period_pushed";

/// The database takes no writes: no job can run until it does (ER-6).
pub const DATABASE_READ_ONLY: &str = "database_read_only";

/// The database takes writes again after it was read-only (ER-6).
pub const DATABASE_WRITABLE: &str = "database_writable";

/// The database could not be reached at start; another attempt follows (ER-2).
pub const DATABASE_UNREACHABLE: &str = "database_unreachable";

/// An object-store root's store did not answer at start; another attempt follows (ER-2, OS-1).
pub const OBJECT_STORE_UNREACHABLE: &str = "object_store_unreachable";

/// A queue consumer failed and is restarted after a pause (ER-2); logged once per interval.
pub const CONSUMER_RESTARTING: &str = "consumer_restarting";

/// A run until idle finds the queue empty while this worker still handles jobs (their rows gone),
/// and waits for them (FL-5).
pub const WAITING_FOR_OWN_JOBS: &str = "waiting_for_own_jobs";
