//! The benchmark of SPEC §8, run by a person with `bash bench/run.sh` (never by the tests).
//!
//! For each scale it seeds one template database with `sexton seed`, then on identical copies
//! (`CREATE DATABASE … TEMPLATE`) removes the detail of exactly the same owners five ways — sexton
//! (tick and a worker through the queue, default settings but every other age-driven job kind off,
//! so that it measures the job alone; timed from the worker taking the nightly slot to its last
//! hop), the raw floor (batched `DELETE … WHERE run_id = ANY($1)`, 500 owners per transaction, no
//! checks), the same floor setting the markers sexton's end state has (`raw+markers`), that floor
//! also unlinking the owners' output files after each batch commits, beside the next batch
//! (`raw+markers+files`: sexton's whole end state, disk included; both are checked to leave none of
//! the owners' unreferenced files on disk), and the naive delete (one `DELETE` per table over all
//! owners) — while an application writer runs at a fixed rate. Each method's WAL is read from the
//! cluster's position before and after it. At one scale (the largest up to 10) sexton runs once
//! more under a WAL budget, a quarter of the rate its unbudgeted pass wrote at. It prints a
//! markdown table, a summary of the PF targets against the same run's figures, and writes them,
//! with the raw figures as JSON, to `bench/results/`. The default scales are 1, 10 and 400 (about a
//! million runs).
//!
//! The short-lived records (SPEC §4, TTL-1 and TTL-4) have their own part: a template with a
//! large backlog of expired handoffs and conversation events (`INSERT … SELECT` from
//! `generate_series`, no seed), expired by a sexton pass and by a raw batched
//! `DELETE … WHERE id = ANY($1)` on identical copies, with an application writer beside each.
//! `--only expiry` measures that part alone and merges it into the existing results.
//!
//! The file-side jobs have two more parts (their own modules): run traces (`--only traces`,
//! `sexton traces clean` against `find … -delete` on trees of up to a million files, with peak
//! RSS) and attachment bytes (`--only attachments`, a pass through the queue against a plain
//! stat-and-unlink loop). `--only` takes a list: `--only traces,attachments`.

mod attachments;
mod disk;
mod tenants;
mod traces;

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use clap::Parser;
use serde::Serialize;
use sexton_jobs::prune_execution_details::DETAIL_TABLES;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

#[derive(Debug, Parser)]
struct Cli {
    /// Seed scales to measure (`sexton seed --scale`).
    #[arg(long, value_delimiter = ',', default_value = "1,10,400")]
    scales: Vec<u64>,
    /// The sexton binary (a release build).
    #[arg(long, default_value = "target/release/sexton")]
    sexton: PathBuf,
    /// Application writer transactions per second.
    #[arg(long, default_value_t = 50)]
    writer_rate: u32,
    /// How long the writer's idle baseline runs.
    #[arg(long, default_value_t = 10)]
    baseline_seconds: u64,
    /// Where the markdown table and JSON go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Scratch directory for the file roots.
    #[arg(long, default_value = "/tmp/sexton-bench")]
    scratch: PathBuf,
    /// Measure these parts only (a comma-separated list), keeping the other parts' figures in
    /// the results files.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Short-lived records: expired rows of each table (handoffs, conversation events); a tenth
    /// as many young ones stay.
    #[arg(long, default_value_t = 1_000_000)]
    expiry_rows: u64,
    /// Short-lived records: rows per batch, for sexton (`expiry.batch_size`) and the raw delete.
    #[arg(long, default_value_t = 2000)]
    expiry_batch: u32,
    /// Run traces: the trees' sizes in files (a hundred per agent directory).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    trace_files: Vec<u64>,
    /// Run traces: the age limit in days, sexton's `max_age_days` and `find -mtime +N`.
    #[arg(long, default_value_t = 60)]
    trace_age_days: u32,
    /// Run traces: bodies of the signature line alone (less written; still a block per file on
    /// a file system of 4 KiB blocks, against one or two).
    #[arg(long)]
    trace_small: bool,
    /// Run traces: the agents table holds only the agents with live sessions, not one row per
    /// directory (to tell the live-session check's cost from the walk's).
    #[arg(long)]
    trace_live_agents_only: bool,
    /// Attachment bytes: rows, each with a file (half of them past the age).
    #[arg(long, default_value_t = 100_000)]
    attachment_rows: u64,
    /// Attachment bytes: accounts the rows are spread over.
    #[arg(long, default_value_t = 4)]
    attachment_accounts: u32,
    /// Many accounts (PF-5): the account counts of the nights measured with this build (none
    /// when given no value: the baseline's nights alone).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "10000,100000,1000000")]
    tenant_accounts: Vec<u64>,
    /// Many accounts: how many of them hold the same small backlog, at every size.
    #[arg(long, default_value_t = 10_000)]
    tenant_due: u64,
    /// Many accounts: an earlier sexton binary (built from its own commit) to run the same
    /// nights with, beside this build's.
    #[arg(long)]
    tenant_baseline: Option<PathBuf>,
    /// Many accounts: the account counts of the earlier binary's nights.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    tenant_baseline_accounts: Vec<u64>,
    /// Run traces and attachment bytes: start each method after a walk of its tree instead of
    /// dropping the page cache (what the file system costs, told from what the method does).
    #[arg(long)]
    warm: bool,
    /// Keep each sexton worker's log (JSON lines) in this directory, one file per method's
    /// database, to read its timeline afterwards.
    #[arg(long)]
    logs: Option<PathBuf>,
}

/// The parts of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// PruneExecutionDetails and SessionRetention at each seed scale.
    Scales,
    /// The short-lived records' expiry jobs (handoffs, conversation events).
    Expiry,
    /// Run traces: `sexton traces clean` against `find -delete`, by age and by quota.
    Traces,
    /// Attachment bytes: `attachment_expiry` through the queue against a plain loop.
    Attachments,
    /// Many accounts, the same due work: the whole night and the operator's views (PF-5).
    Tenants,
}

/// The moment the data is seeded relative to and the pass starts at: in the past, so that the
/// database's now (which caps every cutoff, EX-1) never binds.
fn pass_start() -> DateTime<Utc> {
    "2026-11-01T03:00:00Z".parse().expect("a valid constant")
}

/// Owners a complete pass prunes (EX-1, EX-2, EX-5), as in the tests' audit.
const ELIGIBLE: &str = "INSERT INTO bench_owners (id)
    SELECT r.id FROM runs r JOIN accounts a ON a.id = r.account_id
    WHERE r.conversation_id IS NOT NULL AND r.kind IN ('conversation', 'direct_reply')
      AND r.details_pruned_at IS NULL
      AND (CASE WHEN r.kind = 'conversation' THEN r.completed_at
                WHEN r.settled_at IS NOT NULL THEN r.terminal_at END)
          < $1 - make_interval(days => a.execution_details_retention_days)
      AND NOT EXISTS (SELECT 1 FROM invocation_attempts WHERE run_id = r.id AND status IN ('pending', 'running'))
      AND NOT EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = r.id AND status = 'pending')
      AND NOT EXISTS (SELECT 1 FROM delegations WHERE parent_run_id = r.id AND status = 'outstanding')
      AND NOT EXISTS (SELECT 1 FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id
                      WHERE s.source_run_id = r.id AND h.sealed_at IS NULL)";

/// Sessions a complete SessionRetention pass deletes (SS-1 … SS-4), by the job's own verdict.
const ELIGIBLE_SESSIONS: &str = "INSERT INTO bench_sessions (id)
    SELECT s.id FROM sessions s
    JOIN session_retention_policies p ON p.account_id = s.account_id AND p.enabled
    CROSS JOIN LATERAL (SELECT $1 - make_interval(days => CASE s.kind
                                WHEN 'main' THEN COALESCE(p.main_days, 60)
                                WHEN 'task' THEN COALESCE(p.task_days, 30)
                                ELSE COALESCE(p.subagent_days, 7) END) AS cutoff) c
    WHERE sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
                                 s.last_activity_at, c.cutoff) IS NULL";

#[derive(Debug, Clone, Copy, Serialize)]
struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    samples: usize,
}

