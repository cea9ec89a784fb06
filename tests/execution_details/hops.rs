//! EX-7, EX-8 (and ER-4, FL-6, OP-1): a pass is a chain of hops with the right cursors and a
//! cutoff fixed at its start, moving forward however small its budget; a hop run twice gives
//! the same end state, holds no more connections than it declares, and the preview counts what
//! the pass then does.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::job::Job;
use sexton_jobs::prune_execution_details::{self as job, Args, HopOutcome, RetainReason};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::hops::{Env, retained};

#[sqlx::test]
async fn ex7_a_backlog_takes_several_hops_with_the_right_cursors(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.window_size = 3;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    for days in [40.0, 41.0, 42.0, 43.0, 44.0, 45.0, 46.0] {
        env.run(RunSpec::conversation(account, conversation, days))
            .await;
    }
    let ordered: Vec<(DateTime<Utc>, Uuid)> = sqlx::query_as(
        "SELECT completed_at, id FROM runs WHERE account_id = $1 ORDER BY completed_at, id",
    )
    .bind(account)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let reports = env.pass(account).await;
    let per_hop: Vec<u64> = reports.iter().map(|r| r.pruned).collect();
    assert_eq!(per_hop, [3, 3, 1]);
    let cursors: Vec<(DateTime<Utc>, Uuid)> = reports
        .iter()
        .filter_map(|r| r.next.as_ref())
        .map(|n| {
            let c = n.cursor.unwrap();
            (c.age, c.run_id)
        })
        .collect();
    assert_eq!(cursors, [ordered[2], ordered[5]]);
    let cutoffs: Vec<_> = reports
        .iter()
        .filter_map(|r| r.next.as_ref())
        .map(|n| n.cutoff)
        .collect();
    let expected = Some(pass_start() - chrono::Duration::days(30));
    assert!(cutoffs.iter().all(|c| *c == expected), "{cutoffs:?}");
    assert_eq!(reports.last().unwrap().outcome, HopOutcome::Finished);
}

#[sqlx::test]
async fn ex7_the_cutoff_is_fixed_at_pass_start(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.window_size = 1;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let old = env
        .run(RunSpec::conversation(account, conversation, 31.0))
        .await;
    let old_too = env
        .run(RunSpec::conversation(account, conversation, 30.5))
        .await;
    let almost = env
        .run(RunSpec::conversation(account, conversation, 29.5))
        .await;
    let first = env.hop(&Args::first(Some(account), pass_start())).await;
    // Two days pass during the pass: `almost` is now past the window, but waits for next night.
    env.clock.advance(chrono::Duration::days(2));
    let mut next = first.next;
    while let Some(args) = next {
        next = env.hop(&args).await.next;
    }
    assert!(fixture::is_pruned(&env.pool, old.id).await);
    assert!(fixture::is_pruned(&env.pool, old_too.id).await);
    assert!(fixture::has_detail(&env.pool, almost.id).await);
}

#[sqlx::test]
async fn ex7_a_spent_budget_still_moves_every_hop_forward(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.budget = Duration::from_millis(1);
    env.settings.owners_per_transaction = 1;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let mut runs = Vec::new();
    for days in [40.0, 41.0, 42.0] {
        runs.push(
            env.run(RunSpec::conversation(account, conversation, days))
                .await
                .id,
        );
    }
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let mut args = Args::first(Some(account), pass_start());
    for _ in 0..20 {
        let report = env.hop(&args).await;
        match report.next {
            Some(next) => args = next,
            None => break,
        }
    }
    for run in runs {
        assert!(
            fixture::is_pruned(&env.pool, run).await,
            "the pass got through"
        );
    }
    assert!(
        !fixture::is_pruned(&env.pool, young.id).await,
        "inside its window"
    );
}

#[sqlx::test]
async fn ex8_the_same_hop_twice_gives_the_same_end_state(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    for days in [35.0, 50.0, 10.0] {
        env.run(RunSpec::conversation(account, conversation, days))
            .await;
    }
    let state = "SELECT string_agg(concat_ws(':', r.id, r.details_pruned_at, r.runner_effects,
                     (SELECT count(*) FROM run_tasks WHERE run_id = r.id),
                     (SELECT count(*) FROM output_files WHERE run_id = r.id)), ',' ORDER BY r.id)
                 FROM runs r";
    let args = Args::first(Some(account), pass_start());
    let first = env.hop(&args).await;
    let after_first: String = sqlx::query_scalar(state)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let second = env.hop(&args).await;
    let after_second: String = sqlx::query_scalar(state)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(first.pruned, 2);
    assert_eq!(second.pruned, 0);
    assert_eq!(after_first, after_second);
}

#[sqlx::test]
async fn er4_an_account_deleted_mid_pass_ends_it_quietly(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.window_size = 1;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    for days in [50.0, 40.0] {
        env.run(RunSpec::conversation(account, conversation, days))
            .await;
    }
    let first = env.hop(&Args::first(Some(account), pass_start())).await;
    sqlx::query("DELETE FROM accounts WHERE id = $1")
        .bind(account)
        .execute(&env.pool)
        .await
        .unwrap();
    let second = env.hop(first.next.as_ref().unwrap()).await;
    assert_eq!(second.outcome, HopOutcome::AccountGone);
    assert!(second.next.is_none());
}

