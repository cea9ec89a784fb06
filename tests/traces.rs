//! Run traces (SPEC §4, TR-1 … TR-4, ER-3) on real files in temp dirs: age and quota by
//! allocated bytes (a sparse file by its blocks), symlinks and bad signatures never deleted,
//! live sessions kept, the lease held by another cleaner, files changed between plan and delete,
//! the CLI's dry run and `--confirm`, the background job on its own cadence, and names that are
//! not UTF-8 cleaned like any other (found by their bytes, shown lossily).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton::event;
use sexton_jobs::files::{Root, Store};
use sexton_jobs::trace_cleanup::{
    self as job, Lease, Limits, Observer, Planned, Quiet, TraceReport,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, pass_start};
use crate::common::process::{Proc, events, fleet_worker, poll_until};
use crate::common::{self, backend};

/// A traces root with agents' directories, and the moment the cleaner runs at.
struct Traces {
    dir: tempfile::TempDir,
    root: PathBuf,
    agent: Uuid,
}

impl Traces {
    fn new() -> Self {
        let dir = backend::tempdir();
        let root = dir.path().join("traces");
        std::fs::create_dir_all(&root).unwrap();
        Self {
            dir,
            root,
            agent: Uuid::new_v4(),
        }
    }

    /// Where the cleaner finds the traces: the directory, or the bucket's prefix it is.
    fn store(&self) -> Store {
        backend::paths(self.dir.path()).store(Root::Traces)
    }

    /// A trace of `session` with `body_bytes` of content after its signature, last modified
    /// `days` before the pass start.
    fn trace(&self, name: &str, session: Uuid, days: f64, body_bytes: usize) -> PathBuf {
        let path = self.root.join(self.agent.to_string()).join(name);
        self.trace_at(&path, session, days, body_bytes)
    }

    /// [`trace`](Self::trace) at any `path`, whatever bytes its names are.
    fn trace_at(&self, path: &Path, session: Uuid, days: f64, body_bytes: usize) -> PathBuf {
        let signature = serde_json::json!({
            "format": "run-trace/1", "agent_id": self.agent.to_string(),
            "session_id": session.to_string()
        });
        let mut content = format!("{signature}\n").into_bytes();
        content.extend(std::iter::repeat_n(b'x', body_bytes));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &content).unwrap();
        age(path, days);
        path.to_owned()
    }

    /// Any file under the agent's directory, last modified `days` before the pass start.
    fn file(&self, name: &str, content: &[u8], days: f64) -> PathBuf {
        let path = self.root.join(self.agent.to_string()).join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        age(&path, days);
        path
    }
}

fn age(path: &Path, days: f64) {
    let at = pass_start() - chrono::Duration::seconds((days * 86_400.0) as i64);
    common::fixture::set_mtime(path, at);
}

/// A run of the cleaner over the traces of `t`: with `confirm`, holding the root's lease.
async fn clean(pool: &PgPool, t: &Traces, limits: Limits, confirm: bool) -> TraceReport {
    common::migrate(pool).await;
    clean_watched(pool, t, limits, confirm, &mut Quiet).await
}

async fn clean_watched(
    pool: &PgPool,
    t: &Traces,
    limits: Limits,
    confirm: bool,
    observer: &mut dyn Observer,
) -> TraceReport {
    let mut conn = pool.acquire().await.unwrap();
    let store = t.store();
    let mut lease = match confirm {
        true => Some(Lease::take(&mut conn, &store, "the test").await.unwrap()),
        false => None,
    };
    let report = job::clean(
        &mut conn,
        &store,
        limits,
        pass_start(),
        lease.as_mut(),
        observer,
        &AtomicBool::new(false),
    )
    .await
    .unwrap();
    if let Some(lease) = lease {
        lease.release(&mut conn).await.unwrap();
    }
    report
}

fn age_limit(days: i32) -> Limits {
    Limits {
        max_age_days: days,
        max_bytes: 0,
    }
}

#[sqlx::test]
async fn tr2_traces_older_than_the_age_go_younger_ones_stay(pool: PgPool) {
    let t = Traces::new();
    let old = t.trace("old.trace.jsonl", Uuid::new_v4(), 31.0, 10);
    let young = t.trace("young.trace.jsonl", Uuid::new_v4(), 29.0, 10);

    let dry = clean(&pool, &t, age_limit(30), false).await;
    assert!(old.exists(), "a dry run deletes nothing");
    assert_eq!(dry.planned.get("age"), Some(&1));

    let report = clean(&pool, &t, age_limit(30), true).await;
    assert!(!old.exists());
    assert!(young.exists());
    assert_eq!((report.candidates, report.deleted), (2, 1));
}

