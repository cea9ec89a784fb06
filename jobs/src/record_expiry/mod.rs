//! Short-lived records (SPEC §4, TTL-1 … TTL-5): handoffs, dream preloads, working records and
//! rolling cards, and conversation event replay expire by age, each kind its own job
//! (`expire_handoffs`, `expire_dream_preloads`, `expire_working_records`,
//! `expire_conversation_events`), global rather than per account: age alone decides, whatever
//! the account's other policies (TTL-4: events go after 30 days even where execution retention
//! is disabled).
//!
//! A pass is a chain of hops over one table in (age, id) order through an index, with its
//! cutoff fixed by the first hop and carried. A hop deletes batch after batch, each batch one
//! statement and so its own short transaction: it reads the next `batch_size` expired rows,
//! locks those no application holds (`SKIP LOCKED`: a held row is counted `busy` and revisited
//! by the next pass, never waited on), re-checks their age under the lock (an update that made
//! a record young again, or pinned it, wins), and deletes them. Nothing here reads or writes
//! `brain_memories` (TTL-5).

use std::marker::PhantomData;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::cutoff::days_before;
use crate::files::PathSettings;
pub use crate::job::HopOutcome;
use crate::job::{Cadence, Job, Report, Scope};
use crate::owner_loop::{Bounds, End};
use crate::pass::{Now, Policy, Step};
use crate::settings::{Check, Raw};

mod hop;
mod kinds;
mod read;
mod sql;
use hop::hop;
pub use kinds::*;
pub use read::*;

/// The `[expiry]` section: one age per record kind (0 disables that kind) and the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpirySettings {
    pub handoffs_days: i32,
    pub dream_preloads_days: i32,
    pub working_records_days: i32,
    pub conversation_events_days: i32,
    /// Rows read, locked and deleted together in one statement.
    pub batch_size: u32,
    /// A hop stops taking batches after this long and hands over to the next hop.
    pub budget: Duration,
}

/// A kind of short-lived record: its table, what its age is measured from, and the statements
/// that read and delete it. Every statement names its table and columns in full.
pub trait Record: Send + Sync + 'static {
    /// The job's name, and so its metric label and queue (`sexton.<JOB>`).
    const JOB: &'static str;
    const TABLE: &'static str;
    /// The rule it implements, for logs and `preview`.
    const RULE: &'static str;
    /// The `[expiry]` setting of its age.
    const SETTING: &'static str;
    /// The smallest id, as text: where the cursor of a pass's first hop stands.
    const FIRST_ID: &'static str;
    /// The SQL type of its ids.
    const ID_TYPE: &'static str;
    /// A boolean column that keeps a row whatever its age, if the kind has one.
    const PINNED: Option<&'static str> = None;
    /// The predicate that a row belongs to one of the accounts `$3` (`uuid[]`).
    const OF_ACCOUNTS: &'static str = "account_id = ANY($3)";

    /// What `sexton explain` calls one record (`handoff`, …).
    const SUBJECT: &'static str;
    /// The column its age is measured from.
    const AGE: &'static str;
    /// The holds that cover a row `t` of it (HD-2): a call of the holds migration's functions;
    /// by default those of a record of an agent (its account, its agent).
    const HOLDS: &'static str = "sexton.agent_record_holds(t.account_id, t.agent_id)";
    /// One record for `sexton explain`: `$1` its id (as text); its account, its age and whether
    /// it is pinned (never for kinds without pins).
    const ROW: &'static str;

    fn days(settings: &ExpirySettings) -> i32;
}

crate::reasons! {
    /// Why a record was left in place this pass.
    pub enum RecordReason {
        /// Locked by an application, or changed (made young again, pinned) since it was read.
        Busy = "busy",
        /// A hold covers it (HD-2).
        LegalHold = "legal_hold",
    }
}

pub use crate::owner_loop::Error;

/// One hop's payload, the same for every record kind: the pass's envelope with its cutoff and
/// the last row visited (its age and id as text).
pub type Args = crate::pass::Args<DateTime<Utc>, (DateTime<Utc>, String)>;

/// A short-lived record kind as a job.
pub struct Expire<R>(PhantomData<R>);

/// The `[expiry]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    handoffs_days: Raw<i64>,
    dream_preloads_days: Raw<i64>,
    working_records_days: Raw<i64>,
    conversation_events_days: Raw<i64>,
    batch_size: Raw<i64>,
    hop_budget_ms: Raw<i64>,
}

