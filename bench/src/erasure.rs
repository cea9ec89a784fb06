//! Erasure on request (SPEC §8 PF-8, §11 RQ-8): one account holding 100 k runs with their
//! execution detail, 5 k sessions with history and 10 k files, erased by sexton (`sexton erase
//! --account`, then one worker until idle) beside the floor that reaches the same end state
//! ([`floor`]: children-first batched deletes, then the unlinks), on identical copies of one
//! template with the same application writer beside each; the two end states checked equal,
//! table by table and file by file. Then the other accounts' nightly pass, alone and again
//! while the erasure runs, on two more copies: PF-8 holds it to 1.2× its time alone.
//!
//! The sizes are options (`--erasure-runs`, `--erasure-sessions`, `--erasure-files`,
//! `--erasure-others`), PF-8's by default; each size's figures are kept in latest.json beside
//! those of the other sizes, so that peak RSS can be read across sizes (RQ-8: flat).

mod fill;
mod floor;
mod markdown;
mod night;
mod profile;
mod state;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use self::fill::{Digest, File, Sizes};
use self::night::night;
use self::profile::profile;
use self::state::{differences, end_state};
use crate::cli::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::compare::{self, Comparison};
use crate::method::{Latency, Method, max_ms, median, score};
use crate::part::Bench;
use crate::results::{machine, member};
use crate::sexton::{sexton, sexton_env};
use crate::writer::{TimedLock, Writes, at_rate, beside, idle_baseline};

/// The erasure's receipt key (RQ-6), for the bench's throw-away databases only.
const RECEIPT_KEY: &str = "bench-only-receipt-key-not-a-secret";

/// `transaction_target_ms` of the retention kinds (config/default.toml): PF-8 holds the writer's
/// longest lock wait beside the erasure to twice it, as PF-6 does.
pub const TRANSACTION_TARGET_MS: f64 = 10.0;

/// The template every method's copy is made from.
const TEMPLATE: &str = "benchera_template";

/// The part: measured at the sizes the command line gives, then written into the results
/// beside the other sizes' figures.
pub fn run<'a>(bench: &'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>> {
    Box::pin(async move {
        let cli = bench.cli;
        let sizes = Sizes {
            runs: cli.erasure_runs,
            sessions: cli.erasure_sessions,
            files: cli.erasure_files,
            others: cli.erasure_others,
        };
        let mut erasure = Erasure {
            measured_at: Utc::now(),
            machine: machine(),
            runs: earlier(cli)?,
        };
        let measured = measure(cli, bench.admin, bench.base, sizes).await?;
        let before_after = measured.before_after.clone();
        erasure.runs.retain(|r| r.sizes != sizes);
        erasure.runs.push(measured);
        erasure
            .runs
            .sort_by_key(|r| (r.sizes.runs, r.sizes.sessions, r.sizes.files));
        erasure.measured_at = Utc::now();
        bench.report.write(&[("erasure", member(&erasure)?)])?;
        Ok(before_after)
    })
}

/// The part's section of latest.md, from latest.json's `erasure`.
pub fn render(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
    let Some(erasure) = json.get("erasure") else {
        return Ok(None);
    };
    Ok(Some(markdown::markdown(&serde_json::from_value(
        erasure.clone(),
    )?)))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Erasure {
    measured_at: DateTime<Utc>,
    machine: String,
    /// A run per size, the smallest first.
    runs: Vec<ErasureRun>,
}

/// One size measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ErasureRun {
    measured_at: DateTime<Utc>,
    sizes: Sizes,
    /// Building the template: migrations, rows, VACUUM (FREEZE, ANALYZE).
    fill_seconds: f64,
    /// Writing one copy of the file tree (every root, the other accounts' files too).
    tree_seconds: f64,
    /// Rounds of sexton and the floor; each side's row is its median round.
    #[serde(default = "crate::method::one_round")]
    rounds: u32,
    /// The erased account's rows an erasure removes (all but the account row and its usage
    /// records, which stay by law, RQ-2), over every table.
    rows_removed: i64,
    /// The erased account's files, and every file of the tree.
    account_files: u64,
    tree_files: u64,
    writer_rate: u32,
    idle_writer: Latency,
    idle_writer_longest_lock_wait_ms: f64,
    /// sexton (its time from the worker taking the request's first hop to the request's
    /// `completed_at`: plan, steps, drain, verification and receipt), then the floor.
    methods: Vec<Method>,
    /// sexton's worker runs until the request completed (more than one when an item the writer
    /// held was withheld as busy and retried, RQ-3), and its hops.
    sexton_workers: u32,
    sexton_hops: usize,
    /// Where sexton's time went: its backends' statements sampled every 50 ms from
    /// pg_stat_activity, by step, as shares of the samples.
    profile: Vec<(String, f64)>,
    /// The two end states were equal: every table's rows (bar the account's name) and every
    /// file left.
    same_end: bool,
    /// The other accounts' nightly pass alone, and while the erasure runs.
    night_alone: Night,
    night_beside: Night,
    /// The erasure beside the night: seconds from its first hop to its completion.
    erasure_beside_seconds: f64,
    /// With `--baseline-sexton`: sexton's erasure by both builds, pair by pair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    before_after: Vec<Comparison>,
}

