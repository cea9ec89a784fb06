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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

pub use self::markdown::markdown;
use self::naive::run_naive;
use self::raw::{
    Floor, SAME_END, SAME_END_BOUNDED, SAME_END_LOCKED, SAME_END_RULES, SESSIONS_SAME_END,
    SESSIONS_SAME_END_LOCKED, SESSIONS_SAME_END_RULES, run_raw, run_raw_sessions, run_rules,
    run_session_rules,
};
use self::seed::{Template, seed};
pub use self::targets::targets;
use self::writers::{append_at_rate, write_at_rate};
use crate::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::method::{Latency, Method, score};
use crate::sexton::{Pass, run_sexton};
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
    /// The sessions' appending writer alone: its latency and the WAL bytes per second it wrote.
    idle_appender: Latency,
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
    let template = seed(cli, admin, base, scale).await?;
    eprintln!(
        "scale {scale}: {} runs, {} owners, {} detail rows; idle writer baseline",
        template.runs, template.owners, template.detail_rows
    );
    let (idle, idle_writer_wal_bytes_per_s) = idle_baseline(
        cli,
        admin,
        base,
        &template.name,
        &format!("bench_idle_{scale}"),
        |pool, stop| write_at_rate(pool, template.targets.clone(), cli.writer_rate, stop),
    )
    .await?;
    let (methods, wal_budget) =
        detail_methods(cli, admin, base, &template, idle_writer_wal_bytes_per_s).await?;
    let (idle_appender, idle_appender_wal_bytes_per_s, session_methods) =
        session_methods(cli, admin, base, &template).await?;
    drop_db(admin, &template.name).await?;
    let _ = std::fs::remove_dir_all(&template.files);
    Ok(Scale {
        scale,
        runs: template.runs,
        owners: template.owners,
        detail_rows: template.detail_rows,
        seed_seconds: template.seed_seconds,
        idle_writer: Latency::of(idle.total_ms),
        idle_writer_wal_bytes_per_s,
        methods,
        wal_budget,
        transaction_target_ms: transaction_target_ms()?,
        sessions: template.sessions,
        session_rows: template.session_rows,
        idle_appender,
        idle_appender_wal_bytes_per_s,
        session_methods,
    })
}

/// The execution-details methods, each on a fresh copy, their WAL net of the writer's idle
/// rate `idle_wal`; at the budget's scale sexton once more under a WAL budget, after its
/// unbudgeted pass.
async fn detail_methods(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    idle_wal: f64,
) -> anyhow::Result<(Vec<Method>, Option<WalBudget>)> {
    let mut names = DETAIL_METHODS.to_vec();
    if budget_scale(&cli.scales) == Some(template.scale) {
        names.insert(1, BUDGETED);
    }
    names.retain(|name| chosen(cli, name));
    let (mut methods, mut wal_budget) = (Vec::new(), None);
    for name in names {
        eprintln!("scale {}: {name}", template.scale);
        let budget = match name {
            BUDGETED => {
                let unbudgeted = methods.iter().find(|m: &&Method| m.name == "sexton");
                Some(quarter_rate(
                    unbudgeted.context("the budget follows sexton's pass")?,
                ))
            }
            _ => None,
        };
        let mut method = detail_method(cli, admin, base, template, name, budget).await?;
        net_wal(&mut method, template.owners, idle_wal);
        match budget {
            Some(budget) => wal_budget = Some(WalBudget::of(budget, method)),
            None => methods.push(method),
        }
    }
    Ok((methods, wal_budget))
}

