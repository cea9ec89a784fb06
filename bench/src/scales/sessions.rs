//! SessionRetention's methods at a scale: a nightly pass through the queue and its raw floors
//! (the cascading delete, with the sessions' directories, under the job's locks, keeping its
//! rules), each on a fresh copy set up for that job alone with the appending writer beside it,
//! checked to delete exactly the sessions a pass deletes.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::bail;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use super::raw::{
    SESSIONS_SAME_END, SESSIONS_SAME_END_LOCKED, SESSIONS_SAME_END_RULES, run_raw_sessions,
    run_session_rules,
};
use super::seed::Template;
use super::writers::append_at_rate;
use super::{chosen, drop_copy, fresh_copy, net_wal};
use crate::cli::Cli;
use crate::cluster::connect;
use crate::method::{Latency, Method, Rounds, score};
use crate::sexton::{Pass, Worker, run_sexton};
use crate::writer::{beside, idle_baseline};

/// The job the sessions passes are timed by.
const SESSIONS: Pass = Pass {
    job: "session_retention",
    global: false,
};

/// SessionRetention's methods, each on a fresh copy, after the appending writer's idle
/// baseline: its latency and WAL rate, and the methods with their WAL net of it.
pub async fn session_methods(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
) -> anyhow::Result<(Latency, f64, Vec<Method>)> {
    let (idle, idle_wal) = idle_baseline(
        cli,
        admin,
        base,
        &template.name,
        &format!("bench_idle_sessions_{}", template.scale),
        |pool, stop| {
            append_at_rate(
                pool,
                template.session_targets.clone(),
                cli.writer_rate,
                stop,
            )
        },
    )
    .await?;
    // Round by round, the methods taking turns; each method's median round is kept.
    let mut rounds = Rounds::new();
    for _ in 0..cli.scale_rounds_at(template.scale) {
        for (at, name) in SESSION_METHODS
            .into_iter()
            .filter(|name| chosen(cli, name))
            .enumerate()
        {
            eprintln!("scale {}: {name}", template.scale);
            let mut method = session_method(cli, admin, base, template, name, &cli.sexton).await?;
            net_wal(&mut method, template.sessions, idle_wal);
            rounds.add(at, method);
        }
    }
    let methods = rounds.medians(|run: &Method| run.seconds);
    Ok((Latency::of(idle.total_ms), idle_wal, methods))
}

/// SessionRetention's methods, in the order they run.
pub const SESSION_METHODS: [&str; 5] = [
    "sessions",
    "sessions raw",
    SESSIONS_SAME_END,
    SESSIONS_SAME_END_LOCKED,
    SESSIONS_SAME_END_RULES,
];

/// SessionRetention method `name` on a fresh copy set up for that job alone (sexton's by the
/// build `binary`), the appending writer beside it, checked to delete exactly the sessions a
/// pass deletes, and scored.
pub async fn session_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    name: &'static str,
    binary: &Path,
) -> anyhow::Result<Method> {
    let (db, run_files) = fresh_copy(cli, admin, template, name).await?;
    let before = sessions_alone(base, &db).await?;
    let writer_pool = connect(base, &db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let (writer, sampler) = beside(
        base,
        &db,
        append_at_rate(
            writer_pool.clone(),
            template.session_targets.clone(),
            cli.writer_rate,
            stop.clone(),
        ),
        &stop,
    )
    .await?;
    let mut method = match name {
        "sessions" => {
            let worker = Worker {
                binary,
                name,
                concurrency: 2,
                pass: &SESSIONS,
                env: &[],
            };
            run_sexton(cli, admin, &db, &run_files, &worker).await?
        }
        SESSIONS_SAME_END | SESSIONS_SAME_END_LOCKED => {
            let dirs = run_files.join("sessions");
            let locks = name == SESSIONS_SAME_END_LOCKED;
            run_raw_sessions(admin, base, &db, Some(&dirs), locks).await?
        }
        SESSIONS_SAME_END_RULES => {
            run_session_rules(admin, base, &db, &run_files.join("sessions")).await?
        }
        _ => run_raw_sessions(admin, base, &db, None, false).await?,
    };
    stop.store(true, Ordering::Relaxed);
    let writer = writer.await??;
    let longest = sampler.await??;
    let check = connect(base, &db, "bench").await?;
    // A session the writer holds when sexton's lock reaches it is skipped (`busy`, SS-5) and
    // left for the next pass, as by the floor that keeps SS-5; no other session may be left,
    // and the other raw floors leave none.
    let skips = name == "sessions" || name == SESSIONS_SAME_END_RULES;
    let (left, unheld, after): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM sessions WHERE id IN (SELECT id FROM bench_sessions)),
                (SELECT count(*) FROM sessions
                 WHERE id IN (SELECT id FROM bench_sessions) AND id <> ALL($1)),
                (SELECT count(*) FROM sessions)",
    )
    .bind(&template.session_targets)
    .fetch_one(&check)
    .await?;
    if unheld > 0 || (!skips && left > 0) || before - after + left != template.sessions {
        bail!(
            "{name} left {left} sessions ({unheld} of them never held by the writer) and \
             deleted {} at scale {}",
            before - after,
            template.scale
        );
    }
    check.close().await;
    if name != "sessions raw" {
        let left = session_dirs_left(base, &db, &run_files.join("sessions")).await?;
        if left > 0 {
            bail!(
                "{name} left {left} directories of deleted sessions at scale {}",
                template.scale
            );
        }
    }
    writer_pool.close().await;
    let (sessions, rows) = (template.sessions - left, template.session_rows);
    score(&mut method, sessions, rows, writer, longest);
    drop_copy(admin, &db, &run_files).await?;
    Ok(method)
}

/// How many of the deleted sessions' directories are still under `root`: of the sessions to
/// delete, those gone from the database (one the writer held is skipped, its directory kept).
async fn session_dirs_left(
    base: &PgConnectOptions,
    db: &str,
    root: &Path,
) -> anyhow::Result<usize> {
    let pool = connect(base, db, "bench").await?;
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM bench_sessions b WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = b.id)",
    )
    .fetch_all(&pool)
    .await?;
    pool.close().await;
    Ok(ids
        .iter()
        .filter(|id| root.join(id.to_string()).exists())
        .count())
}

/// Sets copy `db` up for SessionRetention alone — the policies back, execution retention off —
/// and counts its sessions.
async fn sessions_alone(base: &PgConnectOptions, db: &str) -> anyhow::Result<i64> {
    let setup = connect(base, db, "bench").await?;
    sqlx::query(
        "UPDATE session_retention_policies p SET enabled = b.enabled
         FROM bench_policies b WHERE b.account_id = p.account_id",
    )
    .execute(&setup)
    .await?;
    sqlx::query("UPDATE accounts SET execution_details_retention_days = NULL")
        .execute(&setup)
        .await?;
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
        .fetch_one(&setup)
        .await?;
    setup.close().await;
    Ok(before)
}