impl Latency {
    fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if ms.is_empty() {
                0.0
            } else {
                ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1]
            }
        };
        Self {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: ms.last().copied().unwrap_or(0.0),
            samples: ms.len(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Method {
    name: &'static str,
    seconds: f64,
    owners_per_s: f64,
    rows_per_s: f64,
    writer: Latency,
    /// The writer's longest wait for its conversation and run locks.
    writer_longest_lock_wait_ms: f64,
    longest_transaction_ms: f64,
    /// What the longest transaction was running when last sampled.
    longest_transaction_query: String,
    /// What its backend waited on in the samples of it, most seen first (see
    /// [`longest_transaction`]).
    longest_transaction_waits: String,
    /// sexton only: hop durations, each hop's time per candidate, peak RSS, and where the
    /// time went.
    hop: Option<Latency>,
    /// sexton only: the worker's start, from its "worker started" line to its taking the
    /// nightly slot (its queue consumers registering, its first connections): not part of the
    /// timed pass, which a running fleet's idle workers take at once.
    start_seconds: Option<f64>,
    hop_us_per_candidate: Option<Latency>,
    peak_rss_kb: Option<u64>,
    share_outside_owner_transactions: Option<f64>,
    share_outside_hops: Option<f64>,
    /// The cluster's WAL over the method's timed span, in bytes: `pg_current_wal_lsn()` read on
    /// the bench's own connection just before and right after (for sexton, at the worker being
    /// up and at its last hop). The writer's WAL beside it is included. Measured for every
    /// sexton pass and the scales' other methods.
    wal_bytes: Option<i64>,
    /// Scales only: the writer's estimated share of `wal_bytes`, its idle baseline's WAL rate ×
    /// the method's seconds.
    wal_bytes_writer: Option<f64>,
    /// Scales only: `wal_bytes` less the writer's share, per owner pruned (session deleted).
    wal_bytes_per_owner: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Scale {
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

/// The name the budgeted pass runs under (its database's, too).
const BUDGETED: &str = "sexton wal budget";

/// The scale of the budgeted pass: the largest up to 10, or the smallest when none is.
fn budget_scale(scales: &[u64]) -> Option<u64> {
    let small = scales.iter().copied().filter(|&s| s <= 10).max();
    small.or_else(|| scales.iter().copied().min())
}

/// A performance target of SPEC §8, held against this run's figures.
#[derive(Debug, Clone, Serialize)]
struct Target {
    /// PF-1, PF-2 or PF-3.
    id: &'static str,
    /// The scale measured, or for growth the largest (from `from_scale`).
    scale: u64,
    from_scale: Option<u64>,
    /// What is held to what, with the figures.
    check: String,
    value: f64,
    /// The bound `value` is held to: at least it for PF-1, at most it otherwise.
    bound: f64,
    met: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let base = PgConnectOptions::new();
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(base.clone())
        .await?;
    let runs = |part| cli.only.is_empty() || cli.only.contains(&part);
    if runs(Part::Scales) {
        let mut results = Vec::new();
        for &scale in &cli.scales {
            results.push(measure_scale(&cli, &admin, &base, scale).await?);
            write_results(&cli, Section::Scales(&results))?;
        }
        println!("{}", markdown(&results));
    }
    if runs(Part::Expiry) {
        let expiry = measure_expiry(&cli, &admin, &base).await?;
        write_results(&cli, Section::Expiry(&expiry))?;
        println!("{}", expiry_markdown(&expiry));
    }
    if runs(Part::Traces) {
        traces::measure(&cli, &admin, &base).await?;
    }
    if runs(Part::Attachments) {
        attachments::measure(&cli, &admin, &base).await?;
    }
    if runs(Part::Tenants) {
        tenants::measure(&cli, &admin, &base).await?;
    }
    Ok(())
}

async fn measure_scale(
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

/// A short-lived record kind the expiry part measures (SPEC §4).
struct Expiring {
    table: &'static str,
    job: &'static str,
    /// Its age setting, as an environment override names it (`SEXTON_EXPIRY__…`).
    setting: &'static str,
    /// Its age in days, the default (config/default.toml).
    days: i32,
    id: Id,
    /// Adds rows: `$1` the pass start, `$2` how many, created evenly from `$3` to `$4` days
    /// before the pass, oldest first (an append-only table's order), with a 100-byte payload.
    fill: &'static str,
    /// What the writer's new records hang on, and the insert of one (`$1` that parent).
    parent: &'static str,
    insert: &'static str,
}

/// A record kind's id type.
#[derive(Debug, Clone, Copy)]
enum Id {
    Uuid,
    BigInt,
}

impl Id {
    fn sql(self) -> &'static str {
        match self {
            Id::Uuid => "uuid",
            Id::BigInt => "bigint",
        }
    }
}

/// Every other age-driven job kind switched off, so that a sexton method measures `job` alone
/// and on the CPU the other methods have (the seed holds expired records of every kind): the
/// expiry ages and the attachments' age at 0 but the measured job's (the caller's environment
/// sets an expiry age it measures). Sessions wait for their policies; traces are off by default.
fn alone(job: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = EXPIRY_AGES
        .iter()
        .map(|age| (format!("SEXTON_EXPIRY__{age}"), "0".to_owned()))
        .collect();
    if job != "attachment_expiry" {
        env.push((
            "SEXTON_ATTACHMENTS__MAX_AGE_DAYS".to_owned(),
            "0".to_owned(),
        ));
    }
    env
}

/// The ages the expiry jobs read, as `SEXTON_EXPIRY__…` names them.
const EXPIRY_AGES: [&str; 4] = [
    "HANDOFFS_DAYS",
    "DREAM_PRELOADS_DAYS",
    "WORKING_RECORDS_DAYS",
    "CONVERSATION_EVENTS_DAYS",
];

/// The oldest expired record, in days before the pass.
const OLDEST_DAYS: f64 = 400.0;

static EXPIRING: [Expiring; 2] = [
    Expiring {
        table: "handoffs",
        job: "expire_handoffs",
        setting: "HANDOFFS_DAYS",
        days: 14,
        id: Id::Uuid,
        fill: "WITH p AS (SELECT array_agg(id ORDER BY id) AS agents FROM agents)
            INSERT INTO handoffs (account_id, agent_id, payload, created_at)
            SELECT a.account_id, a.id, jsonb_build_object('text', repeat('x', 100)),
                   $1 - $3 * interval '1 day' + (g::float8 / $2) * ($3 - $4) * interval '1 day'
            FROM p CROSS JOIN generate_series(1, $2) g
            JOIN agents a ON a.id = p.agents[1 + g % cardinality(p.agents)]",
        parent: "SELECT id::text FROM agents ORDER BY id LIMIT 1",
        insert: "INSERT INTO handoffs (account_id, agent_id, payload)
            SELECT account_id, id, jsonb_build_object('text', repeat('x', 100))
            FROM agents WHERE id = $1::uuid",
    },
    Expiring {
        table: "conversation_events",
        job: "expire_conversation_events",
        setting: "CONVERSATION_EVENTS_DAYS",
        days: 30,
        id: Id::BigInt,
        fill: "WITH p AS (SELECT array_agg(id ORDER BY id) AS conversations FROM conversations)
            INSERT INTO conversation_events (conversation_id, kind, payload, created_at)
            SELECT p.conversations[1 + g % cardinality(p.conversations)], 'delta',
                   jsonb_build_object('text', repeat('x', 100)),
                   $1 - $3 * interval '1 day' + (g::float8 / $2) * ($3 - $4) * interval '1 day'
            FROM p, generate_series(1, $2) g",
        parent: "SELECT id::text FROM conversations ORDER BY id LIMIT 1",
        insert: "INSERT INTO conversation_events (conversation_id, kind, payload)
            VALUES ($1::uuid, 'delta', jsonb_build_object('text', repeat('x', 100)))",
    },
];

impl Expiring {
    /// The cutoff of a pass at the pass start: rows created before it expire.
    fn cutoff(&self) -> DateTime<Utc> {
        pass_start() - chrono::Duration::days(self.days.into())
    }

    /// The worker's settings for a pass of this kind alone: its age, the batch, every other
    /// kind off.
    fn sexton_env(&self, batch: u32) -> Vec<(String, String)> {
        let mut env = vec![("SEXTON_EXPIRY__BATCH_SIZE".to_owned(), batch.to_string())];
        for age in EXPIRY_AGES {
            let days = if age == self.setting { self.days } else { 0 };
            env.push((format!("SEXTON_EXPIRY__{age}"), days.to_string()));
        }
        env
    }
}

#[derive(Debug, Clone, Serialize)]
struct Expiry {
    measured_at: DateTime<Utc>,
    machine: String,
    /// Measured by `--only expiry`, in another run than the scales.
    separate_run: bool,
    /// Expired rows asked for per table (a tenth as many young ones).
    rows: u64,
    batch_size: u32,
    writer_rate: u32,
    /// Building the template: migrations, rows, indexes' growth, VACUUM and ANALYZE.
    fill_seconds: f64,
    tables: Vec<ExpiryTable>,
}

#[derive(Debug, Clone, Serialize)]
struct ExpiryTable {
    table: &'static str,
    job: &'static str,
    days: i32,
    expired: i64,
    young: i64,
    idle_writer: Latency,
    idle_writer_longest_lock_wait_ms: f64,
    methods: Vec<ExpiryMethod>,
}

#[derive(Debug, Clone, Serialize)]
struct ExpiryMethod {
    /// Rates are of rows deleted (`owners_per_s` = `rows_per_s`).
    #[serde(flatten)]
    method: Method,
    deleted: i64,
    /// Expired rows left: sexton skips a row the writer holds (`busy`), for the next pass.
    left: i64,
}

/// The short-lived records: one template with `rows` expired handoffs and conversation events
/// and a tenth as many young ones; on a copy per method, a sexton pass of one kind and the raw
/// batched delete of the same rows, with the application writer beside each.
async fn measure_expiry(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
) -> anyhow::Result<Expiry> {
    let template = "benchexp_template";
    let files = cli.scratch.join("files-expiry");
    recreate(admin, template, None).await?;
    let _ = std::fs::remove_dir_all(&files);
    for (_, dir) in ROOTS {
        std::fs::create_dir_all(files.join(dir))?;
    }
    eprintln!("expiry: filling {} expired rows per table", cli.expiry_rows);
    let started = Instant::now();
    if !sexton(cli, template, &files, &["migrate"])
        .status()
        .await?
        .success()
    {
        bail!("migrating {template} failed");
    }
    let pool = connect(base, template, "bench").await?;
    fill_expiry(&pool, cli.expiry_rows).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    // What each kind holds, and the writer's records: a hundred old ones (the pass's) and a
    // hundred young ones, and the parent of its new ones.
    let mut prepared = Vec::new();
    for kind in &EXPIRING {
        let (expired, young) = counts(&pool, kind).await?;
        let targets: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "(SELECT id::text FROM {t} WHERE created_at < $1 ORDER BY md5(id::text) LIMIT 100)
             UNION ALL
             (SELECT id::text FROM {t} WHERE created_at >= $1 ORDER BY md5(id::text) LIMIT 100)",
            t = kind.table
        )))
        .bind(kind.cutoff())
        .fetch_all(&pool)
        .await?;
        let parent: String = sqlx::query_scalar(kind.parent).fetch_one(&pool).await?;
        prepared.push((kind, expired, young, targets, parent));
    }
    // A template is copied only with no one connected.
    pool.close().await;
    let mut tables = Vec::new();
    for (kind, expired, young, targets, parent) in prepared {
        let writes = |pool: PgPool, stop: Arc<AtomicBool>| {
            touch_at_rate(
                pool,
                kind,
                targets.clone(),
                parent.clone(),
                cli.writer_rate,
                stop,
            )
        };
        eprintln!(
            "expiry: {} ({expired} expired, {young} young): idle writer",
            kind.table
        );
        let (idle, _) = idle_baseline(cli, admin, base, template, "benchexp_idle", writes).await?;
        let idle_writer_longest_lock_wait_ms = max_ms(&idle.lock_wait_ms);
        let idle_writer = Latency::of(idle.total_ms);
        let mut methods = Vec::new();
        for name in ["sexton", "raw"] {
            eprintln!("expiry: {} {name}", kind.table);
            let db = format!("benchexp_{name}_{}", kind.table);
            recreate(admin, &db, Some(template)).await?;
            let writer_pool = connect(base, &db, "bench-writer").await?;
            let stop = Arc::new(AtomicBool::new(false));
            let (writer, sampler) =
                beside(base, &db, writes(writer_pool.clone(), stop.clone()), &stop).await?;
            let mut method = match name {
                "sexton" => {
                    let pass = Pass {
                        job: kind.job,
                        global: true,
                    };
                    let env = kind.sexton_env(cli.expiry_batch);
                    run_sexton(cli, admin, &db, &files, name, 2, &pass, &env).await?
                }
                _ => run_raw_expiry(base, &db, kind, cli.expiry_batch).await?,
            };
            stop.store(true, Ordering::Relaxed);
            let writer = writer.await??;
            let longest = sampler.await??;
            writer_pool.close().await;
            let check = connect(base, &db, "bench").await?;
            let (left, young_after) = counts(&check, kind).await?;
            check.close().await;
            // Only the writer's old records can be held when the pass goes by.
            if young_after != young || (name == "raw" && left > 0) || left > 100 {
                bail!(
                    "{name} left {left} expired {} and {young_after} of {young} young ones",
                    kind.table
                );
            }
            let deleted = expired - left;
            score(&mut method, deleted, deleted, writer, longest);
            methods.push(ExpiryMethod {
                method,
                deleted,
                left,
            });
            drop_db(admin, &db).await?;
        }
        tables.push(ExpiryTable {
            table: kind.table,
            job: kind.job,
            days: kind.days,
            expired,
            young,
            idle_writer,
            idle_writer_longest_lock_wait_ms,
            methods,
        });
    }
    drop_db(admin, template).await?;
    let _ = std::fs::remove_dir_all(&files);
    Ok(Expiry {
        measured_at: Utc::now(),
        machine: machine(),
        separate_run: !cli.only.is_empty() && !cli.only.contains(&Part::Scales),
        rows: cli.expiry_rows,
        batch_size: cli.expiry_batch,
        writer_rate: cli.writer_rate,
        fill_seconds,
        tables,
    })
}

/// The template's rows: an account (execution retention off) with ten agents and a hundred
/// conversations, and for each kind `rows` expired records and a tenth as many young ones.
/// Nothing else: the other jobs find no work.
async fn fill_expiry(pool: &PgPool, rows: u64) -> anyhow::Result<()> {
    let account: Uuid = sqlx::query_scalar(
        "INSERT INTO accounts (name, execution_details_retention_days)
         VALUES ('bench', NULL) RETURNING id",
    )
    .fetch_one(pool)
    .await?;
    sqlx::query(
        "INSERT INTO agents (account_id, name) SELECT $1, 'agent ' || g FROM generate_series(1, 10) g",
    )
    .bind(account)
    .execute(pool)
    .await?;
    sqlx::query("INSERT INTO conversations (account_id) SELECT $1 FROM generate_series(1, 100)")
        .bind(account)
        .execute(pool)
        .await?;
    let rows = i64::try_from(rows)?;
    for kind in &EXPIRING {
        let days = f64::from(kind.days);
        // Expired, then young (1 day to a day short of the age): far from the cutoff both.
        for (count, oldest, youngest) in [
            (rows, OLDEST_DAYS, days + 1.0),
            (rows / 10, days - 1.0, 1.0),
        ] {
            sqlx::query(kind.fill)
                .bind(pass_start())
                .bind(count)
                .bind(oldest)
                .bind(youngest)
                .execute(pool)
                .await?;
        }
    }
    // Every copy starts alike: hint bits set, visibility map full, statistics fresh.
    sqlx::query("VACUUM (FREEZE, ANALYZE)")
        .execute(pool)
        .await?;
    Ok(())
}

/// A kind's expired rows, and its young ones from before the pass (the writer's new records
/// come after it).
async fn counts(pool: &PgPool, kind: &Expiring) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE created_at < $1),
                count(*) FILTER (WHERE created_at >= $1 AND created_at < $2)
         FROM {}",
        kind.table
    )))
    .bind(kind.cutoff())
    .bind(pass_start())
    .fetch_one(pool)
    .await?)
}

