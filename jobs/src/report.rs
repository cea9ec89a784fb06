//! What a hop did, in the terms every job kind shares: how it ended ([`HopOutcome`]), and
//! the [`Report`] of what it removed and kept, its retained reasons an enum of the kind's own
//! ([`Reason`], declared with [`reasons!`](crate::reasons)).

use std::fmt;

use serde::Serialize;

use crate::files::FileCounts;
use crate::health::Indicator;

/// How a hop ended, for every job kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HopOutcome {
    /// The window was full or the budget ran out: another hop follows.
    Continued,
    /// The pass is complete.
    Finished,
    /// The account's policy turns this job off (EX-1, SS-1): the pass ends, nothing goes.
    Disabled,
    /// The account no longer exists (ER-4): the pass ends quietly.
    AccountGone,
    /// The database is unhealthy (replication lag, a vacuum on a table the job writes): the
    /// hop took no more owners and the next one waits `[health] backoff_ms`.
    Throttled,
    /// Another process holds the job's lease (the trace cleaner, TR-3): this hop did nothing.
    LeaseHeld,
    /// The hop failed (the worker's verdict, never a job's): it is retried or failed for good.
    Failed,
}

impl HopOutcome {
    /// The outcomes every kind's hops can end with, in the order metrics list them; a kind
    /// may end with [`HopOutcome::LeaseHeld`] too, and the worker counts [`HopOutcome::Failed`].
    pub const ALL: [HopOutcome; 5] = [
        HopOutcome::Continued,
        HopOutcome::Finished,
        HopOutcome::Disabled,
        HopOutcome::AccountGone,
        HopOutcome::Throttled,
    ];

    /// The label in metrics, logs and the pass ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            HopOutcome::Continued => "continued",
            HopOutcome::Finished => "finished",
            HopOutcome::Disabled => "disabled",
            HopOutcome::AccountGone => "account_gone",
            HopOutcome::Throttled => "throttled",
            HopOutcome::LeaseHeld => "lease_held",
            HopOutcome::Failed => "failed",
        }
    }
}

/// Why an owner was left in place, for one kind: an enum whose values are the `reason` labels
/// of its metrics, its pass ledger and `explain` (declared with [`reasons!`]). A reason the kind
/// does not declare cannot be counted; one read from the database that is not among them fails
/// the statement instead of being dropped.
pub trait Reason: Copy + Eq + Ord + fmt::Debug + Send + Sync + 'static {
    /// Every reason, in the order metrics list them.
    const ALL: &'static [Self];

    /// The label in metrics, logs, the pass ledger and `explain`.
    fn as_str(self) -> &'static str;
}

/// Declares a kind's [`Reason`] enum, each variant with its label, decoded from text by
/// `sqlx` (an unknown label is a decode error, never a silent drop).
#[macro_export]
macro_rules! reasons {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $label:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, sqlx::Type)]
        #[serde(rename_all = "snake_case")]
        #[sqlx(type_name = "text", rename_all = "snake_case")]
        $vis enum $name { $($(#[$vmeta])* $variant),* }

        impl $name {
            /// Its label in metrics, logs, the pass ledger and `explain`.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $label),* }
            }
        }

        impl $crate::report::Reason for $name {
            const ALL: &'static [Self] = &[$($name::$variant),*];

            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }
    };
}

/// A kind whose owners are never retained: no reason to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoReason {}

impl Reason for NoReason {
    const ALL: &'static [Self] = &[];

    fn as_str(self) -> &'static str {
        match self {}
    }
}

/// What one hop did, in the terms every job shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Report<R> {
    /// How the hop ended.
    pub outcome: HopOutcome,
    /// The bounded number of candidates the hop read at most.
    pub window: u32,
    /// Candidates the hop looked at.
    pub candidates: u64,
    /// Owners (runs, sessions, files, records) whose expired data was removed.
    pub pruned: u64,
    /// Owners left in place, by reason: every one of [`Reason::ALL`], in that order.
    pub retained: Vec<(R, u64)>,
    /// Rows deleted, by table.
    pub rows: Vec<(&'static str, u64)>,
    pub files: FileCounts,
    /// Time spent inside owner transactions.
    pub owner_seconds: f64,
    /// The red indicator that stopped the hop early, if one did: the next hop waits.
    pub throttled: Option<Indicator>,
}

impl<R: Reason> Report<R> {
    /// A hop that did nothing yet: finished, every count 0 (each reason listed), a row count
    /// for each of `tables`.
    pub fn new(tables: &[&'static str]) -> Self {
        Self {
            outcome: HopOutcome::Finished,
            window: 0,
            candidates: 0,
            pruned: 0,
            retained: R::ALL.iter().map(|r| (*r, 0)).collect(),
            rows: tables.iter().map(|t| (*t, 0)).collect(),
            files: FileCounts::default(),
            owner_seconds: 0.0,
            throttled: None,
        }
    }

    /// Counts `n` owners retained for `reason`.
    pub fn retain(&mut self, reason: R, n: u64) {
        if let Some((_, count)) = self.retained.iter_mut().find(|(r, _)| *r == reason) {
            *count += n;
        }
    }

    /// How many owners were retained for `reason`.
    pub fn retained(&self, reason: R) -> u64 {
        self.retained
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }

    /// Counts `n` rows deleted from `table`.
    pub fn deleted(&mut self, table: &str, n: u64) {
        match self.rows.iter_mut().find(|(t, _)| *t == table) {
            Some((_, count)) => *count += n,
            None => debug_assert!(false, "{table} is not among the hop's tables"),
        }
    }

    /// Rows deleted from `table`.
    pub fn rows_of(&self, table: &str) -> u64 {
        self.rows
            .iter()
            .find(|(t, _)| *t == table)
            .map_or(0, |(_, n)| *n)
    }

    pub fn retained_total(&self) -> u64 {
        self.retained.iter().map(|(_, n)| n).sum()
    }

    /// The retained counts by label.
    pub fn retained_by_label(&self) -> Vec<(&'static str, u64)> {
        self.retained
            .iter()
            .map(|(r, n)| (r.as_str(), *n))
            .collect()
    }
}
