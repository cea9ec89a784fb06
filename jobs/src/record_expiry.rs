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
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::cutoff::{self, EARLIEST, days_before};
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::files::PathSettings;
use crate::health::Health;
pub use crate::job::HopOutcome;
use crate::job::{Env, Job, Position, Report, Scope};
use crate::owner_loop::{Bounds, Hop, Owners, Then, Took};
use crate::payload::V1;
use crate::settings::{Check, Raw};

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
    const QUEUE: &'static str;
    const TABLE: &'static str;
    /// The rule it implements, for logs and `preview`.
    const RULE: &'static str;
    /// The `[expiry]` setting of its age.
    const SETTING: &'static str;
    /// The smallest id, as text: where the cursor of a pass's first hop stands.
    const FIRST_ID: &'static str;
    /// One batch. `$1` the cutoff, `$2`/`$3` the cursor (age, id as text), `$4` the batch size.
    /// Returns the rows read and deleted and the last row read (the next cursor).
    const BATCH: &'static str;
    /// The oldest expired age. `$1` the cutoff, `$2` the earliest finite age.
    const OLDEST: &'static str;
    /// Expired rows, of one account or all. `$1` the cutoff, `$2` the earliest finite age,
    /// `$3` the accounts or NULL (every account).
    const COUNT: &'static str;

    /// What `sexton explain` calls one record (`handoff`, …).
    const SUBJECT: &'static str;
    /// The column its age is measured from.
    const AGE: &'static str;
    /// One record for `sexton explain`: `$1` its id (as text); its account, its age and whether
    /// it is pinned (never for kinds without pins).
    const ROW: &'static str;

    fn days(settings: &ExpirySettings) -> i32;
}

/// TTL-1: handoffs, 14 days after `created_at`.
pub struct Handoffs;

impl Record for Handoffs {
    const AGE: &'static str = "created_at";
    const SUBJECT: &'static str = "handoff";
    const ROW: &'static str =
        "SELECT account_id, created_at, false FROM handoffs WHERE id = $1::uuid";
    const JOB: &'static str = "expire_handoffs";
    const QUEUE: &'static str = "sexton.expire_handoffs";
    const TABLE: &'static str = "handoffs";
    const RULE: &'static str = "TTL-1";
    const SETTING: &'static str = "expiry.handoffs_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, created_at FROM handoffs
            WHERE created_at < $1 AND (created_at, id) > ($2, $3::uuid)
            ORDER BY created_at, id
            LIMIT $4),
        locked AS (
            SELECT h.id FROM handoffs h JOIN batch b ON b.id = h.id
            WHERE h.created_at < $1
            FOR UPDATE OF h SKIP LOCKED),
        gone AS (
            DELETE FROM handoffs h USING locked WHERE h.id = locked.id RETURNING 1),
        last AS (
            SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT created_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str =
        "SELECT min(created_at) FROM handoffs WHERE created_at < $1 AND created_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM handoffs
        WHERE created_at < $1 AND created_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.handoffs_days
    }
}

/// TTL-2: dream preloads, 7 days after `created_at`.
pub struct DreamPreloads;

impl Record for DreamPreloads {
    const AGE: &'static str = "created_at";
    const SUBJECT: &'static str = "dream_preload";
    const ROW: &'static str =
        "SELECT account_id, created_at, false FROM dream_preloads WHERE id = $1::uuid";
    const JOB: &'static str = "expire_dream_preloads";
    const QUEUE: &'static str = "sexton.expire_dream_preloads";
    const TABLE: &'static str = "dream_preloads";
    const RULE: &'static str = "TTL-2";
    const SETTING: &'static str = "expiry.dream_preloads_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, created_at FROM dream_preloads
            WHERE created_at < $1 AND (created_at, id) > ($2, $3::uuid)
            ORDER BY created_at, id
            LIMIT $4),
        locked AS (
            SELECT d.id FROM dream_preloads d JOIN batch b ON b.id = d.id
            WHERE d.created_at < $1
            FOR UPDATE OF d SKIP LOCKED),
        gone AS (
            DELETE FROM dream_preloads d USING locked WHERE d.id = locked.id RETURNING 1),
        last AS (
            SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT created_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str =
        "SELECT min(created_at) FROM dream_preloads WHERE created_at < $1 AND created_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM dream_preloads
        WHERE created_at < $1 AND created_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.dream_preloads_days
    }
}

