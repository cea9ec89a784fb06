//! FL-8 from the candidates' side: discovery reads the candidates older than the latest cutoff
//! any account's setting gives, then holds each account found to its own window. The cases the
//! random agreement test (`fanout`) need not draw: an account whose only old owner is held back,
//! windows and policy ages overriding each other in both directions, and a fan-out that failed
//! half-way on its one connection.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use sexton::context::JobContext;
use sexton::preview::{self, Shown};
use sexton::tick::{self, NightlySlot};
use sexton_jobs::clock::ManualClock;
use sexton_jobs::payload::V1;
use sexton_jobs::prune_execution_details::{Args, PruneExecutionDetails};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};

fn context(pool: &PgPool, settings: &sexton::config::Settings) -> JobContext {
    JobContext::new(
        pool.clone(),
        Arc::new(settings.clone()),
        Arc::new(ManualClock::new(pass_start())),
    )
}

fn slot() -> NightlySlot {
    NightlySlot {
        version: V1,
        slot: pass_start(),
    }
}

/// The accounts `job` has a pass for at the test's slot.
async fn started(pool: &PgPool, job: &str) -> BTreeSet<Uuid> {
    sqlx::query_scalar::<_, Uuid>("SELECT scope FROM sexton.passes WHERE job = $1 AND slot = $2")
        .bind(job)
        .bind(pass_start())
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// An account with the execution window `days` and one conversation run `age` days old.
async fn account_with_run(
    pool: &PgPool,
    root: &std::path::Path,
    days: Option<i32>,
    age: f64,
) -> (Uuid, Uuid) {
    let account = fixture::account(pool, days).await;
    let conversation = fixture::conversation(pool, account).await;
    let run = fixture::run(
        pool,
        root,
        RunSpec::conversation(account, conversation, age),
    )
    .await;
    (account, run.id)
}

/// A row of `session_retention_policies`: enabled, then the main, task and subagent ages.
type PolicyRow = (bool, Option<i32>, Option<i32>, Option<i32>);

/// An account with the execution window NULL, the session policy `policy` if any, and one idle
/// `kind` session `age` days old.
async fn account_with_session(
    pool: &PgPool,
    policy: Option<PolicyRow>,
    kind: &str,
    age: i64,
) -> Uuid {
    let account = fixture::account(pool, None).await;
    if let Some((enabled, main, task, subagent)) = policy {
        sqlx::query(
            "INSERT INTO session_retention_policies
                 (account_id, enabled, main_days, task_days, subagent_days)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(account)
        .bind(enabled)
        .bind(main)
        .bind(task)
        .bind(subagent)
        .execute(pool)
        .await
        .unwrap();
    }
    let agent = fixture::agent(pool, account).await;
    sqlx::query(
        "INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
         VALUES ($1, $2, $3, 'idle', $4)",
    )
    .bind(account)
    .bind(agent)
    .bind(kind)
    .bind(pass_start() - chrono::Duration::days(age))
    .execute(pool)
    .await
    .unwrap();
    account
}

#[sqlx::test]
async fn fl8_ex5_an_account_whose_only_old_owner_is_held_back_is_found_and_the_hold_looked_at_again(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let root = &settings.paths.output_root;
    let (held, run) = account_with_run(&pool, root, Some(30), 45.0).await;
    sqlx::query("INSERT INTO settlement_receipts (run_id, status) VALUES ($1, 'pending')")
        .bind(run)
        .execute(&pool)
        .await
        .unwrap();
    // The control: an account whose one run is young has nothing due.
    let (quiet, young) = account_with_run(&pool, root, Some(30), 5.0).await;

    let ctx = context(&pool, &settings);
    tick::fan_out(&ctx, &slot()).await.unwrap();
    assert_eq!(
        started(&pool, "prune_execution_details").await,
        BTreeSet::from([held]),
        "the held-back account's pass starts, the quiet one's ({quiet}) does not"
    );
    sexton::hop::run::<PruneExecutionDetails>(&ctx, Args::first(Some(held), pass_start()))
        .await
        .unwrap();
    let retained: serde_json::Value = sqlx::query_scalar(
        "SELECT retained FROM sexton.passes WHERE job = 'prune_execution_details' AND scope = $1",
    )
    .bind(held)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(retained["pending_settlement"], 1, "{retained}");
    assert!(
        fixture::has_detail(&pool, run).await,
        "the held run keeps its detail"
    );
    assert!(fixture::has_detail(&pool, young).await);
}

#[sqlx::test]
async fn fl8_ex1_ss1_each_account_is_held_to_its_own_window_whatever_the_shortest_one_is(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let root = &settings.paths.output_root;
    // Execution details: the shortest window (1 day) sets how far back discovery reads; each
    // account found is then held to its own.
    let (shortest, _) = account_with_run(&pool, root, Some(1), 3.0).await;
    let (long_window, _) = account_with_run(&pool, root, Some(400), 45.0).await;
    let (usual, _) = account_with_run(&pool, root, Some(30), 45.0).await;
    let (disabled, _) = account_with_run(&pool, root, None, 500.0).await;
    // Sessions: an enabled policy's own age, shorter or longer than the fallback, decides.
    let task_override =
        account_with_session(&pool, Some((true, None, Some(2), None)), "task", 5).await;
    let task_fallback =
        account_with_session(&pool, Some((true, None, None, None)), "task", 5).await;
    let main_longer =
        account_with_session(&pool, Some((true, Some(90), None, None)), "main", 70).await;
    let main_fallback =
        account_with_session(&pool, Some((true, None, None, None)), "main", 70).await;
    let policy_off =
        account_with_session(&pool, Some((false, Some(1), None, None)), "main", 100).await;
    let no_policy = account_with_session(&pool, None, "subagent", 100).await;

    let ctx = context(&pool, &settings);
    tick::fan_out(&ctx, &slot()).await.unwrap();
    let execution = started(&pool, "prune_execution_details").await;
    let sessions = started(&pool, "session_retention").await;
    assert_eq!(
        execution,
        BTreeSet::from([shortest, usual]),
        "not the 400-day window's 45-day run ({long_window}) nor the disabled window ({disabled})"
    );
    assert_eq!(
        sessions,
        BTreeSet::from([task_override, main_fallback]),
        "not the task session within the fallback ({task_fallback}), the main session within its \
         longer age ({main_longer}), a disabled policy ({policy_off}) or none ({no_policy})"
    );

    // `sexton preview` finds the same accounts through the same discovery.
    for root in [
        &settings.paths.attachments_root,
        &settings.paths.traces_root,
    ] {
        std::fs::create_dir_all(root).unwrap();
    }
    let mut conn = pool.acquire().await.unwrap();
    let mut out = Vec::new();
    preview::write(
        &mut conn,
        &settings,
        pass_start(),
        Shown::Summary,
        true,
        &mut out,
    )
    .await
    .unwrap();
    let summary: Vec<serde_json::Value> = serde_json::from_slice(&out).unwrap();
    for (job, due) in [
        ("prune_execution_details", &execution),
        ("session_retention", &sessions),
    ] {
        let line = summary.iter().find(|l| l["job"] == job).unwrap();
        assert_eq!(
            (&line["due"], &line["accounts"]),
            (&due.len().into(), &10.into()),
            "{line}"
        );
    }
}

#[sqlx::test]
async fn fl8_a_fan_out_failed_half_way_leaves_nothing_in_the_way_of_its_retry_on_the_same_connection(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::settings(dir.path());
    settings.queue.fan_out_batch = 1;
    let root = &settings.paths.output_root;
    let mut due = BTreeSet::new();
    for _ in 0..3 {
        due.insert(account_with_run(&pool, root, Some(30), 45.0).await.0);
    }
    // The control: an account with nothing due.
    account_with_run(&pool, root, Some(30), 5.0).await;
    let one = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(
            (*pool.connect_options())
                .clone()
                .options([("lock_timeout", "200ms")]),
        )
        .await
        .unwrap();
    // The second batch's ledger row is held by another transaction: the fan-out fails there,
    // its discovery still open on the pool's one connection.
    let second = *due.iter().nth(1).unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO sexton.passes (job, scope, slot) VALUES ('prune_execution_details', $1, $2)",
    )
    .bind(second)
    .bind(pass_start())
    .execute(&mut *holder)
    .await
    .unwrap();
    let ctx = context(&one, &settings);
    assert!(tick::fan_out(&ctx, &slot()).await.is_err());
    holder.rollback().await.unwrap();

    tick::fan_out(&ctx, &slot()).await.unwrap();
    assert_eq!(started(&pool, "prune_execution_details").await, due);
    let hops: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE job_type = 'sexton.prune_execution_details'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(hops, 3, "one first hop per due account, none twice");
    one.close().await;
}
