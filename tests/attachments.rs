//! Attachment bytes (SPEC §4, AT-1) on real files: the mtime decides, the row stays with
//! `bytes_expired_at` set, paths leaving the root are never followed, a missing file is
//! counted, the artifacts root is never touched, and a pass over many rows goes in bounded hops.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::attachment_expiry::{
    Args, AttachmentExpiry, AttachmentReason, AttachmentSettings,
};
use sexton_jobs::files::PathSettings;
use sexton_jobs::job::Report;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{days_before_pass, pass_start};
use crate::common::run;

struct World {
    pool: PgPool,
    _dir: tempfile::TempDir,
    paths: PathSettings,
    account: Uuid,
}

fn settings() -> AttachmentSettings {
    AttachmentSettings {
        max_age_days: 30,
        window_size: 100,
        budget: Duration::from_secs(600),
    }
}

impl World {
    async fn new(pool: PgPool) -> Self {
        common::migrate(&pool).await;
        let dir = common::backend::tempdir();
        let paths = run::roots(dir.path());
        let account = common::fixture::account(&pool, Some(90)).await;
        Self {
            pool,
            _dir: dir,
            paths,
            account,
        }
    }

    /// A file under the attachments root, last modified at `mtime`.
    fn file(&self, relative: &str, mtime: DateTime<Utc>) -> PathBuf {
        let path = self.paths.attachments_root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"attachment bytes").unwrap();
        set_mtime(&path, mtime);
        path
    }

    /// An attachment row of the account naming `relative`, created at `created_at`.
    async fn row(&self, relative: &str, created_at: DateTime<Utc>) -> Uuid {
        sqlx::query_scalar(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             VALUES ($1, $2, 16, $3) RETURNING id",
        )
        .bind(self.account)
        .bind(relative)
        .bind(created_at)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn pass(&self, settings: &AttachmentSettings) -> Vec<Report<AttachmentReason>> {
        let args = Args::first(Some(self.account), pass_start());
        run::pass::<AttachmentExpiry>(&self.pool, &self.paths, settings, args)
            .await
            .into_iter()
            .map(|hopped| hopped.report)
            .collect()
    }

    async fn expired(&self, id: Uuid) -> bool {
        let (exists, expired): (bool, bool) = sqlx::query_as(
            "SELECT count(*) = 1, COALESCE(bool_and(bytes_expired_at IS NOT NULL), false)
             FROM attachments WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        assert!(exists, "the row of attachment {id} stays");
        expired
    }
}

fn set_mtime(path: &std::path::Path, at: DateTime<Utc>) {
    common::fixture::set_mtime(path, at);
}

fn kept(reports: &[Report<AttachmentReason>], reason: &str) -> u64 {
    reports
        .iter()
        .flat_map(|r| r.retained_by_label())
        .filter(|(r, _)| *r == reason)
        .map(|(_, n)| n)
        .sum()
}

#[sqlx::test]
async fn at1_the_files_mtime_decides_and_the_row_stays_marked(pool: PgPool) {
    let w = World::new(pool).await;
    // Old file, new row: expires. New file, old row: stays. Both sides of the boundary.
    let old_file = w.file("a/old.bin", days_before_pass(31.0));
    let old = w.row("a/old.bin", days_before_pass(1.0)).await;
    let new_file = w.file("a/new.bin", days_before_pass(29.0));
    let new = w.row("a/new.bin", days_before_pass(400.0)).await;

    let reports = w.pass(&settings()).await;

    assert!(w.expired(old).await);
    assert!(!old_file.exists());
    assert!(!w.expired(new).await);
    assert!(new_file.exists());
    assert_eq!(reports.iter().map(|r| r.pruned).sum::<u64>(), 1);
    assert_eq!(reports.iter().map(|r| r.files.deleted).sum::<u64>(), 1);
}

#[sqlx::test]
async fn at1_paths_leaving_the_root_are_never_followed(pool: PgPool) {
    let w = World::new(pool).await;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.bin");
    std::fs::write(&secret, b"keep").unwrap();
    set_mtime(&secret, days_before_pass(400.0));
    std::os::unix::fs::symlink(outside.path(), w.paths.attachments_root.join("evil")).unwrap();
    std::os::unix::fs::symlink(&secret, w.paths.attachments_root.join("link.bin")).unwrap();
    let climbing = format!(
        "../{}/secret.bin",
        outside.path().file_name().unwrap().to_string_lossy()
    );
    let mut refused = Vec::new();
    for path in [
        climbing.as_str(),
        secret.to_str().unwrap(),
        "evil/secret.bin",
        "link.bin",
    ] {
        refused.push(w.row(path, days_before_pass(400.0)).await);
    }
    let _control_file = w.file("ok/old.bin", days_before_pass(400.0));
    let control = w.row("ok/old.bin", days_before_pass(400.0)).await;

    let reports = w.pass(&settings()).await;

    assert!(
        secret.exists(),
        "nothing outside the attachments root is touched"
    );
    for id in refused {
        assert!(!w.expired(id).await);
    }
    assert!(w.expired(control).await, "the control expires");
    assert_eq!(kept(&reports, "outside_root"), 4);
}

#[sqlx::test]
async fn at1_a_missing_file_is_counted_and_its_row_left_unmarked(pool: PgPool) {
    let w = World::new(pool).await;
    let missing = w.row("gone/never-there.bin", days_before_pass(400.0)).await;
    let _file = w.file("here/old.bin", days_before_pass(400.0));
    let present = w.row("here/old.bin", days_before_pass(400.0)).await;

    let reports = w.pass(&settings()).await;

    assert!(!w.expired(missing).await);
    assert!(w.expired(present).await);
    assert_eq!(kept(&reports, "missing"), 1);
}

#[sqlx::test]
async fn at1_the_artifacts_root_and_a_file_another_live_row_names_are_never_touched(pool: PgPool) {
    let w = World::new(pool).await;
    let artifact = w.paths.artifacts_root.join("x/old.bin");
    std::fs::create_dir_all(artifact.parent().unwrap()).unwrap();
    std::fs::write(&artifact, b"generated").unwrap();
    set_mtime(&artifact, days_before_pass(400.0));
    let file = w.file("x/old.bin", days_before_pass(400.0));
    let expiring = w.row("x/old.bin", days_before_pass(400.0)).await;
    // Another account's live attachment names the same file.
    let other = common::fixture::account(&w.pool, Some(90)).await;
    sqlx::query("INSERT INTO attachments (account_id, relative_path) VALUES ($1, 'x/old.bin')")
        .bind(other)
        .execute(&w.pool)
        .await
        .unwrap();

    w.pass(&settings()).await;

    assert!(w.expired(expiring).await, "this account's row is marked");
    assert!(file.exists(), "a file a live attachment still names stays");
    assert!(artifact.exists(), "generated artifacts have no TTL");

    // The control: once the other row is gone, the file goes with the next expiry.
    sqlx::query("DELETE FROM attachments WHERE account_id = $1")
        .bind(other)
        .execute(&w.pool)
        .await
        .unwrap();
    let _again = w.row("x/old.bin", days_before_pass(400.0)).await;
    w.pass(&settings()).await;
    assert!(!file.exists());
    assert!(artifact.exists());
}

#[sqlx::test]
async fn at1_many_attachments_go_in_bounded_hops_and_zero_disables(pool: PgPool) {
    let w = World::new(pool).await;
    let mut ids = Vec::new();
    for n in 0..250 {
        let relative = format!("bulk/{n}.bin");
        w.file(&relative, days_before_pass(400.0));
        ids.push(w.row(&relative, days_before_pass(400.0)).await);
    }

    let disabled = w
        .pass(&AttachmentSettings {
            max_age_days: 0,
            ..settings()
        })
        .await;
    assert_eq!(disabled.len(), 1);
    assert_eq!(disabled[0].outcome.as_str(), "disabled");
    assert!(!w.expired(ids[0]).await);

    let reports = w
        .pass(&AttachmentSettings {
            window_size: 40,
            ..settings()
        })
        .await;
    assert!(reports.len() >= 7, "{} hops of at most 40", reports.len());
    assert!(reports.iter().all(|r| r.candidates <= 40));
    for id in &ids {
        assert!(w.expired(*id).await);
    }
    let left = std::fs::read_dir(w.paths.attachments_root.join("bulk"))
        .unwrap()
        .count();
    assert_eq!(left, 0);
}

#[sqlx::test]
async fn at1_overlapping_roots_are_refused_but_a_shared_prefix_is_not_an_overlap(pool: PgPool) {
    let url = common::database_url(&pool).await;
    let dir = common::backend::tempdir();
    let store = dir.path().join("store");
    let inside = store.join("artifacts");
    let beside = dir.path().join("store-artifacts");
    for d in [&store, &inside, &beside] {
        std::fs::create_dir_all(d).unwrap();
    }
    let check = |artifacts: &std::path::Path| {
        let mut cmd = common::sexton(&url, dir.path());
        cmd.arg("check-config")
            .env("SEXTON_PATHS__ATTACHMENTS_ROOT", &store)
            .env("SEXTON_PATHS__ARTIFACTS_ROOT", artifacts);
        cmd
    };
    let refused = check(&inside).output().await.unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("paths.attachments_root"));
    let accepted = check(&beside).output().await.unwrap();
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
}