/// TTL-3: working records and rolling cards, 90 days after `updated_at`; pinned ones never.
pub struct WorkingRecords;

impl Record for WorkingRecords {
    const AGE: &'static str = "updated_at";
    const SUBJECT: &'static str = "working_record";
    const ROW: &'static str =
        "SELECT account_id, updated_at, pinned FROM working_records WHERE id = $1::uuid";
    const JOB: &'static str = "expire_working_records";
    const QUEUE: &'static str = "sexton.expire_working_records";
    const TABLE: &'static str = "working_records";
    const RULE: &'static str = "TTL-3";
    const SETTING: &'static str = "expiry.working_records_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, updated_at FROM working_records
            WHERE NOT pinned AND updated_at < $1 AND (updated_at, id) > ($2, $3::uuid)
            ORDER BY updated_at, id
            LIMIT $4),
        locked AS (
            SELECT w.id FROM working_records w JOIN batch b ON b.id = w.id
            WHERE NOT w.pinned AND w.updated_at < $1
            FOR UPDATE OF w SKIP LOCKED),
        gone AS (
            DELETE FROM working_records w USING locked WHERE w.id = locked.id RETURNING 1),
        last AS (
            SELECT b.updated_at, b.id::text AS id FROM batch b ORDER BY b.updated_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT updated_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str = "SELECT min(updated_at) FROM working_records
         WHERE NOT pinned AND updated_at < $1 AND updated_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM working_records
        WHERE NOT pinned AND updated_at < $1 AND updated_at > $2
          AND ($3::uuid[] IS NULL OR account_id = ANY($3))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.working_records_days
    }
}

/// TTL-4: conversation event replay, 30 days after `created_at`, whatever the account's
/// execution retention (disabled included).
pub struct ConversationEvents;

impl Record for ConversationEvents {
    const AGE: &'static str = "created_at";
    const SUBJECT: &'static str = "conversation_event";
    const ROW: &'static str = "SELECT c.account_id, e.created_at, false FROM conversation_events e JOIN conversations c ON c.id = e.conversation_id WHERE e.id = $1::bigint";
    const JOB: &'static str = "expire_conversation_events";
    const QUEUE: &'static str = "sexton.expire_conversation_events";
    const TABLE: &'static str = "conversation_events";
    const RULE: &'static str = "TTL-4";
    const SETTING: &'static str = "expiry.conversation_events_days";
    const FIRST_ID: &'static str = "-9223372036854775808";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, created_at FROM conversation_events
            WHERE created_at < $1 AND (created_at, id) > ($2, $3::bigint)
            ORDER BY created_at, id
            LIMIT $4),
        locked AS (
            SELECT e.id FROM conversation_events e JOIN batch b ON b.id = e.id
            WHERE e.created_at < $1
            FOR UPDATE OF e SKIP LOCKED),
        gone AS (
            DELETE FROM conversation_events e USING locked WHERE e.id = locked.id RETURNING 1),
        last AS (
            SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT created_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str = "SELECT min(created_at) FROM conversation_events
         WHERE created_at < $1 AND created_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM conversation_events
        WHERE created_at < $1 AND created_at > $2
          AND ($3::uuid[] IS NULL
               OR conversation_id IN (SELECT id FROM conversations WHERE account_id = ANY($3)))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.conversation_events_days
    }
}

/// One hop's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    pub version: V1,
    pub pass_started_at: DateTime<Utc>,
    /// Fixed by the first hop and carried by every later one; a later hop never prunes past
    /// the cutoff in force when it runs either (EX-1's rule).
    pub cutoff: Option<DateTime<Utc>>,
    /// The last row visited (its age and id as text); `None` at the start of the pass.
    pub after: Option<(DateTime<Utc>, String)>,
    /// 0 for the first hop of a pass.
    pub hop: u32,
}

impl Args {
    pub fn first(pass_started_at: DateTime<Utc>) -> Self {
        Self {
            version: V1,
            pass_started_at,
            cutoff: None,
            after: None,
            hop: 0,
        }
    }
}

/// Why a record was left in place this pass.
pub const RETAIN_REASONS: [&str; 1] = [
    // Locked by an application, or changed (made young again, pinned) since it was read.
    "busy",
];

