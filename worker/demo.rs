//! `sexton demo`: migrate, seed a small dataset, hold one conversation (HD-1), run one nightly
//! pass through the queue exactly as a fleet would (tick, then a worker until the queue is
//! idle), and print what changed: every table and root before and after, what the held
//! conversation kept, and what each job kind's passes did; then erase one conversation and one
//! session on request ([`erasure`]) and print their receipts. The worker's logs go to a file the
//! report names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use sexton_jobs::clock::SystemClock;
use sexton_jobs::job::{Cadence, Job as _};
use sexton_jobs::orphans::{OrphanSettings, Orphans};
use sexton_jobs::trace_cleanup::{Limits, TraceCleanup, TraceSettings};

use crate::config::{PathSettings, Settings};
use crate::context::JobContext;
use crate::seed::{SeedOptions, seed};
use crate::{db, holds, ledger, preview, queue, registry, schedule, tick, worker};

mod erasure;

pub use erasure::DEMO_RECEIPT_KEY;

/// Where the demo writes its files and log: a fresh directory per run, or `SEXTON_DEMO_DIR` —
/// with file roots in an object store, the directory a local server serves as their bucket
/// (`bash scripts/demo.sh --object-store` runs s3s-fs so).
pub fn root() -> PathBuf {
    std::env::var_os(DIR_VARIABLE).map_or_else(
        || std::env::temp_dir().join(format!("sexton-demo-{}", std::process::id())),
        PathBuf::from,
    )
}

/// The environment variable naming the demo's directory.
const DIR_VARIABLE: &str = "SEXTON_DEMO_DIR";

/// The demo's log file, in [`root`] (created here, so that logging can start before the demo).
pub fn log_file() -> PathBuf {
    let root = root();
    // If the directory cannot be made, opening the log file says so.
    let _ = std::fs::create_dir_all(&root);
    root.join("sexton-demo.log")
}

/// Every table of SPEC §1, in the order the report lists them.
pub const TABLES: &[&str] = &[
    "accounts",
    "conversations",
    "turns",
    "variants",
    "follow_ups",
    "fragments",
    "runs",
    "run_tasks",
    "run_task_edges",
    "tool_results",
    "sealed_requests",
    "reasoning_traces",
    "invocation_attempts",
    "output_files",
    "settlement_receipts",
    "delegations",
    "history_requests",
    "history_request_sources",
    "usage_records",
    "conversation_events",
    "agents",
    "sessions",
    "board_tasks",
    "session_retention_policies",
    "conversation_entries",
    "conversation_archives",
    "conversation_archive_entries",
    "handoffs",
    "dream_preloads",
    "working_records",
    "brain_memories",
    "attachments",
];

/// Rows per table and files per root at one moment.
#[derive(Debug, Default)]
struct Snapshot {
    rows: BTreeMap<&'static str, i64>,
    pruned_runs: i64,
    files: BTreeMap<&'static str, (u64, u64)>,
}

/// Runs the demo against the configured database, with file roots in a fresh temp directory.
///
/// # Errors
/// When the database already holds accounts (the demo only seeds throw-away databases), or
/// any step fails.
pub async fn run(settings: &Settings, scale: u64) -> anyhow::Result<()> {
    let root = root();
    if !settings.paths.objects.is_empty() && std::env::var_os(DIR_VARIABLE).is_none() {
        bail!(
            "with file roots in an object store, the demo seeds its files into {DIR_VARIABLE}, \
             the directory a local S3 server serves as their bucket: `bash scripts/demo.sh \
             --object-store` starts one (s3s-fs) and sets it"
        );
    }
    let settings = demo_settings(settings, &root);
    let pool = db::connect(&settings.database, db::Access::Write).await?;
    let now = seed_empty(&pool, &settings, scale, &root).await?;
    settings.check_dirs()?;
    settings.reach_stores().await?;
    let held = hold_one(&pool).await?;

    let before = snapshot(&pool, &settings.paths).await?;
    let ticked = start_night(&pool, &settings, now).await?;
    println!(
        "\nnightly slot {}: {}; running it (worker log: {})",
        ticked.slot.to_rfc3339(),
        ticked.outcome,
        log_file().display()
    );
    let started = std::time::Instant::now();
    worker::run(&settings, worker::Mode::UntilIdle).await?;
    let elapsed = started.elapsed();
    let after = snapshot(&pool, &settings.paths).await?;
    let jobs = queue::counts(&pool).await?;

    println!(
        "pass finished in {:.1}s: {} jobs done, {} failed\n",
        elapsed.as_secs_f64(),
        jobs.done,
        jobs.failed
    );
    print_report(&before, &after);
    if let Some(held) = &held {
        println!(
            "\nheld conversation {}: {} of its {} runs were past their window when it was held; \
             {} have details_pruned_at after the pass",
            held.conversation,
            held.past_window,
            held.runs,
            pruned_runs(&pool, held.conversation).await?
        );
    }
    print_passes(&ledger::latest(&pool).await?);
    erasure::run(&pool, &settings).await?;
    for (name, objects) in &settings.paths.objects {
        println!("root {} is {objects}", name.as_str());
    }
    if settings.paths.objects.is_empty() {
        println!(
            "\nfiles were written under {}; delete it when done.",
            root.display()
        );
    }
    Ok(())
}