/// Execution-details method `name` on a fresh copy, the writer beside it (sexton with
/// `budget` WAL bytes per second, if given), checked to leave none of the owners' detail rows
/// (nor, for sexton and [`SAME_END`], their unreferenced output files), and scored.
async fn detail_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    name: &'static str,
    budget: Option<u64>,
) -> anyhow::Result<Method> {
    let (db, run_files) = fresh_copy(cli, admin, template, name).await?;
    let writer_pool = connect(base, &db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let (writer, sampler) = beside(
        base,
        &db,
        write_at_rate(
            writer_pool.clone(),
            template.targets.clone(),
            cli.writer_rate,
            stop.clone(),
        ),
        &stop,
    )
    .await?;
    let env: Vec<(String, String)> = budget
        .map(|b| {
            (
                "SEXTON_HEALTH__MAX_WAL_BYTES_PER_SECOND".to_owned(),
                b.to_string(),
            )
        })
        .into_iter()
        .collect();
    // Each method times itself (sexton from its worker taking the nightly slot, see
    // `run_sexton`).
    let mut method = match name {
        "sexton" | BUDGETED => run_sexton(cli, admin, &db, &run_files, name, 2, &PED, &env).await?,
        "sexton c=1" => run_sexton(cli, admin, &db, &run_files, name, 1, &PED, &[]).await?,
        "raw" => run_raw(admin, base, &db, Floor::Rows).await?,
        "raw+markers" => run_raw(admin, base, &db, Floor::Markers).await?,
        SAME_END => {
            let outputs = run_files.join("outputs");
            run_raw(admin, base, &db, Floor::Files(&outputs)).await?
        }
        SAME_END_LOCKED => {
            let outputs = run_files.join("outputs");
            run_raw(admin, base, &db, Floor::Locked(&outputs)).await?
        }
        SAME_END_RULES => run_rules(admin, base, &db, &run_files.join("outputs"), None).await?,
        SAME_END_BOUNDED => {
            let target = Duration::from_secs_f64(transaction_target_ms()? / 1000.0);
            run_rules(admin, base, &db, &run_files.join("outputs"), Some(target)).await?
        }
        _ => run_naive(admin, base, &db).await?,
    };
    stop.store(true, Ordering::Relaxed);
    let writer = writer.await??;
    let longest = sampler.await??;
    check_details(base, &db, template, name, &run_files).await?;
    writer_pool.close().await;
    score(
        &mut method,
        template.owners,
        template.detail_rows,
        writer,
        longest,
    );
    drop_copy(admin, &db, &run_files).await?;
    Ok(method)
}

/// Fails if method `name` left any of the owners' detail rows on `db` or, for sexton's passes
/// and [`SAME_END`], any of their unreferenced output files under `run_files`.
async fn check_details(
    base: &PgConnectOptions,
    db: &str,
    template: &Template,
    name: &str,
    run_files: &Path,
) -> anyhow::Result<()> {
    let scale = template.scale;
    let check = connect(base, db, "bench").await?;
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
    if name.starts_with("sexton") || name.starts_with(SAME_END) {
        let outputs = run_files.join("outputs");
        let left = template
            .owner_files
            .iter()
            .filter(|f| outputs.join(f).exists())
            .count();
        if left > 0 {
            bail!("{name} left {left} of the owners' output files at scale {scale}");
        }
    }
    Ok(())
}

/// SessionRetention's methods, each on a fresh copy, after the appending writer's idle
/// baseline: its latency and WAL rate, and the methods with their WAL net of it.
async fn session_methods(
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
    let mut methods = Vec::new();
    for name in SESSION_METHODS.into_iter().filter(|name| chosen(cli, name)) {
        eprintln!("scale {}: {name}", template.scale);
        let mut method = session_method(cli, admin, base, template, name).await?;
        net_wal(&mut method, template.sessions, idle_wal);
        methods.push(method);
    }
    Ok((Latency::of(idle.total_ms), idle_wal, methods))
}

/// The execution-details methods, in the order they run ([`BUDGETED`] after sexton, at its
/// scale).
const DETAIL_METHODS: [&str; 9] = [
    "sexton",
    "sexton c=1",
    "raw",
    "raw+markers",
    SAME_END,
    SAME_END_LOCKED,
    SAME_END_RULES,
    SAME_END_BOUNDED,
    "naive",
];

/// SessionRetention's methods, in the order they run.
const SESSION_METHODS: [&str; 5] = [
    "sessions",
    "sessions raw",
    SESSIONS_SAME_END,
    SESSIONS_SAME_END_LOCKED,
    SESSIONS_SAME_END_RULES,
];

/// Fails on a `--methods` name no table has, naming those it has.
pub fn check_methods(cli: &Cli) -> anyhow::Result<()> {
    let known = || {
        DETAIL_METHODS
            .iter()
            .chain(&SESSION_METHODS)
            .chain(&[BUDGETED])
    };
    if let Some(unknown) = cli.methods.iter().find(|m| !known().any(|k| k == m)) {
        let known: Vec<_> = known().copied().collect();
        bail!(
            "--methods: no method is called {unknown:?}; expected some of: {}",
            known.join(", ")
        );
    }
    Ok(())
}

/// Whether method `name` is measured: `--methods` names it, or names none.
fn chosen(cli: &Cli, name: &str) -> bool {
    cli.methods.is_empty() || cli.methods.iter().any(|m| m == name)
}

/// SessionRetention method `name` on a fresh copy set up for that job alone, the appending
/// writer beside it, checked to delete exactly the sessions a pass deletes, and scored.
async fn session_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    name: &'static str,
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
        "sessions" => run_sexton(cli, admin, &db, &run_files, name, 2, &SESSIONS, &[]).await?,
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

/// A fresh copy of the template for method `name`: its database, named after the method and
/// the scale, and its own copy of the files; both returned.
async fn fresh_copy(
    cli: &Cli,
    admin: &PgPool,
    template: &Template,
    name: &str,
) -> anyhow::Result<(String, PathBuf)> {
    let scale = template.scale;
    let db = format!("bench_{}_{scale}", name.replace(['+', ' ', '='], "_"));
    recreate(admin, &db, Some(&template.name)).await?;
    let run_files = cli.scratch.join(format!("run-{scale}"));
    let _ = std::fs::remove_dir_all(&run_files);
    copy_dir(&template.files, &run_files)?;
    Ok((db, run_files))
}

/// Drops a copy [`fresh_copy`] made.
async fn drop_copy(admin: &PgPool, db: &str, run_files: &Path) -> anyhow::Result<()> {
    drop_db(admin, db).await?;
    let _ = std::fs::remove_dir_all(run_files);
    Ok(())
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
