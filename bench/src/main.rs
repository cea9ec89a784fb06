//! The benchmark of SPEC §8, run by a person with `bash bench/run.sh` (never by the tests).
//!
//! For each scale it seeds one template database with `sexton seed`, then on identical copies
//! (`CREATE DATABASE … TEMPLATE`) removes the detail of exactly the same owners four ways —
//! sexton (tick and a worker through the queue, default settings; timed from the worker being
//! up to its last hop), the raw floor (batched
//! `DELETE … WHERE run_id = ANY($1)`, 500 owners per transaction, no checks), the same floor
//! setting the markers sexton's end state has, and the naive
//! delete (one `DELETE` per table over all owners) — while an application writer runs at a
//! fixed rate. It prints a markdown table and writes it, with the raw figures as JSON, to
//! `bench/results/`.

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
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
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
    /// sexton only: hop durations, each hop's time per candidate, peak RSS, and where the
    /// time went.
    hop: Option<Latency>,
    hop_us_per_candidate: Option<Latency>,
    peak_rss_kb: Option<u64>,
    share_outside_owner_transactions: Option<f64>,
    share_outside_hops: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Scale {
    scale: u64,
    runs: i64,
    owners: i64,
    detail_rows: i64,
    seed_seconds: f64,
    idle_writer: Latency,
    methods: Vec<Method>,
    /// SessionRetention: sessions a pass deletes, their history rows, and the methods.
    sessions: i64,
    session_rows: i64,
    session_methods: Vec<Method>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let base = PgConnectOptions::new();
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(base.clone())
        .await?;
    let mut results = Vec::new();
    for &scale in &cli.scales {
        results.push(measure_scale(&cli, &admin, &base, scale).await?);
        write_results(&cli, &results)?;
    }
    println!("{}", markdown(&results));
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
    let idle_db = format!("bench_idle_{scale}");
    recreate(admin, &idle_db, Some(&template)).await?;
    let pool = connect(base, &idle_db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_at_rate(
        pool.clone(),
        targets.clone(),
        cli.writer_rate,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(cli.baseline_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let idle_writer = Latency::of(writer.await??.total_ms);
    pool.close().await;
    drop_db(admin, &idle_db).await?;

    let mut methods = Vec::new();
    for name in ["sexton", "sexton c=1", "raw", "raw+markers", "naive"] {
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
        // Each method times itself (sexton from its worker being up, see `run_sexton`).
        let mut method = match name {
            "sexton" => run_sexton(cli, &db, &run_files, name, 2, PED).await?,
            "sexton c=1" => run_sexton(cli, &db, &run_files, name, 1, PED).await?,
            "raw" => run_raw(base, &db, false).await?,
            "raw+markers" => run_raw(base, &db, true).await?,
            _ => run_naive(base, &db).await?,
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
        score(&mut method, owners, detail_rows, writer, longest);
        methods.push(method);
        drop_db(admin, &db).await?;
        let _ = std::fs::remove_dir_all(&run_files);
    }
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
            "sessions" => run_sexton(cli, &db, &run_files, name, 2, SESSIONS).await?,
            _ => run_raw_sessions(base, &db).await?,
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
        methods,
        sessions,
        session_rows,
        session_methods,
    })
}

/// The job labels a run of sexton is timed by.
const PED: &str = "prune_execution_details";
const SESSIONS: &str = "session_retention";

/// What runs beside a method until `stop`: the application's `writes` and the sampler of the
/// deleter's longest transaction.
async fn beside(
    base: &PgConnectOptions,
    db: &str,
    writes: impl std::future::Future<Output = anyhow::Result<Writes>> + Send + 'static,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<(
    tokio::task::JoinHandle<anyhow::Result<Writes>>,
    tokio::task::JoinHandle<anyhow::Result<(f64, String)>>,
)> {
    let writer = tokio::spawn(writes);
    let sampler = tokio::spawn(longest_transaction(
        connect(base, db, "bench-sampler").await?,
        stop.clone(),
    ));
    Ok((writer, sampler))
}

/// A method's rates over `items` and `rows`, and what the writer and the sampler saw.
fn score(method: &mut Method, items: i64, rows: i64, writer: Writes, longest: (f64, String)) {
    method.owners_per_s = items as f64 / method.seconds;
    method.rows_per_s = rows as f64 / method.seconds;
    method.writer = Latency::of(writer.total_ms);
    method.writer_longest_lock_wait_ms = writer.lock_wait_ms.iter().copied().fold(0.0, f64::max);
    (
        method.longest_transaction_ms,
        method.longest_transaction_query,
    ) = longest;
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
        hop: None,
        hop_us_per_candidate: None,
        peak_rss_kb: None,
        share_outside_owner_transactions: None,
        share_outside_hops: None,
    }
}

/// The environment of a sexton process on database `db` with file roots under `files`.
fn sexton_env(db: &str, files: &Path) -> Vec<(String, std::ffi::OsString)> {
    let mut env = vec![("PGDATABASE".to_owned(), db.into())];
    for (setting, dir) in [
        ("OUTPUT_ROOT", "outputs"),
        ("ATTACHMENTS_ROOT", "attachments"),
        ("ARTIFACTS_ROOT", "artifacts"),
        ("SESSIONS_ROOT", "sessions"),
        ("TRACES_ROOT", "traces"),
    ] {
        env.push((format!("SEXTON_PATHS__{setting}"), files.join(dir).into()));
    }
    env
}

fn sexton(cli: &Cli, db: &str, files: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&cli.sexton);
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, files))
        .stdout(Stdio::null());
    cmd
}

