//! EX-3 (and ER-3, OP-3): an owner's output files are recorded with its rows and unlinked after
//! the commit, by the hop or beside it; a path outside the root, a directory or a file a
//! surviving row names under any spelling is never unlinked; bytes reclaimed count what was.

use std::time::Duration;

use sexton_jobs::files::{self, Root};
use sexton_jobs::prune_execution_details::Args;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::hops::Env;
use crate::common::process::poll_until;

async fn set_path(pool: &PgPool, run: Uuid, path: &str) {
    sqlx::query("UPDATE output_files SET relative_path = $2 WHERE run_id = $1")
        .bind(run)
        .bind(path)
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test]
async fn ex3_a_file_recorded_before_a_crash_is_deleted_by_the_next_hop(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let leftover = env.root().join("left/over.bin");
    std::fs::create_dir_all(leftover.parent().unwrap()).unwrap();
    std::fs::write(&leftover, b"x").unwrap();
    // What a worker killed between commit and unlink leaves behind.
    sqlx::query("INSERT INTO sexton.pending_file_deletions (account_id, relative_path) VALUES ($1, 'left/over.bin')")
        .bind(account)
        .execute(&env.pool)
        .await
        .unwrap();
    // The control: a young run's file that the crashed hop recorded too, as the pruned run it
    // went with named it as well; the young run's row still does.
    let conversation = fixture::conversation(&env.pool, account).await;
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let young_file = env.output_file(account, young.id);
    sqlx::query(
        "INSERT INTO sexton.pending_file_deletions (account_id, relative_path) VALUES ($1, $2)",
    )
    .bind(account)
    .bind(format!("{account}/{}/out.bin", young.id))
    .execute(&env.pool)
    .await
    .unwrap();
    let report = env.hop(&Args::first(Some(account), pass_start())).await;
    assert!(
        young_file.exists(),
        "a file a surviving run references was deleted"
    );
    assert!(fixture::has_detail(&env.pool, young.id).await);
    assert!(!leftover.exists());
    assert_eq!(report.files.deleted, 1);
}

/// Enough owners that their files are unlinked beside the hop (`files::Beside` starts once 100
/// paths wait) as well as by its last drain: every file goes, each counted once, and a young
/// run's file stays. The overlap is shown, not sampled: the platform holds the conversation of
/// the hop's last 200 owners, and while the hop waits for it, files of the 300 it pruned before
/// go (without the drain beside it, a hop unlinks only after its last owner transaction).
#[sqlx::test]
async fn ex3_files_of_many_owners_go_beside_the_hop_each_counted_once(pool: PgPool) {
    const OWNERS: usize = 500;
    const HELD: usize = 200;
    let mut env = Env::new(pool).await;
    env.settings.owners_per_transaction = 10;
    env.settings.window_size = 1000;
    env.settings.owner_lock_timeout = Duration::from_secs(60);
    let account = fixture::account(&env.pool, Some(30)).await;
    let first = fixture::conversation(&env.pool, account).await;
    let held = fixture::conversation(&env.pool, account).await;
    let mut old = Vec::new();
    for i in 0..OWNERS {
        // Oldest first: the hop reaches `held`'s runs, the youngest of the old, last.
        let conversation = if i < HELD { held } else { first };
        let run = env
            .run(RunSpec::conversation(
                account,
                conversation,
                40.0 + i as f64 / 10.0,
            ))
            .await;
        old.push(run.id);
    }
    let young = env.run(RunSpec::conversation(account, first, 10.0)).await;
    let file = |run: &Uuid| env.root().join(format!("{account}/{run}/out.bin"));

    let mut writer = env.pool.begin().await.unwrap();
    fixture::lock_conversation(&mut writer, held).await;
    let hop = env.spawn_hop(Args::first(Some(account), pass_start()));
    common::wait_for_lock_waiter(&env.pool, "conversations").await;
    poll_until(Duration::from_secs(60), || async {
        old[HELD..].iter().any(|run| !file(run).exists())
    })
    .await;
    assert!(
        old[..HELD].iter().all(|run| file(run).exists()),
        "the waiting owners' files are all there"
    );
    writer.rollback().await.unwrap();
    let report = hop.await.unwrap();

    assert_eq!(
        (report.pruned, report.files.deleted),
        (OWNERS as u64, OWNERS as u64)
    );
    assert_eq!(report.files.bytes, OWNERS as u64 * 5);
    assert!(old.iter().all(|run| !file(run).exists()));
    assert!(file(&young.id).exists());
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(waiting, 0);
}

