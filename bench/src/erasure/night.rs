//! The other accounts' night, alone and beside an erasure (PF-8's 1.2× bound).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{Night, TEMPLATE, Template, fill, log_path, request, spawn_worker, wait_worker};
use crate::cli::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::sexton::sexton;

/// The other accounts' nightly pass on a fresh copy `db` (its tree under `root`): `sexton tick`
/// at the template's now, then one worker until idle — with `erasure`, after the account's
/// erasure was requested and its first hop began, the same worker working both. Returns the
/// night, and with `erasure` the erasure's seconds from its first hop to its completion.
pub(super) async fn night(
    cli: &Cli,
    admin: &PgPool,
    template: &Template,
    db: &str,
    root: &Path,
    erasure: bool,
) -> anyhow::Result<(Night, Option<f64>)> {
    recreate(admin, db, Some(TEMPLATE)).await?;
    let files = root.join(db);
    fill::write_tree(&files, &template.files).await?;
    let log = log_path(cli, db, &files)?;
    let rss_file = files.with_extension("rss");
    let pool = connect(&admin.connect_options(), db, "bench").await?;
    let started = Instant::now();
    let child = if erasure {
        request(&cli.sexton, db, &files, template.account).await?;
        let child = spawn_worker(&cli.sexton, db, &files, &log, &rss_file)?;
        // The night starts once the erasure's first hop runs.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let running: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM apalis.jobs
                                WHERE job_type = 'sexton.erasure' AND lock_at IS NOT NULL)",
            )
            .fetch_one(&pool)
            .await?;
            if running || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tick(cli, db, &files, template.now).await?;
        child
    } else {
        tick(cli, db, &files, template.now).await?;
        spawn_worker(&cli.sexton, db, &files, &log, &rss_file)?
    };
    let peak = wait_worker(child, &rss_file).await?;
    let worker_seconds = started.elapsed().as_secs_f64();
    let (seconds, jobs): (f64, i64) = sqlx::query_as(
        "SELECT EXTRACT(EPOCH FROM max(j.done_at) - s.lock_at)::float8, count(*)
         FROM apalis.jobs j
         CROSS JOIN (SELECT lock_at FROM apalis.jobs
                     WHERE job_type = 'sexton.nightly' ORDER BY lock_at LIMIT 1) s
         WHERE j.job_type <> 'sexton.erasure'
         GROUP BY s.lock_at",
    )
    .fetch_one(&pool)
    .await?;
    let (pruned, old_sessions): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs WHERE details_pruned_at IS NOT NULL),
                (SELECT count(*) FROM sessions WHERE state = 'completed' AND account_id <> $1)",
    )
    .bind(template.account)
    .fetch_one(&pool)
    .await?;
    let others = i64::try_from(cli.erasure_others)?;
    if (pruned, old_sessions) != (2 * others, 0) {
        bail!(
            "{db}: the night pruned {pruned} runs (expected {}) and left {old_sessions} old sessions",
            2 * others
        );
    }
    let beside = if erasure {
        let (state, s): (String, Option<f64>) = sqlx::query_as(
            "SELECT e.state, EXTRACT(EPOCH FROM e.completed_at
                    - (SELECT min(lock_at) FROM apalis.jobs WHERE job_type = 'sexton.erasure'))::float8
             FROM sexton.erasures e",
        )
        .fetch_one(&pool)
        .await?;
        if state != "completed" {
            bail!("{db}: the erasure beside the night ended {state}");
        }
        s
    } else {
        None
    };
    pool.close().await;
    drop_db(admin, db).await?;
    let _ = std::fs::remove_dir_all(&files);
    Ok((
        Night {
            seconds,
            jobs,
            worker_seconds,
            worker_peak_rss_kb: peak,
        },
        beside,
    ))
}

/// `sexton tick` on `db` at `now`: the nightly slot.
async fn tick(cli: &Cli, db: &str, files: &Path, now: DateTime<Utc>) -> anyhow::Result<()> {
    let at = now.to_rfc3339();
    if !sexton(&cli.sexton, db, files, &["tick", "--at", &at])
        .status()
        .await?
        .success()
    {
        bail!("sexton tick failed on {db}");
    }
    Ok(())
}
