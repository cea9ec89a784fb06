//! Holds without gaps (HD-3, HD-4): a hold placed while a deletion is in flight waits for it —
//! the deletion committed first — and is then in force; a hold found through rows the platform
//! deleted since still keeps its files and traces; a cascade or a TRUNCATE cannot take a held
//! session. Each race is forced open (a platform transaction holding a row or table lock) and
//! the test sees that its window was hit: the deletion waiting on the lock, and `holds place`
//! waiting at the hold gate behind it.

use std::time::Duration;

use sexton::holds::{self, Scope};
use sexton_jobs::files::{self, Root};
use sexton_jobs::prune_execution_details::{Args, RetainReason};
use sexton_jobs::session_retention::{self as sessions, Policy, SessionRetention};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::hops::{Env, retained};
use crate::common::{self, run};
use crate::holds::{clean_traces, old_trace, with_policy};

/// `holds place` as the CLI calls it, on a task of its own.
fn place(pool: &PgPool, scope: Scope, id: Uuid) -> tokio::task::JoinHandle<holds::Hold> {
    let pool = pool.clone();
    tokio::spawn(async move {
        holds::place(&pool, scope, id, "CASE-9", "litigation", "legal@example")
            .await
            .unwrap()
    })
}

/// Waits until `n` backends of the test's database wait on a lock while running a statement
/// whose text contains `text` (`advisory` waits when `text` is `None`); fails after 60 s rather
/// than hang. This is how a test sees that its race window was really hit.
async fn waiting(pool: &PgPool, text: Option<&str>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND wait_event_type = 'Lock'
               AND CASE WHEN $1::text IS NULL THEN wait_event = 'advisory'
                        ELSE wait_event <> 'advisory' AND strpos(query, $1) > 0 END",
        )
        .bind(text)
        .fetch_one(pool)
        .await
        .unwrap();
        if n > 0 {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let seen: Vec<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
                "SELECT wait_event_type, wait_event, left(query, 300) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            panic!("no statement {text:?} waited for a lock within 60 s: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn exists(pool: &PgPool, table: &str, id: Uuid) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM {table} WHERE id = $1)"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn hd3_an_account_hold_placed_while_an_owner_transaction_waits_on_a_row_lock_waits_for_it(
    pool: PgPool,
) {
    let mut env = Env::new(pool).await;
    env.settings.owner_lock_timeout = Duration::from_secs(30);
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    // The platform holds the run's output row: the owner transaction, past its hold check,
    // waits on it inside its delete.
    let mut writer = env.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM output_files WHERE run_id = $1 FOR UPDATE")
        .bind(run.id)
        .fetch_all(&mut *writer)
        .await
        .unwrap();
    let hop = env.spawn_hop(Args::first(Some(account), pass_start()));
    waiting(&env.pool, Some("WITH locked AS")).await;
    let placing = place(&env.pool, Scope::Account, account);
    waiting(&env.pool, None).await;
    assert!(!placing.is_finished(), "the hold waits for the deletion");
    let released_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *writer)
        .await
        .unwrap();
    writer.commit().await.unwrap();

    let report = hop.await.unwrap();
    let hold = placing.await.unwrap();
    assert_eq!(report.pruned, 1, "the deletion begun first committed");
    assert!(fixture::is_pruned(&env.pool, run.id).await);
    assert!(
        hold.placed.placed_at > released_at,
        "placed after the deletion could end, not while it waited"
    );
    // From its return on, the hold is in force for every deletion.
    let later = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    let reports = env.pass(account).await;
    assert_eq!(retained(&reports, RetainReason::LegalHold), 1);
    assert!(fixture::has_detail(&env.pool, later.id).await);
    assert!(env.output_file(account, later.id).exists());
}

#[sqlx::test]
async fn hd3_an_agent_hold_placed_while_a_session_deletion_waits_on_a_handoff_waits_for_it(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let paths = run::roots(dir.path());
    let settings = sessions::HopSettings {
        window_size: 10,
        sessions_per_transaction: 2,
        transaction_target: Duration::from_millis(50),
        budget: Duration::from_secs(600),
        lock_timeout: Duration::from_secs(30),
        policy: Policy::Persisted,
    };
    let account = with_policy(&pool).await;
    let agent = fixture::agent(&pool, account).await;
    let session = fixture::session(&pool, account, agent, "main", 100, None).await;
    let handoff: Uuid = sqlx::query_scalar(
        "INSERT INTO handoffs (account_id, agent_id, from_session_id) VALUES ($1, $2, $3)
         RETURNING id",
    )
    .bind(account)
    .bind(agent)
    .bind(session)
    .fetch_one(&pool)
    .await
    .unwrap();
    // The platform holds the handoff: the deletion, past the guard and its re-check, waits on it
    // for the foreign key's SET NULL.
    let mut writer = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM handoffs WHERE id = $1 FOR UPDATE")
        .bind(handoff)
        .fetch_all(&mut *writer)
        .await
        .unwrap();
    let first = sessions::Args::first(Some(account), pass_start());
    let pass = tokio::spawn({
        let (pool, paths, settings) = (pool.clone(), paths.clone(), settings.clone());
        async move { run::pass::<SessionRetention>(&pool, &paths, &settings, first).await }
    });
    waiting(&pool, Some("conversation_archive_entries")).await;
    let placing = place(&pool, Scope::Agent, agent);
    waiting(&pool, None).await;
    assert!(!placing.is_finished(), "the hold waits for the deletion");
    writer.commit().await.unwrap();

    pass.await.unwrap();
    placing.await.unwrap();
    assert!(
        !exists(&pool, "sessions", session).await,
        "the deletion begun first committed"
    );
    // From its return on, the hold is in force.
    let later = fixture::session(&pool, account, agent, "main", 100, None).await;
    let first = sessions::Args::first(Some(account), pass_start());
    run::pass::<SessionRetention>(&pool, &paths, &settings, first).await;
    assert!(exists(&pool, "sessions", later).await, "held by the agent");
}