/// Records committed for an account, with their files on disk.
async fn recorded_files(env: &Env, account: Uuid, n: usize) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for i in 0..n {
        let relative = format!("{account}/beside/{i}-{}.bin", Uuid::new_v4());
        let path = env.root().join(&relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"bytes").unwrap();
        // Written an hour before its record, as a file is before its rows go: an object written
        // in its record's own instant may be a new one, and stays (OS-2).
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        common::fixture::set_mtime(&path, hour_ago);
        sqlx::query(
            "INSERT INTO sexton.pending_file_deletions (account_id, relative_path) VALUES ($1, $2)",
        )
        .bind(account)
        .bind(&relative)
        .execute(&env.pool)
        .await
        .unwrap();
        files.push(path);
    }
    files
}

/// EX-3 through `files::Beside` alone: told of 100 or more recorded paths, it drains them on a
/// connection of its own before the hop's own last drain; told of fewer, it leaves them to that
/// drain; another account's records and files stay either way.
#[sqlx::test]
async fn ex3_a_drain_beside_the_hop_removes_what_is_recorded_once_enough_waits(pool: PgPool) {
    let env = Env::new(pool).await;
    let (account, other) = (
        fixture::account(&env.pool, Some(30)).await,
        fixture::account(&env.pool, Some(30)).await,
    );
    let others = recorded_files(&env, other, 3).await;

    let few = recorded_files(&env, account, 99).await;
    let mut beside = files::Beside::new(&env.pool, Root::Outputs, &env.store(), Some(account), 0);
    beside.recorded(99).await.unwrap();
    let (counts, after) = beside.finish().await.unwrap();
    assert_eq!((counts.deleted, after), (0, 0));
    assert!(few.iter().all(|f| f.exists()));

    let many = recorded_files(&env, account, 60).await;
    let last: i64 = sqlx::query_scalar(
        "SELECT max(id) FROM sexton.pending_file_deletions WHERE account_id = $1",
    )
    .bind(account)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let mut beside = files::Beside::new(&env.pool, Root::Outputs, &env.store(), Some(account), 0);
    beside.recorded(159).await.unwrap();
    let (counts, after) = beside.finish().await.unwrap();
    assert_eq!((counts.deleted, counts.bytes, after), (159, 159 * 5, last));
    assert!(few.iter().chain(&many).all(|f| !f.exists()));
    let left: Vec<Uuid> =
        sqlx::query_scalar("SELECT DISTINCT account_id FROM sexton.pending_file_deletions")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(left, vec![other]);
    assert!(others.iter().all(|f| f.exists()));
}

#[sqlx::test]
async fn ex3_a_symlinked_directory_in_the_output_root_is_never_followed(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let secret = elsewhere.path().join("secret.txt");
    std::fs::write(&secret, b"keep me").unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), env.root().join("evil")).unwrap();
    let evil = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    set_path(&env.pool, evil.id, "evil/secret.txt").await;
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;
    let control_file = env.root().join(format!("{account}/{}/out.bin", control.id));

    let reports = env.pass(account).await;
    assert!(
        secret.exists(),
        "a file outside the output root was deleted"
    );
    assert!(
        !control_file.exists(),
        "the control's file inside the root went"
    );
    assert!(fixture::is_pruned(&env.pool, evil.id).await);
    assert_eq!(reports.iter().map(|r| r.files.errors).sum::<u64>(), 1);
    assert_eq!(reports.iter().map(|r| r.files.deleted).sum::<u64>(), 1);
}

#[sqlx::test]
async fn ex3_a_file_still_referenced_by_a_surviving_run_stays(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let old = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let shared = format!("{account}/{}/out.bin", young.id);
    set_path(&env.pool, old.id, &shared).await;
    let alone = env
        .run(RunSpec::conversation(account, conversation, 45.0))
        .await;

    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, old.id).await);
    assert!(!fixture::is_pruned(&env.pool, young.id).await);
    assert!(
        env.root().join(&shared).exists(),
        "the young run's file is still referenced and stays"
    );
    assert!(
        !env.root()
            .join(format!("{account}/{}/out.bin", alone.id))
            .exists(),
        "an unshared file of a pruned run goes"
    );
}