/// The conversation the demo holds, and its runs when it was held.
struct Held {
    conversation: uuid::Uuid,
    runs: i64,
    /// Runs completed before their account's window, still holding their execution detail.
    past_window: i64,
}

/// Holds the seeded conversation with the most runs past their window (HD-1, placed by
/// "demo"), so that the report shows held data staying; `None` if no run is past a window.
async fn hold_one(pool: &sqlx::PgPool) -> anyhow::Result<Option<Held>> {
    let found: Option<(uuid::Uuid, i64, i64)> = sqlx::query_as(
        "SELECT r.conversation_id,
                (SELECT count(*) FROM runs x WHERE x.conversation_id = r.conversation_id),
                count(*)
         FROM runs r JOIN accounts a ON a.id = r.account_id
         WHERE r.kind = 'conversation' AND r.details_pruned_at IS NULL
           AND r.completed_at < now() - make_interval(days => a.execution_details_retention_days)
         GROUP BY r.conversation_id ORDER BY count(*) DESC, r.conversation_id LIMIT 1",
    )
    .fetch_optional(pool)
    .await?;
    let Some((conversation, runs, past_window)) = found else {
        return Ok(None);
    };
    let hold = holds::place(
        pool,
        holds::Scope::Conversation,
        conversation,
        "DEMO-1",
        "the demo's hold: what it covers stays, whatever the windows say",
        "demo",
    )
    .await?;
    println!(
        "\nplaced hold {} on conversation {conversation} (case DEMO-1, by demo): retention keeps \
         what it covers, its {past_window} runs past their window included (sexton holds list)",
        hold.placed.id
    );
    Ok(Some(Held {
        conversation,
        runs,
        past_window,
    }))
}

/// Runs of `conversation` whose execution detail was pruned.
async fn pruned_runs(pool: &sqlx::PgPool, conversation: uuid::Uuid) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE conversation_id = $1 AND details_pruned_at IS NOT NULL",
    )
    .bind(conversation)
    .fetch_one(pool)
    .await?)
}

/// The configured settings as the demo runs them: every job on (background trace cleanup with
/// an age limit unless the configuration already enables it, derivative cleanup), no health pauses, and the file
/// roots under `root` — where the seed writes them; a root configured in an object store is
/// reached there by the jobs.
fn demo_settings(settings: &Settings, root: &Path) -> Settings {
    let mut settings = settings.clone();
    let traces: &TraceSettings = settings.jobs.get(TraceCleanup::NAME);
    if !traces.enabled {
        let demo_traces = TraceSettings {
            enabled: true,
            limits: Limits {
                max_age_days: 30,
                ..traces.limits
            },
            ..traces.clone()
        };
        settings.jobs.set(TraceCleanup::NAME, demo_traces);
    }
    let orphans: &OrphanSettings = settings.jobs.get(Orphans::NAME);
    if !orphans.enabled {
        let demo_orphans = OrphanSettings {
            enabled: true,
            ..orphans.clone()
        };
        settings.jobs.set(Orphans::NAME, demo_orphans);
    }
    // Freshly seeded tables are what autovacuum works on first: the demo does not wait for it.
    settings.health = sexton_jobs::health::HealthSettings::OFF;
    settings.paths = PathSettings {
        output_root: root.join("outputs"),
        attachments_root: root.join("attachments"),
        artifacts_root: root.join("artifacts"),
        sessions_root: root.join("sessions"),
        traces_root: root.join("traces"),
        objects: settings.paths.objects.clone(),
    };
    settings
}

/// Migrates and seeds the database at `scale`, refusing one that already holds accounts; the
/// moment the data was seeded relative to.
async fn seed_empty(
    pool: &sqlx::PgPool,
    settings: &Settings,
    scale: u64,
    root: &Path,
) -> anyhow::Result<DateTime<Utc>> {
    db::migrate(pool).await?;
    let existing: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(pool)
        .await?;
    if existing > 0 {
        bail!(
            "the database already holds {existing} accounts; `sexton demo` seeds synthetic data \
             and only runs against an empty, throw-away database"
        );
    }
    let now = Utc::now();
    println!(
        "sexton demo: seeding scale {scale} (files under {})",
        root.display()
    );
    let report = seed(
        pool,
        &settings.paths,
        &SeedOptions {
            scale,
            seed: 1,
            now,
            show_progress: true,
            checked: false,
        },
    )
    .await
    .context("seeding failed")?;
    println!(
        "seeded {} accounts, {} conversations, {} runs, {} rows, {} files",
        report.accounts, report.conversations, report.runs, report.rows, report.files
    );
    Ok(now)
}