#[sqlx::test]
async fn tr2_with_no_quota_a_trace_younger_than_the_age_is_not_read(pool: PgPool) {
    let t = Traces::new();
    let young_bad = t.file("young-bad.trace.jsonl", b"not a signature\n", 10.0);
    let old_bad = t.file("old-bad.trace.jsonl", b"not a signature\n", 40.0);
    let old = t.trace("old.trace.jsonl", Uuid::new_v4(), 40.0, 10);
    let young = t.trace("young.trace.jsonl", Uuid::new_v4(), 10.0, 10);

    let report = clean(&pool, &t, age_limit(30), true).await;

    assert!(!old.exists(), "the control: an old trace goes");
    assert!(young.exists() && young_bad.exists() && old_bad.exists());
    // Only the old files' first lines were read: one bad signature is found, not two.
    assert_eq!(report.kept.get("bad_signature"), Some(&1), "{report:?}");
    assert_eq!((report.candidates, report.deleted), (3, 1), "{report:?}");

    // With a quota every trace may go, so every one is read.
    let quota = Limits {
        max_age_days: 30,
        max_bytes: 1 << 40,
    };
    let report = clean(&pool, &t, quota, true).await;
    assert_eq!(report.kept.get("bad_signature"), Some(&2), "{report:?}");
    assert_eq!(report.candidates, 1, "{report:?}");
    assert!(young.exists() && young_bad.exists() && old_bad.exists());
}

#[sqlx::test]
async fn tr2_over_quota_the_oldest_go_first_and_a_sparse_file_counts_by_its_blocks(pool: PgPool) {
    let t = Traces::new();
    // The oldest is sparse: a gigabyte long, a few blocks allocated.
    let sparse = t.trace("sparse.trace.jsonl", Uuid::new_v4(), 10.0, 0);
    std::fs::File::options()
        .write(true)
        .open(&sparse)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    age(&sparse, 10.0);
    let a = t.trace("a.trace.jsonl", Uuid::new_v4(), 9.0, 20_000);
    let b = t.trace("b.trace.jsonl", Uuid::new_v4(), 8.0, 20_000);
    let c = t.trace("c.trace.jsonl", Uuid::new_v4(), 7.0, 20_000);
    assert!(
        backend::allocated(&sparse) < 1 << 20,
        "the file system keeps it sparse"
    );
    let total: u64 = [&sparse, &a, &b, &c]
        .iter()
        .map(|p| backend::allocated(p))
        .sum();

    // Within the quota once the sparse file goes: by length it would take all of them.
    let limits = Limits {
        max_age_days: 0,
        max_bytes: total - backend::allocated(&sparse),
    };
    let report = clean(&pool, &t, limits, true).await;
    assert!(!sparse.exists());
    assert!(a.exists() && b.exists() && c.exists());
    assert_eq!(report.planned.get("quota"), Some(&1));

    // A tighter quota takes the next oldest too, and only it.
    let limits = Limits {
        max_age_days: 0,
        max_bytes: backend::allocated(&b) + backend::allocated(&c),
    };
    clean(&pool, &t, limits, true).await;
    assert!(!a.exists());
    assert!(b.exists() && c.exists());
}

#[sqlx::test]
async fn tr2_age_first_then_quota_over_what_remains(pool: PgPool) {
    let t = Traces::new();
    let ancient = t.trace("ancient.trace.jsonl", Uuid::new_v4(), 100.0, 50_000);
    let older = t.trace("older.trace.jsonl", Uuid::new_v4(), 5.0, 20_000);
    let newer = t.trace("newer.trace.jsonl", Uuid::new_v4(), 1.0, 20_000);
    let limits = Limits {
        max_age_days: 30,
        max_bytes: backend::allocated(&newer),
    };
    let report = clean(&pool, &t, limits, true).await;
    assert!(!ancient.exists() && !older.exists());
    assert!(newer.exists());
    assert_eq!(report.planned.get("age"), Some(&1));
    assert_eq!(report.planned.get("quota"), Some(&1));
}

