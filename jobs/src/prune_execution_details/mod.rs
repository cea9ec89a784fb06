//! PruneExecutionDetails (SPEC §2, seed 003): removes the execution detail of conversation runs
//! whose account's retention window has passed, keeping the conversation itself.
//!
//! A nightly pass per account is a chain of hops (EX-7). Each hop reads one bounded window of
//! candidates through `runs_execution_details_window` in (age, id) order after its cursor, and
//! takes them through short transactions of several owners each, sized by time: conversation
//! rows locked first, then the runs (EX-6), eligibility re-checked under those locks (EX-1,
//! EX-2, EX-5), detail deleted and markers set together (EX-3, EX-9). Owned output files are
//! recorded in `sexton.pending_file_deletions` inside that transaction and unlinked after it
//! commits. The hop then reports the next hop's arguments — same cutoff, advanced cursor — if
//! the window was full or its time budget ran out.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::files::{PathSettings, Root};
pub use crate::job::HopOutcome;
use crate::job::{Due, Job, Report};
use crate::owner_loop::{Bounds, End};
use crate::pass::{Now, Policy, Removals, Step};
use crate::settings::{Check, Raw};

mod hop;
mod read;
mod sql;
pub use hop::FIRST_TOGETHER;
use hop::{hop, policy};
pub use read::*;
use sql::{BLOCKERS, PRUNE_WAITING};

/// `runner_effects` of a pruned run and its variant (EX-3).
pub fn pruned_runner_effects() -> serde_json::Value {
    serde_json::json!({"status": "unavailable", "runners": [], "reason": "execution_details_pruned"})
}

/// The owner statement a hop runs once its owners' conversations are locked, waiting for the
/// runs' locks: the rules it keeps (EX-1, EX-2 and EX-5 re-checked under the lock, EX-3's
/// record of the files, EX-4's account) in one statement, with `prune_locked`'s parameters. The
/// benchmark times it in a plain loop, to tell what the rules cost from what the hops do.
pub fn owner_statement() -> &'static str {
    &PRUNE_WAITING
}

/// The seven execution-detail tables, in deletion order.
pub const DETAIL_TABLES: [&str; 7] = [
    "run_task_edges",
    "run_tasks",
    "tool_results",
    "sealed_requests",
    "reasoning_traces",
    "invocation_attempts",
    "output_files",
];

/// Every table a hop writes: the detail tables, the markers' tables, the file records.
const WRITTEN: [&str; DETAIL_TABLES.len() + 3] = {
    let others = ["runs", "variants", "pending_file_deletions"];
    let mut written = [""; DETAIL_TABLES.len() + 3];
    let mut i = 0;
    while i < written.len() {
        written[i] = if i < DETAIL_TABLES.len() {
            DETAIL_TABLES[i]
        } else {
            others[i - DETAIL_TABLES.len()]
        };
        i += 1;
    }
    written
};

/// One hop's payload: the pass's envelope with this kind's cutoff and cursor.
pub type Args = crate::pass::ArgsOf<PruneExecutionDetails>;

/// A position in the (age, id) order of candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    pub age: DateTime<Utc>,
    pub run_id: Uuid,
}

/// The `[execution_details]` section as given.
#[derive(Debug, Deserialize)]
pub struct RawSettings {
    window_size: Raw<i64>,
    owners_per_transaction: Raw<i64>,
    transaction_target_ms: Raw<i64>,
    hop_budget_ms: Raw<i64>,
    owner_lock_timeout_ms: Raw<i64>,
}

/// How much one hop may do.
#[derive(Debug, Clone)]
pub struct HopSettings {
    /// Candidates read per hop.
    pub window_size: u32,
    /// The most owners taken together through one transaction; a busy one is retried alone.
    pub owners_per_transaction: u32,
    /// How long one such transaction should last: the number of owners taken together is
    /// adjusted after each transaction to approach it, which keeps a writer's wait near it.
    pub transaction_target: Duration,
    /// Time after which a hop stops taking new owners and hands over to the next hop.
    pub budget: Duration,
    /// Longest wait for an owner's conversation or run lock before it is skipped as busy.
    pub owner_lock_timeout: Duration,
}

/// Why an owner was left in place this pass (EX-5, EX-6), as counted in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetainReason {
    /// A hold covers the run: its account, its conversation or itself (HD-2).
    LegalHold,
    /// An invocation attempt is pending or running.
    PendingWork,
    /// A settlement receipt is pending.
    PendingSettlement,
    /// A delegation from this run is outstanding.
    OutstandingDelegation,
    /// The run is a source of an unsealed history request (inherited sources included).
    ActiveHistoryRequest,
    /// Under lock the run was no longer old enough or no longer an owner.
    NotEligible,
    /// The conversation or run lock was not granted in time.
    Busy,
    /// The account's window is 0 or less, which the platform's table allows but which means
    /// nothing (EX-1): nothing of the account is old. Counted once per pass, not per owner.
    InvalidWindow,
}

impl RetainReason {
    pub const ALL: [RetainReason; 8] = [
        RetainReason::LegalHold,
        RetainReason::PendingWork,
        RetainReason::PendingSettlement,
        RetainReason::OutstandingDelegation,
        RetainReason::ActiveHistoryRequest,
        RetainReason::NotEligible,
        RetainReason::Busy,
        RetainReason::InvalidWindow,
    ];

    /// The labels of [`RetainReason::ALL`], in that order.
    pub const NAMES: [&'static str; 8] = {
        let mut names = [""; 8];
        let mut i = 0;
        while i < names.len() {
            names[i] = RetainReason::ALL[i].as_str();
            i += 1;
        }
        names
    };