/// Records `run`'s output file for removal, as a pruning transaction does.
async fn record(env: &Env, account: Uuid, conversation: Uuid, run: Uuid) {
    sqlx::query(
        "INSERT INTO sexton.pending_file_deletions
             (root, account_id, relative_path, run_ids, conversation_ids)
         VALUES ('outputs', $1, $2, ARRAY[$3]::uuid[], ARRAY[$4]::uuid[])",
    )
    .bind(account)
    .bind(format!("{account}/{run}/out.bin"))
    .bind(run)
    .bind(conversation)
    .execute(&env.pool)
    .await
    .unwrap();
}

#[sqlx::test]
async fn hd3_a_conversation_hold_placed_between_a_drains_hold_check_and_its_unlink_waits_for_it(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    let later = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    sqlx::query("DELETE FROM output_files WHERE run_id = ANY($1)")
        .bind([run.id, later.id])
        .execute(&env.pool)
        .await
        .unwrap();
    record(&env, account, conversation, run.id).await;
    // A lock on output_files stalls the drain after its hold check, at its still-referenced
    // check, just before the unlink.
    let mut stall = env.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE output_files IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *stall)
        .await
        .unwrap();
    let drain = tokio::spawn({
        let (pool, store) = (env.pool.clone(), env.store().clone());
        async move {
            let mut conn = pool.acquire().await.unwrap();
            files::drain(&mut conn, Root::Outputs, &store, Some(account))
                .await
                .unwrap()
        }
    });
    waiting(&env.pool, Some("output_files")).await;
    let placing = place(&env.pool, Scope::Conversation, conversation);
    waiting(&env.pool, None).await;
    assert!(!placing.is_finished(), "the hold waits for the unlink");
    stall.commit().await.unwrap();

    assert_eq!(drain.await.unwrap().deleted, 1, "the unlink begun first");
    placing.await.unwrap();
    assert!(!env.output_file(account, run.id).exists());
    // From its return on, the hold keeps the conversation's files.
    record(&env, account, conversation, later.id).await;
    let mut conn = env.pool.acquire().await.unwrap();
    let counts = files::drain(&mut conn, Root::Outputs, &env.store(), Some(account))
        .await
        .unwrap();
    assert_eq!(counts.deleted, 0);
    assert!(env.output_file(account, later.id).exists());
}

#[sqlx::test]
async fn hd3_holds_keep_a_pending_file_whose_run_row_the_platform_deleted(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    // Held by a run hold, held by a conversation hold, and free.
    let mut runs = Vec::new();
    for _ in 0..3 {
        let conversation = fixture::conversation(&env.pool, account).await;
        let run = env
            .run(RunSpec::conversation(account, conversation, 50.0))
            .await;
        runs.push((conversation, run.id));
    }
    // The pass prunes all three, and its drain cannot reach the root: the files stay recorded.
    let moved = env.dir.path().join("outputs-away");
    std::fs::rename(env.root(), &moved).unwrap();
    assert!(
        env.try_hop(&Args::first(Some(account), pass_start()))
            .await
            .is_err()
    );
    std::fs::rename(&moved, env.root()).unwrap();
    for (_, run) in &runs {
        assert!(fixture::is_pruned(&env.pool, *run).await);
    }
    // A run hold placed before the platform deletes the run's row, a conversation hold after.
    let run = runs[0].1;
    place(&env.pool, Scope::Run, run).await.unwrap();
    for (_, run) in &runs {
        sqlx::query("DELETE FROM runs WHERE id = $1")
            .bind(run)
            .execute(&env.pool)
            .await
            .unwrap();
    }
    let by_conversation = place(&env.pool, Scope::Conversation, runs[1].0)
        .await
        .unwrap();

    env.pass(account).await;
    assert!(env.output_file(account, run).exists(), "held by its run");
    assert!(
        env.output_file(account, runs[1].1).exists(),
        "held by its conversation"
    );
    assert!(
        !env.output_file(account, runs[2].1).exists(),
        "the control goes"
    );
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(waiting, 2, "the held files keep their records");

    holds::release(&env.pool, by_conversation.placed.id, "legal@example")
        .await
        .unwrap();
    env.pass(account).await;
    assert!(!env.output_file(account, runs[1].1).exists(), "released");
    assert!(env.output_file(account, run).exists());
}

