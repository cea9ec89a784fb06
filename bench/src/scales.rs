//! The scales part (SPEC §8, PF-1 … PF-3): at each seed scale, a template seeded by `sexton
//! seed` and, on identical copies of it, the execution-details methods — sexton, sexton at
//! concurrency 1, the raw floors and the naive delete, and once sexton under a WAL budget —
//! then SessionRetention's, sexton and its raw floor, each with an application writer beside it
//! and checked against the rules' end state; with `--baseline-sexton`, the sexton methods once
//! more pair by pair with the earlier build. The figures are [`Scale`]'s; [`render`] writes
//! them as markdown, [`targets()`] holds them to SPEC §8.

mod markdown;
mod naive;
mod raw;
mod seed;
mod sessions;
mod targets;
mod writers;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use self::naive::run_naive;
use self::raw::{
    Floor, SAME_END, SAME_END_BOUNDED, SAME_END_LOCKED, SAME_END_RULES, run_raw, run_rules,
};
use self::seed::{Template, seed};
use self::sessions::{SESSION_METHODS, session_method, session_methods};
use self::targets::targets;
use self::writers::write_at_rate;
use crate::cli::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::compare::{self, Comparison};
use crate::method::{Latency, Method, Rounds, score};
use crate::part::Bench;
use crate::results::{machine, member};
use crate::sexton::{Pass, Worker, run_sexton};
use crate::writer::{beside, idle_baseline};

/// The part: every scale of `--scales` in turn, each written into the results as it is done.
pub fn run<'a>(bench: &'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>> {
    Box::pin(async move {
        let (mut results, mut comparisons) = (Vec::new(), Vec::new());
        for &scale in &bench.cli.scales {
            let scale = measure(bench.cli, bench.admin, bench.base, scale).await?;
            comparisons.extend(scale.before_after.iter().cloned());
            results.push(scale);
            bench.report.write(&[
                ("machine", member(&machine())?),
                ("measured_at", member(&Utc::now())?),
                ("scales", member(&results)?),
                ("targets", member(&targets(&results))?),
            ])?;
        }
        Ok(comparisons)
    })
}

/// The part's section of latest.md, from latest.json's `scales` (and when and where they were
/// measured).
pub fn render(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
    let Some(scales) = json.get("scales") else {
        return Ok(None);
    };
    let scales: Vec<Scale> = serde_json::from_value(scales.clone())?;
    let measured_at: DateTime<Utc> = serde_json::from_value(json["measured_at"].clone())?;
    let machine = json["machine"].as_str().unwrap_or_default();
    Ok(Some(markdown::markdown(&scales, &measured_at, machine)))
}

/// A scale's figures: its template's, the writers' idle baselines, and every method's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scale {
    scale: u64,
    runs: i64,
    owners: i64,
    detail_rows: i64,
    seed_seconds: f64,
    /// Rounds of each method (but the budgeted pass); each method's row is its median round.
    #[serde(default = "crate::method::one_round")]
    rounds: u32,
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
    /// The sessions' appending writer alone: its latency (none in results files of runs
    /// before it was kept) and the WAL bytes per second it wrote.
    #[serde(default)]
    idle_appender: Latency,
    idle_appender_wal_bytes_per_s: f64,
    session_methods: Vec<Method>,
    /// With `--baseline-sexton`: the sexton methods by both builds, pair by pair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    before_after: Vec<Comparison>,
}

/// sexton once more after its unbudgeted pass, on a fresh copy, with
/// `health.max_wal_bytes_per_second` at a quarter of the rate that pass wrote at (its
/// `wal_bytes` ÷ its seconds); the other health indicators stay off.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// The job the execution-details passes are timed by.
const PED: Pass = Pass {
    job: "prune_execution_details",
    global: false,
};

