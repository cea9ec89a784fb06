//! Erasure on request (SPEC §11): everything of an account, a conversation, an agent or a
//! session goes, now, whatever its age — children first in bounded transactions under the
//! platform's lock order, what is in flight or held withheld item by item and retried, verified
//! by an independent read, and proven by a chained receipt.
//!
//! A request is a row of `sexton.erasures` ([`request`]); the kind's passes work the open
//! requests one after the other, one hop at a time fleet-wide (a global kind, FL-3). `sexton
//! erase` starts a pass at once; the kind's cadence (`[erasure] retry_minutes`) starts one per
//! period for the requests that wait (RQ-3), and releasing a hold starts one (RQ-4). A request's
//! progress is its row, not the hop's payload: every step deletes what is left of its scope and
//! is as good run twice, so a pass that dies anywhere is resumed by the next one (EX-8).
//!
//! A pass over a request: its scope's ids found ([`plan`]), then the steps of [`steps`] in
//! order, each transaction locking a batch first and judging it in a fresh snapshot, then the
//! files drained, then what is left either withheld (the request waits) or verified
//! ([`verify`]) and the request completed with its receipt.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::files::PathSettings;
use crate::job::{Cadence, HopOutcome, Job, Report, Scope};
use crate::owner_loop::{Bounds, End, Error};
use crate::pass::{Now, Policy, Step};
use crate::receipts::ReceiptKey;
use crate::settings::{Check, Raw};

mod derivatives;
pub mod explain;
mod pass;
pub mod plan;
mod read;
pub mod request;
mod steps;
pub mod verify;
pub mod visible;

pub use request::{Erasure, Request, State};

/// Every statement an erasure's pass reads the platform's tables with — each scope's plan, each
/// step's, its verification's — with its parameters' types, for tests to read the plans the
/// database makes of them.
pub fn statements() -> Vec<(String, &'static str)> {
    let plans = Subject::ALL.into_iter().flat_map(|subject| {
        [false, true].map(|again| (plan::members(subject, again), "uuid, uuid"))
    });
    let steps = steps::STEPS.iter().flat_map(|step| match step.shape {
        steps::Shape::Owners { lock, take } => vec![
            (lock.to_owned(), "uuid, uuid, bigint"),
            (take.to_owned(), "uuid, uuid[], boolean"),
        ],
        steps::Shape::Sweep(sweep) => vec![(sweep.to_owned(), "uuid, bigint, boolean")],
    });
    let verification = verify::STATEMENTS.map(|(sql, types)| (sql.to_owned(), types));
    plans.chain(steps).chain(verification).collect()
}

crate::reasons! {
    /// Why an item of a request stays for now (RQ-3, RQ-4).
    pub enum Withheld {
        /// A hold covers it (§9).
        LegalHold = "legal_hold",
        /// A run, an attempt or a history request in flight, a session running or finalizing.
        InFlight = "in_flight",
        /// A session an agent points at (SS-3) that is not erased with it.
        PointedAt = "pointed_at",
        /// A row left because something under it is withheld.
        WithheldChild = "withheld_child",
        /// Locked by the platform when its batch came: taken by the next pass.
        Busy = "busy",
    }
}

/// What an erasure covers (RQ-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum Subject {
    Account,
    Conversation,
    Agent,
    Session,
}