/// sexton as an operator runs it: a tick, then one worker through the queue until idle, running
/// `concurrency` hops at a time (the default is 2; 1 leaves the database more room). The
/// pass is timed as a running fleet sees it: from the worker being up (the slot waiting in the
/// queue) to its last hop — neither the process start nor the wait for an idle queue.
async fn run_sexton(
    cli: &Cli,
    db: &str,
    files: &Path,
    name: &'static str,
    concurrency: u32,
    job: &str,
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
    let mut child = tokio::process::Command::new("/usr/bin/time")
        .args(["-f", "max_rss_kb=%M"])
        .arg(&cli.sexton)
        .args(["worker", "--exit-when-idle"])
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, files))
        .env("SEXTON_LOG__FORMAT", "json")
        .env("SEXTON_QUEUE__CONCURRENCY", concurrency.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("/usr/bin/time (Debian package time) runs the worker")?;
    let mut started = Instant::now();
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let (mut hops, mut per_candidate, mut hop_s, mut owner_s) = (Vec::new(), Vec::new(), 0.0, 0.0);
    let (mut last_hop, mut rss) = (0.0, None);
    while let Some(line) = lines.next_line().await? {
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
        if event["message"] == "hop done" && event["span"]["job"] == job {
            let ms = event["elapsed_ms"].as_f64().unwrap_or(0.0);
            let candidates = event["candidates"].as_f64().unwrap_or(0.0);
            if candidates > 0.0 {
                hops.push(ms);
                per_candidate.push(ms * 1000.0 / candidates);
            }
            last_hop = started.elapsed().as_secs_f64();
            hop_s += ms / 1000.0;
            owner_s += event["owner_ms"].as_f64().unwrap_or(0.0) / 1000.0;
        }
    }
    if !child.wait().await?.success() {
        bail!("the sexton worker failed");
    }
    let wall = last_hop;
    let concurrency = f64::from(concurrency);
    let mut m = method(name);
    m.seconds = last_hop;
    m.hop = Some(Latency::of(hops));
    m.hop_us_per_candidate = Some(Latency::of(per_candidate));
    m.peak_rss_kb = rss;
    m.share_outside_owner_transactions = Some(1.0 - owner_s / (wall * concurrency));
    m.share_outside_hops = Some(1.0 - hop_s / (wall * concurrency));
    Ok(m)
}

/// The floor: batched deletes of the same owners, 500 per transaction, no checks. With
/// `markers`, the batch also sets the runs' and variants' markers, as sexton's end state has
/// them: the floor of the same end state, to tell the markers' cost from sexton's own.
async fn run_raw(base: &PgConnectOptions, db: &str, markers: bool) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-raw").await?;
    let owners: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM bench_owners ORDER BY id")
        .fetch_all(&pool)
        .await?;
    for batch in owners.chunks(500) {
        let mut tx = pool.begin().await?;
        for table in DETAIL_TABLES {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE run_id = ANY($1)"
            )))
            .bind(batch)
            .execute(&mut *tx)
            .await?;
        }
        if markers {
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
    }
    pool.close().await;
    let mut m = method(if markers { "raw+markers" } else { "raw" });
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// The floor for sessions: batched deletes of exactly the same sessions, 100 per transaction;
/// the foreign keys cascade to their history and null the handoffs, as sexton's end state has
/// it (frame files are left on disk: sexton also removes those).
async fn run_raw_sessions(base: &PgConnectOptions, db: &str) -> anyhow::Result<Method> {
    let started = Instant::now();
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
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writes = Writes {
        total_ms: Vec::new(),
        lock_wait_ms: Vec::new(),
    };
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) && !targets.is_empty() {
        tick.tick().await;
        let session = targets[i % targets.len()];
        i += 1;
        let started = Instant::now();
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
        writes
            .total_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        writes.lock_wait_ms.push(lock_wait.as_secs_f64() * 1000.0);
    }
    Ok(writes)
}

