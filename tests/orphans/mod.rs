//! Derivative cleanup (SPEC §12, DC-1 … DC-5) on real files in temp dirs: every kind of orphan
//! goes and what a row owns stays (under any spelling); the grace keeps what may be in the
//! making; a row that appears between the judgement and the unlink keeps its file (the window
//! held open for real on the hold gate); holds keep what they can reach; symlinks and what lies
//! outside every root are never touched; the CLI's dry run lists exactly what `--confirm` then
//! removes; bad roots and hostile names are reported, never a crash; and the counts per root and
//! reason reach the report, the ledger and `status`. They run again with their roots in a bucket
//! of a real S3-compatible server (scripts/test.sh); those about what only a local root has
//! (symlinks, byte names, a missing directory, permissions) return early there.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::files::Root;
use sexton_jobs::files::object::ObjectRoot;
use sexton_jobs::orphans::{Listed, Observer, OrphanReport, Quiet, ROOTS, Scan};
use sqlx::PgPool;
use uuid::Uuid;

mod process;

use crate::common::fixture::{self, pass_start};
use crate::common::{self, backend};

/// File roots in a temp dir, an account with a run and a session, and the moment scans run at.
struct World {
    dir: tempfile::TempDir,
    account: Uuid,
    run: Uuid,
    agent: Uuid,
    session: Uuid,
    /// What files are aged back from.
    now: DateTime<Utc>,
}

impl World {
    async fn new(pool: &PgPool) -> Self {
        Self::at(pool, pass_start()).await
    }

    /// A world aged back from the database's now: for the tests that run the `sexton` binary,
    /// whose scans take the database's clock.
    async fn at_database_now(pool: &PgPool) -> Self {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(pool)
            .await
            .unwrap();
        Self::at(pool, now).await
    }

    async fn at(pool: &PgPool, now: DateTime<Utc>) -> Self {
        common::migrate(pool).await;
        let dir = backend::tempdir();
        for root in ["outputs", "attachments", "artifacts", "sessions", "traces"] {
            std::fs::create_dir_all(dir.path().join(root)).unwrap();
        }
        let account = fixture::account(pool, Some(90)).await;
        let run = run(pool, account).await;
        let agent = fixture::agent(pool, account).await;
        let session = fixture::session(pool, account, agent, "task", 1, None).await;
        Self {
            dir,
            account,
            run,
            agent,
            session,
            now,
        }
    }

    fn path(&self, root: &str, relative: &str) -> PathBuf {
        self.dir.path().join(root).join(relative)
    }

    /// A file at `relative` (its bytes) under `root`, last modified `days` before `now`.
    fn put_bytes(&self, root: &str, relative: &[u8], days: f64) -> PathBuf {
        let path = self.dir.path().join(root).join(OsStr::from_bytes(relative));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"0123456789").unwrap();
        age(&path, self.now, days);
        path
    }

    fn put(&self, root: &str, relative: &str, days: f64) -> PathBuf {
        self.put_bytes(root, relative.as_bytes(), days)
    }

    /// A scan of every root (or `roots`), confirmed or not, at `now`.
    async fn scan(&self, pool: &PgPool, roots: &[Root], confirm: bool) -> OrphanReport {
        self.scan_watched(pool, roots, confirm, &mut Quiet).await
    }

    async fn scan_watched(
        &self,
        pool: &PgPool,
        roots: &[Root],
        confirm: bool,
        observer: &mut dyn Observer,
    ) -> OrphanReport {
        let paths = backend::paths(self.dir.path());
        let scan = Scan {
            paths: &paths,
            roots,
            grace_days: 7,
            now: self.now,
            confirm,
        };
        let mut conn = pool.acquire().await.unwrap();
        scan.run(&mut conn, observer, &AtomicBool::new(false))
            .await
            .unwrap()
    }
}

fn age(path: &Path, now: DateTime<Utc>, days: f64) {
    let at = now - chrono::Duration::seconds((days * 86_400.0) as i64);
    common::fixture::set_mtime(path, at);
}

/// Sets a directory's modification time (a directory is aged like its files).
fn age_dir(path: &Path, now: DateTime<Utc>, days: f64) {
    let at = now - chrono::Duration::seconds((days * 86_400.0) as i64);
    common::fixture::set_mtime(path, at);
}