/// The floor for short-lived records: the next `batch` expired ids in (created_at, id) order,
/// then `DELETE … WHERE id = ANY($1)`, each batch its own transaction; no lock, no re-check.
async fn run_raw_expiry(
    base: &PgConnectOptions,
    db: &str,
    kind: &Expiring,
    batch: u32,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-raw").await?;
    match kind.id {
        Id::Uuid => raw_batches::<Uuid>(&pool, kind, batch).await?,
        Id::BigInt => raw_batches::<i64>(&pool, kind, batch).await?,
    }
    pool.close().await;
    let mut m = method("raw");
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

async fn raw_batches<T>(pool: &PgPool, kind: &Expiring, batch: u32) -> anyhow::Result<()>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    Vec<T>: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let next = format!(
        "SELECT id FROM {} WHERE created_at < $1 ORDER BY created_at, id LIMIT $2",
        kind.table
    );
    let delete = format!("DELETE FROM {} WHERE id = ANY($1)", kind.table);
    loop {
        let ids: Vec<T> = sqlx::query_scalar(sqlx::AssertSqlSafe(next.clone()))
            .bind(kind.cutoff())
            .bind(i64::from(batch))
            .fetch_all(pool)
            .await?;
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(delete.clone()))
            .bind(ids)
            .execute(pool)
            .await?;
    }
}