#[sqlx::test]
async fn tr3_symlinks_bad_signatures_and_odd_files_are_counted_never_deleted(pool: PgPool) {
    let t = Traces::new();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.trace.jsonl");
    let signature = format!(
        "{{\"format\":\"run-trace/1\",\"agent_id\":\"{}\",\"session_id\":\"{}\"}}\n",
        t.agent,
        Uuid::new_v4()
    );
    std::fs::write(&secret, &signature).unwrap();
    age(&secret, 400.0);
    let agent_dir = t.root.join(t.agent.to_string());
    std::fs::create_dir_all(&agent_dir).unwrap();
    // A symlinked file and a symlinked directory leading out of the root.
    std::os::unix::fs::symlink(&secret, agent_dir.join("link.trace.jsonl")).unwrap();
    std::os::unix::fs::symlink(outside.path(), t.root.join("escape")).unwrap();
    let bad = [
        t.file("not-json.trace.jsonl", b"hello\n", 400.0),
        t.file(
            "wrong-format.trace.jsonl",
            br#"{"format":"run-trace/2","agent_id":"a","session_id":"s"}"#,
            400.0,
        ),
        t.file(
            "no-session.trace.jsonl",
            br#"{"format":"run-trace/1","agent_id":"a"}"#,
            400.0,
        ),
        t.file(
            "numeric-agent.trace.jsonl",
            br#"{"format":"run-trace/1","agent_id":7,"session_id":"s"}"#,
            400.0,
        ),
        t.file("array.trace.jsonl", b"[1,2]\n", 400.0),
        t.file("empty.trace.jsonl", b"", 400.0),
    ];
    let other_name = t.file("notes.txt", b"keep", 400.0);
    let good = t.trace("good.trace.jsonl", Uuid::new_v4(), 400.0, 10);

    let report = clean(&pool, &t, age_limit(30), true).await;

    assert!(secret.exists(), "nothing outside the root is ever deleted");
    assert!(
        agent_dir
            .join("link.trace.jsonl")
            .symlink_metadata()
            .is_ok()
    );
    for file in &bad {
        assert!(file.exists(), "{} has no valid signature", file.display());
    }
    assert!(other_name.exists());
    assert!(!good.exists(), "the control: a valid old trace goes");
    assert_eq!(report.kept.get("bad_signature"), Some(&(bad.len() as u64)));
    assert_eq!(report.kept.get("outside_root"), Some(&2));
    assert_eq!(report.deleted, 1);
}

#[sqlx::test]
async fn tr3_the_trace_of_a_live_session_stays(pool: PgPool) {
    common::migrate(&pool).await;
    let account = fixture::account(&pool, Some(90)).await;
    let agent = fixture::agent(&pool, account).await;
    let current =
        fixture::session(&pool, account, agent, "task", 0, Some("current_session_id")).await;
    let main = fixture::session(&pool, account, agent, "main", 0, Some("main_session_id")).await;
    let t = Traces::new();
    let of_current = t.trace("current.trace.jsonl", current, 100.0, 10);
    let of_main = t.trace("main.trace.jsonl", main, 100.0, 10);
    let of_gone = t.trace("gone.trace.jsonl", Uuid::new_v4(), 100.0, 10);

    let report = clean(&pool, &t, age_limit(30), true).await;

    assert!(of_current.exists() && of_main.exists());
    assert!(!of_gone.exists());
    assert_eq!(report.kept.get("live_session"), Some(&2));
}

/// Deletes one planned file and rewrites another just before the batch is deleted.
struct Meddler {
    root: PathBuf,
}

impl Observer for Meddler {
    fn before_delete(&mut self, batch: &[Planned]) {
        for file in batch {
            let path = self.root.join(file.raw_path());
            if file.path.ends_with("vanishes.trace.jsonl") {
                std::fs::remove_file(&path).unwrap();
            }
            if file.path.ends_with("rewritten.trace.jsonl") {
                let content = std::fs::read(&path).unwrap();
                std::fs::write(&path, [content.as_slice(), b"more\n"].concat()).unwrap();
            }
        }
    }
}