#[sqlx::test]
async fn hd3_an_account_hold_keeps_the_traces_of_an_agent_whose_row_is_gone(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("traces");
    let account = fixture::account(&pool, Some(90)).await;
    let (gone, live) = (
        fixture::agent(&pool, account).await,
        fixture::agent(&pool, account).await,
    );
    let of_gone = old_trace(&root, gone, Uuid::new_v4());
    let of_live = old_trace(&root, live, Uuid::new_v4());
    let hold = place(&pool, Scope::Account, account).await.unwrap();
    sqlx::query("DELETE FROM agents WHERE id = $1")
        .bind(gone)
        .execute(&pool)
        .await
        .unwrap();

    let report = clean_traces(&pool, &root).await;
    assert!(
        of_gone.exists(),
        "whose account it was cannot be told: kept"
    );
    assert!(of_live.exists(), "held through its agent's account");
    assert_eq!(report.kept.get("legal_hold"), Some(&2));

    // The control: with no account hold active, the same trace goes.
    holds::release(&pool, hold.placed.id, "legal@example")
        .await
        .unwrap();
    clean_traces(&pool, &root).await;
    assert!(!of_gone.exists() && !of_live.exists());
}

/// A held session (by a session hold) of an agent of a fresh account, and a free one beside.
async fn held_session(pool: &PgPool) -> (Uuid, Uuid, Uuid, Uuid) {
    let account = fixture::account(pool, Some(90)).await;
    let agent = fixture::agent(pool, account).await;
    let session = fixture::session(pool, account, agent, "task", 1, None).await;
    let hold = place(pool, Scope::Session, session).await.unwrap();
    (account, agent, session, hold.placed.id)
}

#[sqlx::test]
async fn hd4_a_cascade_from_the_agent_or_the_account_cannot_take_a_held_session(pool: PgPool) {
    common::migrate(&pool).await;
    let (account, agent, session, hold) = held_session(&pool).await;
    for (table, id) in [("agents", agent), ("accounts", account)] {
        let refused = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE id = $1"
        )))
        .bind(id)
        .execute(&pool)
        .await
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("is held") && refused.contains(&hold.to_string()),
            "{table}: {refused}"
        );
        assert!(exists(&pool, "sessions", session).await, "{table}");
    }
    // The control: an agent none of whose sessions is held goes with its sessions.
    let free_agent = fixture::agent(&pool, account).await;
    let free = fixture::session(&pool, account, free_agent, "task", 1, None).await;
    sqlx::query("DELETE FROM agents WHERE id = $1")
        .bind(free_agent)
        .execute(&pool)
        .await
        .unwrap();
    assert!(!exists(&pool, "sessions", free).await);
    // Released, the account goes whole.
    holds::release(&pool, hold, "legal@example").await.unwrap();
    sqlx::query("DELETE FROM accounts WHERE id = $1")
        .bind(account)
        .execute(&pool)
        .await
        .unwrap();
    assert!(!exists(&pool, "sessions", session).await);
}

#[sqlx::test]
async fn hd4_a_truncate_of_sessions_is_refused_while_a_session_is_held_or_protected(pool: PgPool) {
    common::migrate(&pool).await;
    let (account, agent, session, hold) = held_session(&pool).await;
    for statement in [
        "TRUNCATE sessions CASCADE",
        "TRUNCATE agents CASCADE",
        "TRUNCATE accounts CASCADE",
    ] {
        let refused = sqlx::raw_sql(statement)
            .execute(&pool)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("cannot be truncated"),
            "{statement}: {refused}"
        );
        assert!(exists(&pool, "sessions", session).await, "{statement}");
    }
    holds::release(&pool, hold, "legal@example").await.unwrap();
    // Protected (the agent's current session): still refused.
    sqlx::query("UPDATE agents SET current_session_id = $1 WHERE id = $2")
        .bind(session)
        .bind(agent)
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        sqlx::raw_sql("TRUNCATE sessions CASCADE")
            .execute(&pool)
            .await
            .is_err()
    );
    // The control: nothing held or protected, the TRUNCATE goes through.
    sqlx::query("UPDATE agents SET current_session_id = NULL WHERE id = $1")
        .bind(agent)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql("TRUNCATE sessions CASCADE")
        .execute(&pool)
        .await
        .unwrap();
    assert!(!exists(&pool, "sessions", session).await);
    assert!(exists(&pool, "accounts", account).await);
}