#[sqlx::test]
async fn ex3_an_output_path_naming_a_directory_never_removes_a_tree(pool: PgPool) {
    let env = Env::new(pool).await;
    let other = fixture::account(&env.pool, Some(30)).await;
    let other_conversation = fixture::conversation(&env.pool, other).await;
    let theirs = env
        .run(RunSpec::conversation(other, other_conversation, 5.0))
        .await;
    let their_file = env.output_file(other, theirs.id);
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let hostile = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    set_path(&env.pool, hostile.id, &other.to_string()).await;
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    let reports = env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, hostile.id).await);
    assert!(
        their_file.exists(),
        "another account's directory was removed"
    );
    assert!(
        !env.output_file(account, control.id).exists(),
        "the control's own file goes"
    );
    assert_eq!(reports.iter().map(|r| r.files.errors).sum::<u64>(), 1);
}

#[sqlx::test]
async fn ex3_another_spelling_of_a_referenced_path_is_never_deleted(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let young_file = env.output_file(account, young.id);
    let old = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    set_path(
        &env.pool,
        old.id,
        &format!("./{account}//{}/out.bin", young.id),
    )
    .await;
    // A record made before a surviving row took the path (a crash, a late writer): the drain
    // checks again just before unlinking.
    sqlx::query("INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path) VALUES ('outputs', $1, $2)")
        .bind(account)
        .bind(format!("{account}/{}/out.bin", young.id))
        .execute(&env.pool)
        .await
        .unwrap();

    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, old.id).await);
    assert!(young_file.exists(), "a surviving run's file was deleted");
    assert!(
        !env.output_file(account, control.id).exists(),
        "an unreferenced file in canonical spelling goes"
    );
}

#[sqlx::test]
async fn ex3_a_retained_run_naming_the_file_another_way_keeps_it(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let spellings = [
        "{a}//{r}/out.bin",
        "./{a}/{r}/out.bin",
        "{a}/./{r}/out.bin",
        "{a}/{r}//out.bin",
        ".//{a}/././{r}/out.bin/",
    ];
    let mut shared = Vec::new();
    for spelling in spellings {
        let old = env
            .run(RunSpec::conversation(account, conversation, 40.0))
            .await;
        let young = env
            .run(RunSpec::conversation(account, conversation, 5.0))
            .await;
        let path = spelling
            .replace("{a}", &account.to_string())
            .replace("{r}", &old.id.to_string());
        set_path(&env.pool, young.id, &path).await;
        shared.push((old, young, env.output_file(account, old.id)));
    }
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    env.pass(account).await;
    for (old, young, file) in &shared {
        assert!(fixture::is_pruned(&env.pool, old.id).await);
        assert!(!fixture::is_pruned(&env.pool, young.id).await);
        assert!(file.exists(), "a retained run's file went: {file:?}");
    }
    assert!(
        !env.output_file(account, control.id).exists(),
        "an unreferenced file goes"
    );

    // Once the last row naming it goes, so does the file, whichever spelling recorded it.
    sqlx::query("UPDATE accounts SET execution_details_retention_days = 1 WHERE id = $1")
        .bind(account)
        .execute(&env.pool)
        .await
        .unwrap();
    let reports = env.pass(account).await;
    for (_, young, file) in &shared {
        assert!(fixture::is_pruned(&env.pool, young.id).await);
        assert!(!file.exists(), "left forever: {file:?}");
    }
    assert_eq!(reports.iter().map(|r| r.files.errors).sum::<u64>(), 0);
}

