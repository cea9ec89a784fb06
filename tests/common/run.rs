//! Any job kind's hops, run in-process as the worker runs them (without the queue around
//! them), with the clock at the fixtures' pass start.

use std::sync::atomic::AtomicBool;

use chrono::{DateTime, Utc};
use sexton_jobs::clock::ManualClock;
use sexton_jobs::explain::Explanation;
use sexton_jobs::files::PathSettings;
use sexton_jobs::health::Health;
use sexton_jobs::job::{Env, Inspect, Job, Look, Report};
use sqlx::PgPool;
use uuid::Uuid;

use super::fixture::pass_start;

/// One hop of `J` under `health`.
pub async fn hop_with<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    args: &J::Args,
) -> Report<J::Args> {
    hop_stopping::<J>(pool, paths, health, settings, args, false).await
}

/// One hop of `J` under `health`, with the worker stopping (FL-5) as `stopping` says from
/// the start.
pub async fn hop_stopping<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    args: &J::Args,
    stopping: bool,
) -> Report<J::Args> {
    let mut conn = pool.acquire().await.unwrap();
    let env = Env {
        conn: &mut conn,
        pool,
        clock: &ManualClock::new(pass_start()),
        stop: &AtomicBool::new(stopping),
        paths,
        health,
    };
    let mut report = Report::new(J::RETAIN_REASONS);
    J::run(env, settings, args, &mut report).await.unwrap();
    report
}

/// A whole pass of `J` from `args`, hop after hop; every hop's report.
pub async fn pass<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    settings: &J::Settings,
    args: J::Args,
) -> Vec<Report<J::Args>> {
    pass_with::<J>(pool, paths, &Health::off(), settings, args).await
}

/// [`pass`] under `health`.
pub async fn pass_with<J: Job>(
    pool: &PgPool,
    paths: &PathSettings,
    health: &Health,
    settings: &J::Settings,
    mut args: J::Args,
) -> Vec<Report<J::Args>> {
    let mut reports = Vec::new();
    loop {
        let report = hop_with::<J>(pool, paths, health, settings, &args).await;
        let next = report.next.clone();
        reports.push(report);
        match next {
            Some(next) => args = next,
            None => return reports,
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
