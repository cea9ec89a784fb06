//! The scales part (SPEC §8, PF-1 … PF-3): at each seed scale, a template seeded by `sexton
//! seed` and, on identical copies of it, the execution-details methods — sexton, sexton at
//! concurrency 1, the raw floors and the naive delete, and once sexton under a WAL budget —
//! then SessionRetention's, sexton and its raw floor, each with an application writer beside it
//! and checked against the rules' end state. The figures are [`Scale`]'s; [`markdown()`] renders
//! them, [`targets()`] holds them to SPEC §8.

mod markdown;
mod naive;
mod raw;
mod seed;
mod targets;
mod writers;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

pub use self::markdown::markdown;
use self::naive::run_naive;
use self::raw::{Floor, SAME_END, run_raw, run_raw_sessions};
use self::seed::{ELIGIBLE, ELIGIBLE_SESSIONS, detail_rows};
pub use self::targets::targets;
use self::writers::{append_at_rate, write_at_rate, writer_targets};
use crate::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::method::{Latency, Method, score};
use crate::sexton::{Pass, pass_start, run_sexton, sexton};
use crate::writer::{beside, idle_baseline};

/// A scale's figures: its template's, the writers' idle baselines, and every method's.
#[derive(Debug, Clone, Serialize)]
pub struct Scale {
    scale: u64,
    runs: i64,
    owners: i64,
    detail_rows: i64,
    seed_seconds: f64,
    idle_writer: Latency,
    /// WAL bytes per second the writer wrote alone, in its idle baseline.
    idle_writer_wal_bytes_per_s: f64,
    methods: Vec<Method>,
    /// The largest scale up to 10 (or the smallest): sexton under a WAL budget.
    wal_budget: Option<WalBudget>,
    /// `execution_details.transaction_target_ms` as the worker was given it (PF-2).
    transaction_target_ms: f64,
    /// SessionRetention: sessions a pass deletes, their history rows, and the methods.
    sessions: i64,
    session_rows: i64,
    /// WAL bytes per second the sessions' appending writer wrote alone, in its idle baseline.
    idle_appender_wal_bytes_per_s: f64,
    session_methods: Vec<Method>,
}

/// sexton once more after its unbudgeted pass, on a fresh copy, with
/// `health.max_wal_bytes_per_second` at a quarter of the rate that pass wrote at (its
/// `wal_bytes` ÷ its seconds); the other health indicators stay off.
#[derive(Debug, Clone, Serialize)]
struct WalBudget {
    budget_bytes_per_s: u64,
    /// The WAL rate over the pass, `wal_bytes` ÷ seconds, measured as for every method: the
    /// cluster's, whose position the pace reads too, the writer's included.
    achieved_bytes_per_s: f64,
    /// `achieved_bytes_per_s` ÷ `budget_bytes_per_s`.
    ratio: f64,
    #[serde(flatten)]
    method: Method,
}

impl WalBudget {
    fn of(budget_bytes_per_s: u64, method: Method) -> Self {
        let achieved_bytes_per_s = method.wal_bytes.unwrap_or(0) as f64 / method.seconds;
        Self {
            budget_bytes_per_s,
            achieved_bytes_per_s,
            ratio: achieved_bytes_per_s / budget_bytes_per_s as f64,
            method,
        }
    }
}

/// The name the budgeted pass runs under (its database's, too).
const BUDGETED: &str = "sexton wal budget";

/// The scale of the budgeted pass: the largest up to 10, or the smallest when none is.
fn budget_scale(scales: &[u64]) -> Option<u64> {
    let small = scales.iter().copied().filter(|&s| s <= 10).max();
    small.or_else(|| scales.iter().copied().min())
}

/// The jobs the scales' sexton passes are timed by.
const PED: Pass = Pass {
    job: "prune_execution_details",
    global: false,
};
const SESSIONS: Pass = Pass {
    job: "session_retention",
    global: false,
};

