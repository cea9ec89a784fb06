//! EX-6, EX-9: owners are removed under the platform's lock order — a held conversation or row is
//! skipped as busy, a writer that commits first wins, no deadlock — and readers, forks among
//! them, see each owner whole or pruned.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::prune_execution_details::{self as job, Args, RetainReason};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::hops::{self, Env, retained};

#[sqlx::test]
async fn ex6_a_conversation_held_busy_is_skipped_not_waited_on(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let busy_conversation = fixture::conversation(&env.pool, account).await;
    let free_conversation = fixture::conversation(&env.pool, account).await;
    let busy = env
        .run(RunSpec::conversation(account, busy_conversation, 50.0))
        .await;
    let free = env
        .run(RunSpec::conversation(account, free_conversation, 40.0))
        .await;
    let mut writer = env.pool.begin().await.unwrap();
    fixture::lock_conversation(&mut writer, busy_conversation).await;
    let reports = env.pass(account).await;
    assert_eq!(retained(&reports, RetainReason::Busy), 1);
    assert!(fixture::has_detail(&env.pool, busy.id).await);
    assert!(
        fixture::is_pruned(&env.pool, free.id).await,
        "the pass goes on"
    );
    writer.rollback().await.unwrap();
    env.pass(account).await;
    assert!(
        fixture::is_pruned(&env.pool, busy.id).await,
        "revisited next pass"
    );
}

#[sqlx::test]
async fn ex6_a_writer_that_commits_pending_work_under_the_lock_wins(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.owner_lock_timeout = Duration::from_secs(30);
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    // The writer takes the conversation lock (platform order), then the hop reads its window
    // and queues behind the lock; the writer adds pending work and commits.
    let mut writer = env.pool.begin().await.unwrap();
    fixture::lock_conversation(&mut writer, conversation).await;
    let hop = env.spawn_hop(Args::first(Some(account), pass_start()));
    common::wait_for_lock_waiter(&env.pool, "conversations").await;
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(run.id)
        .execute(&mut *writer)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO invocation_attempts (run_id, attempt, status) VALUES ($1, 2, 'pending')",
    )
    .bind(run.id)
    .execute(&mut *writer)
    .await
    .unwrap();
    writer.commit().await.unwrap();
    let report = hop.await.unwrap();
    assert_eq!(report.retained(RetainReason::PendingWork), 1);
    assert_eq!(
        fixture::detail_counts(&env.pool, run.id).await,
        fixture::WITH_SECOND_ATTEMPT
    );
    assert!(!fixture::is_pruned(&env.pool, run.id).await);
}

#[sqlx::test]
async fn ex6_a_detail_row_an_application_holds_is_busy_not_a_failed_hop(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let held = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let free = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;
    let mut app = env.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tool_results WHERE run_id = $1 FOR UPDATE")
        .bind(held.id)
        .execute(&mut *app)
        .await
        .unwrap();
    let report = env.hop(&Args::first(Some(account), pass_start())).await;
    app.rollback().await.unwrap();
    assert!(!fixture::is_pruned(&env.pool, held.id).await);
    assert!(
        fixture::is_pruned(&env.pool, free.id).await,
        "the other owner still goes"
    );
    assert_eq!(Some(report.retained(job::RetainReason::Busy)), Some(1));
}

/// Many old owners over a few conversations, for the concurrency cases.
async fn many_owners(
    env: &Env,
    conversations: usize,
    per_conversation: usize,
) -> (Uuid, Vec<Uuid>) {
    let account = fixture::account(&env.pool, Some(30)).await;
    let mut ids = Vec::new();
    for _ in 0..conversations {
        let conversation = fixture::conversation(&env.pool, account).await;
        ids.push(conversation);
        for i in 0..per_conversation {
            env.run(RunSpec::conversation(
                account,
                conversation,
                40.0 + i as f64,
            ))
            .await;
        }
    }
    (account, ids)
}

/// Runs a whole pass in the background.
fn spawn_pass(env: &Env, account: Uuid) -> tokio::task::JoinHandle<u64> {
    let (pool, clock, settings) = (env.pool.clone(), env.clock.clone(), env.settings.clone());
    let paths = env.paths();
    tokio::spawn(async move {
        let mut args = Args::first(Some(account), pass_start());
        let mut pruned = 0;
        loop {
            let report = hops::try_hop_at(&pool, &clock, &paths, &settings, &args)
                .await
                .unwrap();
            pruned += report.pruned;
            match report.next {
                Some(next) => args = next,
                None => return pruned,
            }
        }
    })
}