/// Why a hop failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Never for these kinds, which own no files: the owner loop's drain can fail so.
    #[error(transparent)]
    Files(#[from] crate::files::DrainError),
}

/// What one batch read and did.
#[derive(sqlx::FromRow)]
struct Batch {
    read: i64,
    deleted: i64,
    last_at: Option<DateTime<Utc>>,
    last_id: Option<String>,
}

/// A short-lived record kind as a job.
pub struct Expire<R>(PhantomData<R>);

/// One hop: batches until the expired rows run out, the budget is spent or the worker stops
/// (the owner loop, [`Hop::run`]).
///
/// # Errors
/// [`Error::Database`]; every batch before the failing one is committed, and the hop can be
/// run again.
pub async fn hop<R: Record>(
    conn: &mut PgConnection,
    health: &Health,
    settings: &ExpirySettings,
    args: &Args,
    stop: &std::sync::atomic::AtomicBool,
    report: &mut Report<Args>,
) -> Result<(), Error> {
    *report = Report::new(&RETAIN_REASONS);
    report.window = settings.batch_size;
    report.rows = vec![(R::TABLE, 0)];
    let bounds = Bounds {
        window: None,
        budget: settings.budget,
    };
    let hop = Hop::start(conn, health, stop, bounds, None, report).await?;
    let days = R::days(settings);
    if days == 0 {
        report.outcome = HopOutcome::Disabled.as_str();
        return Ok(());
    }
    let database_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *hop.conn)
        .await?;
    let current = days_before(cutoff::reference(args.pass_started_at, database_now), days);
    let cutoff = match args.cutoff {
        Some(carried) => current.map(|current| current.min(carried)),
        None => current,
    };
    let Some(cutoff) = cutoff else {
        return Ok(());
    };
    let mut batches = Batches::<R> {
        cutoff,
        size: settings.batch_size,
        kind: PhantomData,
    };
    let end = hop.run(&mut batches, args.after.clone(), report).await?;
    report.outcome = end.outcome().as_str();
    report.next = end.next().map(|after| Args {
        version: V1,
        pass_started_at: args.pass_started_at,
        cutoff: Some(cutoff),
        after,
        hop: args.hop + 1,
    });
    Ok(())
}

/// A pass over one record kind as the owner loop takes it: each step one batch, read, locked,
/// re-checked and deleted by one statement.
struct Batches<R> {
    cutoff: DateTime<Utc>,
    size: u32,
    kind: PhantomData<R>,
}

impl<R: Record> Owners for Batches<R> {
    /// The last row visited: its age and id as text.
    type Cursor = (DateTime<Utc>, String);
    type Report = Report<Args>;
    type Error = Error;

    const TABLES: &'static [&'static str] = &[R::TABLE];

    async fn step(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Self::Cursor>,
        _room: Option<u32>,
        report: &mut Report<Args>,
    ) -> Result<Took<Self::Cursor>, Error> {
        let (after_at, after_id) = at
            .cloned()
            .unwrap_or_else(|| (EARLIEST, R::FIRST_ID.to_owned()));
        let started = Instant::now();
        let batch: Batch = sqlx::query_as(R::BATCH)
            .bind(self.cutoff)
            .bind(after_at.max(EARLIEST))
            .bind(after_id)
            .bind(i64::from(self.size))
            .fetch_one(&mut *conn)
            .await?;
        let seconds = started.elapsed().as_secs_f64();
        let (read, deleted) = (batch.read.max(0) as u64, batch.deleted.max(0) as u64);
        report.pruned += deleted;
        report.rows[0].1 += deleted;
        report.retained[0].1 += read.saturating_sub(deleted);
        Ok(Took {
            read,
            at: batch.last_at.zip(batch.last_id),
            recorded: 0,
            seconds,
            then: if read == u64::from(self.size) {
                Then::More
            } else {
                Then::End(None)
            },
        })
    }
}

/// How far past its cutoff the oldest expired row is, in seconds (0 when none is).
///
/// # Errors
/// [`Error::Database`].
pub async fn backlog_seconds<R: Record>(
    pool: &PgPool,
    settings: &ExpirySettings,
    now: DateTime<Utc>,
) -> Result<Option<f64>, Error> {
    let Some(cutoff) = enabled_cutoff::<R>(settings, now) else {
        return Ok(Some(0.0));
    };
    let oldest: Option<DateTime<Utc>> = sqlx::query_scalar(R::OLDEST)
        .bind(cutoff)
        .bind(EARLIEST)
        .fetch_one(pool)
        .await?;
    Ok(Some(
        oldest.map_or(0.0, |oldest| (cutoff - oldest).as_seconds_f64()),
    ))
}