/// One nightly pass over the other accounts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Night {
    /// From the worker taking the nightly slot to its last job done (the queue's own times),
    /// the erasure's jobs left out.
    seconds: f64,
    jobs: i64,
    worker_seconds: f64,
    worker_peak_rss_kb: Option<u64>,
}

/// The sizes latest.json holds already.
fn earlier(cli: &Cli) -> anyhow::Result<Vec<ErasureRun>> {
    let Ok(text) = std::fs::read_to_string(cli.out.join("latest.json")) else {
        return Ok(Vec::new());
    };
    let json: serde_json::Value = serde_json::from_str(&text)?;
    Ok(match json.pointer("/erasure/runs") {
        Some(runs) => serde_json::from_value(runs.clone()).unwrap_or_default(),
        None => Vec::new(),
    })
}

/// What the template holds, as every method needs it.
struct Template {
    account: Uuid,
    digest: Digest,
    files: Vec<File>,
    targets: Vec<(Uuid, Uuid, Uuid)>,
    now: DateTime<Utc>,
}

/// One size: the template, the writer alone, sexton and the floor beside it, their end states
/// compared, then the night alone and beside an erasure.
async fn measure(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    sizes: Sizes,
) -> anyhow::Result<ErasureRun> {
    let root = cli.scratch.join("erasure");
    let started = Instant::now();
    let template = template(cli, admin, base, sizes).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let tree = Instant::now();
    fill::write_tree(&root.join("check"), &template.files).await?;
    let tree_seconds = tree.elapsed().as_secs_f64();
    let tree_files = template.files.len() as u64;
    let _ = std::fs::remove_dir_all(root.join("check"));
    eprintln!("erasure: the writer alone");
    let writes = |pool, stop| writes(pool, template.targets.clone(), cli.writer_rate, stop);
    let (idle, _) = idle_baseline(cli, admin, base, TEMPLATE, "benchera_idle", writes).await?;

    // Round by round, sexton then the floor, each on a fresh copy; each side's median round is
    // kept (sexton's with its workers, hops and profile), and every round must end alike.
    let (mut sextons, mut floors) = (Vec::new(), Vec::new());
    let mut sexton_end = None;
    for round in 1..=cli.erasure_rounds {
        eprintln!("erasure: sexton (round {round})");
        let db = "benchera_sexton";
        let files = root.join("sexton");
        let erased =
            erase_beside_writer(cli, admin, base, &template, db, &files, &cli.sexton).await?;
        let end = end_state(base, db, &files, template.account).await?;
        drop_db(admin, db).await?;
        let _ = std::fs::remove_dir_all(&files);
        sextons.push(erased);

        eprintln!("erasure: the floor (round {round})");
        let db = "benchera_floor";
        let files = root.join("floor");
        floors.push(floor_beside_writer(cli, admin, base, &template, db, &files).await?);
        let floor_end = end_state(base, db, &files, template.account).await?;
        drop_db(admin, db).await?;
        let _ = std::fs::remove_dir_all(&files);

        if end != floor_end {
            bail!(
                "sexton's end state and the floor's differ: {}",
                differences(&end, &floor_end)
            );
        }
        sexton_end = Some(end);
    }
    let sexton_end = sexton_end.context("--erasure-rounds is at least 1")?;
    // Every round's two end states were compared above: a difference ends the part.
    let same_end = true;
    let (sexton_method, workers, hops, profile) =
        median(sextons, |(method, ..)| method.seconds).context("a round of sexton")?;
    let floor_method = median(floors, |method| method.seconds).context("a round of the floor")?;
    // With `--baseline-sexton`, sexton's erasure by both builds, pair by pair on fresh copies.
    let case = format!("{} runs · sexton", sizes.runs);
    let before_after = compare::pairs(cli, "erasure", case, "runs/s", async |build| {
        let db = "benchera_pair";
        let files = root.join("pair");
        let erased = erase_beside_writer(cli, admin, base, &template, db, &files, build.binary);
        let (mut method, ..) = erased.await?;
        drop_db(admin, db).await?;
        let _ = std::fs::remove_dir_all(&files);
        method.owners_per_s = sizes.runs as f64 / method.seconds;
        Ok(method.side())
    })
    .await?
    .into_iter()
    .collect();
    // The writer changes no row's text and adds none: what is gone is what the erasure removed.
    let (after, _) = &sexton_end;
    let rows_removed = template
        .digest
        .iter()
        .map(|(table, (n, _))| n - after.get(table).map_or(0, |(m, _)| *m))
        .sum::<i64>();
    let account_files = sizes.split().iter().map(|(_, n)| n).sum();
    let mut methods = vec![sexton_method, floor_method];
    for m in &mut methods {
        m.owners_per_s = sizes.runs as f64 / m.seconds;
        m.rows_per_s = rows_removed as f64 / m.seconds;
    }

    eprintln!("erasure: the night alone");
    let night_alone = night(cli, admin, &template, "benchera_night", &root, false)
        .await?
        .0;
    eprintln!("erasure: the night beside the erasure");
    let (night_beside, beside) =
        night(cli, admin, &template, "benchera_night_beside", &root, true).await?;
    drop_db(admin, TEMPLATE).await?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(ErasureRun {
        measured_at: Utc::now(),
        sizes,
        fill_seconds,
        tree_seconds,
        rounds: cli.erasure_rounds,
        rows_removed,
        account_files,
        tree_files,
        writer_rate: cli.writer_rate,
        idle_writer_longest_lock_wait_ms: max_ms(&idle.lock_wait_ms),
        idle_writer: Latency::of(idle.total_ms),
        methods,
        sexton_workers: workers,
        sexton_hops: hops,
        profile,
        same_end,
        night_alone,
        night_beside,
        erasure_beside_seconds: beside.unwrap_or(0.0),
        before_after,
    })
}