/// Counts the reads (or writes) that overlapped a pass: made while it was running and while the
/// account was part pruned, part not. A test over concurrency requires enough of them, so that it
/// cannot pass with every read before the pass started or after it ended.
#[derive(Default)]
struct Overlap {
    all: usize,
    mid_pass: usize,
}

impl Overlap {
    /// Records one access made on `db` (inside its transaction, so that the state it counts is
    /// the one the access saw).
    async fn record<'e>(
        &mut self,
        db: impl sqlx::PgExecutor<'e>,
        account: Uuid,
        pass: &tokio::task::JoinHandle<u64>,
    ) {
        let (pruned, total): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE details_pruned_at IS NOT NULL), count(*)
             FROM runs WHERE account_id = $1",
        )
        .bind(account)
        .fetch_one(db)
        .await
        .unwrap();
        self.all += 1;
        if !pass.is_finished() && pruned > 0 && pruned < total {
            self.mid_pass += 1;
        }
    }

    fn require(&self, at_least: usize) {
        assert!(
            self.mid_pass >= at_least,
            "only {} of {} accesses overlapped the pass mid-way",
            self.mid_pass,
            self.all
        );
    }
}

/// Another platform writer holding back a pass, so that accesses overlap it whatever the
/// machine's pace: it holds the conversation of the last, in the pass's order, of each
/// conversation's oldest run. The pass prunes the others' oldest runs, then waits there (its
/// owner lock timeout must outlast the wait) until [`HoldBack::release_after`] lets it go on.
struct HoldBack {
    conversation: Uuid,
    holder: Option<sqlx::Transaction<'static, sqlx::Postgres>>,
}

impl HoldBack {
    async fn new(env: &Env, account: Uuid, conversations: usize) -> Self {
        let conversation = sqlx::query_scalar(
            "SELECT conversation_id FROM runs WHERE account_id = $1
             ORDER BY completed_at, id LIMIT 1 OFFSET $2",
        )
        .bind(account)
        .bind(conversations as i64 - 1)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        let mut holder = env.pool.begin().await.unwrap();
        fixture::lock_conversation(&mut holder, conversation).await;
        Self {
            conversation,
            holder: Some(holder),
        }
    }

    /// Whether `conversation` is held: an access that locks it would wait for the release.
    fn holds(&self, conversation: Uuid) -> bool {
        self.holder.is_some() && conversation == self.conversation
    }

    /// Lets the pass go on once `enough` accesses overlapped it.
    async fn release_after(&mut self, overlap: &Overlap, enough: usize) {
        if overlap.mid_pass >= enough
            && let Some(holder) = self.holder.take()
        {
            holder.rollback().await.unwrap();
        }
    }
}

/// Settings that make a pass long: one owner per transaction, small windows.
fn slow_pass(env: &mut Env, window: u32) {
    env.settings.window_size = window;
    env.settings.owners_per_transaction = 1;
    env.settings.transaction_target = Duration::from_millis(1);
}

#[sqlx::test]
async fn ex6_a_reader_that_locks_the_conversation_sees_owners_whole_or_pruned(pool: PgPool) {
    let mut env = Env::new(pool).await;
    slow_pass(&mut env, 10);
    env.settings.owner_lock_timeout = Duration::from_secs(60);
    let (account, conversations) = many_owners(&env, 8, 15).await;
    let mut hold_back = HoldBack::new(&env, account, conversations.len()).await;
    let pass = spawn_pass(&env, account);
    let mut reads = 0;
    let mut overlap = Overlap::default();
    while !pass.is_finished() {
        let conversation = conversations[reads % conversations.len()];
        reads += 1;
        if hold_back.holds(conversation) {
            continue;
        }
        let mut tx = env.pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR SHARE")
            .bind(conversation)
            .execute(&mut *tx)
            .await
            .unwrap();
        // Several statements, as a materializing reader would issue them.
        let runs: Vec<(Uuid, Option<DateTime<Utc>>, Option<serde_json::Value>)> = sqlx::query_as(
            "SELECT id, details_pruned_at, runner_effects FROM runs WHERE conversation_id = $1",
        )
        .bind(conversation)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        for (run, pruned_at, effects) in runs {
            let rows = fixture::detail_rows(&mut *tx, run).await;
            match pruned_at {
                Some(_) => {
                    assert_eq!(rows, 0, "a pruned owner with detail left");
                    assert_eq!(effects, Some(job::pruned_runner_effects()));
                }
                None => assert_eq!(rows, 7, "an unpruned owner missing detail"),
            }
        }
        overlap.record(&mut *tx, account, &pass).await;
        tx.commit().await.unwrap();
        hold_back.release_after(&overlap, 10).await;
    }
    assert_eq!(pass.await.unwrap(), 120);
    overlap.require(10);
}