/// The cutoff at `now`, or `None` when the kind is disabled or nothing can be old enough.
fn enabled_cutoff<R: Record>(
    settings: &ExpirySettings,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    match R::days(settings) {
        0 => None,
        days => days_before(now, days),
    }
}

/// What a pass of one record kind would delete now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub table: &'static str,
    pub rule: &'static str,
    /// The configured age; 0 means the kind is disabled.
    pub days: i32,
    pub cutoff: Option<DateTime<Utc>>,
    pub account_id: Option<Uuid>,
    /// Rows past the cutoff (of the account, if one was asked for).
    pub expired: i64,
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scope = self
            .account_id
            .map_or_else(|| "all accounts".to_owned(), |a| format!("account {a}"));
        match (self.days, self.cutoff) {
            (0, _) => write!(f, "{} ({}): disabled, nothing goes", self.table, self.rule),
            (_, None) => write!(
                f,
                "{} ({}): {} days reaches past the calendar, nothing goes",
                self.table, self.rule, self.days
            ),
            (days, Some(cutoff)) => write!(
                f,
                "{} ({}), {scope}: {} rows older than {days} days (before {}) expire",
                self.table,
                self.rule,
                self.expired,
                cutoff.format("%Y-%m-%dT%H:%M:%SZ")
            ),
        }
    }
}

/// The job's verdict on one record: past its age (the batches' `< cutoff`, finite
/// ages only) and not pinned.
async fn explain_record<R: Record>(
    conn: &mut PgConnection,
    settings: &ExpirySettings,
    now: DateTime<Utc>,
    id: &str,
) -> Result<Option<Explanation>, Error> {
    let row: Option<(Uuid, DateTime<Utc>, bool)> = sqlx::query_as(R::ROW)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((account, age, pinned)) = row else {
        return Ok(None);
    };
    let days = R::days(settings);
    let cutoff = enabled_cutoff::<R>(settings, now);
    let mut explanation = Explanation {
        job: R::JOB,
        subject: R::SUBJECT,
        id: id.to_owned(),
        account_id: Some(account),
        policy: match days {
            0 => format!("{} = 0: this kind never expires", R::SETTING),
            days => format!("{} = {days}", R::SETTING),
        },
        measured_from: Some(R::AGE.to_owned()),
        age_at: Some(age),
        cutoff,
        verdict: ExplainVerdict::Retained,
        reasons: Vec::new(),
        removed_at: None,
        removed_by: None,
    };
    if pinned {
        explanation.reasons.push(ExplainReason::new(
            "TTL-3",
            "pinned",
            "pinned records and cards never expire",
        ));
    }
    match cutoff {
        None => explanation.reasons.push(ExplainReason::new(
            "TTL-5",
            "disabled",
            "expiry of this kind is off (or its age reaches back past the calendar)",
        )),
        Some(cutoff) if !(age < cutoff && age > EARLIEST) => explanation.reasons.push(
            ExplainReason::new(R::RULE, "not_expired", "younger than its age"),
        ),
        Some(_) if !pinned => {
            explanation.verdict = ExplainVerdict::Eligible;
            explanation.reasons.push(ExplainReason::new(
                R::RULE,
                "expired",
                "older than its age: the next pass deletes it (unless an application holds it)",
            ));
        }
        Some(_) => {}
    }
    Ok(Some(explanation))
}

/// The `[expiry]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    handoffs_days: Raw<i64>,
    dream_preloads_days: Raw<i64>,
    working_records_days: Raw<i64>,
    conversation_events_days: Raw<i64>,
    batch_size: Raw<i64>,
    hop_budget_ms: Raw<i64>,
}