/// Builds the template: migrated, filled, and what every method needs read from it.
async fn template(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    sizes: Sizes,
) -> anyhow::Result<Template> {
    recreate(admin, TEMPLATE, None).await?;
    let scratch = cli.scratch.join("erasure").join("template");
    std::fs::create_dir_all(&scratch)?;
    eprintln!(
        "erasure: filling {} runs, {} sessions, {} files of one account, and {} other accounts",
        sizes.runs, sizes.sessions, sizes.files, sizes.others
    );
    if !sexton(&cli.sexton, TEMPLATE, &scratch, &["migrate"])
        .status()
        .await?
        .success()
    {
        bail!("migrating {TEMPLATE} failed");
    }
    let pool = connect(base, TEMPLATE, "bench").await?;
    // Tonight, as the many-accounts part has it: the night's slot is now.
    let now = Utc::now();
    let account = fill::fill(&pool, sizes, now).await?;
    let digest = fill::digest(&pool).await?;
    let files = fill::files(&pool, sizes, now).await?;
    let targets: Vec<(Uuid, Uuid, Uuid)> = sqlx::query_as(
        "(SELECT r.conversation_id, r.id, s.id FROM runs r
          JOIN LATERAL (SELECT id FROM sessions s WHERE s.account_id = r.account_id
                        ORDER BY md5(s.id::text || r.id::text) LIMIT 1) s ON true
          WHERE r.account_id = $1 ORDER BY md5(r.id::text) LIMIT 100)
         UNION ALL
         (SELECT r.conversation_id, r.id, s.id FROM runs r
          JOIN sessions s ON s.account_id = r.account_id AND s.state = 'idle'
          WHERE r.account_id <> $1 AND r.completed_at > now() - interval '10 days'
          ORDER BY md5(r.id::text) LIMIT 100)",
    )
    .bind(account)
    .fetch_all(&pool)
    .await?;
    pool.close().await;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(Template {
        account,
        digest,
        files,
        targets,
        now,
    })
}