#[sqlx::test]
async fn er3_a_file_deleted_or_rewritten_between_plan_and_delete_is_not_deleted_blindly(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let t = Traces::new();
    let vanishes = t.trace("vanishes.trace.jsonl", Uuid::new_v4(), 100.0, 10);
    let rewritten = t.trace("rewritten.trace.jsonl", Uuid::new_v4(), 100.0, 10);
    let plain = t.trace("plain.trace.jsonl", Uuid::new_v4(), 100.0, 10);
    let mut meddler = Meddler {
        root: t.root.clone(),
    };

    let report = clean_watched(&pool, &t, age_limit(30), true, &mut meddler).await;

    assert!(!vanishes.exists());
    assert!(
        rewritten.exists(),
        "written just now: no longer past the age"
    );
    assert!(!plain.exists(), "the control goes");
    assert_eq!(report.kept.get("vanished"), Some(&1));
    assert_eq!(report.kept.get("changed"), Some(&1));
    assert_eq!(report.deleted, 1);
}

#[sqlx::test]
async fn tr3_a_second_cleaner_reports_the_lease_holder_deletes_nothing_and_exits_1(pool: PgPool) {
    common::migrate(&pool).await;
    let url = common::database_url(&pool).await;
    let t = Traces::new();
    let old = t.trace("old.trace.jsonl", Uuid::new_v4(), 100.0, 10);
    let cli = || {
        let mut cmd = common::sexton(&url, t.dir.path());
        cmd.args(["traces", "clean", "--confirm"])
            .env("SEXTON_TRACES__MAX_AGE_DAYS", "30");
        cmd
    };

    let mut conn = pool.acquire().await.unwrap();
    let store = t.store();
    let lease = Lease::take(&mut conn, &store, "the test's cleaner pid=1")
        .await
        .unwrap();
    let held = cli().output().await.unwrap();
    assert_eq!(held.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&held.stderr);
    assert!(stderr.contains("the test's cleaner pid=1"), "{stderr}");
    assert!(old.exists(), "nothing deleted while the lease is held");

    lease.release(&mut conn).await.unwrap();
    let free = cli().output().await.unwrap();
    assert_eq!(free.status.code(), Some(0));
    assert!(!old.exists(), "the control: with the lease free, it goes");
    match store {
        // The file stays, naming its last holder; the row lease is gone with its cleaner.
        Store::Local(root) => {
            let holder = std::fs::read_to_string(root.join(job::LEASE_FILE)).unwrap();
            assert!(
                holder.contains("sexton traces clean") && holder.contains("pid="),
                "{holder}"
            );
        }
        Store::Object(_) => {
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.trace_leases")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(rows, 0, "released when the cleaner is done");
        }
    }
}

#[sqlx::test]
async fn tr4_the_dry_run_prints_the_plan_and_confirm_deletes_it(pool: PgPool) {
    common::migrate(&pool).await;
    let url = common::database_url(&pool).await;
    let t = Traces::new();
    let old = t.trace("old.trace.jsonl", Uuid::new_v4(), 100.0, 10);
    let young = t.trace("young.trace.jsonl", Uuid::new_v4(), 1.0, 10);
    let cli = |args: &[&str]| {
        let mut cmd = common::sexton(&url, t.dir.path());
        // The CLI measures from the database's now, a month after the fixtures' pass start.
        cmd.args(["traces", "clean"])
            .args(args)
            .env("SEXTON_TRACES__MAX_AGE_DAYS", "60");
        cmd
    };

    let dry = cli(&[]).output().await.unwrap();
    assert_eq!(dry.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&dry.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("old.trace.jsonl"))
        .unwrap_or_else(|| panic!("a line for the old trace in: {stdout}"));
    assert!(line.contains("bytes") && line.ends_with("age"), "{line}");
    assert!(!stdout.contains("young.trace.jsonl"));
    assert!(stdout.contains("dry run: nothing was deleted"), "{stdout}");
    assert!(old.exists());

    let json = cli(&["--json"]).output().await.unwrap();
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["files"].as_array().unwrap().len(), 1);
    assert_eq!(value["files"][0]["reason"], "age");
    assert_eq!(value["totals"]["confirmed"], false);

    let confirmed = cli(&["--confirm"]).output().await.unwrap();
    assert_eq!(confirmed.status.code(), Some(0));
    assert!(!old.exists());
    assert!(young.exists());
}