/// Prints what the pass will do, then enqueues the nightly slot at `now` and the current
/// period of every kind on a cadence of its own.
async fn start_night(
    pool: &sqlx::PgPool,
    settings: &Settings,
    now: DateTime<Utc>,
) -> anyhow::Result<tick::Ticked> {
    println!("\nwhat the pass will do (sexton preview --all):");
    let mut conn = pool.acquire().await?;
    let mut out = std::io::stdout().lock();
    preview::write(
        &mut conn,
        settings,
        now,
        preview::Shown::All,
        false,
        &mut out,
    )
    .await?;
    drop(out);
    drop(conn);
    let ticked = tick::tick(pool, settings, now).await?;
    // Kinds on a cadence of their own (trace cleanup, when enabled) start their period too.
    let ctx = JobContext::new(
        pool.clone(),
        Arc::new(settings.clone()),
        Arc::new(SystemClock),
    );
    for kind in registry::KINDS {
        if let Cadence::Every(period) = kind.cadence(settings) {
            tick::start_period(&ctx, *kind, schedule::period_start(now, period)).await?;
        }
    }
    Ok(ticked)
}

async fn snapshot(pool: &sqlx::PgPool, paths: &PathSettings) -> anyhow::Result<Snapshot> {
    let mut snapshot = Snapshot::default();
    for table in TABLES {
        let count: i64 = // The table names are the constants above, never input.
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(pool)
            .await?;
        snapshot.rows.insert(table, count);
    }
    snapshot.pruned_runs =
        sqlx::query_scalar("SELECT count(*) FROM runs WHERE details_pruned_at IS NOT NULL")
            .fetch_one(pool)
            .await?;
    for (name, dir) in [
        ("outputs", &paths.output_root),
        ("attachments", &paths.attachments_root),
        ("artifacts", &paths.artifacts_root),
        ("sessions", &paths.sessions_root),
        ("traces", &paths.traces_root),
    ] {
        snapshot.files.insert(name, count_files(dir));
    }
    Ok(snapshot)
}

/// Regular files and their bytes under a directory (symlinks are not followed).
fn count_files(dir: &Path) -> (u64, u64) {
    let mut stack: Vec<PathBuf> = vec![dir.to_owned()];
    let (mut files, mut bytes) = (0, 0);
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                files += 1;
                bytes += meta.len();
            }
        }
    }
    (files, bytes)
}

fn print_report(before: &Snapshot, after: &Snapshot) {
    println!(
        "{:<30} {:>10} {:>10} {:>10}",
        "table", "before", "after", "removed"
    );
    for (table, rows) in &before.rows {
        let now = after.rows.get(table).copied().unwrap_or_default();
        println!("{table:<30} {rows:>10} {now:>10} {:>10}", rows - now);
    }
    println!(
        "{:<30} {:>10} {:>10}",
        "runs marked details_pruned_at", before.pruned_runs, after.pruned_runs
    );
    println!(
        "\n{:<30} {:>10} {:>10} {:>14}",
        "files", "before", "after", "bytes freed"
    );
    for (root, (files, bytes)) in &before.files {
        let (now, now_bytes) = after.files.get(root).copied().unwrap_or_default();
        println!("{root:<30} {files:>10} {now:>10} {:>14}", bytes - now_bytes);
    }
}

/// What each job kind's passes did, summed over accounts.
fn print_passes(passes: &[ledger::Pass]) {
    println!(
        "\n{:<30} {:>7} {:>9} {:>6} {:>10} {:>10} {:>12} {:>8} {:>12}",
        "job",
        "passes",
        "finished",
        "hops",
        "pruned",
        "retained",
        "rows deleted",
        "files",
        "bytes freed"
    );
    for kind in registry::KINDS {
        let mine: Vec<&ledger::Pass> = passes.iter().filter(|p| p.job == kind.name()).collect();
        let sum = |f: fn(&ledger::Pass) -> i64| mine.iter().map(|p| f(p)).sum::<i64>();
        let total = |v: &serde_json::Value| -> i64 {
            v.as_object().map_or(0, |m| {
                m.values().filter_map(serde_json::Value::as_i64).sum()
            })
        };
        println!(
            "{:<30} {:>7} {:>9} {:>6} {:>10} {:>10} {:>12} {:>8} {:>12}",
            kind.name(),
            mine.len(),
            mine.iter().filter(|p| p.finished_at.is_some()).count(),
            sum(|p| i64::from(p.hops)),
            sum(|p| p.pruned),
            mine.iter().map(|p| total(&p.retained)).sum::<i64>(),
            mine.iter().map(|p| total(&p.rows_deleted)).sum::<i64>(),
            sum(|p| p.files_deleted),
            sum(|p| p.bytes_reclaimed),
        );
    }
}
