//! SessionRetention (SPEC §3, seeds 000 and 002): deletes old agent sessions with their history
//! — live entries, archives and archive entries — and, after commit, their archive frame
//! directories; handoffs that point at a deleted session keep their rows with the reference
//! nulled.
//!
//! A nightly pass per account is one chain of hops over the account's sessions, kind by kind
//! (main, task, subagent), each kind in (last activity, id) order through
//! `sessions_retention_window`; the kinds share a hop's window and budget, so that a hop hands
//! over only when one of them is spent (FL-8). The policy is the account's persisted one (SS-1: missing or
//! disabled prunes nothing) or, for `sexton sessions prune`, ages given by the operator. The
//! verdict on a session — old enough (SS-2), not protected (SS-3), with its evidence (SS-4) —
//! is `sexton.session_verdict`, one SQL function used for the window, the re-check and the
//! preview alike. Sessions go in short transactions of a few: their agents are share-locked and
//! the sessions locked (SKIP LOCKED: a busy session is counted and revisited next pass), the
//! verdict re-checked under those locks (SS-5), and a session's whole history deleted with its
//! row in the same transaction, so no surviving session ever loses part of its history. The
//! store guard (`sexton.guard_protected_session`) refuses the delete of a protected session
//! independently of all this.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::cutoff::days_before;
use crate::files::{PathSettings, Root};
pub use crate::job::HopOutcome;
use crate::job::{Due, Job, Report};
use crate::owner_loop::{Bounds, End};
use crate::pass::{self, Now, Removals, Step};
use crate::settings::{Check, Raw};

mod hop;
mod read;
mod sql;
use hop::{ages, hop};
pub use read::*;
pub use sql::{delete_statement, window_statement};

/// A session kind, in the order a pass visits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    Main,
    Task,
    Subagent,
}

impl SessionKind {
    pub const ALL: [SessionKind; 3] = [SessionKind::Main, SessionKind::Task, SessionKind::Subagent];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Main => "main",
            SessionKind::Task => "task",
            SessionKind::Subagent => "subagent",
        }
    }

    fn next(self) -> Option<SessionKind> {
        match self {
            SessionKind::Main => Some(SessionKind::Task),
            SessionKind::Task => Some(SessionKind::Subagent),
            SessionKind::Subagent => None,
        }
    }
}

/// Ages in days per kind (SS-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ages {
    pub main_days: i32,
    pub task_days: i32,
    pub subagent_days: i32,
}

impl Ages {
    /// The fallback ages of an enabled policy, and the CLI's defaults: 60, 30, 7 days.
    pub const FALLBACK: Ages = Ages {
        main_days: 60,
        task_days: 30,
        subagent_days: 7,
    };

    fn days(&self, kind: SessionKind) -> i32 {
        match kind {
            SessionKind::Main => self.main_days,
            SessionKind::Task => self.task_days,
            SessionKind::Subagent => self.subagent_days,
        }
    }

    /// The kinds whose age is 0 or less: the platform's table allows it, but nothing of such a
    /// kind is old (SS-1), as the CLI refuses the same value.
    fn invalid(&self) -> impl Iterator<Item = SessionKind> + '_ {
        SessionKind::ALL
            .into_iter()
            .filter(|kind| !crate::cutoff::valid_window(self.days(*kind)))
    }

    /// The cutoff of each kind, measured back from `reference`: none for an age that is not a
    /// valid one (SS-1) or that reaches past the calendar.
    pub fn cutoffs(&self, reference: DateTime<Utc>) -> Cutoffs {
        Cutoffs {
            main: days_before(reference, self.main_days),
            task: days_before(reference, self.task_days),
            subagent: days_before(reference, self.subagent_days),
        }
    }
}