/// An application on short-lived records at `rate` per second: lock one record (old or young,
/// by turns), update it if it is still there, and add a new one.
async fn touch_at_rate(
    pool: PgPool,
    kind: &'static Expiring,
    targets: Vec<String>,
    parent: String,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Writes> {
    let (table, id) = (kind.table, kind.id.sql());
    let lock = format!("SELECT 1 FROM {table} WHERE id = $1::{id} FOR UPDATE");
    let update =
        format!("UPDATE {table} SET payload = payload || '{{\"seen\": true}}' WHERE id = $1::{id}");
    at_rate(rate, stop, targets, move |target| {
        let (pool, parent, lock, update) =
            (pool.clone(), parent.clone(), lock.clone(), update.clone());
        async move {
            let mut tx = pool.begin().await?;
            let locking = Instant::now();
            let found = sqlx::query(sqlx::AssertSqlSafe(lock))
                .bind(&target)
                .fetch_optional(&mut *tx)
                .await?;
            let lock_wait = locking.elapsed();
            if found.is_some() {
                sqlx::query(sqlx::AssertSqlSafe(update))
                    .bind(&target)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(kind.insert)
                .bind(&parent)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(lock_wait)
        }
    })
    .await
}

/// The job a run of sexton is timed by. A job per account runs one chain of hops per account,
/// up to `queue.concurrency` at once; a global job runs one chain, a hop at a time.
struct Pass {
    job: &'static str,
    global: bool,
}

const PED: Pass = Pass {
    job: "prune_execution_details",
    global: false,
};
const SESSIONS: Pass = Pass {
    job: "session_retention",
    global: false,
};

/// The writer's idle baseline: `writes` alone for `baseline_seconds` on a fresh copy `db` of
/// `template`, and the WAL bytes per second the cluster wrote meanwhile.
async fn idle_baseline<F, Fut>(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &str,
    db: &str,
    writes: F,
) -> anyhow::Result<(Writes, f64)>
where
    F: FnOnce(PgPool, Arc<AtomicBool>) -> Fut,
    Fut: Future<Output = anyhow::Result<Writes>> + Send + 'static,
{
    recreate(admin, db, Some(template)).await?;
    let pool = connect(base, db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let writer = tokio::spawn(writes(pool.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(cli.baseline_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let idle = writer.await??;
    let wal_per_s = (wal_position(admin).await? - wal) as f64 / started.elapsed().as_secs_f64();
    pool.close().await;
    drop_db(admin, db).await?;
    Ok((idle, wal_per_s))
}

/// The cluster's WAL position in bytes (`pg_current_wal_lsn()`), read on the bench's own
/// connection.
async fn wal_position(admin: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            .fetch_one(admin)
            .await?,
    )
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

/// What runs beside a method until `stop`: the application's `writes` and the sampler of the
/// deleter's longest write transaction.
async fn beside(
    base: &PgConnectOptions,
    db: &str,
    writes: impl Future<Output = anyhow::Result<Writes>> + Send + 'static,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<(
    tokio::task::JoinHandle<anyhow::Result<Writes>>,
    tokio::task::JoinHandle<anyhow::Result<Longest>>,
)> {
    let writer = tokio::spawn(writes);
    let sampler = tokio::spawn(longest_transaction(
        connect(base, db, "bench-sampler").await?,
        stop.clone(),
    ));
    Ok((writer, sampler))
}

/// A method's rates over `items` and `rows`, and what the writer and the sampler saw.
fn score(method: &mut Method, items: i64, rows: i64, writer: Writes, longest: Longest) {
    method.owners_per_s = items as f64 / method.seconds;
    method.rows_per_s = rows as f64 / method.seconds;
    method.writer = Latency::of(writer.total_ms);
    method.writer_longest_lock_wait_ms = max_ms(&writer.lock_wait_ms);
    method.longest_transaction_ms = longest.ms;
    method.longest_transaction_query = longest.query;
    method.longest_transaction_waits = longest.waits;
}

fn max_ms(ms: &[f64]) -> f64 {
    ms.iter().copied().fold(0.0, f64::max)
}

fn method(name: &'static str) -> Method {
    Method {
        name,
        seconds: 0.0,
        owners_per_s: 0.0,
        rows_per_s: 0.0,
        writer: Latency::of(Vec::new()),
        writer_longest_lock_wait_ms: 0.0,
        longest_transaction_ms: 0.0,
        longest_transaction_query: String::new(),
        longest_transaction_waits: String::new(),
        hop: None,
        start_seconds: None,
        hop_us_per_candidate: None,
        peak_rss_kb: None,
        share_outside_owner_transactions: None,
        share_outside_hops: None,
        wal_bytes: None,
        wal_bytes_writer: None,
        wal_bytes_per_owner: None,
    }
}

/// The environment of a sexton process on database `db` with file roots under `files`.
fn sexton_env(db: &str, files: &Path) -> Vec<(String, std::ffi::OsString)> {
    let mut env = vec![
        ("PGDATABASE".to_owned(), db.into()),
        // Health throttling off: autovacuum on the freshly loaded copies would pause
        // the pass, and the comparison is of the work itself.
        ("SEXTON_HEALTH__PAUSE_ON_VACUUM".to_owned(), "false".into()),
        (
            "SEXTON_HEALTH__MAX_REPLICATION_LAG_BYTES".to_owned(),
            "0".into(),
        ),
    ];
    for (setting, dir) in ROOTS {
        env.push((format!("SEXTON_PATHS__{setting}"), files.join(dir).into()));
    }
    env
}

/// The file roots sexton is given (`[paths]`), each a directory under the run's files.
const ROOTS: [(&str, &str); 5] = [
    ("OUTPUT_ROOT", "outputs"),
    ("ATTACHMENTS_ROOT", "attachments"),
    ("ARTIFACTS_ROOT", "artifacts"),
    ("SESSIONS_ROOT", "sessions"),
    ("TRACES_ROOT", "traces"),
];

fn sexton(cli: &Cli, db: &str, files: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&cli.sexton);
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, files))
        .stdout(Stdio::null());
    cmd
}

/// sexton as an operator runs it: a tick, then one worker through the queue until idle, running
/// `concurrency` hops at a time (the default is 2; 1 leaves the database more room), with the
/// worker's settings overridden by `env` (`SEXTON_…` variables). The pass is timed as a running
/// fleet sees it: from the worker taking the nightly slot (its fan-out line) to its last hop
/// of `pass.job` — neither the process start, nor its queue consumers registering and opening
/// their connections (reported apart, as `start_seconds`), nor the wait for an idle queue —
/// and its WAL over the same span, read on `admin`.
#[expect(
    clippy::too_many_arguments,
    reason = "where the worker runs, how, and what it is timed by: each set by the caller"
)]
async fn run_sexton(
    cli: &Cli,
    admin: &PgPool,
    db: &str,
    files: &Path,
    name: &'static str,
    concurrency: u32,
    pass: &Pass,
    env: &[(String, String)],
) -> anyhow::Result<Method> {
    let tick = sexton(
        cli,
        db,
        files,
        &["tick", "--at", &pass_start().to_rfc3339()],
    )
    .status()
    .await?;
    if !tick.success() {
        bail!("sexton tick failed");
    }
    let mut log = match &cli.logs {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            let file = dir.join(format!("{db}.log"));
            Some(std::io::BufWriter::new(std::fs::File::create(file)?))
        }
        None => None,
    };
    let mut child = tokio::process::Command::new("/usr/bin/time")
        .args(["-f", "max_rss_kb=%M"])
        .arg(&cli.sexton)
        .args(["worker", "--exit-when-idle"])
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, files))
        .env("SEXTON_LOG__FORMAT", "json")
        .env("SEXTON_QUEUE__CONCURRENCY", concurrency.to_string())
        .envs(alone(pass.job))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("/usr/bin/time (Debian package time) runs the worker")?;
    let (mut started, mut wal_start) = (Instant::now(), wal_position(admin).await?);
    let mut wal_end = wal_start;
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let (mut hops, mut per_candidate, mut hop_s, mut owner_s) = (Vec::new(), Vec::new(), 0.0, 0.0);
    let (mut last_hop, mut rss, mut start_seconds) = (0.0, None, None);
    while let Some(line) = lines.next_line().await? {
        if let Some(log) = log.as_mut() {
            writeln!(log, "{line}")?;
        }
        if let Some(kb) = line.strip_prefix("max_rss_kb=") {
            rss = kb.trim().parse().ok();
            continue;
        }
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if event["message"] == "worker started" {
            started = Instant::now();
        }
        if event["message"] == "fanning out nightly slot" {
            start_seconds = Some(started.elapsed().as_secs_f64());
            started = Instant::now();
            wal_start = wal_position(admin).await?;
        }
        if event["message"] == "hop done" && event["span"]["job"] == pass.job {
            let ms = event["elapsed_ms"].as_f64().unwrap_or(0.0);
            let candidates = event["candidates"].as_f64().unwrap_or(0.0);
            if candidates > 0.0 {
                hops.push(ms);
                per_candidate.push(ms * 1000.0 / candidates);
            }
            last_hop = started.elapsed().as_secs_f64();
            wal_end = wal_position(admin).await?;
            hop_s += ms / 1000.0;
            owner_s += event["owner_ms"].as_f64().unwrap_or(0.0) / 1000.0;
        }
    }
    if !child.wait().await?.success() {
        bail!("the sexton worker failed");
    }
    let wall = last_hop;
    // How many of this job's hops can run at once: a global job's pass is one chain.
    let lanes = if pass.global {
        1.0
    } else {
        f64::from(concurrency)
    };
    let mut m = method(name);
    m.seconds = last_hop;
    m.start_seconds = start_seconds;
    m.hop = Some(Latency::of(hops));
    m.hop_us_per_candidate = Some(Latency::of(per_candidate));
    m.peak_rss_kb = rss;
    m.share_outside_owner_transactions = Some(1.0 - owner_s / (wall * lanes));
    m.share_outside_hops = Some(1.0 - hop_s / (wall * lanes));
    m.wal_bytes = Some(wal_end - wal_start);
    Ok(m)
}