/// Measures scale `scale`: seeds its template, then on copies of it the execution-details
/// methods and SessionRetention's, each after its writer's idle baseline.
pub async fn measure(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    scale: u64,
) -> anyhow::Result<Scale> {
    let template = format!("bench_template_{scale}");
    let files = cli.scratch.join(format!("files-{scale}"));
    recreate(admin, &template, None).await?;
    let _ = std::fs::remove_dir_all(&files);
    eprintln!("scale {scale}: seeding");
    let started = Instant::now();
    sexton(cli, &template, &files, &["migrate"])
        .status()
        .await?;
    let seeded = sexton(
        cli,
        &template,
        &files,
        &[
            "seed",
            "--json",
            "--scale",
            &scale.to_string(),
            "--now",
            &pass_start().to_rfc3339(),
        ],
    )
    .status()
    .await?;
    if !seeded.success() {
        bail!("seeding scale {scale} failed");
    }
    let seed_seconds = started.elapsed().as_secs_f64();
    let pool = connect(base, &template, "bench").await?;
    sqlx::query("CREATE TABLE bench_owners (id uuid PRIMARY KEY)")
        .execute(&pool)
        .await?;
    sqlx::query(ELIGIBLE)
        .bind(pass_start())
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE bench_sessions (id uuid PRIMARY KEY)")
        .execute(&pool)
        .await?;
    sqlx::query(ELIGIBLE_SESSIONS)
        .bind(pass_start())
        .execute(&pool)
        .await?;
    // The execution-details methods compare that job alone: sessions wait for their own rows.
    sqlx::query("CREATE TABLE bench_policies AS SELECT * FROM session_retention_policies")
        .execute(&pool)
        .await?;
    sqlx::query("UPDATE session_retention_policies SET enabled = false")
        .execute(&pool)
        .await?;
    sqlx::query("ANALYZE").execute(&pool).await?;
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&pool)
        .await?;
    let owners: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_owners")
        .fetch_one(&pool)
        .await?;
    let detail_rows = detail_rows(&pool).await?;
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_sessions")
        .fetch_one(&pool)
        .await?;
    let session_rows: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM conversation_entries WHERE session_id IN (SELECT id FROM bench_sessions))
              + (SELECT count(*) FROM conversation_archives WHERE session_id IN (SELECT id FROM bench_sessions))
              + (SELECT count(*) FROM conversation_archive_entries e JOIN conversation_archives a
                 ON a.id = e.archive_id WHERE a.session_id IN (SELECT id FROM bench_sessions))
              + (SELECT count(*) FROM bench_sessions)",
    )
    .fetch_one(&pool)
    .await?;
    let targets = writer_targets(&pool).await?;
    // The owners' output files no surviving run references: sexton's end state has none of
    // them on disk, and neither has the floor that unlinks.
    let owner_files: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT o.relative_path FROM output_files o JOIN bench_owners b ON b.id = o.run_id
         WHERE NOT EXISTS (SELECT 1 FROM output_files s
                           WHERE s.relative_path = o.relative_path
                             AND NOT EXISTS (SELECT 1 FROM bench_owners c WHERE c.id = s.run_id))",
    )
    .fetch_all(&pool)
    .await?;
    let session_targets: Vec<Uuid> = sqlx::query_scalar(
        "(SELECT id FROM bench_sessions ORDER BY id LIMIT 100)
         UNION ALL
         (SELECT id FROM sessions WHERE id NOT IN (SELECT id FROM bench_sessions) ORDER BY id LIMIT 100)",
    )
    .fetch_all(&pool)
    .await?;
    pool.close().await;

    eprintln!(
        "scale {scale}: {runs} runs, {owners} owners, {detail_rows} detail rows; idle writer baseline"
    );
    let (idle, idle_writer_wal_bytes_per_s) = idle_baseline(
        cli,
        admin,
        base,
        &template,
        &format!("bench_idle_{scale}"),
        |pool, stop| write_at_rate(pool, targets.clone(), cli.writer_rate, stop),
    )
    .await?;
    let idle_writer = Latency::of(idle.total_ms);

    let mut names = vec![
        "sexton",
        "sexton c=1",
        "raw",
        "raw+markers",
        SAME_END,
        "naive",
    ];
    if budget_scale(&cli.scales) == Some(scale) {
        names.insert(1, BUDGETED);
    }
    let (mut methods, mut budget, mut wal_budget) = (Vec::new(), 0, None);
    for name in names {
        eprintln!("scale {scale}: {name}");
        let db = format!("bench_{}_{scale}", name.replace(['+', ' ', '='], "_"));
        recreate(admin, &db, Some(&template)).await?;
        let run_files = cli.scratch.join(format!("run-{scale}"));
        let _ = std::fs::remove_dir_all(&run_files);
        copy_dir(&files, &run_files)?;
        let writer_pool = connect(base, &db, "bench-writer").await?;
        let stop = Arc::new(AtomicBool::new(false));
        let (writer, sampler) = beside(
            base,
            &db,
            write_at_rate(
                writer_pool.clone(),
                targets.clone(),
                cli.writer_rate,
                stop.clone(),
            ),
            &stop,
        )
        .await?;
        // Each method times itself (sexton from its worker taking the nightly slot, see
        // `run_sexton`).
        let mut method = match name {
            "sexton" => run_sexton(cli, admin, &db, &run_files, name, 2, &PED, &[]).await?,
            BUDGETED => {
                let unbudgeted = methods.iter().find(|m: &&Method| m.name == "sexton");
                budget = quarter_rate(unbudgeted.context("the budget follows sexton's pass")?);
                let env = [(
                    "SEXTON_HEALTH__MAX_WAL_BYTES_PER_SECOND".to_owned(),
                    budget.to_string(),
                )];
                run_sexton(cli, admin, &db, &run_files, name, 2, &PED, &env).await?
            }
            "sexton c=1" => run_sexton(cli, admin, &db, &run_files, name, 1, &PED, &[]).await?,
            "raw" => run_raw(admin, base, &db, Floor::Rows).await?,
            "raw+markers" => run_raw(admin, base, &db, Floor::Markers).await?,
            SAME_END => {
                let outputs = run_files.join("outputs");
                run_raw(admin, base, &db, Floor::Files(&outputs)).await?
            }
            _ => run_naive(admin, base, &db).await?,
        };
        stop.store(true, Ordering::Relaxed);
        let writer = writer.await??;
        let longest = sampler.await??;
        let check = connect(base, &db, "bench").await?;
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM run_tasks WHERE run_id IN (SELECT id FROM bench_owners))
                  + (SELECT count(*) FROM tool_results WHERE run_id IN (SELECT id FROM bench_owners))",
        )
        .fetch_one(&check)
        .await?;
        if left > 0 {
            bail!("{name} left {left} detail rows of the owners at scale {scale}");
        }
        check.close().await;
        writer_pool.close().await;
        if name.starts_with("sexton") || name == SAME_END {
            let outputs = run_files.join("outputs");
            let left = owner_files
                .iter()
                .filter(|f| outputs.join(f).exists())
                .count();
            if left > 0 {
                bail!("{name} left {left} of the owners' output files at scale {scale}");
            }
        }
        score(&mut method, owners, detail_rows, writer, longest);
        net_wal(&mut method, owners, idle_writer_wal_bytes_per_s);
        if name == BUDGETED {
            wal_budget = Some(WalBudget::of(budget, method));
        } else {
            methods.push(method);
        }
        drop_db(admin, &db).await?;
        let _ = std::fs::remove_dir_all(&run_files);
    }
    let (_, idle_appender_wal_bytes_per_s) = idle_baseline(
        cli,
        admin,
        base,
        &template,
        &format!("bench_idle_sessions_{scale}"),
        |pool, stop| append_at_rate(pool, session_targets.clone(), cli.writer_rate, stop),
    )
    .await?;
    let mut session_methods = Vec::new();
    for name in ["sessions", "sessions raw"] {
        eprintln!("scale {scale}: {name}");
        let db = format!("bench_{}_{scale}", name.replace(' ', "_"));
        recreate(admin, &db, Some(&template)).await?;
        let run_files = cli.scratch.join(format!("run-{scale}"));
        let _ = std::fs::remove_dir_all(&run_files);
        copy_dir(&files, &run_files)?;
        let setup = connect(base, &db, "bench").await?;
        // This job alone: the policies back, execution retention off.
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
        let writer_pool = connect(base, &db, "bench-writer").await?;
        let stop = Arc::new(AtomicBool::new(false));
        let (writer, sampler) = beside(
            base,
            &db,
            append_at_rate(
                writer_pool.clone(),
                session_targets.clone(),
                cli.writer_rate,
                stop.clone(),
            ),
            &stop,
        )
        .await?;
        let mut method = match name {
            "sessions" => run_sexton(cli, admin, &db, &run_files, name, 2, &SESSIONS, &[]).await?,
            _ => run_raw_sessions(admin, base, &db).await?,
        };
        stop.store(true, Ordering::Relaxed);
        let writer = writer.await??;
        let longest = sampler.await??;
        let check = connect(base, &db, "bench").await?;
        let (left, after): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM sessions WHERE id IN (SELECT id FROM bench_sessions)),
                    (SELECT count(*) FROM sessions)",
        )
        .fetch_one(&check)
        .await?;
        if left > 0 || before - after != sessions {
            bail!(
                "{name} left {left} sessions and deleted {} at scale {scale}",
                before - after
            );
        }
        check.close().await;
        writer_pool.close().await;
        score(&mut method, sessions, session_rows, writer, longest);
        net_wal(&mut method, sessions, idle_appender_wal_bytes_per_s);
        session_methods.push(method);
        drop_db(admin, &db).await?;
        let _ = std::fs::remove_dir_all(&run_files);
    }
    drop_db(admin, &template).await?;
    let _ = std::fs::remove_dir_all(&files);
    Ok(Scale {
        scale,
        runs,
        owners,
        detail_rows,
        seed_seconds,
        idle_writer,
        idle_writer_wal_bytes_per_s,
        methods,
        wal_budget,
        transaction_target_ms: transaction_target_ms()?,
        sessions,
        session_rows,
        idle_appender_wal_bytes_per_s,
        session_methods,
    })
}