/// The naive delete: one statement per table over every owner.
async fn run_naive(base: &PgConnectOptions, db: &str) -> anyhow::Result<Method> {
    let started = Instant::now();
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
/// two locks, in ms.
struct Writes {
    total_ms: Vec<f64>,
    lock_wait_ms: Vec<f64>,
}

/// The application writer (materialization and convergence) at a fixed rate: lock the
/// conversation, then a run, update it, insert detail, commit.
async fn write_at_rate(
    pool: PgPool,
    targets: Vec<(Uuid, Uuid)>,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Writes> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writes = Writes {
        total_ms: Vec::new(),
        lock_wait_ms: Vec::new(),
    };
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let (conversation, run) = targets[i % targets.len()];
        i += 1;
        let started = Instant::now();
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
        sqlx::query("INSERT INTO conversation_events (conversation_id, run_id, kind) VALUES ($1, $2, 'materialized')")
            .bind(conversation)
            .bind(run)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        writes
            .total_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        writes.lock_wait_ms.push(lock_wait.as_secs_f64() * 1000.0);
    }
    Ok(writes)
}

/// The longest open transaction of the deleter, sampled every 10 ms from pg_stat_activity.
/// Returns its length in ms and the statement it was running when last seen.
async fn longest_transaction(pool: PgPool, stop: Arc<AtomicBool>) -> anyhow::Result<(f64, String)> {
    let mut longest = (0.0, String::new());
    while !stop.load(Ordering::Relaxed) {
        let oldest: Option<(f64, String)> = sqlx::query_as(
            "SELECT (EXTRACT(EPOCH FROM clock_timestamp() - xact_start) * 1000)::float8,
                    left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
             FROM pg_stat_activity
             WHERE datname = current_database() AND xact_start IS NOT NULL
               AND application_name IN ('sexton', 'bench-raw', 'bench-naive')
               -- The worker's LISTEN connection holds no data locks; it was once seen
               -- running LISTEN for 10 s, which is not a deleter's transaction.
               AND query NOT LIKE 'LISTEN %'
             ORDER BY xact_start LIMIT 1",
        )
        .fetch_optional(&pool)
        .await?;
        if let Some(oldest) = oldest.filter(|(ms, _)| *ms > longest.0) {
            longest = oldest;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.close().await;
    Ok(longest)
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

fn write_results(cli: &Cli, results: &[Scale]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cli.out)?;
    let machine = format!(
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
    );
    let json = serde_json::json!({
        "measured_at": Utc::now().to_rfc3339(),
        "machine": machine,
        "scales": results,
    });
    std::fs::write(
        cli.out.join("latest.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(
        cli.out.join("latest.md"),
        format!(
            "Measured {} on {machine}.\n\n{}",
            Utc::now().format("%Y-%m-%d"),
            markdown(results)
        ),
    )?;
    Ok(())
}

fn markdown(results: &[Scale]) -> String {
    let mut md = String::from(
        "| scale | runs | owners | detail rows | method | seconds | owners/s | rows/s | vs raw | vs naive | writer p50 / p99 / max ms (idle) | writer longest lock wait ms | longest tx ms | hop median / p99 ms | µs per candidate (median hop) | peak RSS MB | outside owner tx | outside hops |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
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
                "| {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.2}× | {:.2}× | {:.1} / {:.1} / {:.1} ({:.1} / {:.1} / {:.1}) | {:.1} | {:.0} | {} | {} | {} | {} | {} |\n",
                s.scale, s.runs, s.owners, s.detail_rows, m.name, m.seconds, m.owners_per_s, m.rows_per_s,
                m.owners_per_s / rate("raw"), m.owners_per_s / rate("naive"),
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
    md.push_str(
        "\nSessionRetention: the same sessions deleted by a nightly pass through the queue and by a raw batched delete (100 per transaction, cascading).\n\n| scale | sessions | history rows | method | seconds | sessions/s | rows/s | vs raw | writer p50 / p99 / max ms | writer longest lock wait ms | longest tx ms | hop median / p99 ms | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in results {
        let raw = s
            .session_methods
            .iter()
            .find(|m| m.name == "sessions raw")
            .map_or(0.0, |m| m.owners_per_s);
        for m in &s.session_methods {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.2}× | {:.1} / {:.1} / {:.1} | {:.1} | {:.0} | {} | {} |\n",
                s.scale, s.sessions, s.session_rows, m.name, m.seconds, m.owners_per_s, m.rows_per_s,
                m.owners_per_s / raw,
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