#[sqlx::test]
async fn tr1_enabled_without_a_limit_is_refused_naming_both_settings(pool: PgPool) {
    let url = common::database_url(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let refused = common::sexton(&url, dir.path())
        .arg("check-config")
        .env("SEXTON_TRACES__ENABLED", "true")
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("traces.max_age_days") && stderr.contains("traces.max_bytes"),
        "{stderr}"
    );
    for limit in ["SEXTON_TRACES__MAX_AGE_DAYS", "SEXTON_TRACES__MAX_BYTES"] {
        let accepted = common::sexton(&url, dir.path())
            .arg("check-config")
            .env("SEXTON_TRACES__ENABLED", "true")
            .env(limit, "1000")
            .output()
            .await
            .unwrap();
        assert_eq!(accepted.status.code(), Some(0), "{limit}");
    }
    let no_limit_cli = common::sexton(&url, dir.path())
        .args(["traces", "clean"])
        .output()
        .await
        .unwrap();
    assert_eq!(no_limit_cli.status.code(), Some(2));
}

async fn trace_jobs(pool: &PgPool) -> Vec<(String, Option<DateTime<Utc>>)> {
    sqlx::query_as(
        "SELECT status, done_at FROM apalis.jobs WHERE job_type = 'sexton.trace_cleanup'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn tr4_the_background_job_runs_once_per_period_fleet_wide_only_when_enabled(pool: PgPool) {
    common::migrate(&pool).await;
    let url = common::database_url(&pool).await;
    let t = Traces::new();
    let old = t.trace("old.trace.jsonl", Uuid::new_v4(), 100.0, 10);

    // Disabled: a nightly pass of every job leaves traces alone.
    let settings = common::settings(t.dir.path());
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    common::run_until_idle(&pool, t.dir.path()).await;
    assert!(old.exists(), "trace retention is off by default");
    assert!(trace_jobs(&pool).await.is_empty());

    // Enabled: two replicas, one period (a day), one run.
    let worker = || {
        let mut cmd = fleet_worker(&url, t.dir.path());
        cmd.env("SEXTON_TRACES__ENABLED", "true")
            .env("SEXTON_TRACES__MAX_AGE_DAYS", "30")
            .env("SEXTON_TRACES__CADENCE_MINUTES", "1440");
        cmd
    };
    let (a, b) = (Proc::spawn(worker()), Proc::spawn(worker()));
    poll_until(Duration::from_secs(60), || async { !old.exists() }).await;
    // Each replica pushes the period of every kind on a cadence of its own (erasure too).
    a.wait_for_job(event::PERIOD_PUSHED, "trace_cleanup").await;
    b.wait_for_job(event::PERIOD_PUSHED, "trace_cleanup").await;
    common::process::wait_until_idle(&pool).await;
    let mut lines = a.stop().await;
    lines.extend(b.stop().await);
    // Both replicas pushed the period: one enqueued it, the other found it there.
    let periods: Vec<serde_json::Value> = events(&lines, event::PERIOD_PUSHED)
        .filter(|e| e["job"] == "trace_cleanup")
        .collect();
    let said = |outcome: &str| periods.iter().filter(|e| e["outcome"] == outcome).count();
    assert_eq!((said("enqueued"), said("duplicate")), (1, 1), "{periods:?}");
    let jobs = trace_jobs(&pool).await;
    assert_eq!(
        jobs.len(),
        1,
        "one run for the period across the fleet: {jobs:?}"
    );
    assert_eq!(jobs[0].0, "Done");
    let finished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sexton.passes WHERE job = 'trace_cleanup' AND finished_at IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(finished, 1);
}

#[sqlx::test]
async fn tr3_a_live_session_spelled_otherwise_still_stays_and_a_non_uuid_session_is_kept(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let account = fixture::account(&pool, Some(90)).await;
    let agent = fixture::agent(&pool, account).await;
    let current =
        fixture::session(&pool, account, agent, "task", 0, Some("current_session_id")).await;
    let t = Traces::new();
    let spelled = |session: String| {
        format!(
            "{{\"format\":\"run-trace/1\",\"agent_id\":\"{}\",\"session_id\":\"{session}\"}}\n",
            t.agent
        )
    };
    let upper = t.file(
        "upper.trace.jsonl",
        spelled(current.to_string().to_uppercase()).as_bytes(),
        100.0,
    );
    let braced = t.file(
        "braced.trace.jsonl",
        spelled(format!("{{{current}}}")).as_bytes(),
        100.0,
    );
    let not_uuid = t.file(
        "not-uuid.trace.jsonl",
        spelled("session-7".into()).as_bytes(),
        100.0,
    );
    let control = t.trace("gone.trace.jsonl", Uuid::new_v4(), 100.0, 10);

    let report = clean(&pool, &t, age_limit(30), true).await;

    assert!(
        upper.exists() && braced.exists(),
        "the same session, spelled otherwise"
    );
    assert!(not_uuid.exists(), "no proof that it is not live");
    assert!(!control.exists());
    assert_eq!(report.kept.get("live_session"), Some(&2));
    assert_eq!(report.kept.get("bad_signature"), Some(&1));
}

#[sqlx::test]
async fn tr2_live_traces_count_toward_the_quota_and_the_next_oldest_go_instead(pool: PgPool) {
    common::migrate(&pool).await;
    let account = fixture::account(&pool, Some(90)).await;
    let agent = fixture::agent(&pool, account).await;
    let main = fixture::session(&pool, account, agent, "main", 0, Some("main_session_id")).await;
    let t = Traces::new();
    let live = t.trace("live.trace.jsonl", main, 10.0, 20_000);
    let a = t.trace("a.trace.jsonl", Uuid::new_v4(), 9.0, 20_000);
    let b = t.trace("b.trace.jsonl", Uuid::new_v4(), 8.0, 20_000);
    let c = t.trace("c.trace.jsonl", Uuid::new_v4(), 7.0, 20_000);
    let limits = Limits {
        max_age_days: 0,
        max_bytes: backend::allocated(&live) + backend::allocated(&c),
    };

    let dry = clean(&pool, &t, limits, false).await;
    assert_eq!(
        dry.planned.get("quota"),
        Some(&2),
        "the dry run plans what will go"
    );
    let report = clean(&pool, &t, limits, true).await;

    assert!(live.exists() && c.exists());
    assert!(!a.exists() && !b.exists());
    assert_eq!(report.kept.get("live_session"), Some(&1));
}

#[sqlx::test]
async fn tr2_more_equally_old_traces_than_are_sorted_in_memory_still_meet_the_quota(pool: PgPool) {
    let t = Traces::new();
    let mut files = Vec::new();
    for n in 0..21_000 {
        files.push(t.trace(&format!("t{n}.trace.jsonl"), Uuid::new_v4(), 5.0, 0));
    }
    let each = backend::allocated(&files[0]);
    let limits = Limits {
        max_age_days: 0,
        max_bytes: each * 10_000,
    };

    let report = clean(&pool, &t, limits, true).await;

    let left = files.iter().filter(|f| f.exists()).count() as u64;
    assert_eq!(left, 10_000, "exactly within the quota");
    assert_eq!(report.deleted, 11_000);
}

#[sqlx::test]
async fn tr3_a_lease_file_that_is_a_hard_link_is_refused_and_its_target_left_whole(pool: PgPool) {
    common::migrate(&pool).await;
    let url = common::database_url(&pool).await;
    let t = Traces::new();
    let old = t.trace("old.trace.jsonl", Uuid::new_v4(), 100.0, 10);
    let precious = t.dir.path().join("precious.txt");
    std::fs::write(&precious, b"must not be truncated").unwrap();
    std::fs::hard_link(&precious, t.root.join(job::LEASE_FILE)).unwrap();
    let cli = || {
        let mut cmd = common::sexton(&url, t.dir.path());
        cmd.args(["traces", "clean", "--confirm"])
            .env("SEXTON_TRACES__MAX_AGE_DAYS", "60");
        cmd
    };

    let refused = cli().output().await.unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(std::fs::read(&precious).unwrap(), b"must not be truncated");
    assert!(old.exists());

    std::fs::remove_file(t.root.join(job::LEASE_FILE)).unwrap();
    let accepted = cli().output().await.unwrap();
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "the control: a lease sexton creates"
    );
    assert!(!old.exists());
}