/// The batched floor that reaches sexton's end state, disk included: `raw+markers` that also
/// unlinks the output files of each batch's owners once the batch has committed, on a thread
/// beside the next batch's statements (one batch's unlinks at a time), as sexton's hops do.
const SAME_END: &str = "raw+markers+files";

/// How much of sexton's end state a floor reaches.
#[derive(Clone, Copy)]
enum Floor<'a> {
    /// The detail rows gone.
    Rows,
    /// And the run and variant markers set.
    Markers,
    /// And the output files, under this root, unlinked.
    Files(&'a Path),
}

/// The floor: batched deletes of the same owners, 500 per transaction, no checks; with the
/// markers and the files as `floor` says — the floor of the same end state, to tell their cost
/// from sexton's own. Its WAL is read on `admin`.
async fn run_raw(
    admin: &PgPool,
    base: &PgConnectOptions,
    db: &str,
    floor: Floor<'_>,
) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-raw").await?;
    let owners: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM bench_owners ORDER BY id")
        .fetch_all(&pool)
        .await?;
    let mut unlinking: Option<tokio::task::JoinHandle<anyhow::Result<()>>> = None;
    for batch in owners.chunks(500) {
        let mut tx = pool.begin().await?;
        let mut files: Vec<String> = Vec::new();
        for table in DETAIL_TABLES {
            let delete = format!("DELETE FROM {table} WHERE run_id = ANY($1)");
            if table == "output_files" && matches!(floor, Floor::Files(_)) {
                files = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "{delete} RETURNING relative_path"
                )))
                .bind(batch)
                .fetch_all(&mut *tx)
                .await?;
            } else {
                sqlx::query(sqlx::AssertSqlSafe(delete))
                    .bind(batch)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        if !matches!(floor, Floor::Rows) {
            sqlx::query(
                "WITH r AS (UPDATE runs SET details_pruned_at = now(), runner_effects = $2
                            WHERE id = ANY($1) RETURNING variant_id)
                 UPDATE variants SET details_pruned_at = now(), runner_effects = $2
                 WHERE id IN (SELECT variant_id FROM r)",
            )
            .bind(batch)
            .bind(sexton_jobs::prune_execution_details::pruned_runner_effects())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if let Floor::Files(root) = floor {
            // One batch's unlinks at a time, beside the next batch's statements.
            if let Some(previous) = unlinking.take() {
                previous.await??;
            }
            unlinking = Some(tokio::task::spawn_blocking({
                let root = root.to_owned();
                move || unlink_all(&root, &files)
            }));
        }
    }
    if let Some(last) = unlinking {
        last.await??;
    }
    pool.close().await;
    let mut m = method(match floor {
        Floor::Rows => "raw",
        Floor::Markers => "raw+markers",
        Floor::Files(_) => SAME_END,
    });
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}

/// Unlinks `files` under `root`; one already gone is no error.
fn unlink_all(root: &Path, files: &[String]) -> anyhow::Result<()> {
    for file in files {
        match std::fs::remove_file(root.join(file)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("unlinking {file}"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The floor for sessions: batched deletes of exactly the same sessions, 100 per transaction;
/// the foreign keys cascade to their history and null the handoffs, as sexton's end state has
/// it (frame files are left on disk: sexton also removes those). Its WAL is read on `admin`.
async fn run_raw_sessions(
    admin: &PgPool,
    base: &PgConnectOptions,
    db: &str,
) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-raw").await?;
    let sessions: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM bench_sessions ORDER BY id")
        .fetch_all(&pool)
        .await?;
    for batch in sessions.chunks(100) {
        sqlx::query("DELETE FROM sessions WHERE id = ANY($1)")
            .bind(batch)
            .execute(&pool)
            .await?;
    }
    pool.close().await;
    let mut m = method("sessions raw");
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}

/// An application appending to sessions at `rate` per second, old and young alike: lock the
/// session row (as the platform's append does), add an entry if the session is still there.
async fn append_at_rate(
    pool: PgPool,
    targets: Vec<Uuid>,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Writes> {
    at_rate(rate, stop, targets, move |session| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            let locking = Instant::now();
            let found = sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
                .bind(session)
                .fetch_optional(&mut *tx)
                .await?;
            let lock_wait = locking.elapsed();
            if found.is_some() {
                sqlx::query(
                    "INSERT INTO conversation_entries (session_id, entry_id, seq, payload)
                     VALUES ($1, gen_random_uuid()::text, 0, '{}')",
                )
                .bind(session)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(lock_wait)
        }
    })
    .await
}

/// The naive delete: one statement per table over every owner. Its WAL is read on `admin`.
async fn run_naive(admin: &PgPool, base: &PgConnectOptions, db: &str) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-naive").await?;
    for table in DETAIL_TABLES {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE run_id IN (SELECT id FROM bench_owners)"
        )))
        .execute(&pool)
        .await?;
    }
    pool.close().await;
    let mut m = method("naive");
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}

/// (conversation, run) pairs the writer materializes into: old owners and recent runs alike.
async fn writer_targets(pool: &PgPool) -> anyhow::Result<Vec<(Uuid, Uuid)>> {
    let rows = sqlx::query(
        "(SELECT r.conversation_id, r.id FROM runs r JOIN bench_owners o ON o.id = r.id ORDER BY r.id LIMIT 100)
         UNION ALL
         (SELECT conversation_id, id FROM runs WHERE conversation_id IS NOT NULL
            AND id NOT IN (SELECT id FROM bench_owners) ORDER BY id LIMIT 100)",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// What the application writer saw: each transaction's latency, and how long it waited for its
/// locks, in ms.
struct Writes {
    total_ms: Vec<f64>,
    lock_wait_ms: Vec<f64>,
}

/// An application at a fixed `rate` until `stop`: one transaction per tick, over `targets` in
/// turn. `transaction` runs one (from its `BEGIN` to its commit) and returns how long it waited
/// for its locks; its whole latency is measured here.
async fn at_rate<T, F, Fut>(
    rate: u32,
    stop: Arc<AtomicBool>,
    targets: Vec<T>,
    mut transaction: F,
) -> anyhow::Result<Writes>
where
    T: Clone,
    F: FnMut(T) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writes = Writes {
        total_ms: Vec::new(),
        lock_wait_ms: Vec::new(),
    };
    for target in targets.iter().cycle() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        tick.tick().await;
        let started = Instant::now();
        let lock_wait = transaction(target.clone()).await?;
        writes
            .total_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        writes.lock_wait_ms.push(lock_wait.as_secs_f64() * 1000.0);
    }
    Ok(writes)
}