/// Measures scale `scale`: seeds its template, then on copies of it the execution-details
/// methods and SessionRetention's, each after its writer's idle baseline.
async fn measure(
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
    let budget = wal_budget.as_ref().map(|b| b.budget_bytes_per_s);
    let before_after = compare_builds(cli, admin, base, &template, budget).await?;
    drop_db(admin, &template.name).await?;
    let _ = std::fs::remove_dir_all(&template.files);
    Ok(Scale {
        scale,
        runs: template.runs,
        owners: template.owners,
        detail_rows: template.detail_rows,
        seed_seconds: template.seed_seconds,
        rounds: cli.scale_rounds_at(scale),
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
        before_after,
    })
}

/// With `--baseline-sexton`, each sexton method chosen once more by the earlier build and this
/// one, pair by pair on fresh copies (the budgeted pass at this scale's `budget`, if it ran).
async fn compare_builds(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    budget: Option<u64>,
) -> anyhow::Result<Vec<Comparison>> {
    let mut comparisons = Vec::new();
    for name in ["sexton", "sexton c=1", BUDGETED, "sessions"] {
        let budgeted = if name == BUDGETED { budget } else { None };
        if !chosen(cli, name) || (name == BUDGETED && budgeted.is_none()) {
            continue;
        }
        let case = format!("{} · {name}", template.scale);
        let unit = if name == "sessions" {
            "sessions/s"
        } else {
            "owners/s"
        };
        let compared = compare::pairs(cli, "scales", case, unit, async |build| {
            let binary = build.binary;
            let method = if name == "sessions" {
                session_method(cli, admin, base, template, name, binary).await?
            } else {
                detail_method(cli, admin, base, template, name, budgeted, binary).await?
            };
            Ok(method.side())
        });
        comparisons.extend(compared.await?);
    }
    Ok(comparisons)
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
    let mut wal_budget = None;
    // Round by round, the methods taking turns; the budgeted pass once, after the first
    // round's unbudgeted one.
    let mut rounds = Rounds::new();
    for round in 0..cli.scale_rounds_at(template.scale) {
        for (at, name) in names
            .iter()
            .filter(|name| **name != BUDGETED || round == 0)
            .enumerate()
        {
            eprintln!("scale {}: {name}", template.scale);
            let budget = match *name {
                BUDGETED => {
                    let unbudgeted = rounds.iter().find(|m: &&Method| m.name == "sexton");
                    Some(quarter_rate(
                        unbudgeted.context("the budget follows sexton's pass")?,
                    ))
                }
                _ => None,
            };
            let sexton = &cli.sexton;
            let mut method =
                detail_method(cli, admin, base, template, name, budget, sexton).await?;
            net_wal(&mut method, template.owners, idle_wal);
            match budget {
                Some(budget) => wal_budget = Some(WalBudget::of(budget, method)),
                None => rounds.add(at, method),
            }
        }
    }
    Ok((rounds.medians(|run| run.seconds), wal_budget))
}

/// Execution-details method `name` on a fresh copy, the writer beside it (sexton's methods by
/// the build `binary`, with `budget` WAL bytes per second if given), checked to leave none of
/// the owners' detail rows (nor, for sexton and [`SAME_END`], their unreferenced output files),
/// and scored.
async fn detail_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    name: &'static str,
    budget: Option<u64>,
    binary: &Path,
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
    let worker = |concurrency, env| Worker {
        binary,
        name,
        concurrency,
        pass: &PED,
        env,
    };
    let mut method = match name {
        "sexton" | BUDGETED => run_sexton(cli, admin, &db, &run_files, &worker(2, &env)).await?,
        "sexton c=1" => run_sexton(cli, admin, &db, &run_files, &worker(1, &[])).await?,
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

/// Fails on a `--methods` name no table has, naming those it has.
pub fn check_methods(cli: &Cli) -> anyhow::Result<()> {
    let known = || {
        DETAIL_METHODS
            .iter()
            .chain(&SESSION_METHODS)
            .chain(&[BUDGETED])
            .chain(&crate::traces::METHODS)
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
pub fn chosen(cli: &Cli, name: &str) -> bool {
    cli.methods.is_empty() || cli.methods.iter().any(|m| m == name)
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
pub(crate) fn transaction_target_ms() -> anyhow::Result<f64> {
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