#[sqlx::test]
async fn tr4_a_cadence_longer_than_the_queue_keeps_its_keys_and_roots_overlapping_artifacts_are_refused(
    pool: PgPool,
) {
    let url = common::database_url(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let check = |envs: &[(&str, String)]| {
        let mut cmd = common::sexton(&url, dir.path());
        cmd.arg("check-config")
            .env("SEXTON_TRACES__ENABLED", "true")
            .env("SEXTON_TRACES__MAX_AGE_DAYS", "30");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd
    };
    let long = check(&[("SEXTON_TRACES__CADENCE_MINUTES", (8 * 1440).to_string())])
        .output()
        .await
        .unwrap();
    assert_eq!(long.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&long.stderr).contains("traces.cadence_minutes"));
    let week = check(&[("SEXTON_TRACES__CADENCE_MINUTES", (7 * 1440).to_string())])
        .output()
        .await
        .unwrap();
    assert_eq!(
        week.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&week.stderr)
    );

    let inside = dir.path().join("artifacts").join("traces");
    std::fs::create_dir_all(&inside).unwrap();
    let overlapping = check(&[("SEXTON_PATHS__TRACES_ROOT", inside.display().to_string())])
        .output()
        .await
        .unwrap();
    assert_eq!(overlapping.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&overlapping.stderr).contains("paths.traces_root"));
}

