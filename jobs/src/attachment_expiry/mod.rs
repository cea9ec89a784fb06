//! Attachment bytes (SPEC §4, AT-1): per account, in the nightly fan-out, an attachment whose
//! file was last modified more than `[attachments] max_age_days` ago loses its file and gets
//! `attachments.bytes_expired_at` set; the row stays. The file's mtime decides, not the row's
//! `created_at`.
//!
//! A pass is a chain of hops over the account's live attachments (`bytes_expired_at IS NULL`)
//! in id order. Each row's path is resolved under the attachments root one component at a time
//! without following a symlink: an absolute path, `..`, or a symlink anywhere on the way is
//! never followed — counted `outside_root`. A row whose file is missing is counted `missing`
//! and left unmarked (nothing says how old its bytes were; a restored file is judged next
//! night). Expired rows are marked, and their files recorded for removal, in one short
//! transaction that skips rows an application holds (`busy`); the files go after commit through
//! the shared mechanism (`files::drain`), which keeps a file another live attachment still
//! names. The artifacts root is never touched.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use crate::cutoff::days_before;
use crate::files::{self, PathSettings, Root};
use crate::job::{Due, HopOutcome, Job, Report};
use crate::owner_loop::{Bounds, End};
use crate::pass::{Now, Policy, Removals, Step};
use crate::settings::{Check, Raw};

mod hop;
mod read;
use hop::{Verdict, count, hop, judge, judge_all};
pub use read::*;

/// The `[attachments]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    max_age_days: Raw<i64>,
    window_size: Raw<i64>,
    hop_budget_ms: Raw<i64>,
}

/// `[attachments]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentSettings {
    /// Files older than this many days (by mtime) expire; 0 disables.
    pub max_age_days: i32,
    /// Rows looked at per hop.
    pub window_size: u32,
    /// A hop stops after this long and hands the rest to the next hop.
    pub budget: Duration,
}

crate::reasons! {
    /// Why an attachment kept its bytes this pass.
    pub enum AttachmentReason {
        /// A hold covers its account (HD-2).
        LegalHold = "legal_hold",
        /// Its path leads out of the root (absolute, `..`, a symlink on the way).
        OutsideRoot = "outside_root",
        /// Not a regular file.
        NotRegular = "not_regular",
        /// No file at its path: nothing says how old its bytes were.
        Missing = "missing",
        /// Its file could not be looked at.
        Unreadable = "unreadable",
        /// An application holds its row.
        Busy = "busy",
    }
}

/// Rows marked together in one transaction.
const CHUNK: usize = 200;

pub use crate::owner_loop::Error;

/// One hop's payload: the pass's envelope with this kind's cutoff and cursor.
pub type Args = crate::pass::ArgsOf<AttachmentExpiry>;

/// The job kind, as the worker registers it.
pub struct AttachmentExpiry;

impl Job for AttachmentExpiry {
    const NAME: &'static str = "attachment_expiry";
    const SECTION: &'static str = "attachments";

    type Reason = AttachmentReason;
    type Cutoff = DateTime<Utc>;
    /// The last attachment looked at.
    type Cursor = Uuid;
    type Raw = RawSettings;
    type Settings = AttachmentSettings;
    type Error = Error;

    fn settings(
        s: RawSettings,
        _paths: &PathSettings,
        c: &mut Check<'_>,
    ) -> Option<AttachmentSettings> {
        let max_age_days = c.int(
            "attachments.max_age_days",
            &s.max_age_days,
            0..=36_500,
            "a number of days from 0 (never expire) to 36500",
        );
        let window_size = c.window_size("attachments.window_size", &s.window_size);
        let budget = c.millis("attachments.hop_budget_ms", &s.hop_budget_ms);
        Some(AttachmentSettings {
            max_age_days: max_age_days?,
            window_size: window_size?,
            budget: budget?,
        })
    }

    /// The file's mtime decides (AT-1), not a column: an account with any live attachment is
    /// due while the job is on (found from the attachments' side, through `attachments_expiry`),
    /// and one with attachment files waiting to be removed always.
    fn due(settings: &AttachmentSettings, _slot: DateTime<Utc>) -> Due {
        let sql = format!(
            "SELECT account_id FROM attachments
             WHERE $1 AND sexton.attachment_live(bytes_expired_at)
             UNION ALL
             {}",
            files::waiting_sql(Root::Attachments)
        );
        sqlx::query(sqlx::AssertSqlSafe(sql)).bind(settings.max_age_days != 0)
    }

    fn bounds(settings: &AttachmentSettings) -> Bounds {
        Bounds {
            window: Some(settings.window_size),
            budget: settings.budget,
        }
    }

    fn removals(_settings: &AttachmentSettings, paths: &PathSettings) -> Option<Removals> {
        Some(Removals {
            root: Root::Attachments,
            store: paths.store(Root::Attachments),
        })
    }

    async fn policy(now: Now<'_, Self>) -> Result<Policy<DateTime<Utc>>, Error> {
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM accounts WHERE id = $1)")
                .bind(now.account)
                .fetch_one(now.conn)
                .await?;
        Ok(if !exists {
            Policy::Ends(HopOutcome::AccountGone)
        } else if now.settings.max_age_days == 0 {
            Policy::Ends(HopOutcome::Disabled)
        } else {
            Policy::up_to(days_before(now.reference, now.settings.max_age_days))
        })
    }

    async fn run(
        step: Step<'_, Self>,
        report: &mut Report<AttachmentReason>,
    ) -> Result<End<Uuid>, Error> {
        hop(step, report).await
    }
}