/// FL-6: an execution-details hop holds no more connections than it declares
/// (`Job::CONNECTIONS`): on a pool of exactly that many it prunes its owners while their files
/// are unlinked beside it (a hop that took one more would wait for it until the pool timed
/// out). On a pool of one fewer, the drain beside the hop cannot get its connection: the hop
/// fails for it, and nothing is lost — the owners it pruned keep their files recorded, and the
/// next hop unlinks them.
#[sqlx::test]
async fn fl6_a_hop_holds_at_most_the_connections_it_declares(pool: PgPool) {
    // One drain beside the hop starts once 100 paths wait (`files::BESIDE_AFTER`), and the 50
    // after it never make another: on the short pool the timeout surfaces when the hop ends,
    // after every owner transaction.
    const OWNERS: usize = 150;
    let mut env = Env::new(pool).await;
    env.settings.owners_per_transaction = 10;
    let declared = <job::PruneExecutionDetails as Job>::CONNECTIONS;
    assert_eq!(
        declared, 2,
        "a hop's owner transactions and the drain beside it"
    );
    // Every connection is opened before the hop, so that only a connection the pool lacks can
    // time out, never a slow connect.
    let sized = async |connections: u32| {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with((*env.pool.connect_options()).clone())
            .await
            .unwrap();
        let mut open = Vec::new();
        for _ in 0..connections {
            open.push(pool.acquire().await.unwrap());
        }
        drop(open);
        pool
    };
    // Each account: old owners that go, and a young run whose file must stay.
    let (mut accounts, mut young) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let account = fixture::account(&env.pool, Some(30)).await;
        let conversation = fixture::conversation(&env.pool, account).await;
        for i in 0..OWNERS {
            env.run(RunSpec::conversation(
                account,
                conversation,
                40.0 + i as f64 / 10.0,
            ))
            .await;
        }
        let kept = env
            .run(RunSpec::conversation(account, conversation, 10.0))
            .await;
        accounts.push(account);
        young.push(env.root().join(format!("{account}/{}/out.bin", kept.id)));
    }
    // The old owners' files still on disk.
    let files_left = |account: Uuid| {
        std::fs::read_dir(env.root().join(account.to_string()))
            .unwrap()
            .map(|run| run.unwrap().path().join("out.bin"))
            .filter(|file| file.exists() && !young.contains(file))
            .count()
    };
    let args = |account| Args::first(Some(account), pass_start());

    let exact = sized(declared).await;
    let paths = env.paths();
    let report = crate::common::hops::try_hop_at(
        &exact,
        &env.clock,
        &paths,
        &env.settings,
        &args(accounts[0]),
    )
    .await
    .unwrap();
    assert_eq!(
        (report.pruned, report.files.deleted),
        (OWNERS as u64, OWNERS as u64)
    );
    assert_eq!(files_left(accounts[0]), 0);

    exact.close().await;

    let short = sized(declared - 1).await;
    let failed = crate::common::hops::try_hop_at(
        &short,
        &env.clock,
        &paths,
        &env.settings,
        &args(accounts[1]),
    )
    .await;
    let err = failed.expect_err("the drain beside the hop had no connection to take");
    assert!(err.to_string().contains("pool timed out"), "{err}");
    short.close().await;
    let (pruned, recorded): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs WHERE account_id = $1 AND details_pruned_at IS NOT NULL),
                (SELECT count(*) FROM sexton.pending_file_deletions WHERE account_id = $1)",
    )
    .bind(accounts[1])
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(pruned, OWNERS as i64, "the owner transactions went on");
    assert_eq!(
        files_left(accounts[1]) as i64,
        recorded,
        "every file still there is still recorded"
    );
    assert!(recorded > 0);

    let report = env.hop(&args(accounts[1])).await;
    assert_eq!(report.files.deleted, recorded as u64);
    assert_eq!(files_left(accounts[1]), 0);
    assert!(
        young.iter().all(|file| file.exists()),
        "young runs' files stay"
    );
}

#[sqlx::test]
async fn op1_the_preview_counts_what_the_next_pass_then_does(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    for _ in 0..3 {
        env.run(RunSpec::conversation(account, conversation, 50.0))
            .await;
    }
    env.run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    for blocker in [
        "INSERT INTO invocation_attempts (run_id, attempt, status) VALUES ($1, 2, 'running')",
        "INSERT INTO settlement_receipts (run_id, status) VALUES ($1, 'pending')",
        "INSERT INTO delegations (parent_run_id, status) VALUES ($1, 'outstanding')",
    ] {
        let run = env
            .run(RunSpec::conversation(account, conversation, 60.0))
            .await;
        sqlx::query(blocker)
            .bind(run.id)
            .execute(&env.pool)
            .await
            .unwrap();
    }
    // Another account's old owner is not in this account's preview.
    let other = fixture::account(&env.pool, Some(30)).await;
    let elsewhere = fixture::conversation(&env.pool, other).await;
    env.run(RunSpec::conversation(other, elsewhere, 50.0)).await;

    let previews = env.preview(pass_start(), Some(&[account])).await;
    let reports = env.pass(account).await;

    assert_eq!(previews.len(), 1);
    let preview = &previews[0];
    let pruned: u64 = reports.iter().map(|r| r.pruned).sum();
    assert_eq!((preview.eligible_owners, pruned), (3, 3));
    for reason in [
        RetainReason::PendingWork,
        RetainReason::PendingSettlement,
        RetainReason::OutstandingDelegation,
    ] {
        assert_eq!(
            preview.retained.get(&reason).copied().unwrap_or_default(),
            retained(&reports, reason) as i64,
            "{reason:?}"
        );
        assert_eq!(retained(&reports, reason), 1, "{reason:?}");
    }
    for (table, expected) in &preview.rows {
        let deleted: u64 = reports.iter().map(|r| r.rows_of(table)).sum();
        assert_eq!(*expected as u64, deleted, "{table}");
    }
    assert_eq!(preview.rows.values().sum::<i64>(), 3 * 7);
    let bytes: u64 = reports.iter().map(|r| r.files.bytes).sum();
    assert_eq!(
        (preview.bytes, bytes),
        (15, 15),
        "five bytes per output file"
    );
}
