//! Shared test helpers: settings with file roots in a temp dir, the queue's schema on the test's
//! fresh database, and the `sexton` binary pointed at that database.

pub mod audit;
pub mod backend;
pub mod contract;
pub mod fixture;
pub mod hops;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod run;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use sexton::config::Settings;
use sqlx::PgPool;
use tokio::process::{Child, Command};

/// The default settings with every file root under `dir`.
pub fn settings(dir: &Path) -> Settings {
    let mut settings = sexton::registry::load_settings(None).expect("default settings are valid");
    settings.paths = backend::paths(dir);
    settings.queue.poll_interval = Duration::from_millis(100);
    settings.queue.retry_backoff = Duration::from_millis(50);
    // Health throttling is proven by its own tests; elsewhere an autovacuum the
    // test's bulk inserts start, or another test's replication slot, must not pause a pass.
    settings.health = sexton_jobs::health::HealthSettings::OFF;
    settings
}

/// The environment that switches background trace cleanup (an age limit of 30 days) and
/// derivative cleanup on, so that a pass covers every job kind.
pub const EVERY_JOB_ENV: [(&str, &str); 3] = [
    ("SEXTON_TRACES__ENABLED", "true"),
    ("SEXTON_TRACES__MAX_AGE_DAYS", "30"),
    ("SEXTON_ORPHANS__ENABLED", "true"),
];

/// `settings` as [`EVERY_JOB_ENV`] makes them.
pub fn every_job(mut settings: Settings) -> Settings {
    use sexton_jobs::job::Job as _;
    use sexton_jobs::orphans::{OrphanSettings, Orphans};
    use sexton_jobs::trace_cleanup::{Limits, TraceCleanup, TraceSettings};
    let traces: TraceSettings = settings
        .jobs
        .get::<TraceSettings>(TraceCleanup::NAME)
        .clone();
    settings.jobs.set(
        TraceCleanup::NAME,
        TraceSettings {
            enabled: true,
            limits: Limits {
                max_age_days: 30,
                ..traces.limits
            },
            ..traces
        },
    );
    let orphans: OrphanSettings = settings.jobs.get::<OrphanSettings>(Orphans::NAME).clone();
    settings.jobs.set(
        Orphans::NAME,
        OrphanSettings {
            enabled: true,
            ..orphans
        },
    );
    settings
}

/// Enqueues the nightly slot at `at`, and the period `at` falls in of every kind on a cadence
/// of its own: one pass of every job kind.
pub async fn start_every_pass(
    pool: &PgPool,
    settings: &Settings,
    at: chrono::DateTime<chrono::Utc>,
) {
    use sexton_jobs::job::Cadence;
    sexton::tick::tick(pool, settings, at).await.unwrap();
    let ctx = sexton::context::JobContext::new(
        pool.clone(),
        std::sync::Arc::new(settings.clone()),
        std::sync::Arc::new(sexton_jobs::clock::SystemClock),
    );
    for kind in sexton::registry::KINDS {
        if let Cadence::Every(period) = kind.cadence(settings) {
            sexton::tick::start_period(&ctx, *kind, sexton::schedule::period_start(at, period))
                .await
                .unwrap();
        }
    }
}

/// Installs the queue's schema too (sqlx::test applied sexton's migrations already).
pub async fn migrate(pool: &PgPool) {
    sexton::db::migrate(pool).await.expect("migrations apply");
}

/// A URL for the test's own database, for child processes.
pub async fn database_url(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .expect("current_database");
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for the tests");
    let mut url = url_without_path(&base);
    url.push('/');
    url.push_str(&name);
    url
}

fn url_without_path(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => url[..after_scheme + i].to_owned(),
        None => url.to_owned(),
    }
}

/// The `sexton` binary with the test database and file roots under `dir` (created, as a
/// platform's would be).
pub fn sexton(database_url: &str, dir: &Path) -> Command {
    for root in ["outputs", "attachments", "artifacts", "sessions", "traces"] {
        std::fs::create_dir_all(dir.join(root)).expect("a file root");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sexton"));
    cmd.env("DATABASE_URL", database_url)
        .envs(backend::env(dir))
        .env("SEXTON_QUEUE__POLL_INTERVAL_MS", "100")
        .env("SEXTON_HEALTH__MAX_REPLICATION_LAG_BYTES", "0")
        .env("SEXTON_HEALTH__PAUSE_ON_VACUUM", "false")
        .env("SEXTON_QUEUE__RETRY_BACKOFF_MS", "50")
        .env("SEXTON_LOG__LEVEL", "info,sqlx=warn")
        // Tests fire slots themselves; a fleet member must not catch up on, or reach, a real one.
        .env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "0")
        .env("SEXTON_SCHEDULE__CRON", "0 0 29 2 *")
        .env("SEXTON_HTTP__LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Waits for a child to exit, failing the test if it takes longer than `limit` (a hang guard,
/// not a timing assertion).
pub async fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status.expect("child process status"),
        Err(_) => {
            child.kill().await.ok();
            panic!("sexton did not exit within {limit:?}");
        }
    }
}

/// Runs `sexton worker --exit-when-idle` on the test's database and asserts it exits 0.
pub async fn run_until_idle(pool: &PgPool, dir: &Path) {
    let url = database_url(pool).await;
    let mut child = sexton(&url, dir)
        .args(["worker", "--exit-when-idle"])
        .spawn()
        .unwrap();
    let status = wait(&mut child, Duration::from_secs(120)).await;
    assert!(status.success(), "worker exited with {status}");
}

/// A seeded backlog (scale 1) on the test's database, with its file roots and the audit's
/// snapshot: where the process tests start.
pub struct Backlog {
    pub dir: tempfile::TempDir,
    pub settings: Settings,
    pub before: audit::Before,
    pub url: String,
}

pub async fn seeded_backlog(pool: &PgPool, seed: u64) -> Backlog {
    migrate(pool).await;
    let dir = backend::tempdir();
    let settings = settings(dir.path());
    let options = sexton::seed::SeedOptions {
        scale: 1,
        seed,
        now: fixture::pass_start(),
        show_progress: false,
        checked: false,
    };
    sexton::seed::seed(pool, &settings.paths, &options)
        .await
        .unwrap();
    let before = audit::snapshot(pool, fixture::pass_start()).await;
    let url = database_url(pool).await;
    Backlog {
        dir,
        settings,
        before,
        url,
    }
}

/// Waits until a session of the test's database is blocked on a lock while running a statement
/// that locks rows `FROM <table>` — the waiter the test expects, not any; fails the test after
/// 60 s rather than hang.
pub async fn wait_for_lock_waiter(pool: &PgPool, table: &str) {
    wait_for_lock_waiters(pool, table, 1).await;
}

/// [`wait_for_lock_waiter`] until `n` sessions wait so.
pub async fn wait_for_lock_waiters(pool: &PgPool, table: &str, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fewer than {n} statements on {table} waited for a lock within 60 s"
        );
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND pid <> pg_backend_pid() AND query ILIKE '%FROM ' || $1 || ' %FOR %'",
        )
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