#[sqlx::test]
async fn ex3_a_retained_row_climbing_through_dotdot_keeps_every_file_it_could_name(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    // A `..` resolved through a real directory, one that could climb through a symlink from
    // anywhere, and an absolute path ending in the file's. (What follows the last `..` is
    // all that is certain of a loose path: `d/sub/../out.bin` keeps every `out.bin`.)
    let spellings = [
        "{a}/{r}/sub/../../{r}/out.bin",
        "elsewhere/../{a}/{r}/out.bin",
        "/srv/outputs/{a}/{r}/out.bin",
    ];
    let mut shared = Vec::new();
    for spelling in spellings {
        let old = env
            .run(RunSpec::conversation(account, conversation, 40.0))
            .await;
        let young = env
            .run(RunSpec::conversation(account, conversation, 5.0))
            .await;
        std::fs::create_dir_all(env.root().join(format!("{account}/{}/sub", old.id))).unwrap();
        let path = spelling
            .replace("{a}", &account.to_string())
            .replace("{r}", &old.id.to_string());
        set_path(&env.pool, young.id, &path).await;
        shared.push((old, env.output_file(account, old.id)));
    }
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    env.pass(account).await;
    for (old, file) in &shared {
        assert!(fixture::is_pruned(&env.pool, old.id).await);
        assert!(file.exists(), "a retained run's file went: {file:?}");
    }
    assert!(
        !env.output_file(account, control.id).exists(),
        "a file no spelling could name goes"
    );
}

#[sqlx::test]
async fn op3_bytes_reclaimed_counts_what_was_unlinked(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let present = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let missing = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;
    sqlx::query("UPDATE output_files SET bytes = 999999")
        .execute(&env.pool)
        .await
        .unwrap();
    let present_file = env.root().join(format!("{account}/{}/out.bin", present.id));
    std::fs::write(&present_file, b"twelve bytes").unwrap();
    std::fs::remove_file(env.root().join(format!("{account}/{}/out.bin", missing.id))).unwrap();

    let reports = env.pass(account).await;
    assert!(!present_file.exists());
    assert_eq!(reports.iter().map(|r| r.files.deleted).sum::<u64>(), 1);
    assert_eq!(
        reports.iter().map(|r| r.files.bytes).sum::<u64>(),
        12,
        "the bytes of the one file unlinked, not what the rows said"
    );
}

#[sqlx::test]
async fn er3_a_missing_output_root_fails_the_hop_and_forgets_nothing(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let file = env.root().join(format!("{account}/{}/out.bin", run.id));
    let parked = env.dir.path().join("parked");
    std::fs::rename(env.root(), &parked).unwrap();

    let err = env
        .try_hop(&Args::first(Some(account), pass_start()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot be opened"), "{err}");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(pending, 1, "the file is not forgotten as already gone");

    std::fs::rename(&parked, env.root()).unwrap();
    assert!(file.exists());
    env.pass(account).await;
    assert!(!file.exists(), "the retried hop deletes it");
}

#[sqlx::test]
async fn ex3_one_file_recorded_under_three_spellings_in_one_drain_goes_once_without_an_error(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    // A drain removes a claimed batch's paths several at a time, each thread a run of them: the
    // three spellings lie far apart among 64 other files, in different runs.
    let mut paths: Vec<String> = (0..64).map(|n| format!("many/{n}.bin")).collect();
    paths.insert(0, "twice/f.bin".into());
    paths.insert(33, "twice//f.bin".into());
    paths.push("./twice/f.bin".into());
    for path in &paths {
        let file = env.root().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"12345").unwrap();
    }
    // The controls: files beside them that nothing recorded.
    let beside = [
        env.root().join("twice/g.bin"),
        env.root().join("many/kept.bin"),
    ];
    for file in &beside {
        std::fs::write(file, b"12345").unwrap();
    }
    sqlx::query(
        "INSERT INTO sexton.pending_file_deletions (account_id, relative_path)
         SELECT $1, p FROM unnest($2::text[]) WITH ORDINALITY AS t (p, n) ORDER BY n",
    )
    .bind(account)
    .bind(&paths)
    .execute(&env.pool)
    .await
    .unwrap();

    let mut conn = env.pool.acquire().await.unwrap();
    let counts = files::drain(&mut conn, Root::Outputs, &env.store(), Some(account))
        .await
        .unwrap();

    assert_eq!((counts.deleted, counts.errors), (65, 0), "{counts:?}");
    assert_eq!(counts.bytes, 65 * 5, "each file's bytes counted once");
    assert!(!env.root().join("twice/f.bin").exists());
    assert!((0..64).all(|n| !env.root().join(format!("many/{n}.bin")).exists()));
    assert!(
        beside.iter().all(|file| file.exists()),
        "what was not recorded stays"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "every record forgotten, none kept as failed");
}