/// A name of raw bytes, not UTF-8.
fn raw(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

/// Every path the cleaner planned, as it shows them.
#[derive(Default)]
struct Shown(Vec<String>);

impl Observer for Shown {
    fn planned(&mut self, file: &Planned) {
        self.0.push(file.path.clone());
    }
}

#[sqlx::test]
async fn tr2_tr3_a_trace_whose_names_are_not_utf8_is_cleaned_like_any_other(pool: PgPool) {
    common::migrate(&pool).await;
    let account = fixture::account(&pool, Some(90)).await;
    let agent = fixture::agent(&pool, account).await;
    let main = fixture::session(&pool, account, agent, "main", 0, Some("main_session_id")).await;
    let t = Traces::new();
    let odd_dir = t.root.join(raw(b"agent-\xff\xfe"));
    let agent_dir = t.root.join(t.agent.to_string());
    // Old, signed, named *.trace.jsonl: under a directory whose name is not UTF-8, and with a
    // file name that is not UTF-8 (in an ordinary directory and in the odd one).
    let in_odd_dir = t.trace_at(&odd_dir.join("old.trace.jsonl"), Uuid::new_v4(), 100.0, 10);
    let odd_name = t.trace_at(
        &agent_dir.join(raw(b"\xff\xfe.trace.jsonl")),
        Uuid::new_v4(),
        100.0,
        10,
    );
    let both_odd = t.trace_at(
        &odd_dir.join(raw(b"run-\xc3.trace.jsonl")),
        Uuid::new_v4(),
        100.0,
        10,
    );
    // What must stay. Young, with a name that shows exactly as the old one's does: a literal
    // U+FFFD name (what the lossy rendering of b"\xff\xfe" reads as) and b"\xfe\xff".
    let young_literal = t.trace_at(
        &agent_dir.join("\u{FFFD}\u{FFFD}.trace.jsonl"),
        Uuid::new_v4(),
        1.0,
        10,
    );
    let young_odd = t.trace_at(
        &agent_dir.join(raw(b"\xfe\xff.trace.jsonl")),
        Uuid::new_v4(),
        1.0,
        10,
    );
    // A live session's old trace, both names odd.
    let live = t.trace_at(
        &odd_dir.join(raw(b"live-\xff.trace.jsonl")),
        main,
        100.0,
        10,
    );
    // Old and signed, but not named *.trace.jsonl.
    let not_a_trace = t.trace_at(
        &odd_dir.join(raw(b"old-\xff.trace.json")),
        Uuid::new_v4(),
        100.0,
        10,
    );
    // A symlink with an odd name leading out of the root, to an old signed trace.
    let outside = tempfile::tempdir().unwrap();
    let secret = t.trace_at(
        &outside.path().join("secret.trace.jsonl"),
        Uuid::new_v4(),
        100.0,
        10,
    );
    let link = odd_dir.join(raw(b"link-\xff.trace.jsonl"));
    std::os::unix::fs::symlink(&secret, &link).unwrap();

    let mut shown = Shown::default();
    let dry = clean_watched(&pool, &t, age_limit(30), false, &mut shown).await;
    assert_eq!(dry.planned.get("age"), Some(&3), "{dry:?}");
    assert!(in_odd_dir.exists() && odd_name.exists() && both_odd.exists());
    shown.0.sort();
    let mut expected = vec![
        format!("{}/\u{FFFD}\u{FFFD}.trace.jsonl", t.agent),
        "agent-\u{FFFD}\u{FFFD}/old.trace.jsonl".to_owned(),
        "agent-\u{FFFD}\u{FFFD}/run-\u{FFFD}.trace.jsonl".to_owned(),
    ];
    expected.sort();
    assert_eq!(shown.0, expected, "shown lossily");

    let report = clean(&pool, &t, age_limit(30), true).await;

    assert!(
        !in_odd_dir.exists(),
        "under a directory whose name is not UTF-8"
    );
    assert!(!odd_name.exists(), "a file name that is not UTF-8");
    assert!(!both_odd.exists(), "both");
    assert!(
        young_literal.exists() && young_odd.exists(),
        "young, shown alike"
    );
    assert!(live.exists(), "a live session's trace stays");
    assert!(not_a_trace.exists(), "not named *.trace.jsonl");
    assert!(
        secret.exists() && link.symlink_metadata().is_ok(),
        "a symlink is never followed"
    );
    assert_eq!(report.deleted, 3, "{report:?}");
    assert_eq!(report.candidates, 6, "{report:?}");
    assert_eq!(report.kept.get("unreadable"), None, "{report:?}");
    assert_eq!(report.kept.get("live_session"), Some(&1));
    assert_eq!(report.kept.get("outside_root"), Some(&1));
}

#[sqlx::test]
async fn tr2_over_quota_traces_whose_names_are_not_utf8_count_and_go_oldest_first(pool: PgPool) {
    let t = Traces::new();
    let odd_dir = t.root.join(raw(b"agent-\xff"));
    let oldest = t.trace_at(
        &odd_dir.join(raw(b"\xff.trace.jsonl")),
        Uuid::new_v4(),
        9.0,
        20_000,
    );
    // Two equally old whose names show alike ("\u{FFFD}-x"): the quota needs one of them gone,
    // not both.
    let tie_a = t.trace_at(
        &odd_dir.join(raw(b"\xfe-x.trace.jsonl")),
        Uuid::new_v4(),
        8.0,
        20_000,
    );
    let tie_b = t.trace_at(
        &odd_dir.join(raw(b"\xfd-x.trace.jsonl")),
        Uuid::new_v4(),
        8.0,
        20_000,
    );
    let newest = t.trace_at(
        &odd_dir.join(raw(b"\xfc.trace.jsonl")),
        Uuid::new_v4(),
        7.0,
        20_000,
    );
    let each = backend::allocated(&oldest);
    assert!(
        [&tie_a, &tie_b, &newest]
            .iter()
            .all(|p| backend::allocated(p) == each)
    );
    let limits = Limits {
        max_age_days: 0,
        max_bytes: 2 * each,
    };

    let report = clean(&pool, &t, limits, true).await;

    assert!(!oldest.exists(), "the oldest goes first");
    assert!(newest.exists());
    assert_eq!(
        [&tie_a, &tie_b].iter().filter(|p| p.exists()).count(),
        1,
        "exactly one of the two equally old: {report:?}"
    );
    assert_eq!(report.candidates, 4, "{report:?}");
    assert_eq!(report.planned.get("quota"), Some(&2), "{report:?}");
    assert_eq!(report.deleted, 2);
}

#[sqlx::test]
async fn tr3_os2_an_object_roots_lease_is_a_row_one_holder_at_a_time_and_taken_over_once_expired(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    // Taking and releasing the lease of an object root reaches the database alone.
    let storage = backend::storage("http://127.0.0.1:9");
    let root = sexton_jobs::files::object::ObjectRoot::new("platform", "traces", &storage).unwrap();
    let store = Store::Object(std::sync::Arc::new(root));
    let mut conn = pool.acquire().await.unwrap();
    let holders = || async {
        sqlx::query_scalar::<_, String>("SELECT holder FROM sexton.trace_leases")
            .fetch_all(&pool)
            .await
            .unwrap()
    };

    let first = Lease::take(&mut conn, &store, "cleaner A pid=1")
        .await
        .unwrap();
    let refused = Lease::take(&mut conn, &store, "cleaner B pid=2").await;
    assert!(
        matches!(&refused, Err(job::Error::LeaseHeld { holder }) if holder.contains("cleaner A")),
        "{refused:?}"
    );
    assert_eq!(holders().await, ["cleaner A pid=1"]);

    // A holder that stopped renewing: once its row expires, the next cleaner takes it over, and
    // the old holder's release leaves the new holder's row alone.
    sqlx::query("UPDATE sexton.trace_leases SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let second = Lease::take(&mut conn, &store, "cleaner B pid=2")
        .await
        .unwrap();
    assert_eq!(holders().await, ["cleaner B pid=2"]);
    first.release(&mut conn).await.unwrap();
    assert_eq!(
        holders().await,
        ["cleaner B pid=2"],
        "released by its old holder"
    );
    second.release(&mut conn).await.unwrap();
    assert!(holders().await.is_empty());
}