/// The writer's locks, each wait timed by the server ([`TimedLock`]).
fn locks() -> [TimedLock; 3] {
    [
        TimedLock::new("SELECT 1 FROM conversations WHERE id = $1"),
        TimedLock::new("SELECT 1 FROM runs WHERE id = $1"),
        TimedLock::new("SELECT 1 FROM sessions WHERE id = $1"),
    ]
}

/// The application writer at `rate` per second over `targets` (a conversation, one of its runs
/// and a session of the same account; the erased account's and other accounts' alike): lock the
/// conversation, then the run (EX-6's order), then the session, and touch each that is still
/// there — an update that changes nothing, so that the end states stay comparable.
fn writes(
    pool: PgPool,
    targets: Vec<(Uuid, Uuid, Uuid)>,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> impl Future<Output = anyhow::Result<Writes>> + Send + 'static {
    let locks = locks();
    at_rate(rate, stop, targets, move |(conversation, run, session)| {
        let (pool, locks) = (pool.clone(), locks.clone());
        async move {
            let mut tx = pool.begin().await?;
            let mut waited = 0.0;
            let touch = [
                "UPDATE conversations SET usage_summary = usage_summary WHERE id = $1",
                "UPDATE runs SET requested_model = requested_model WHERE id = $1",
                "UPDATE sessions SET metadata = metadata WHERE id = $1",
            ];
            for ((lock, id), touch) in locks.iter().zip([conversation, run, session]).zip(touch) {
                let (found, wait) = lock.take(&mut tx, id).await?;
                waited += wait;
                if found > 0 {
                    sqlx::query(touch).bind(id).execute(&mut *tx).await?;
                }
            }
            tx.commit().await?;
            Ok(waited)
        }
    })
}

/// The environment of every sexton command here: the receipt key, JSON logs.
fn erasure_env() -> [(&'static str, &'static str); 2] {
    [
        ("SEXTON_ERASURE__RECEIPT_KEY", RECEIPT_KEY),
        ("SEXTON_LOG__FORMAT", "json"),
    ]
}

/// `binary erase --account` on `db`: the request's id.
async fn request(binary: &Path, db: &str, files: &Path, account: Uuid) -> anyhow::Result<Uuid> {
    let account = account.to_string();
    let out = sexton(
        binary,
        db,
        files,
        &[
            "erase",
            "--account",
            &account,
            "--ref",
            "PF-8",
            "--by",
            "bench",
            "--json",
        ],
    )
    .envs(erasure_env())
    .stdout(Stdio::piped())
    .output()
    .await?;
    if !out.status.success() {
        bail!(
            "sexton erase failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "sexton erase printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    Ok(answer["id"].as_str().context("the request's id")?.parse()?)
}

/// A worker until idle on `db`, under GNU time (its peak RSS), its JSON log kept in `log`;
/// spawned, for the caller to wait on.
fn spawn_worker(
    binary: &Path,
    db: &str,
    files: &Path,
    log: &Path,
    rss: &Path,
) -> anyhow::Result<tokio::process::Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    tokio::process::Command::new("/usr/bin/time")
        .args(["-f", "max_rss_kb=%M", "-o"])
        .arg(rss)
        .arg(binary)
        .args(["worker", "--exit-when-idle"])
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, files))
        .envs(erasure_env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("/usr/bin/time (Debian package time) runs the worker")
}

/// A worker's exit, and its peak RSS from GNU time's file `rss`.
async fn wait_worker(mut child: tokio::process::Child, rss: &Path) -> anyhow::Result<Option<u64>> {
    if !child.wait().await?.success() {
        bail!("the sexton worker failed");
    }
    let text = std::fs::read_to_string(rss).unwrap_or_default();
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("max_rss_kb="))
        .and_then(|kb| kb.trim().parse().ok()))
}

/// The log of a worker on `db`: under `--logs` if given, else beside the run's files.
fn log_path(cli: &Cli, db: &str, files: &Path) -> anyhow::Result<PathBuf> {
    let dir = cli
        .logs
        .clone()
        .unwrap_or_else(|| files.with_extension("logs"));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{db}.log"));
    let _ = std::fs::remove_file(&path);
    Ok(path)
}