#[sqlx::test]
async fn at1_one_file_named_two_ways_is_one_file(pool: PgPool) {
    let w = World::new(pool).await;
    let file = w.file("alias/f.bin", days_before_pass(400.0));
    let canonical = w.row("alias/f.bin", days_before_pass(400.0)).await;
    let doubled = w.row("alias//f.bin", days_before_pass(400.0)).await;
    let dotted = w.row("./alias/./f.bin", days_before_pass(400.0)).await;
    // Another account's live attachment names a second file through another spelling.
    let shared = w.file("alias/g.bin", days_before_pass(400.0));
    let mine = w.row("alias/g.bin", days_before_pass(400.0)).await;
    let other = common::fixture::account(&w.pool, Some(90)).await;
    let theirs: Uuid = sqlx::query_scalar(
        "INSERT INTO attachments (account_id, relative_path, created_at)
         VALUES ($1, 'alias//g.bin', $2) RETURNING id",
    )
    .bind(other)
    .bind(days_before_pass(400.0))
    .fetch_one(&w.pool)
    .await
    .unwrap();

    let reports = w.pass(&settings()).await;
    assert_eq!(kept(&reports, "outside_root"), 0, "{reports:?}");
    for id in [canonical, doubled, dotted, mine] {
        assert!(
            w.expired(id).await,
            "every row naming an expired file is marked"
        );
    }
    assert!(!file.exists());
    assert!(
        shared.exists(),
        "a file another live row names under another spelling stays"
    );

    // That account's own pass expires its row, and the file goes.
    run::pass::<AttachmentExpiry>(
        &w.pool,
        &w.paths,
        &settings(),
        Args::first(Some(other), pass_start()),
    )
    .await;
    assert!(w.expired(theirs).await);
    assert!(!shared.exists());
}