/// A method's WAL net of the writer beside it: the writer's share is its idle baseline's rate
/// `writer_bytes_per_s` × the method's seconds; the rest is spread over the `items` pruned.
fn net_wal(method: &mut Method, items: i64, writer_bytes_per_s: f64) {
    if let Some(bytes) = method.wal_bytes {
        let writer = writer_bytes_per_s * method.seconds;
        method.wal_bytes_writer = Some(writer);
        method.wal_bytes_per_owner = Some((bytes as f64 - writer) / items as f64);
    }
}

/// A quarter of the WAL rate `unbudgeted` wrote at, in whole bytes per second (at least 1: 0
/// would be no budget).
fn quarter_rate(unbudgeted: &Method) -> u64 {
    let rate = unbudgeted.wal_bytes.unwrap_or(0) as f64 / unbudgeted.seconds;
    (rate / 4.0).round().max(1.0) as u64
}

/// `execution_details.transaction_target_ms` as the worker is given it: the environment's
/// override (the worker inherits the bench's), else config/default.toml, which the worker has
/// built in.
fn transaction_target_ms() -> anyhow::Result<f64> {
    const SETTING: &str = "SEXTON_EXECUTION_DETAILS__TRANSACTION_TARGET_MS";
    if let Ok(ms) = std::env::var(SETTING) {
        return ms
            .trim()
            .parse()
            .with_context(|| format!("{SETTING}: expected milliseconds, got {ms:?}"));
    }
    let mut section = "";
    for line in include_str!("../../config/default.toml").lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
        } else if section == "[execution_details]"
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "transaction_target_ms"
        {
            return Ok(value.trim().parse()?);
        }
    }
    bail!("config/default.toml sets no execution_details.transaction_target_ms")
}

/// Copies the tree `from` to `to` with `cp -a` (modes, times and links kept).
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()?;
    if !status.success() {
        bail!("copying {} failed", from.display());
    }
    Ok(())
}