/// Reads `[expiry]`. Every kind reads the whole section; a problem is reported once.
fn settings(section: &serde_json::Value, c: &mut Check<'_>) -> Option<ExpirySettings> {
    let s: RawSettings = c.section("expiry", section)?;
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
    const QUEUE: &'static str = R::QUEUE;
    const SCOPE: Scope = Scope::Global;
    const SECTION: &'static str = "expiry";
    const SUBJECTS: &'static [&'static str] = &[R::SUBJECT];
    const RETAIN_REASONS: &'static [&'static str] = &RETAIN_REASONS;

    type Args = Args;
    type Settings = ExpirySettings;
    type Preview = Preview;
    type Error = Error;

    fn settings(
        section: &serde_json::Value,
        _paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<ExpirySettings> {
        settings(section, check)
    }

    fn first(_account: Option<Uuid>, slot: DateTime<Utc>) -> Args {
        Args::first(slot)
    }

    fn position(args: &Args) -> Position {
        Position {
            account: None,
            pass_started_at: args.pass_started_at,
            hop: args.hop,
        }
    }

    async fn run(
        env: Env<'_>,
        settings: &ExpirySettings,
        args: &Args,
        report: &mut Report<Args>,
    ) -> Result<(), Error> {
        hop::<R>(env.conn, env.health, settings, args, env.stop, report).await
    }

    async fn backlog_seconds(
        pool: &PgPool,
        settings: &ExpirySettings,
        now: DateTime<Utc>,
    ) -> Result<Option<f64>, Error> {
        backlog_seconds::<R>(pool, settings, now).await
    }

    fn parse_id(_subject: &str, id: &str) -> Result<(), String> {
        // Conversation events are numbered, every other kind has UUIDs.
        let ok = if R::FIRST_ID.starts_with('-') {
            id.parse::<i64>().is_ok()
        } else {
            Uuid::parse_str(id).is_ok()
        };
        ok.then_some(()).ok_or_else(|| {
            if R::FIRST_ID.starts_with('-') {
                format!("expected a whole number, got {id:?}")
            } else {
                format!("expected a UUID, got {id:?}")
            }
        })
    }

    async fn explain(
        conn: &mut PgConnection,
        settings: &ExpirySettings,
        _paths: &PathSettings,
        now: DateTime<Utc>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        if Self::parse_id(R::SUBJECT, id).is_err() {
            return Ok(None);
        }
        explain_record::<R>(conn, settings, now, id).await
    }

    async fn preview(
        conn: &mut PgConnection,
        settings: &ExpirySettings,
        _paths: &PathSettings,
        now: DateTime<Utc>,
        accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let days = R::days(settings);
        let cutoff = enabled_cutoff::<R>(settings, now);
        let expired = match cutoff {
            Some(cutoff) => {
                sqlx::query_scalar(R::COUNT)
                    .bind(cutoff)
                    .bind(EARLIEST)
                    .bind(accounts)
                    .fetch_one(&mut *conn)
                    .await?
            }
            None => 0,
        };
        Ok(vec![Preview {
            table: R::TABLE,
            rule: R::RULE,
            days,
            cutoff,
            account_id: match accounts {
                Some([account]) => Some(*account),
                _ => None,
            },
            expired,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden<R: Record>() {
        crate::golden::check(&format!("record_expiry/{}_batch", R::TABLE), R::BATCH);
        crate::golden::check(&format!("record_expiry/{}_oldest", R::TABLE), R::OLDEST);
        crate::golden::check(&format!("record_expiry/{}_count", R::TABLE), R::COUNT);
    }

    #[test]
    fn every_statement_matches_its_golden_file() {
        golden::<Handoffs>();
        golden::<DreamPreloads>();
        golden::<WorkingRecords>();
        golden::<ConversationEvents>();
    }

    #[test]
    fn fl1_args_round_trip_and_refuse_unknown_fields() {
        let args = Args {
            after: Some(("2026-10-01T00:00:00Z".parse().unwrap(), "42".to_owned())),
            ..Args::first("2026-12-01T03:00:00Z".parse().unwrap())
        };
        let json = serde_json::to_value(&args).unwrap();
        assert_eq!(serde_json::from_value::<Args>(json.clone()).unwrap(), args);
        let mut bad = json;
        bad["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Args>(bad).is_err());
    }

    #[test]
    fn ttl5_ages_are_validated_and_zero_disables() {
        let mut problems = Vec::new();
        let mut check = Check::new(&mut problems);
        let section = serde_json::json!({
            "handoffs_days": -1, "dream_preloads_days": 0, "working_records_days": "ninety",
            "conversation_events_days": 30, "batch_size": 0, "hop_budget_ms": 1000
        });
        assert!(settings(&section, &mut check).is_none());
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