/// Reads `[expiry]`. Every kind reads the whole section; a problem is reported once.
fn settings(s: RawSettings, c: &mut Check<'_>) -> Option<ExpirySettings> {
    let mut days = |setting: &str, raw: &Raw<i64>| {
        c.int::<i32>(
            setting,
            raw,
            0..=36_500,
            "a number of days from 0 (never expires) to 36500",
        )
    };
    let handoffs_days = days("expiry.handoffs_days", &s.handoffs_days);
    let dream_preloads_days = days("expiry.dream_preloads_days", &s.dream_preloads_days);
    let working_records_days = days("expiry.working_records_days", &s.working_records_days);
    let conversation_events_days = days(
        "expiry.conversation_events_days",
        &s.conversation_events_days,
    );
    let batch_size = c.int(
        "expiry.batch_size",
        &s.batch_size,
        1..=100_000,
        "an integer from 1 to 100000",
    );
    let budget = c.millis("expiry.hop_budget_ms", &s.hop_budget_ms);
    Some(ExpirySettings {
        handoffs_days: handoffs_days?,
        dream_preloads_days: dream_preloads_days?,
        working_records_days: working_records_days?,
        conversation_events_days: conversation_events_days?,
        batch_size: batch_size?,
        budget: budget?,
    })
}

impl<R: Record> Job for Expire<R> {
    const NAME: &'static str = R::JOB;
    const SCOPE: Scope = Scope::Global;
    const SECTION: &'static str = "expiry";
    const TABLES: &'static [&'static str] = &[R::TABLE];

    type Reason = RecordReason;
    type Cutoff = DateTime<Utc>;
    /// The last row visited: its age and id as text.
    type Cursor = (DateTime<Utc>, String);
    type Raw = RawSettings;
    type Settings = ExpirySettings;
    type Error = Error;

    fn settings(
        raw: RawSettings,
        _paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<ExpirySettings> {
        settings(raw, check)
    }

    /// Off at `0` days (TTL-5): the fan-out starts no pass of a kind that expires nothing.
    fn cadence(settings: &ExpirySettings) -> Cadence {
        if R::days(settings) > 0 {
            Cadence::Nightly
        } else {
            Cadence::Off
        }
    }

    fn bounds(settings: &ExpirySettings) -> Bounds {
        Bounds {
            window: None,
            budget: settings.budget,
        }
    }

    /// Off at `0` days: the pass ends; a window past the calendar expires nothing.
    async fn policy(now: Now<'_, Self>) -> Result<Policy<DateTime<Utc>>, Error> {
        Ok(match R::days(now.settings) {
            0 => Policy::Ends(HopOutcome::Disabled),
            days => Policy::up_to(days_before(now.reference, days)),
        })
    }

    async fn run(
        step: Step<'_, Self>,
        report: &mut Report<RecordReason>,
    ) -> Result<End<(DateTime<Utc>, String)>, Error> {
        hop::<R>(step, report).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden<R: Record>() {
        crate::golden::check(
            &format!("record_expiry/{}_batch", R::TABLE),
            &sql::batch::<R>(),
        );
        crate::golden::check(
            &format!("record_expiry/{}_oldest", R::TABLE),
            &sql::oldest::<R>(),
        );
        crate::golden::check(
            &format!("record_expiry/{}_count", R::TABLE),
            &sql::count::<R>(),
        );
    }

    #[test]
    fn every_statement_matches_its_golden_file() {
        golden::<Handoffs>();
        golden::<DreamPreloads>();
        golden::<WorkingRecords>();
        golden::<ConversationEvents>();
    }

    #[test]
    fn ttl5_ages_are_validated_and_zero_disables() {
        let mut problems = Vec::new();
        let mut check = Check::new(&mut problems);
        let section = serde_json::json!({
            "handoffs_days": -1, "dream_preloads_days": 0, "working_records_days": "ninety",
            "conversation_events_days": 30, "batch_size": 0, "hop_budget_ms": 1000
        });
        assert!(settings(serde_json::from_value(section).unwrap(), &mut check).is_none());
        let named: Vec<&str> = problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(
            named,
            [
                "expiry.handoffs_days",
                "expiry.working_records_days",
                "expiry.batch_size"
            ]
        );
    }
}