/// The application writer (materialization and convergence) at a fixed rate: lock the
/// conversation, then a run, update it, insert detail, commit.
async fn write_at_rate(
    pool: PgPool,
    targets: Vec<(Uuid, Uuid)>,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Writes> {
    at_rate(rate, stop, targets, move |(conversation, run)| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            let locking = Instant::now();
            sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
                .bind(conversation)
                .execute(&mut *tx)
                .await?;
            sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
                .bind(run)
                .execute(&mut *tx)
                .await?;
            let lock_wait = locking.elapsed();
            sqlx::query("UPDATE runs SET requested_model = requested_model WHERE id = $1")
                .bind(run)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO conversation_events (conversation_id, run_id, kind) VALUES ($1, $2, 'materialized')",
            )
            .bind(conversation)
            .bind(run)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(lock_wait)
        }
    })
    .await
}

/// The longest write transaction of the deleter, sampled every 10 ms from pg_stat_activity:
/// every open transaction of its backends that holds a transaction id (one that has written or
/// locked a row: sexton's owner transactions, the floors' batches — not a plain read such as a
/// hop's window, which blocks no writer) is followed at each sample. The longest one's length,
/// the statement it was running when last seen, and what its backend was waiting on in each
/// sample of it (`type:event`, or `cpu` when it waited on nothing), most seen first: a stall
/// on data files or WAL told from a long batch.
async fn longest_transaction(pool: PgPool, stop: Arc<AtomicBool>) -> anyhow::Result<Longest> {
    let mut longest = Longest::default();
    // The transactions open at the last sample, by (backend, start), and their waits so far.
    let mut open: HashMap<Sampled, BTreeMap<String, u32>> = HashMap::new();
    // The longest one's, as of its last sample; written out once at the end.
    let mut longest_waits = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let sampled: Vec<(i32, DateTime<Utc>, f64, String, String)> = sqlx::query_as(
            "SELECT pid, xact_start,
                    (EXTRACT(EPOCH FROM clock_timestamp() - xact_start) * 1000)::float8,
                    left(regexp_replace(query, '\\s+', ' ', 'g'), 160),
                    COALESCE(wait_event_type || ':' || wait_event, 'cpu')
             FROM pg_stat_activity
             WHERE datname = current_database() AND xact_start IS NOT NULL
               AND backend_xid IS NOT NULL
               AND application_name IN ('sexton', 'bench-raw', 'bench-naive')",
        )
        .fetch_all(&pool)
        .await?;
        let mut still = HashMap::with_capacity(sampled.len());
        for (pid, started, ms, query, wait) in sampled {
            let mut waits = open.remove(&(pid, started)).unwrap_or_default();
            *waits.entry(wait).or_default() += 1;
            if ms > longest.ms {
                (longest.ms, longest.query) = (ms, query);
                longest_waits.clone_from(&waits);
            }
            still.insert((pid, started), waits);
        }
        open = still;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.close().await;
    let mut seen: Vec<(String, u32)> = longest_waits.into_iter().collect();
    seen.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    longest.waits = seen
        .iter()
        .map(|(wait, n)| format!("{wait} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(longest)
}

/// A transaction the sampler of [`longest_transaction`] sees: its backend and its start.
type Sampled = (i32, DateTime<Utc>);

/// What the sampler of [`longest_transaction`] saw.
#[derive(Debug, Default)]
struct Longest {
    ms: f64,
    query: String,
    waits: String,
}

async fn detail_rows(pool: &PgPool) -> anyhow::Result<i64> {
    let mut total = 0;
    for table in DETAIL_TABLES {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE run_id IN (SELECT id FROM bench_owners)"
        )))
        .fetch_one(pool)
        .await?;
        total += n;
    }
    Ok(total)
}

async fn connect(base: &PgConnectOptions, db: &str, application: &str) -> anyhow::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .connect_with(base.clone().database(db).application_name(application))
        .await?)
}

async fn recreate(admin: &PgPool, db: &str, template: Option<&str>) -> anyhow::Result<()> {
    drop_db(admin, db).await?;
    let sql = match template {
        // FILE_COPY: a checkpoint and a file copy, not the whole template through the WAL.
        Some(t) => format!("CREATE DATABASE {db} TEMPLATE {t} STRATEGY FILE_COPY"),
        None => format!("CREATE DATABASE {db}"),
    };
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(admin).await?;
    Ok(())
}

async fn drop_db(admin: &PgPool, db: &str) -> anyhow::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(admin)
    .await?;
    Ok(())
}

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

/// What a run writes: the scales measured so far, the short-lived records, the run traces
/// measured so far, or the attachment bytes.
enum Section<'a> {
    Scales(&'a [Scale]),
    Expiry(&'a Expiry),
    Traces(&'a traces::Traces),
    Attachments(&'a attachments::Attachments),
    Tenants(&'a tenants::Tenants),
}

/// The heading the short-lived records' section starts with, in latest.md.
const EXPIRY_HEADING: &str = "## Short-lived records";

/// The headed sections of latest.md, in their order there, after the scales' tables (which
/// have no heading of their own).
const HEADINGS: [&str; 4] = [
    EXPIRY_HEADING,
    traces::TRACES_HEADING,
    attachments::ATTACHMENTS_HEADING,
    tenants::TENANTS_HEADING,
];

/// Writes `section` into latest.json (`scales`, `expiry`, `traces`, `attachments` or `tenants`) and
/// latest.md (the tables at the top, or the section under its heading of [`HEADINGS`]), keeping
/// what the files hold of the other parts.
fn write_results(cli: &Cli, section: Section<'_>) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cli.out)?;
    let (json_path, md_path) = (cli.out.join("latest.json"), cli.out.join("latest.md"));
    let mut json = match std::fs::read_to_string(&json_path) {
        Ok(text) => json_members(&text)
            .with_context(|| format!("{} is not a JSON object", json_path.display()))?,
        Err(_) => Vec::new(),
    };
    let md = std::fs::read_to_string(&md_path).unwrap_or_default();
    // parts[0]: the scales' tables; parts[1 + i]: the section under HEADINGS[i].
    let mut starts: Vec<(usize, usize)> = HEADINGS
        .iter()
        .enumerate()
        .filter_map(|(i, heading)| {
            md.match_indices(heading)
                .map(|(at, _)| at)
                .find(|&at| at == 0 || md[..at].ends_with('\n'))
                .map(|at| (at, i + 1))
        })
        .collect();
    starts.sort();
    let mut parts = vec![String::new(); HEADINGS.len() + 1];
    parts[0] = md[..starts.first().map_or(md.len(), |(at, _)| *at)].to_owned();
    for (n, &(at, part)) in starts.iter().enumerate() {
        let end = starts.get(n + 1).map_or(md.len(), |(next, _)| *next);
        parts[part] = md[at..end].to_owned();
    }
    match section {
        Section::Scales(results) => {
            let machine = machine();
            set_member(&mut json, "machine", &machine)?;
            set_member(&mut json, "measured_at", &Utc::now().to_rfc3339())?;
            set_member(&mut json, "scales", results)?;
            set_member(&mut json, "targets", &targets(results))?;
            parts[0] = format!(
                "Measured {} on {machine}.\n\n{}",
                Utc::now().format("%Y-%m-%d"),
                markdown(results)
            );
        }
        Section::Expiry(e) => {
            set_member(&mut json, "expiry", e)?;
            parts[1] = expiry_markdown(e);
        }
        Section::Traces(t) => {
            set_member(&mut json, "traces", t)?;
            parts[2] = traces::markdown(t);
        }
        Section::Attachments(a) => {
            set_member(&mut json, "attachments", a)?;
            parts[3] = attachments::markdown(a);
        }
        Section::Tenants(t) => {
            set_member(&mut json, "tenants", t)?;
            parts[4] = tenants::markdown(t);
        }
    }
    let members: Vec<String> = json
        .iter()
        .map(|(key, value)| format!("  {}: {value}", serde_json::Value::from(key.as_str())))
        .collect();
    std::fs::write(&json_path, format!("{{\n{}\n}}", members.join(",\n")))?;
    let parts: Vec<&str> = parts
        .iter()
        .map(|part| part.trim_end())
        .filter(|part| !part.is_empty())
        .collect();
    std::fs::write(&md_path, parts.join("\n\n") + "\n")?;
    Ok(())
}

/// The members of a JSON object's text in order, each as its key and its value's text, as
/// written: parsing and printing them again would change the last digit of some figures.
fn json_members(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let object: serde_json::Value = serde_json::from_str(text)?;
    let count = object.as_object().context("not an object")?.len();
    let (mut members, mut depth, mut start) = (Vec::new(), 0, 0);
    let (mut in_string, mut escaped) = (false, false);
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            (in_string, escaped) = match b {
                _ if escaped => (true, false),
                b'\\' => (true, true),
                b'"' => (false, false),
                _ => (true, false),
            };
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 {
                    start = i + 1;
                }
            }
            b'}' | b']' | b',' if depth == 1 => {
                let member = text[start..i].trim();
                if !member.is_empty() {
                    let mut key = serde_json::Deserializer::from_str(member).into_iter::<String>();
                    let name = key.next().context("a member without a key")??;
                    let value = member[key.byte_offset()..].trim_start();
                    let value = value.strip_prefix(':').context("a key without a value")?;
                    members.push((name, value.trim().to_owned()));
                }
                start = i + 1;
                if b != b',' {
                    depth -= 1;
                }
            }
            b'}' | b']' => depth -= 1,
            _ => {}
        }
    }
    if members.len() != count {
        bail!("{} members found of {count}", members.len());
    }
    Ok(members)
}

/// Sets member `key` of an object held as [`json_members`] to `value`, pretty-printed as a
/// member of the top level (appended if it is new).
fn set_member(
    members: &mut Vec<(String, String)>,
    key: &str,
    value: &(impl Serialize + ?Sized),
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?.replace('\n', "\n  ");
    match members.iter_mut().find(|(name, _)| name == key) {
        Some(member) => member.1 = text,
        None => members.push((key.to_owned(), text)),
    }
    Ok(())
}

/// The machine, as the results name it: cores and CPU model.
fn machine() -> String {
    format!(
        "{} cores, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_owned())
            )
            .unwrap_or_default()
    )
}