    pub const fn as_str(self) -> &'static str {
        match self {
            RetainReason::LegalHold => "legal_hold",
            RetainReason::PendingWork => "pending_work",
            RetainReason::PendingSettlement => "pending_settlement",
            RetainReason::OutstandingDelegation => "outstanding_delegation",
            RetainReason::ActiveHistoryRequest => "active_history_request",
            RetainReason::NotEligible => "not_eligible",
            RetainReason::Busy => "busy",
            RetainReason::InvalidWindow => "invalid_window",
        }
    }
}

impl crate::job::Reason for RetainReason {
    const ALL: &'static [Self] = &RetainReason::ALL;

    fn as_str(self) -> &'static str {
        RetainReason::as_str(self)
    }
}

/// Counts what one owner transaction's statement found and did.
fn record(report: &mut Report<RetainReason>, locked: &[Locked]) {
    for owner in locked {
        match owner.verdict() {
            Verdict::Prune => report.pruned += 1,
            Verdict::Retain(reason) => report.retain(reason, 1),
            Verdict::AlreadyPruned => {}
        }
    }
    if let Some(first) = locked.first() {
        for (table, deleted) in DETAIL_TABLES.iter().zip(&first.deleted) {
            report.deleted(table, (*deleted).max(0) as u64);
        }
    }
}

pub use crate::owner_loop::Error;

/// One owner as the owner transaction's statement found it under lock, with — the same on
/// every row — what that statement deleted.
#[derive(sqlx::FromRow)]
struct Locked {
    id: Uuid,
    pruned: bool,
    eligible: bool,
    /// Whether each of [`BLOCKERS`] holds it back, in that order.
    blocked: Vec<bool>,
    /// Detail rows deleted, per table in [`DETAIL_TABLES`] order.
    deleted: Vec<i64>,
}

enum Verdict {
    Prune,
    Retain(RetainReason),
    /// Already pruned since the window was read.
    AlreadyPruned,
}

impl Locked {
    /// The statement prunes exactly the owners judged [`Verdict::Prune`] here: not yet pruned,
    /// eligible, and held back by no blocker (see [`prune_locked`]).
    fn verdict(&self) -> Verdict {
        if self.pruned {
            return Verdict::AlreadyPruned;
        }
        if !self.eligible {
            return Verdict::Retain(RetainReason::NotEligible);
        }
        match BLOCKERS
            .iter()
            .zip(&self.blocked)
            .find(|(_, blocked)| **blocked)
        {
            Some((reason, _)) => Verdict::Retain(*reason),
            None => Verdict::Prune,
        }
    }
}

/// The job kind, as the worker registers it.
pub struct PruneExecutionDetails;

impl Job for PruneExecutionDetails {
    const NAME: &'static str = "prune_execution_details";
    const SECTION: &'static str = "execution_details";
    /// The owner transactions' and the files' drain beside them ([`files::Beside`]).
    const CONNECTIONS: u32 = 2;
    const TABLES: &'static [&'static str] = &DETAIL_TABLES;

    type Reason = RetainReason;
    type Cutoff = DateTime<Utc>;
    type Cursor = Cursor;
    type Raw = RawSettings;
    type Settings = HopSettings;
    type Error = Error;

    fn settings(e: RawSettings, _paths: &PathSettings, c: &mut Check<'_>) -> Option<HopSettings> {
        let window_size = c.window_size("execution_details.window_size", &e.window_size);
        let owners_per_transaction = c.int(
            "execution_details.owners_per_transaction",
            &e.owners_per_transaction,
            1..=10_000,
            "an integer from 1 to 10000",
        );
        let transaction_target = c.millis(
            "execution_details.transaction_target_ms",
            &e.transaction_target_ms,
        );
        let budget = c.millis("execution_details.hop_budget_ms", &e.hop_budget_ms);
        let owner_lock_timeout = c.millis(
            "execution_details.owner_lock_timeout_ms",
            &e.owner_lock_timeout_ms,
        );
        Some(HopSettings {
            window_size: window_size?,
            owners_per_transaction: owners_per_transaction?,
            transaction_target: transaction_target?,
            budget: budget?,
            owner_lock_timeout: owner_lock_timeout?,
        })
    }

    fn due(_settings: &HopSettings, slot: DateTime<Utc>) -> Due {
        due(slot)
    }

    fn bounds(settings: &HopSettings) -> Bounds {
        Bounds {
            window: Some(settings.window_size),
            budget: settings.budget,
        }
    }

    fn removals(_settings: &HopSettings, paths: &PathSettings) -> Option<Removals> {
        Some(Removals {
            root: Root::Outputs,
            store: paths.store(Root::Outputs),
        })
    }

    async fn policy(now: Now<'_, Self>) -> Result<Policy<DateTime<Utc>>, Error> {
        policy(now).await
    }

    async fn run(
        step: Step<'_, Self>,
        report: &mut Report<RetainReason>,
    ) -> Result<End<Cursor>, Error> {
        hop(step, report).await
    }
}

#[cfg(test)]
mod tests {
    use super::sql::{BACKLOG, BACKLOG_SCAN, PREVIEW, PRUNE_LOCKED};
    use super::*;

    #[test]
    fn every_statement_matches_its_golden_file() {
        let g = crate::golden::check;
        g("prune_execution_details/prune_together", &PRUNE_LOCKED);
        g("prune_execution_details/prune_alone", &PRUNE_WAITING);
        g("prune_execution_details/backlog", &BACKLOG);
        g("prune_execution_details/backlog_scan", &BACKLOG_SCAN);
        g("prune_execution_details/preview", &PREVIEW);
    }
}
