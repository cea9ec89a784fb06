//! EX-3 (and ER-3, OP-3): an owner's output files are recorded with its rows and unlinked after
//! the commit, by the hop or beside it; a path outside the root, a directory or a file a
//! surviving row names under any spelling is never unlinked; bytes reclaimed count what was.

use sexton_jobs::files::{self, Root};
use sexton_jobs::prune_execution_details::Args;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::hops::Env;

#[sqlx::test]
async fn ex3_a_file_recorded_before_a_crash_is_deleted_by_the_next_hop(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let leftover = env.settings.output_root.join("left/over.bin");
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
    let report = env.hop(&Args::first(account, pass_start())).await;
    assert!(
        young_file.exists(),
        "a file a surviving run references was deleted"
    );
    assert!(fixture::has_detail(&env.pool, young.id).await);
    assert!(!leftover.exists());
    assert_eq!(report.files_deleted, 1);
}

/// Enough owners that their files are unlinked beside the hop (`files::Beside` starts once 100
/// paths wait) as well as by its last drain: every file goes, each counted once, and a young
/// run's file stays. The overlap is counted: files already gone while owners of the same hop
/// still wait to be pruned (without the drain beside it, a hop unlinks only after its last
/// owner transaction).
#[sqlx::test]
async fn ex3_files_of_many_owners_go_beside_the_hop_each_counted_once(pool: PgPool) {
    const OWNERS: usize = 500;
    let mut env = Env::new(pool).await;
    env.settings.owners_per_transaction = 10;
    env.settings.window_size = 1000;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let mut old = Vec::new();
    for i in 0..OWNERS {
        let run = env
            .run(RunSpec::conversation(
                account,
                conversation,
                40.0 + i as f64 / 10.0,
            ))
            .await;
        old.push(run.id);
    }
    let young = env
        .run(RunSpec::conversation(account, conversation, 10.0))
        .await;
    let file = |run: &Uuid| env.root().join(format!("{account}/{run}/out.bin"));

    let hop = env.spawn_hop(Args::first(account, pass_start()));
    let mut overlaps = 0;
    while !hop.is_finished() {
        // Files first: pruning only ever grows, so owners unpruned afterwards were unpruned
        // when the files were seen gone.
        let gone = old.iter().rev().take(150).any(|run| !file(run).exists());
        let unpruned: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE account_id = $1 AND details_pruned_at IS NULL",
        )
        .bind(account)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        // The young run is never pruned.
        if gone && unpruned > 1 {
            overlaps += 1;
        }
    }
    let report = hop.await.unwrap();

    assert!(overlaps > 0, "no file went while the hop was still pruning");
    assert_eq!(
        (report.pruned, report.files_deleted),
        (OWNERS as u32, OWNERS as u64)
    );
    assert_eq!(report.bytes_reclaimed, OWNERS as u64 * 5);
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
    let mut beside = files::Beside::new(&env.pool, Root::Outputs, env.root(), Some(account), 0);
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
    let mut beside = files::Beside::new(&env.pool, Root::Outputs, env.root(), Some(account), 0);
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