/// The short-lived records' section of latest.md.
fn expiry_markdown(e: &Expiry) -> String {
    let when = if e.separate_run {
        "in a separate run from the tables above (`bash bench/run.sh --only expiry`)"
    } else {
        "in the same run as the tables above"
    };
    let mut md = format!(
        "{EXPIRY_HEADING}\n\nMeasured {} on {}, {when}. Each table holds {} expired rows (created evenly from {OLDEST_DAYS:.0} days to a day past its age before the pass, oldest first) and {} young ones that must stay, built in {:.0} s; each method runs on its own copy. sexton: `sexton tick` at the pass start, then one worker (`--exit-when-idle`, default settings but `expiry.batch_size = {}` and every other kind at 0 days), timed from the worker taking the nightly slot to its last hop. raw: `SELECT id … WHERE created_at < cutoff ORDER BY created_at, id LIMIT {}`, then `DELETE … WHERE id = ANY($1)`, each batch its own transaction, with no lock and no re-check. Beside each, an application writer ({} per second) locks one record (old or young, by turns), updates it if it is still there, inserts a new one and commits. \"left\" counts expired rows sexton skipped because the writer held them (`busy`, for the next pass).\n\n| table | expired rows | method | seconds | rows deleted | left | rows/s | vs raw | writer p50 / p99 / max ms (idle) | writer longest lock wait ms (idle) | longest write tx ms | hop median / p99 ms | µs per row read (median hop) | peak RSS MB | outside batch statements |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        e.measured_at.format("%Y-%m-%d"),
        e.machine,
        e.rows,
        e.rows / 10,
        e.fill_seconds,
        e.batch_size,
        e.batch_size,
        e.writer_rate,
    );
    for t in &e.tables {
        let raw = t
            .methods
            .iter()
            .find(|m| m.method.name == "raw")
            .map_or(0.0, |m| m.method.rows_per_s);
        for ExpiryMethod {
            method: m,
            deleted,
            left,
        } in &t.methods
        {
            md.push_str(&format!(
                "| {} | {} | {} | {:.1} | {} | {} | {:.0} | {:.2}× | {:.1} / {:.1} / {:.1} ({:.1} / {:.1} / {:.1}) | {:.1} ({:.1}) | {:.0} | {} | {} | {} | {} |\n",
                t.table, t.expired, m.name, m.seconds, deleted, left, m.rows_per_s, m.rows_per_s / raw,
                m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
                t.idle_writer.p50_ms, t.idle_writer.p99_ms, t.idle_writer.max_ms,
                m.writer_longest_lock_wait_ms, t.idle_writer_longest_lock_wait_ms,
                m.longest_transaction_ms,
                m.hop.map_or("—".into(), |h| format!("{:.0} / {:.0}", h.p50_ms, h.p99_ms)),
                m.hop_us_per_candidate.map_or("—".into(), |h| format!("{:.1}", h.p50_ms)),
                m.peak_rss_kb.map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
                m.share_outside_owner_transactions.map_or("—".into(), |x| format!("{:.0}%", x * 100.0)),
            ));
        }
    }
    md
}

fn markdown(results: &[Scale]) -> String {
    let mut md = String::from(
        "| scale | runs | owners | detail rows | method | seconds | owners/s | rows/s | vs raw | vs naive | WAL MB (writer's share) | WAL bytes per owner | writer p50 / p99 / max ms (idle) | writer longest lock wait ms | longest write tx ms | hop median / p99 ms | µs per candidate (median hop) | peak RSS MB | outside owner tx | outside hops |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in results {
        let rate = |name: &str| {
            s.methods
                .iter()
                .find(|m| m.name == name)
                .map_or(0.0, |m| m.owners_per_s)
        };
        for m in &s.methods {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.2}× | {:.2}× | {} | {} | {:.1} / {:.1} / {:.1} ({:.1} / {:.1} / {:.1}) | {:.1} | {:.0} | {} | {} | {} | {} | {} |\n",
                s.scale, s.runs, s.owners, s.detail_rows, m.name, m.seconds, m.owners_per_s, m.rows_per_s,
                m.owners_per_s / rate("raw"), m.owners_per_s / rate("naive"),
                wal_mb(m), wal_per_owner(m),
                m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
                s.idle_writer.p50_ms, s.idle_writer.p99_ms, s.idle_writer.max_ms,
                m.writer_longest_lock_wait_ms,
                m.longest_transaction_ms,
                m.hop.map_or("—".into(), |h| format!("{:.0} / {:.0}", h.p50_ms, h.p99_ms)),
                m.hop_us_per_candidate.map_or("—".into(), |h| format!("{:.0}", h.p50_ms)),
                m.peak_rss_kb.map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
                m.share_outside_owner_transactions.map_or("—".into(), |x| format!("{:.0}%", x * 100.0)),
                m.share_outside_hops.map_or("—".into(), |x| format!("{:.0}%", x * 100.0)),
            ));
        }
    }
    let idle_rates: Vec<String> = results
        .iter()
        .map(|s| format!("{:.0} at scale {}", s.idle_writer_wal_bytes_per_s, s.scale))
        .collect();
    md.push_str(&format!(
        "\nWAL: the cluster's WAL position (`pg_current_wal_lsn()`, read on the bench's own connection) just before each method and right after it (for sexton, at the worker taking the nightly slot and at its last hop, the span its seconds time). \"WAL MB\" is that delta, the WAL of the writer beside the method included; in brackets the writer's estimated share, its rate alone in the idle baseline (bytes/s: {}; mostly whole pages it is the first to change after the copy's checkpoint, so a rough estimate) × the method's seconds. \"WAL bytes per owner\" is the delta net of that share, per owner pruned. Each copy starts right after the checkpoint of `CREATE DATABASE … STRATEGY FILE_COPY`, so every method writes whole pages (full-page writes) on its first change to each page alike; autovacuum's WAL during a method counts in its delta.\n",
        idle_rates.join(", ")
    ));
    if let Some((s, b)) = results
        .iter()
        .find_map(|s| s.wal_budget.as_ref().map(|b| (s, b)))
    {
        let m = &b.method;
        md.push_str(&format!(
            "\nWAL budget, at scale {}: sexton as in the table (`queue.concurrency` 2) once more on a fresh copy, with `SEXTON_HEALTH__MAX_WAL_BYTES_PER_SECOND` at a quarter of the rate its unbudgeted pass wrote at (WAL delta ÷ seconds, as in the table); the other health indicators stay off. The pace (`WalPace`, jobs/src/health.rs) holds the whole process to the budget by the cluster's WAL position, each byte counted once whichever hop reads it: the writer's WAL (about {:.0} bytes/s alone) counts against the budget too. The achieved rate is measured as in the table: the WAL delta over the pass, the writer's included, ÷ its seconds.\n\n| scale | budget bytes/s | achieved bytes/s | achieved / budget | seconds | owners/s | WAL bytes per owner | writer p50 / p99 / max ms | writer longest lock wait ms | longest write tx ms |\n|---|---|---|---|---|---|---|---|---|---|\n| {} | {} | {:.0} | {:.2} | {:.1} | {:.0} | {} | {:.1} / {:.1} / {:.1} | {:.1} | {:.0} |\n",
            s.scale, s.idle_writer_wal_bytes_per_s,
            s.scale, b.budget_bytes_per_s, b.achieved_bytes_per_s, b.ratio, m.seconds, m.owners_per_s,
            wal_per_owner(m),
            m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
            m.writer_longest_lock_wait_ms,
            m.longest_transaction_ms,
        ));
    }
    let targets = targets(results);
    md.push_str("\nTargets (SPEC §8), from this run's figures:\n\n");
    for t in &targets {
        let at = match t.from_scale {
            Some(from) => format!("from scale {from} to {}", t.scale),
            None => format!("at scale {}", t.scale),
        };
        let verdict = if t.met { "met" } else { "not met" };
        md.push_str(&format!(
            "- **{}** {at}: {}: **{verdict}**\n",
            t.id, t.check
        ));
    }
    if !targets.iter().any(|t| t.id == "PF-3") {
        md.push_str("- **PF-3**: not measured (needs a scale of 10 or more and a larger one)\n");
    }
    md.push_str(
        "\nSessionRetention: the same sessions deleted by a nightly pass through the queue and by a raw batched delete (100 per transaction, cascading). WAL as above, the appending writer's share from its own idle baseline.\n\n| scale | sessions | history rows | method | seconds | sessions/s | rows/s | vs raw | WAL MB (writer's share) | WAL bytes per session | writer p50 / p99 / max ms | writer longest lock wait ms | longest write tx ms | hop median / p99 ms | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in results {
        let raw = s
            .session_methods
            .iter()
            .find(|m| m.name == "sessions raw")
            .map_or(0.0, |m| m.owners_per_s);
        for m in &s.session_methods {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.2}× | {} | {} | {:.1} / {:.1} / {:.1} | {:.1} | {:.0} | {} | {} |\n",
                s.scale, s.sessions, s.session_rows, m.name, m.seconds, m.owners_per_s, m.rows_per_s,
                m.owners_per_s / raw,
                wal_mb(m), wal_per_owner(m),
                m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
                m.writer_longest_lock_wait_ms,
                m.longest_transaction_ms,
                m.hop.map_or("—".into(), |h| format!("{:.0} / {:.0}", h.p50_ms, h.p99_ms)),
                m.peak_rss_kb.map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
            ));
        }
    }
    md
}

