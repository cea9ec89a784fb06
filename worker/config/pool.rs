//! The pool a worker needs (FL-6): no hop may fail for want of a connection. What the
//! registered job kinds hold at once, computed here alone: the check of
//! `database.max_connections` uses it, and `sexton generate` writes it into `config/default.toml`
//! and docs/operating.md.

use super::Section;

/// Connections a worker holds besides its hops and its queues: the LISTEN connection that wakes
/// the queues, the schedule and its fan-out, and the gauges.
pub const FIXED_CONNECTIONS: u32 = 3;

/// Connections each queue consumer may hold at once for the queue's own bookkeeping (fetch,
/// heartbeat, acknowledgements): one each, every consumer at the same moment when the database
/// comes back after an outage and they all retry at once (ER-2).
pub const CONNECTIONS_PER_QUEUE: u32 = 1;

/// The connections one worker may hold at once, and what they are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBudget {
    /// Hops running at once across all queues (`queue.concurrency`).
    pub concurrency: usize,
    /// Connections the widest job kind's hop holds (`Job::CONNECTIONS`), of those in the
    /// shared budget.
    pub per_hop: u32,
    /// Connections the hop slot beside the shared budget holds (`Job::BESIDE`): the widest of
    /// its kinds', 0 without one.
    pub beside: u32,
    /// Queues a worker consumes: one per job kind and the nightly one.
    pub queues: u64,
}

impl PoolBudget {
    /// The budget of a worker running `concurrency` hops of the job kinds `jobs`.
    pub fn new(concurrency: usize, jobs: &[&dyn Section]) -> Self {
        Self {
            concurrency,
            per_hop: jobs
                .iter()
                .filter(|j| !j.beside())
                .map(|j| j.connections())
                .max()
                .unwrap_or(1),
            beside: jobs
                .iter()
                .filter(|j| j.beside())
                .map(|j| j.connections())
                .max()
                .unwrap_or(0),
            queues: jobs.len() as u64 + 1,
        }
    }

    /// Connections the queues' bookkeeping may hold at once.
    pub fn bookkeeping(&self) -> u64 {
        self.queues * u64::from(CONNECTIONS_PER_QUEUE)
    }

    /// The least `database.max_connections` that serves it.
    pub fn needed(&self) -> u64 {
        self.concurrency as u64 * u64::from(self.per_hop)
            + u64::from(self.beside)
            + u64::from(FIXED_CONNECTIONS)
            + self.bookkeeping()
    }

    /// What `database.max_connections` is expected to be, and why.
    pub fn expected(&self) -> String {
        format!(
            "at least queue.concurrency ({}) x {} connections per hop + {} for the hop beside \
             them + {FIXED_CONNECTIONS} for the listener, schedule and gauges + {} for the {} \
             queues' bookkeeping = {}; raise it or lower queue.concurrency",
            self.concurrency,
            self.per_hop,
            self.beside,
            self.bookkeeping(),
            self.queues,
            self.needed()
        )
    }
}