async fn run(pool: &PgPool, account: Uuid) -> Uuid {
    sqlx::query_scalar("INSERT INTO runs (account_id, kind) VALUES ($1, 'standalone') RETURNING id")
        .bind(account)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn output_row(pool: &PgPool, run: Uuid, relative: &str) {
    sqlx::query("INSERT INTO output_files (run_id, relative_path) VALUES ($1, $2)")
        .bind(run)
        .bind(relative)
        .execute(pool)
        .await
        .unwrap();
}

async fn archive(pool: &PgPool, session: Uuid) -> Uuid {
    sqlx::query_scalar("INSERT INTO conversation_archives (session_id) VALUES ($1) RETURNING id")
        .bind(session)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn hold(pool: &PgPool, scope: &str, id: Uuid) {
    sqlx::query(
        "INSERT INTO sexton.holds (scope, scope_id, case_ref, reason, placed_by)
         VALUES ($1, $2, 'CASE-58', 'litigation', 'legal@example')",
    )
    .bind(scope)
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
}

fn count(report: &OrphanReport, root: Root, reason: &str) -> u64 {
    report.roots[root.as_str()].of(reason)
}

/// Every kind of orphan, each beside what a row owns.
#[sqlx::test]
async fn dc1_every_kind_of_orphan_goes_and_what_a_row_owns_stays(pool: PgPool) {
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    // Outputs: a row names one file of the run's directory; its neighbour is no one's.
    output_row(&pool, r, &format!("{a}/{r}/kept.bin")).await;
    let output_kept = w.put("outputs", &format!("{a}/{r}/kept.bin"), 30.0);
    let output_orphan = w.put("outputs", &format!("{a}/{r}/orphan.bin"), 30.0);
    // Attachments: a live row keeps its file; a file no row names goes.
    sqlx::query("INSERT INTO attachments (account_id, relative_path) VALUES ($1, $2)")
        .bind(a)
        .bind(format!("{a}/kept.bin"))
        .execute(&pool)
        .await
        .unwrap();
    let attachment_kept = w.put("attachments", &format!("{a}/kept.bin"), 30.0);
    let attachment_orphan = w.put("attachments", &format!("{a}/orphan.bin"), 30.0);
    // Sessions: an existing session's frame with its archive row stays, one without goes, and
    // so does the whole directory of a session that no longer exists.
    let (s, kept_archive) = (w.session, archive(&pool, w.session).await);
    let frame_kept = w.put(
        "sessions",
        &format!("{s}/archive/compaction-{kept_archive}.frame"),
        30.0,
    );
    let frame_orphan = w.put(
        "sessions",
        &format!("{s}/archive/reset-{}.frame", Uuid::new_v4()),
        30.0,
    );
    let other_file = w.put("sessions", &format!("{s}/archive/notes.txt"), 30.0);
    let gone_session = Uuid::new_v4();
    w.put(
        "sessions",
        &format!("{gone_session}/archive/compaction-{}.frame", Uuid::new_v4()),
        30.0,
    );
    age_dir(
        &w.path("sessions", &format!("{gone_session}/archive")),
        w.now,
        30.0,
    );
    age_dir(&w.path("sessions", &gone_session.to_string()), w.now, 30.0);
    // Traces: an existing agent's directory stays; a gone agent's goes whole.
    let trace_kept = w.put("traces", &format!("{}/run.trace.jsonl", w.agent), 30.0);
    let gone_agent = Uuid::new_v4();
    w.put("traces", &format!("{gone_agent}/run.trace.jsonl"), 30.0);
    age_dir(&w.path("traces", &gone_agent.to_string()), w.now, 30.0);
    // Artifacts are never looked at (AT-1).
    let artifact = w.put("artifacts", &format!("{a}/orphan.bin"), 30.0);

    let report = w.scan(&pool, &ROOTS, true).await;

    for gone in [
        &output_orphan,
        &attachment_orphan,
        &frame_orphan,
        &w.path("sessions", &gone_session.to_string()),
        &w.path("traces", &gone_agent.to_string()),
    ] {
        assert!(backend::gone(gone), "{} should be gone", gone.display());
    }
    for kept in [
        &output_kept,
        &attachment_kept,
        &frame_kept,
        &other_file,
        &trace_kept,
        &artifact,
    ] {
        assert!(kept.exists(), "{} should stay", kept.display());
    }
    for root in ROOTS {
        let counts = &report.roots[root.as_str()];
        let expected = if root == Root::Sessions { 2 } else { 1 };
        assert_eq!(counts.of("no_row"), expected, "{root:?}: {counts:?}");
        assert_eq!(counts.gone, expected, "{root:?}: {counts:?}");
    }
}

/// A row naming the file under another spelling (EX-3's path key, a loose `..` path) keeps it.
#[sqlx::test]
async fn dc1_a_file_a_row_names_under_another_spelling_stays(pool: PgPool) {
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    output_row(&pool, r, &format!("./{a}//{r}/./spelled.bin")).await;
    output_row(&pool, r, &format!("{a}/elsewhere/../{r}/loose.bin")).await;
    let spelled = w.put("outputs", &format!("{a}/{r}/spelled.bin"), 30.0);
    let loose = w.put("outputs", &format!("{a}/{r}/loose.bin"), 30.0);
    let orphan = w.put("outputs", &format!("{a}/{r}/orphan.bin"), 30.0);
    // At the root's top, beside the directories the walkers share out.
    output_row(&pool, r, "./top.bin").await;
    let top = w.put("outputs", "top.bin", 30.0);
    let stray = w.put("outputs", "stray.bin", 30.0);

    let report = w.scan(&pool, &[Root::Outputs], true).await;

    assert!(spelled.exists() && loose.exists() && top.exists());
    assert!(!orphan.exists(), "the control: a file no row names goes");
    assert!(backend::gone(&stray), "and so does one at the root's top");
    assert_eq!(count(&report, Root::Outputs, "no_row"), 2);
}

/// Only what is older than the grace goes; a directory only when everything in it is.
#[sqlx::test]
async fn dc2_a_young_orphan_stays_for_the_grace(pool: PgPool) {
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    let young = w.put("outputs", &format!("{a}/{r}/young.bin"), 1.0);
    let old = w.put("outputs", &format!("{a}/{r}/old.bin"), 30.0);
    // A gone session's directory with one file still being written.
    let session = Uuid::new_v4();
    w.put("sessions", &format!("{session}/archive/a.frame"), 30.0);
    let writing = w.put("sessions", &format!("{session}/archive/b.frame"), 0.5);
    age_dir(
        &w.path("sessions", &format!("{session}/archive")),
        w.now,
        30.0,
    );
    age_dir(&w.path("sessions", &session.to_string()), w.now, 30.0);

    let report = w.scan(&pool, &[Root::Outputs, Root::Sessions], true).await;

    assert!(young.exists() && writing.exists());
    assert!(!old.exists(), "the control: an old orphan goes");
    assert_eq!(count(&report, Root::Outputs, "grace"), 1);
    assert_eq!(count(&report, Root::Sessions, "grace"), 1);
}

/// Waits until a backend of the test's database waits on an advisory lock (the hold gate);
/// fails after 60 s rather than hang. How the test sees its window was really hit.
async fn gate_waiters(pool: &PgPool) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if n > 0 {
            return n;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no scan waited at the hold gate within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A row committed after the scan judged a file, and before its unlink, keeps the file: the
/// scan is held at the hold gate (closed as `holds place` closes it) between the two while the
/// row is written.
#[sqlx::test]
async fn dc2_a_row_that_appears_between_the_scan_and_the_unlink_keeps_its_file(pool: PgPool) {
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    let appears = format!("{a}/{r}/appears.bin");
    let kept = w.put("outputs", &appears, 30.0);
    let goes = w.put("outputs", &format!("{a}/{r}/goes.bin"), 30.0);

    let (gate, scan) = scan_held_between_judgement_and_unlink(&pool, &w).await;
    output_row(&pool, r, &appears).await;
    gate.rollback().await.unwrap();
    let report = scan.await.unwrap();

    assert!(kept.exists(), "the file whose row appeared stays");
    assert!(!goes.exists(), "the control: the other orphan goes");
    assert_eq!(count(&report, Root::Outputs, "row_appeared"), 1);
    assert_eq!(report.roots["outputs"].gone, 1);
}

/// A confirmed scan of the outputs root, spawned and held (the holds' gate closed) between its
/// judgement and its unlinks — the window counted as hit — with the gate to open.
async fn scan_held_between_judgement_and_unlink(
    pool: &PgPool,
    w: &World,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    tokio::task::JoinHandle<OrphanReport>,
) {
    let mut gate = pool.begin().await.unwrap();
    sqlx::query("SELECT sexton.close_for_hold()")
        .execute(&mut *gate)
        .await
        .unwrap();
    let scan = {
        let (pool, paths) = (pool.clone(), backend::paths(w.dir.path()));
        let now = w.now;
        tokio::spawn(async move {
            let scan = Scan {
                paths: &paths,
                roots: &[Root::Outputs],
                grace_days: 7,
                now,
                confirm: true,
            };
            let mut conn = pool.acquire().await.unwrap();
            scan.run(&mut conn, &mut Quiet, &AtomicBool::new(false))
                .await
                .unwrap()
        })
    };
    let waiting = gate_waiters(pool).await;
    assert!(
        waiting >= 1,
        "the window between judgement and unlink was hit"
    );
    (gate, scan)
}

/// An orphan rewritten after it was judged (DC-2: a file changed since it was judged is judged
/// again) stays, counted `changed`, on disk and in the store; the other orphan goes. The scan is
/// held at its second look, between the judgement and the unlink, while the file is rewritten.
#[sqlx::test]
async fn dc2_an_orphan_rewritten_between_the_scan_and_the_unlink_is_judged_again(pool: PgPool) {
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    let rewritten = w.put("outputs", &format!("{a}/{r}/rewritten.bin"), 30.0);
    let goes = w.put("outputs", &format!("{a}/{r}/goes.bin"), 30.0);

    let (gate, scan) = scan_held_between_judgement_and_unlink(&pool, &w).await;
    std::fs::write(&rewritten, b"rewritten since it was judged").unwrap();
    age(&rewritten, w.now, 30.0);
    gate.rollback().await.unwrap();
    let report = scan.await.unwrap();

    assert!(rewritten.exists(), "the rewritten file stays");
    assert!(!goes.exists(), "the control: the other orphan goes");
    assert_eq!(count(&report, Root::Outputs, "changed"), 1);
    assert_eq!(report.roots["outputs"].gone, 1);
}

/// A held account's orphans stay (the path names the account); another account's go. A
/// directory whose owner row is gone cannot be tied to an account: under any account hold it
/// stays (HD-3), and a session hold keeps its own.
#[sqlx::test]
async fn dc2_a_held_accounts_orphan_stays(pool: PgPool) {
    let w = World::new(&pool).await;
    let other = fixture::account(&pool, Some(90)).await;
    let other_run = run(&pool, other).await;
    let (a, r) = (w.account, w.run);
    let held = w.put("outputs", &format!("{a}/{r}/held.bin"), 30.0);
    let free = w.put("outputs", &format!("{other}/{other_run}/free.bin"), 30.0);
    let gone_session = Uuid::new_v4();
    let session_dir = w.put("sessions", &format!("{gone_session}/x.frame"), 30.0);
    age_dir(&w.path("sessions", &gone_session.to_string()), w.now, 30.0);
    hold(&pool, "account", a).await;

    let report = w.scan(&pool, &[Root::Outputs, Root::Sessions], true).await;

    assert!(held.exists(), "the held account's orphan stays");
    assert!(!free.exists(), "the control: another account's orphan goes");
    assert!(
        session_dir.exists(),
        "an ownerless directory stays under an account hold"
    );
    assert_eq!(count(&report, Root::Outputs, "legal_hold"), 1);
    assert_eq!(count(&report, Root::Sessions, "legal_hold"), 1);
}

/// On the object store, a root whose listing fails (a bucket that does not exist) is reported
/// unreadable, naming the store; nothing is deleted there, and the other roots are scanned.
#[sqlx::test]
async fn dc4_a_store_root_that_cannot_be_listed_is_reported_unreadable(pool: PgPool) {
    let Some((endpoint, _)) = backend::server() else {
        return; // The store's counterpart of the test above.
    };
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    let orphan = w.put("outputs", &format!("{a}/{r}/orphan.bin"), 30.0);
    let stranded = w.put("attachments", &format!("{a}/stranded.bin"), 30.0);
    let mut paths = backend::paths(w.dir.path());
    let missing = ObjectRoot::new(
        "no-such-bucket",
        "attachments",
        &backend::storage(&endpoint),
    )
    .expect("an object root");
    paths.objects.retain(|(root, _)| *root != Root::Attachments);
    paths.objects.push((Root::Attachments, Arc::new(missing)));
    let scan = Scan {
        paths: &paths,
        roots: &[Root::Outputs, Root::Attachments],
        grace_days: 7,
        now: w.now,
        confirm: true,
    };
    let mut conn = pool.acquire().await.unwrap();

    let report = scan
        .run(&mut conn, &mut Quiet, &AtomicBool::new(false))
        .await
        .unwrap();

    let attachments = &report.roots["attachments"];
    assert_eq!(attachments.state, "unreadable");
    assert!(
        attachments
            .error
            .as_deref()
            .is_some_and(|error| error.contains("no-such-bucket")),
        "{:?}",
        attachments.error
    );
    assert!(stranded.exists(), "the real bucket's file is not reached");
    assert!(
        backend::gone(&orphan),
        "the control: the outputs root is scanned"
    );
}

/// Symlinks are neither followed nor removed, and nothing outside a root is touched.
#[sqlx::test]
async fn dc4_a_symlink_to_outside_and_a_file_outside_every_root_are_untouched(pool: PgPool) {
    if backend::server().is_some() {
        return; // A store has no symlinks, no byte names and no missing prefix: local roots only.
    }
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.bin");
    std::fs::write(&secret, b"keep").unwrap();
    age(&secret, w.now, 30.0);
    let beside = w.dir.path().join("beside.bin");
    std::fs::write(&beside, b"keep").unwrap();
    age(&beside, w.now, 30.0);
    std::fs::create_dir_all(w.path("outputs", &a.to_string())).unwrap();
    let link = w.path("outputs", &format!("{a}/link.bin"));
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    std::os::unix::fs::symlink(outside.path(), w.path("outputs", &format!("{a}/dir"))).unwrap();
    // A symlink named as a session that no longer exists, to a directory outside.
    let gone = Uuid::new_v4();
    std::os::unix::fs::symlink(outside.path(), w.path("sessions", &gone.to_string())).unwrap();
    let orphan = w.put("outputs", &format!("{a}/{r}/orphan.bin"), 30.0);

    w.scan(&pool, &ROOTS, true).await;

    assert!(secret.exists() && beside.exists());
    assert!(link.symlink_metadata().is_ok(), "the symlink itself stays");
    assert!(
        w.path("sessions", &gone.to_string())
            .symlink_metadata()
            .is_ok()
    );
    assert!(
        !orphan.exists(),
        "the control: an orphan inside the root goes"
    );
}

/// Collects what a scan lists.
#[derive(Default)]
struct Collected(Vec<Listed>);

impl Observer for Collected {
    fn listed(&mut self, entry: &Listed) {
        self.0.push(entry.clone());
    }
}

/// Names with a newline or that are not UTF-8 are listed (lossily) and removed like any other.
#[sqlx::test]
async fn dc4_names_with_newlines_and_invalid_utf8_are_listed_and_removed(pool: PgPool) {
    if backend::server().is_some() {
        return; // A store has no symlinks, no byte names and no missing prefix: local roots only.
    }
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    let newline = w.put("outputs", &format!("{a}/{r}/new\nline.bin"), 30.0);
    let mut bytes = format!("{a}/{r}/").into_bytes();
    bytes.extend_from_slice(b"\xff\xfe.bin");
    let invalid = w.put_bytes("outputs", &bytes, 30.0);
    output_row(&pool, r, &format!("{a}/{r}/kept.bin")).await;
    let kept = w.put("outputs", &format!("{a}/{r}/kept.bin"), 30.0);

    let mut listed = Collected::default();
    let report = w
        .scan_watched(&pool, &[Root::Outputs], true, &mut listed)
        .await;

    assert!(!newline.exists() && !invalid.exists());
    assert!(kept.exists(), "the control: a named file stays");
    assert_eq!(listed.0.len(), 2);
    assert!(listed.0.iter().any(|l| l.path.contains('\u{fffd}')));
    assert_eq!(report.roots["outputs"].gone, 2);
}

/// A missing root and a root that is a file are reported; nothing is deleted there, and the
/// other roots are scanned.
#[sqlx::test]
async fn dc4_a_missing_root_or_one_that_is_not_a_directory_is_reported(pool: PgPool) {
    if backend::server().is_some() {
        return; // A store has no symlinks, no byte names and no missing prefix: local roots only.
    }
    let w = World::new(&pool).await;
    let (a, r) = (w.account, w.run);
    std::fs::remove_dir(w.dir.path().join("attachments")).unwrap();
    std::fs::remove_dir(w.dir.path().join("sessions")).unwrap();
    std::fs::write(w.dir.path().join("sessions"), b"not a directory").unwrap();
    let orphan = w.put("outputs", &format!("{a}/{r}/orphan.bin"), 30.0);

    let report = w.scan(&pool, &ROOTS, true).await;

    assert_eq!(report.roots["attachments"].state, "missing");
    assert_eq!(report.roots["sessions"].state, "not_directory");
    assert!(w.dir.path().join("sessions").is_file());
    assert!(!orphan.exists(), "the control: the outputs root is scanned");
}