/// A method's WAL in MB, with the writer's estimated share in brackets.
fn wal_mb(m: &Method) -> String {
    const MB: f64 = 1024.0 * 1024.0;
    match (m.wal_bytes, m.wal_bytes_writer) {
        (Some(bytes), Some(writer)) => format!("{:.1} ({:.1})", bytes as f64 / MB, writer / MB),
        _ => "—".into(),
    }
}

/// A method's WAL net of the writer, per owner (session).
fn wal_per_owner(m: &Method) -> String {
    m.wal_bytes_per_owner
        .map_or("—".into(), |bytes| format!("{bytes:.0}"))
}

/// The targets of SPEC §8 held against a run's figures, sexton's at its default
/// concurrency: PF-1 and PF-2 at each scale, PF-3 from scale 10 (or the smallest scale above
/// it) to the largest.
fn targets(results: &[Scale]) -> Vec<Target> {
    let mut targets = Vec::new();
    for s in results {
        let (Some(sexton), Some(floor)) = (find(s, "sexton"), find(s, "raw+markers")) else {
            continue;
        };
        for same in [find(s, SAME_END), Some(floor)].into_iter().flatten() {
            let ratio = sexton.owners_per_s / same.owners_per_s;
            targets.push(Target {
                id: "PF-1",
                scale: s.scale,
                from_scale: None,
                check: format!(
                    "sexton {:.0} owners/s ÷ {} {:.0} owners/s = {ratio:.2}× (target ≥ 1.00×)",
                    sexton.owners_per_s, same.name, same.owners_per_s
                ),
                value: ratio,
                bound: 1.0,
                met: ratio >= 1.0,
            });
        }
        let longest = sexton.longest_transaction_ms;
        let bound = 2.0 * s.transaction_target_ms;
        targets.push(Target {
            id: "PF-2",
            scale: s.scale,
            from_scale: None,
            check: format!(
                "sexton's longest write transaction {longest:.0} ms (target ≤ 2 × transaction_target_ms {:.0} = {bound:.0} ms; its backend in the samples of it: {})",
                s.transaction_target_ms,
                sexton.longest_transaction_waits
            ),
            value: longest,
            bound,
            met: longest <= bound,
        });
        let (beside, floor_wait) = (
            sexton.writer_longest_lock_wait_ms,
            floor.writer_longest_lock_wait_ms,
        );
        targets.push(Target {
            id: "PF-2",
            scale: s.scale,
            from_scale: None,
            check: format!(
                "the writer's longest lock wait {beside:.1} ms beside sexton, {floor_wait:.1} ms beside raw+markers (target: no longer)"
            ),
            value: beside,
            bound: floor_wait,
            met: beside <= floor_wait,
        });
    }
    // The seed's rate at the largest scale, where the time it takes matters (a small scale's
    // is mostly the processes' start).
    if let Some(s) = results.iter().max_by_key(|s| s.scale) {
        let rate = s.runs as f64 / s.seed_seconds;
        targets.push(Target {
            id: "seed",
            scale: s.scale,
            from_scale: None,
            check: format!(
                "`sexton seed` (with `migrate`) wrote {} runs in {:.1} s = {rate:.0} runs/s (target ≥ 5000 runs/s)",
                s.runs, s.seed_seconds
            ),
            value: rate,
            bound: 5000.0,
            met: rate >= 5000.0,
        });
    }
    let from = results
        .iter()
        .filter(|s| s.scale >= 10)
        .min_by_key(|s| s.scale);
    let to = results.iter().max_by_key(|s| s.scale);
    if let (Some(from), Some(to)) = (from, to)
        && from.scale < to.scale
    {
        targets.extend(growth(from, to).unwrap_or_default());
    }
    targets
}

/// PF-3 from scale `from` to the larger `to`: sexton's cost per candidate (a median hop's)
/// may grow 10% more than the floor's own cost per owner (`raw+markers`, seconds per owner);
/// its peak RSS stays flat (within 10%). `None` if a figure is missing.
fn growth(from: &Scale, to: &Scale) -> Option<Vec<Target>> {
    let hop = |s| Some(find(s, "sexton")?.hop_us_per_candidate?.p50_ms);
    let floor = |s| Some(find(s, "raw+markers")?.seconds / s.owners as f64);
    let rss = |s| Some(find(s, "sexton")?.peak_rss_kb? as f64 / 1024.0);
    let (hop_from, hop_to) = (hop(from)?, hop(to)?);
    let sexton = hop_to / hop_from;
    let floor = floor(to)? / floor(from)?;
    let bound = floor * 1.1;
    let (rss_from, rss_to) = (rss(from)?, rss(to)?);
    let rss = rss_to / rss_from;
    let target = |check, value, bound| Target {
        id: "PF-3",
        scale: to.scale,
        from_scale: Some(from.scale),
        check,
        value,
        bound,
        met: value <= bound,
    };
    Some(vec![
        target(
            format!(
                "sexton's µs per candidate (median hop) {hop_from:.0} → {hop_to:.0} = {sexton:.2}×, raw+markers' seconds per owner {floor:.2}× (target ≤ {floor:.2} × 1.10 = {bound:.2}×)"
            ),
            sexton,
            bound,
        ),
        target(
            format!(
                "sexton's peak RSS {rss_from:.1} → {rss_to:.1} MB = {rss:.2}× (target ≤ 1.10×, flat)"
            ),
            rss,
            1.1,
        ),
    ])
}

/// The method `name` of scale `s`.
fn find<'a>(s: &'a Scale, name: &str) -> Option<&'a Method> {
    s.methods.iter().find(|m| m.name == name)
}