/// sexton's erasure of the account on a fresh copy `db`, its files under `files`, with the
/// writer beside it: the request, then a worker until idle — again after `sexton erase retry`
/// while the request waits on an item the writer held (`busy`), at most five times. Timed from
/// the first erasure hop's start to the request's completion, by the queue's and the request's
/// own times. Returns the method, the workers run, the hops and the profile.
async fn erase_beside_writer(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    db: &str,
    files: &Path,
    binary: &Path,
) -> anyhow::Result<(Method, u32, usize, Vec<(String, f64)>)> {
    recreate(admin, db, Some(TEMPLATE)).await?;
    fill::write_tree(files, &template.files).await?;
    let log = log_path(cli, db, files)?;
    let rss_file = files.with_extension("rss");
    let writer_pool = connect(base, db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let w = writes(
        writer_pool.clone(),
        template.targets.clone(),
        cli.writer_rate,
        stop.clone(),
    );
    let (writer, sampler) = beside(base, db, w, &stop).await?;
    let profiler = tokio::spawn(profile(
        connect(base, db, "bench-profile").await?,
        stop.clone(),
    ));
    let id = request(binary, db, files, template.account).await?;
    let check = connect(base, db, "bench").await?;
    let (mut workers, mut peak) = (0u32, None::<u64>);
    loop {
        workers += 1;
        let child = spawn_worker(binary, db, files, &log, &rss_file)?;
        let rss = wait_worker(child, &rss_file).await?;
        peak = peak.max(rss);
        let state: String = sqlx::query_scalar("SELECT state FROM sexton.erasures WHERE id = $1")
            .bind(id)
            .fetch_one(&check)
            .await?;
        match state.as_str() {
            "completed" => break,
            "waiting" if workers < 5 => {
                eprintln!("erasure: the request waits (an item was busy): retrying");
                let id = id.to_string();
                if !sexton(binary, db, files, &["erase", "retry", &id])
                    .envs(erasure_env())
                    .status()
                    .await?
                    .success()
                {
                    bail!("sexton erase retry failed");
                }
            }
            other => bail!("the erasure request ended {other} after {workers} workers"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await??;
    let longest = sampler.await??;
    let profile = profiler.await??;
    writer_pool.close().await;
    let seconds: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM e.completed_at
                    - (SELECT min(lock_at) FROM apalis.jobs WHERE job_type = 'sexton.erasure'))::float8
         FROM sexton.erasures e WHERE e.id = $1",
    )
    .bind(id)
    .fetch_one(&check)
    .await?;
    check.close().await;
    let hops = hops_of(&log)?;
    let mut m = crate::method::method("sexton");
    m.seconds = seconds;
    m.peak_rss_kb = peak;
    let owner_s: f64 = hops.iter().map(|(_, owner)| owner).sum::<f64>() / 1000.0;
    let hop_s: f64 = hops.iter().map(|(ms, _)| ms).sum::<f64>() / 1000.0;
    m.share_outside_owner_transactions = Some((1.0 - owner_s / seconds).max(0.0));
    m.share_outside_hops = Some((1.0 - hop_s / seconds).max(0.0));
    let n = hops.len();
    m.hop = Some(Latency::of(hops.into_iter().map(|(ms, _)| ms).collect()));
    score(&mut m, 0, 0, writes, longest);
    Ok((m, workers, n, profile))
}

/// The erasure's hops in a worker's JSON log: each one's ms and its owner transactions' ms.
fn hops_of(log: &Path) -> anyhow::Result<Vec<(f64, f64)>> {
    let text = std::fs::read_to_string(log)?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| e["message"] == "hop done" && e["span"]["job"] == "erasure")
        .map(|e| {
            (
                e["elapsed_ms"].as_f64().unwrap_or(0.0),
                e["owner_ms"].as_f64().unwrap_or(0.0),
            )
        })
        .collect())
}

/// The floor on a fresh copy `db`, its files under `files`, with the writer beside it.
async fn floor_beside_writer(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &Template,
    db: &str,
    files: &Path,
) -> anyhow::Result<Method> {
    recreate(admin, db, Some(TEMPLATE)).await?;
    fill::write_tree(files, &template.files).await?;
    let writer_pool = connect(base, db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let w = writes(
        writer_pool.clone(),
        template.targets.clone(),
        cli.writer_rate,
        stop.clone(),
    );
    let (writer, sampler) = beside(base, db, w, &stop).await?;
    let mut m = floor::run_floor(base, db, files, template.account).await?;
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await??;
    let longest = sampler.await??;
    writer_pool.close().await;
    score(&mut m, 0, 0, writes, longest);
    Ok(m)
}