/// Where the ages come from (SS-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Policy {
    /// The account's `session_retention_policies` row: missing or disabled prunes nothing; an
    /// enabled one's missing ages fall back to [`Ages::FALLBACK`]. The nightly job.
    Persisted,
    /// Ages the operator gave (`sexton sessions prune`), whatever the persisted policy says.
    Fixed(Ages),
}

/// An account's row of `session_retention_policies`, if it has one: its columns, read by
/// name (`enabled`, `main_days`, `task_days`, `subagent_days`), flattened into a wider row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PolicyRow {
    pub enabled: Option<bool>,
    pub main_days: Option<i32>,
    pub task_days: Option<i32>,
    pub subagent_days: Option<i32>,
}

impl PolicyRow {
    /// The ages of an enabled policy, its missing ones falling back (SS-1); `None` when the
    /// policy is missing or disabled: nothing goes.
    pub fn ages(&self) -> Option<Ages> {
        (self.enabled == Some(true)).then(|| Ages {
            main_days: self.main_days.unwrap_or(Ages::FALLBACK.main_days),
            task_days: self.task_days.unwrap_or(Ages::FALLBACK.task_days),
            subagent_days: self.subagent_days.unwrap_or(Ages::FALLBACK.subagent_days),
        })
    }
}

/// The cutoff of each kind; `None` where the window reaches back past the calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cutoffs {
    pub main: Option<DateTime<Utc>>,
    pub task: Option<DateTime<Utc>>,
    pub subagent: Option<DateTime<Utc>>,
}

impl Cutoffs {
    pub fn of(&self, kind: SessionKind) -> Option<DateTime<Utc>> {
        match kind {
            SessionKind::Main => self.main,
            SessionKind::Task => self.task,
            SessionKind::Subagent => self.subagent,
        }
    }

    /// The stricter of two cutoffs, kind by kind (EX-7's rule, for sessions).
    fn min(&self, other: &Cutoffs) -> Cutoffs {
        let min =
            |a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>| a.zip(b).map(|(a, b)| a.min(b));
        Cutoffs {
            main: min(self.main, other.main),
            task: min(self.task, other.task),
            subagent: min(self.subagent, other.subagent),
        }
    }
}

/// A position in a pass: the kind being visited and the last session visited in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    pub kind: SessionKind,
    /// The last session visited of that kind; `None` at the start of the kind.
    pub after: Option<(DateTime<Utc>, Uuid)>,
}

/// One hop's payload: the pass's envelope with this kind's cutoffs and cursor.
pub type Args = crate::pass::ArgsOf<SessionRetention>;

/// The `[sessions]` section as given.
#[derive(Debug, Deserialize)]
pub struct RawSettings {
    window_size: Raw<i64>,
    sessions_per_transaction: Raw<i64>,
    transaction_target_ms: Raw<i64>,
    hop_budget_ms: Raw<i64>,
    lock_timeout_ms: Raw<i64>,
}

/// How much one hop may do.
#[derive(Debug, Clone)]
pub struct HopSettings {
    /// Sessions read per hop.
    pub window_size: u32,
    /// Most sessions deleted together in one transaction (a session's whole history goes with
    /// it).
    pub sessions_per_transaction: u32,
    /// How long one such transaction should last: the number taken together is scaled toward
    /// it after every transaction.
    pub transaction_target: Duration,
    /// Time after which a hop stops taking sessions and hands over to the next hop.
    pub budget: Duration,
    /// Longest wait for any lock inside a deletion (child rows an application holds).
    pub lock_timeout: Duration,
    /// Where the ages come from: the account's persisted policy (the nightly job), or ages the
    /// operator gave (`sexton sessions prune`).
    pub policy: Policy,
}

crate::reasons! {
    /// Why a session was left in place this pass, as counted in metrics: the verdicts of
    /// `sexton.session_verdict`, and what the hop itself finds.
    pub enum SessionReason {
        NotEligible = "not_eligible",
        LegalHold = "legal_hold",
        ProtectedState = "protected_state",
        ProtectedPointer = "protected_pointer",
        MissingEvidence = "missing_evidence",
        MalformedEvidence = "malformed_evidence",
        TaskNotTerminal = "task_not_terminal",
        Busy = "busy",
        /// A kind whose policy age is 0 or less, counted once per pass (SS-1).
        InvalidPolicy = "invalid_policy",
    }
}

