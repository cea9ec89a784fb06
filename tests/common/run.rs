//! Any job kind's hops, run in-process as the worker runs them (without the queue around
//! them), with the clock at the fixtures' pass start.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use chrono::{DateTime, Utc};
use sexton::context::JobContext;
use sexton_jobs::clock::ManualClock;
use sexton_jobs::explain::Explanation;
use sexton_jobs::files::PathSettings;
use sexton_jobs::health::Health;
use sexton_jobs::job::{Env, Inspect, Job, Look, Report};
use sexton_jobs::pass;
use sexton_jobs::pass::ArgsOf;
use sqlx::PgPool;
use uuid::Uuid;

use super::fixture::pass_start;

/// What one hop did, and where its pass goes on (`None`: it ended).
pub struct Hopped<J: Job> {
    pub report: Report<J::Reason>,
    pub next: Option<ArgsOf<J>>,
}

impl<J: Job> std::fmt::Debug for Hopped<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hopped")
            .field("report", &self.report)
            .field("next", &self.next)
            .finish()
    }
}

impl<J: Job> std::ops::Deref for Hopped<J> {
    type Target = Report<J::Reason>;

    fn deref(&self) -> &Report<J::Reason> {
        &self.report
    }
}

/// One hop of `J` as the worker runs it (the engine, [`pass::hop`]), on a connection of
/// `pool`, under `health`, with the worker stopping (FL-5) as `stopping` says from the start.
///
/// # Errors
/// What the hop failed with.
pub async fn try_hop<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    args: &ArgsOf<J>,
    stopping: bool,
) -> Result<Hopped<J>, J::Error> {
    let clock = ManualClock::new(pass_start());
    try_hop_at::<J>(pool, &clock, paths, health, settings, args, stopping).await
}

/// [`try_hop`] at the time `clock` says.
///
/// # Errors
/// What the hop failed with.
pub async fn try_hop_at<J: Job>(
    pool: &PgPool,
    clock: &ManualClock,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    args: &ArgsOf<J>,
    stopping: bool,
) -> Result<Hopped<J>, J::Error> {
    let mut conn = pool.acquire().await?;
    let env = Env {
        conn: &mut conn,
        pool,
        clock,
        stop: &AtomicBool::new(stopping),
        paths,
        health,
    };
    let mut report = Report::new(J::TABLES);
    let next = pass::hop::<J>(env, settings, args, &mut report).await?;
    Ok(Hopped { report, next })
}

/// One hop of `J` under `health`.
pub async fn hop_with<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    args: &ArgsOf<J>,
) -> Hopped<J> {
    hop_stopping::<J>(pool, paths, health, settings, args, false).await
}

/// One hop of `J` under `health`, with the worker stopping (FL-5) as `stopping` says from
/// the start.
pub async fn hop_stopping<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    args: &ArgsOf<J>,
    stopping: bool,
) -> Hopped<J> {
    try_hop::<J>(pool, paths, health, settings, args, stopping)
        .await
        .unwrap()
}

/// A whole pass of `J` from `args`, hop after hop; every hop's report.
pub async fn pass<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    settings: &J::Settings,
    args: ArgsOf<J>,
) -> Vec<Hopped<J>> {
    pass_with::<J>(pool, paths, &Health::off(), settings, args).await
}

/// [`pass`] under `health`.
pub async fn pass_with<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    mut args: ArgsOf<J>,
) -> Vec<Hopped<J>> {
    let mut reports = Vec::new();
    loop {
        let hopped = hop_with::<J>(pool, paths, health, settings, &args).await;
        let next = hopped.next.clone();
        reports.push(hopped);
        match next {
            Some(next) => args = next,
            None => return reports,
        }
    }
}

/// A whole pass of `J` (of `account`, for a per-account kind) through the worker's own hop
/// path and the queue: each hop run as the worker runs it, the next taken from the queue.
/// Returns how many hops it took.
pub async fn through_queue<J: Job>(
    pool: &PgPool,
    settings: &J::Settings,
    account: Option<Uuid>,
) -> u32 {
    let dir = tempfile::tempdir().unwrap();
    let ctx = JobContext::new(
        pool.clone(),
        Arc::new(super::settings(dir.path())),
        Arc::new(ManualClock::new(pass_start())),
    );
    let mut args = ArgsOf::<J>::first(account, pass_start());
    let mut hops = 0;
    loop {
        sexton::hop::run_with::<J>(&ctx, settings, args)
            .await
            .unwrap();
        hops += 1;
        let next: Option<Vec<u8>> = sqlx::query_scalar(
            "UPDATE apalis.jobs SET status = 'Done' WHERE id = (
                 SELECT id FROM apalis.jobs WHERE job_type = $1 AND status = 'Pending' LIMIT 1)
             RETURNING job",
        )
        .bind(sexton_jobs::job::queue(J::NAME))
        .fetch_optional(pool)
        .await
        .unwrap();
        match next {
            Some(payload) => args = serde_json::from_slice(&payload).unwrap(),
            None => return hops,
        }
    }
}

/// The file roots under `dir`, created.
pub fn roots(dir: &std::path::Path) -> PathSettings {
    let paths = super::backend::paths(dir);
    for root in [
        &paths.output_root,
        &paths.attachments_root,
        &paths.artifacts_root,
        &paths.sessions_root,
        &paths.traces_root,
    ] {
        std::fs::create_dir_all(root).unwrap();
    }
    paths
}

/// Puts `root` of `paths` in the object store `store` (in place of where it was).
pub fn object_root(
    paths: &mut PathSettings,
    root: sexton_jobs::files::Root,
    store: Arc<sexton_jobs::files::object::ObjectRoot>,
) {
    paths.objects.retain(|(known, _)| *known != root);
    paths.objects.push((root, store));
}

/// `J`'s preview of `accounts` (every account when `None`) at `now`, its roots under `dir`.
pub async fn preview<J: Inspect>(
    pool: &PgPool,
    settings: &J::Settings,
    dir: &std::path::Path,
    now: DateTime<Utc>,
    accounts: Option<&[Uuid]>,
) -> Vec<J::Preview> {
    let mut conn = pool.acquire().await.unwrap();
    let paths = roots(dir);
    let look = Look {
        conn: &mut conn,
        settings,
        paths: &paths,
        now,
    };
    J::preview(look, accounts).await.unwrap()
}

/// `J`'s verdict on one `subject` at `now`, its roots under `dir`.
pub async fn explain<J: Inspect>(
    pool: &PgPool,
    settings: &J::Settings,
    dir: &std::path::Path,
    now: DateTime<Utc>,
    subject: &'static str,
    id: &str,
) -> Option<Explanation> {
    let mut conn = pool.acquire().await.unwrap();
    let paths = roots(dir);
    let look = Look {
        conn: &mut conn,
        settings,
        paths: &paths,
        now,
    };
    J::explain(look, subject, id).await.unwrap()
}
