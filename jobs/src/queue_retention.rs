//! The queue keeps itself small (SPEC FL-7): finished queue jobs — done, killed (a payload that
//! never decoded) or failed for good (attempts exhausted) — older than
//! `queue.finished_job_retention_days` are deleted in bounded batches, so a failed job stays at
//! least that long for inspection; then worker registrations not seen for a day and no longer
//! named by any job are removed. Pending, running and retrying jobs are never touched, nor are
//! the rows of queues other than sexton's (`sexton.*`) that may share the schema.
//!
//! The slot keys that make a nightly slot exactly-once live in these rows, which is why the
//! configuration refuses a catch-up window reaching past the retention.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::files::PathSettings;
use crate::job::{Inspect, Job, Look, NoReason, Report, Scope};
use crate::owner_loop::{Bounds, End, Owners, Then, Took};
use crate::pass::{Now, Policy, Step};
use crate::settings::{Check, Raw};

/// Rows deleted together in one statement.
pub const BATCH_SIZE: u32 = 1000;

/// A hop stops taking batches after this long and hands over to the next hop.
pub const HOP_BUDGET: Duration = Duration::from_secs(10);

/// A worker registration not seen for this long is stale. Rescue re-queues a silent worker's
/// jobs long before (FL-4); a registration still named by a job is kept whatever its age,
/// because rescue finds a dead worker's jobs through it.
pub const STALE_WORKER_AFTER: chrono::Duration = chrono::Duration::days(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRetentionSettings {
    /// Finished jobs older than this go.
    pub retention: chrono::Duration,
}

pub use crate::owner_loop::Error;

/// One hop's payload: the pass's envelope with its cutoff.
pub type Args = crate::pass::ArgsOf<QueueRetention>;

/// The tables this job deletes from, in the order reports list them.
pub const TABLES: [&str; 2] = ["apalis.jobs", "apalis.workers"];

/// One batch of finished jobs older than `$1` (`sexton.queue_job_expired`, FL-7), at most `$2`;
/// a row a worker holds is left for the next batch or pass. The partial index
/// `sexton_finished_jobs` serves it.
const DELETE_FINISHED: &str = include_str!("queue_retention/delete_finished.sql");

/// Worker registrations not seen since `$1` that no job names (`sexton.stale_workers`), at most
/// `$2`.
const DELETE_STALE_WORKERS: &str = include_str!("queue_retention/delete_stale_workers.sql");

/// What a pass would delete (`sexton preview`): the finished jobs older than `$1` and the
/// registrations not seen since `$2`, asked of the same two rules as the deletes.
const PREVIEW: &str = include_str!("queue_retention/preview.sql");

/// Finished jobs as the owner loop takes them: each step one batch, deleted by one statement;
/// the step that finds the last batch short removes the stale registrations too.
struct Finished {
    before: DateTime<Utc>,
    /// Registrations not seen since then are stale.
    stale: DateTime<Utc>,
}

impl Owners for Finished {
    /// None: each batch takes the oldest left.
    type Cursor = ();
    type Report = Report<NoReason>;

    const TABLES: &'static [&'static str] = &TABLES;

    async fn step(
        &mut self,
        conn: &mut PgConnection,
        _at: Option<&()>,
        _room: Option<u32>,
        report: &mut Report<NoReason>,
    ) -> Result<Took<()>, Error> {
        let started = Instant::now();
        let deleted = sqlx::query(DELETE_FINISHED)
            .bind(self.before)
            .bind(i64::from(BATCH_SIZE))
            .execute(&mut *conn)
            .await?
            .rows_affected();
        report.pruned += deleted;
        report.deleted(TABLES[0], deleted);
        if deleted == u64::from(BATCH_SIZE) {
            return Ok(Took {
                read: deleted,
                at: None,
                recorded: 0,
                seconds: started.elapsed().as_secs_f64(),
                then: Then::More,
            });
        }
        let workers = sqlx::query(DELETE_STALE_WORKERS)
            .bind(self.stale)
            .bind(i64::from(BATCH_SIZE))
            .execute(&mut *conn)
            .await;
        match workers {
            Ok(done) => report.deleted(TABLES[1], done.rows_affected()),
            // A job claimed by that worker in between (it was not dead after all): next pass.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23503") => {}
            Err(err) => return Err(err.into()),
        }
        Ok(Took {
            read: deleted,
            at: None,
            recorded: 0,
            seconds: started.elapsed().as_secs_f64(),
            then: Then::End(None),
        })
    }
}

/// The `[queue]` section, of which this job reads one setting.
#[derive(Debug, Deserialize)]
pub struct RawSettings {
    finished_job_retention_days: Raw<i64>,
}

/// The job kind, as the worker registers it.
pub struct QueueRetention;

impl Job for QueueRetention {
    const NAME: &'static str = "queue_retention";
    const SCOPE: Scope = Scope::Global;
    const SECTION: &'static str = "queue";
    const TABLES: &'static [&'static str] = &TABLES;

    type Reason = NoReason;
    type Cutoff = DateTime<Utc>;
    type Cursor = ();
    type Raw = RawSettings;
    type Settings = QueueRetentionSettings;
    type Error = Error;

    fn settings(
        s: RawSettings,
        _paths: &PathSettings,
        c: &mut Check<'_>,
    ) -> Option<QueueRetentionSettings> {
        Some(QueueRetentionSettings {
            retention: c.finished_job_retention(&s.finished_job_retention_days)?,
        })
    }

    fn bounds(_settings: &QueueRetentionSettings) -> Bounds {
        Bounds {
            window: None,
            budget: HOP_BUDGET,
        }
    }

    async fn policy(now: Now<'_, Self>) -> Result<Policy<DateTime<Utc>>, Error> {
        Ok(Policy::Cutoff(now.reference - now.settings.retention))
    }

    /// Batches of finished jobs until none is old enough (or the budget is spent), then the
    /// stale registrations.
    async fn run(step: Step<'_, Self>, report: &mut Report<NoReason>) -> Result<End<()>, Error> {
        report.window = BATCH_SIZE;
        let mut finished = Finished {
            before: step.cutoff,
            stale: step.reference - STALE_WORKER_AFTER,
        };
        step.hop.run(&mut finished, None, report).await
    }
}

impl Inspect for QueueRetention {
    type Preview = Preview;

    async fn preview(
        look: Look<'_, QueueRetentionSettings>,
        _accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let Look {
            conn,
            settings,
            now,
            ..
        } = look;
        let finished_before = now - settings.retention;
        let (jobs, workers): (i64, i64) = sqlx::query_as(PREVIEW)
            .bind(finished_before)
            .bind(now - STALE_WORKER_AFTER)
            .fetch_one(&mut *conn)
            .await?;
        Ok(vec![Preview {
            retention_days: settings.retention.num_days(),
            finished_before,
            finished_jobs: jobs,
            stale_workers: workers,
        }])
    }
}

/// What a pass would delete now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub retention_days: i64,
    pub finished_before: DateTime<Utc>,
    /// Done, killed and failed-for-good jobs that finished before then.
    pub finished_jobs: i64,
    /// Registrations not seen for a day that no job names.
    pub stale_workers: i64,
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "queue (FL-7), kept {} days: {} finished jobs (before {}) and {} stale worker \
             registrations go",
            self.retention_days,
            self.finished_jobs,
            self.finished_before.format("%Y-%m-%dT%H:%M:%SZ"),
            self.stale_workers
        )
    }
}