/// The history tables, in the order reports list them; `sessions` itself last.
pub const TABLES: [&str; 4] = [
    "conversation_entries",
    "conversation_archive_entries",
    "conversation_archives",
    "sessions",
];

/// Every table a hop writes: the history, the handoffs it unlinks, the file records.
const WRITTEN: [&str; 6] = [
    TABLES[0],
    TABLES[1],
    TABLES[2],
    TABLES[3],
    "handoffs",
    "pending_file_deletions",
];

pub use crate::owner_loop::Error;

/// The job kind, as the worker registers it.
pub struct SessionRetention;

impl Job for SessionRetention {
    const NAME: &'static str = "session_retention";
    const SECTION: &'static str = "sessions";
    const TABLES: &'static [&'static str] = &TABLES;

    type Reason = SessionReason;
    type Cutoff = Cutoffs;
    type Cursor = Cursor;
    type Raw = RawSettings;
    type Settings = HopSettings;
    type Error = Error;

    fn settings(s: RawSettings, _paths: &PathSettings, c: &mut Check<'_>) -> Option<HopSettings> {
        let window_size = c.window_size("sessions.window_size", &s.window_size);
        let sessions_per_transaction = c.int(
            "sessions.sessions_per_transaction",
            &s.sessions_per_transaction,
            1..=1000,
            "an integer from 1 to 1000",
        );
        let transaction_target =
            c.millis("sessions.transaction_target_ms", &s.transaction_target_ms);
        let budget = c.millis("sessions.hop_budget_ms", &s.hop_budget_ms);
        let lock_timeout = c.millis("sessions.lock_timeout_ms", &s.lock_timeout_ms);
        Some(HopSettings {
            window_size: window_size?,
            sessions_per_transaction: sessions_per_transaction?,
            transaction_target: transaction_target?,
            budget: budget?,
            lock_timeout: lock_timeout?,
            policy: Policy::Persisted,
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
            root: Root::Sessions,
            store: paths.store(Root::Sessions),
        })
    }

    async fn policy(now: Now<'_, Self>) -> Result<pass::Policy<Cutoffs>, Error> {
        let account = now.account.unwrap_or_default();
        Ok(match ages(now.conn, account, now.settings.policy).await? {
            Ok(ages) => pass::Policy::Cutoff(ages.cutoffs(now.reference)),
            Err(outcome) => pass::Policy::Ends(outcome),
        })
    }

    async fn run(
        step: Step<'_, Self>,
        report: &mut Report<SessionReason>,
    ) -> Result<End<Cursor>, Error> {
        hop(step, report).await
    }
}

impl pass::Cutoff for Cutoffs {
    /// Kind by kind.
    fn stricter(&self, other: &Cutoffs) -> Cutoffs {
        self.min(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ss1_cutoffs_take_the_stricter_of_carried_and_current_kind_by_kind() {
        let at = |s: &str| Some(s.parse::<DateTime<Utc>>().unwrap());
        let carried = Cutoffs {
            main: at("2026-10-01T00:00:00Z"),
            task: at("2026-11-01T00:00:00Z"),
            subagent: None,
        };
        let current = Cutoffs {
            main: at("2026-10-15T00:00:00Z"),
            task: at("2026-10-20T00:00:00Z"),
            subagent: at("2026-11-20T00:00:00Z"),
        };
        assert_eq!(
            carried.min(&current),
            Cutoffs {
                main: at("2026-10-01T00:00:00Z"),
                task: at("2026-10-20T00:00:00Z"),
                subagent: None,
            }
        );
    }
}