#[sqlx::test]
async fn ex6_no_deadlock_with_a_writer_using_the_same_lock_order(pool: PgPool) {
    let mut env = Env::new(pool).await;
    slow_pass(&mut env, 10);
    env.settings.owner_lock_timeout = Duration::from_secs(60);
    let (account, conversations) = many_owners(&env, 6, 10).await;
    let mut hold_back = HoldBack::new(&env, account, conversations.len()).await;
    let pass = spawn_pass(&env, account);
    let mut writes = 0;
    let mut overlap = Overlap::default();
    while !pass.is_finished() {
        let conversation = conversations[writes % conversations.len()];
        writes += 1;
        if hold_back.holds(conversation) {
            continue;
        }
        let mut tx = env.pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
            .bind(conversation)
            .execute(&mut *tx)
            .await
            .expect("writer: conversation lock");
        let runs: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM runs WHERE conversation_id = $1 ORDER BY id FOR UPDATE",
        )
        .bind(conversation)
        .fetch_all(&mut *tx)
        .await
        .expect("writer: run locks");
        sqlx::query("INSERT INTO conversation_events (conversation_id, run_id, kind) VALUES ($1, $2, 'materialized')")
            .bind(conversation)
            .bind(runs[writes % runs.len()])
            .execute(&mut *tx)
            .await
            .expect("writer: insert");
        overlap.record(&mut *tx, account, &pass).await;
        tx.commit().await.expect("writer: commit");
        hold_back.release_after(&overlap, 10).await;
    }
    assert_eq!(pass.await.unwrap(), 60, "every owner pruned, no hop failed");
    overlap.require(10);
}

#[sqlx::test]
async fn ex9_a_fork_reader_following_the_protocol_always_gets_a_consistent_window(pool: PgPool) {
    let mut env = Env::new(pool).await;
    slow_pass(&mut env, 5);
    env.settings.owner_lock_timeout = Duration::from_secs(60);
    let (account, conversations) = many_owners(&env, 4, 25).await;
    // Reads take no lock: they go on meanwhile, the held conversation's too.
    let mut hold_back = HoldBack::new(&env, account, conversations.len()).await;
    let pass = spawn_pass(&env, account);
    let mut reads = 0;
    let mut overlap = Overlap::default();
    let mut rebuilt = 0;
    while !pass.is_finished() {
        let conversation = conversations[reads % conversations.len()];
        // 1. Assemble the fixed window without locks: markers first, then each run's detail.
        let markers: Vec<(Uuid, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT id, details_pruned_at FROM runs WHERE conversation_id = $1 ORDER BY id",
        )
        .bind(conversation)
        .fetch_all(&env.pool)
        .await
        .unwrap();
        let mut window = Vec::new();
        for (run, pruned_at) in &markers {
            let tasks: i64 = sqlx::query_scalar(
                "SELECT (SELECT count(*) FROM run_tasks WHERE run_id = $1)
                      + (SELECT count(*) FROM tool_results WHERE run_id = $1)",
            )
            .bind(run)
            .fetch_one(&env.pool)
            .await
            .unwrap();
            window.push((*run, pruned_at.is_none(), tasks));
        }
        // 2. Verify the markers; 3. if retention committed meanwhile, rebuild from retained text.
        let now: Vec<(Uuid, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT id, details_pruned_at FROM runs WHERE conversation_id = $1 ORDER BY id",
        )
        .bind(conversation)
        .fetch_all(&env.pool)
        .await
        .unwrap();
        if now != markers {
            let text: Vec<(Uuid, String)> = sqlx::query_as(
                "SELECT r.id, v.prompt || ' ' || v.final_content FROM runs r
                 JOIN variants v ON v.id = r.variant_id WHERE r.conversation_id = $1 ORDER BY r.id",
            )
            .bind(conversation)
            .fetch_all(&env.pool)
            .await
            .unwrap();
            assert!(
                text.iter().all(|(_, t)| t == "the question the answer"),
                "retained text survives"
            );
            window = text.iter().map(|(id, _)| (*id, false, 0)).collect();
            rebuilt += 1;
        }
        // The sealed window never holds a run whose detail was read half-removed.
        for (run, with_detail, tasks) in &window {
            if *with_detail {
                assert_eq!(*tasks, 2, "run {run} assembled with partial detail");
            }
        }
        overlap.record(&env.pool, account, &pass).await;
        hold_back.release_after(&overlap, 5).await;
        reads += 1;
    }
    assert_eq!(pass.await.unwrap(), 100);
    overlap.require(5);
    assert!(
        rebuilt > 0,
        "no read met a marker that moved under it ({reads} reads)"
    );
}