impl Subject {
    pub const ALL: [Subject; 4] = [
        Subject::Account,
        Subject::Conversation,
        Subject::Agent,
        Subject::Session,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Subject::Account => "account",
            Subject::Conversation => "conversation",
            Subject::Agent => "agent",
            Subject::Session => "session",
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[erasure]` (RQ-1 … RQ-7).
#[derive(Debug, Clone)]
pub struct ErasureSettings {
    /// A request's due date, from when it is received, unless it names one.
    pub deadline: chrono::Duration,
    /// How often a request with withheld items is tried again.
    pub retry: chrono::Duration,
    /// How long before its due date an open request is reported as about to be late.
    pub warn: chrono::Duration,
    /// Usage records stay, their links to content cleared (RQ-2).
    pub keep_usage_records: bool,
    /// The secret subjects are hashed under (RQ-6); requests are refused without it.
    pub receipt_key: Option<ReceiptKey>,
    /// Rows (or owners) one transaction takes at most.
    pub batch_size: u32,
    /// How long one transaction should last: its size follows (PF-2).
    pub transaction_target: std::time::Duration,
    /// Time after which a hop takes no further step.
    pub budget: std::time::Duration,
}

/// The `[erasure]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    deadline_days: Raw<i64>,
    retry_minutes: Raw<i64>,
    warn_days: Raw<i64>,
    keep_usage_records: Raw<bool>,
    #[serde(default)]
    receipt_key: Option<Raw<String>>,
    batch_size: Raw<i64>,
    transaction_target_ms: Raw<i64>,
    hop_budget_ms: Raw<i64>,
}

fn settings(s: RawSettings, c: &mut Check<'_>) -> Option<ErasureSettings> {
    let days = "a number of days from 1 to 3650";
    let deadline = c.int::<i64>("erasure.deadline_days", &s.deadline_days, 1..=3650, days);
    let retry = c.int::<i64>(
        "erasure.retry_minutes",
        &s.retry_minutes,
        1..=10_080,
        "a number of minutes from 1 to 10080 (a week)",
    );
    let warn = c.int::<i64>("erasure.warn_days", &s.warn_days, 0..=3650, days);
    let keep_usage_records = c.flag("erasure.keep_usage_records", &s.keep_usage_records);
    let receipt_key = match &s.receipt_key {
        None => Some(None),
        Some(Raw::Typed(key)) if key.is_empty() => Some(None),
        // Never shown, not even when it is refused.
        Some(Raw::Typed(key)) if key.len() >= 16 => Some(Some(ReceiptKey::new(key.as_bytes()))),
        Some(_) => {
            c.fail(
                "erasure.receipt_key",
                "a secret of at least 16 characters (from the environment: \
                 SEXTON_ERASURE__RECEIPT_KEY)",
                "a value that is not one (not shown)",
            );
            None
        }
    };
    let batch_size = c.int(
        "erasure.batch_size",
        &s.batch_size,
        1..=100_000,
        "an integer from 1 to 100000",
    );
    let transaction_target = c.millis("erasure.transaction_target_ms", &s.transaction_target_ms);
    let budget = c.millis("erasure.hop_budget_ms", &s.hop_budget_ms);
    Some(ErasureSettings {
        deadline: chrono::Duration::days(deadline?),
        retry: chrono::Duration::minutes(retry?),
        warn: chrono::Duration::days(warn?),
        keep_usage_records: keep_usage_records?,
        receipt_key: receipt_key?,
        batch_size: batch_size?,
        transaction_target: transaction_target?,
        budget: budget?,
    })
}

/// Where a pass stands: the request in hand, its step, and the last id that step took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub request: Uuid,
    pub step: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Uuid>,
    /// The step's last look, on one lane from its first owner: what its two lanes skipped
    /// because the other lane's transaction held it (a fork's parent link set to NULL by the
    /// other's delete) is taken now, and only a row the platform holds stays `busy`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alone: bool,
}

/// The erasure kind, as the worker registers it.
pub struct Erase;

impl Job for Erase {
    const NAME: &'static str = "erasure";
    const SCOPE: Scope = Scope::Global;
    const SECTION: &'static str = "erasure";
    const TABLES: &'static [&'static str] = steps::TABLES;
    /// An erasure runs beside the nightly passes, never in their slots (PF-8).
    const BESIDE: bool = true;
    /// A second lane for the owner steps while no other kind's pass is under way.
    const CONNECTIONS: u32 = 2;

    type Reason = Withheld;
    /// None: everything of the scope goes, whatever its age.
    type Cutoff = ();
    type Cursor = Cursor;
    type Raw = RawSettings;
    type Settings = ErasureSettings;
    type Error = Error;

    fn settings(
        raw: RawSettings,
        _paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<ErasureSettings> {
        settings(raw, check)
    }

    /// A pass per retry period for the requests that wait; `sexton erase` starts its own.
    fn cadence(settings: &ErasureSettings) -> Cadence {
        Cadence::Every(settings.retry)
    }

    fn bounds(settings: &ErasureSettings) -> Bounds {
        Bounds::new(None, settings.budget)
    }

    async fn policy(_now: Now<'_, Self>) -> Result<Policy<()>, Error> {
        Ok(Policy::Cutoff(()))
    }

    async fn run(
        step: Step<'_, Self>,
        report: &mut Report<Withheld>,
    ) -> Result<End<Cursor>, Error> {
        let mut requests = pass::Requests::new(step.settings, step.env);
        let end = step.hop.run(&mut requests, step.cursor, report).await?;
        if report.outcome == HopOutcome::Finished && requests.failed() > 0 {
            tracing::warn!(failed = requests.failed(), "erasure requests failed");
        }
        Ok(end)
    }
}
