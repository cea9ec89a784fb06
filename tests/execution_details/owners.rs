//! EX-3, EX-4, EX-5: an eligible owner's detail goes and its markers are set, everything else
//! stays; pending work, settlement, delegation and open history requests hold it back.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sexton_jobs::prune_execution_details::{self as job, Args, RetainReason};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::hops::{Env, retained};

/// Everything EX-4 keeps, as text, for one account.
async fn kept_dump(pool: &PgPool, account: Uuid) -> String {
    sqlx::query_scalar(
        "SELECT concat_ws('|',
            (SELECT string_agg(to_jsonb(r) - 'details_pruned_at' - 'runner_effects' #>> '{}', ',' ORDER BY id)
               FROM runs r WHERE account_id = $1),
            (SELECT string_agg(concat_ws(':', v.id, v.prompt, v.requested_model, v.final_content, v.selected), ',' ORDER BY v.id)
               FROM variants v JOIN turns t ON t.id = v.turn_id JOIN conversations c ON c.id = t.conversation_id
               WHERE c.account_id = $1),
            (SELECT string_agg(to_jsonb(t) #>> '{}', ',' ORDER BY t.id) FROM turns t
               JOIN conversations c ON c.id = t.conversation_id WHERE c.account_id = $1),
            (SELECT string_agg(to_jsonb(f) #>> '{}', ',' ORDER BY f.id) FROM follow_ups f
               JOIN variants v ON v.id = f.variant_id JOIN turns t ON t.id = v.turn_id
               JOIN conversations c ON c.id = t.conversation_id WHERE c.account_id = $1),
            (SELECT string_agg(to_jsonb(f) #>> '{}', ',' ORDER BY id) FROM fragments f WHERE account_id = $1),
            (SELECT string_agg(to_jsonb(u) #>> '{}', ',' ORDER BY id) FROM usage_records u WHERE account_id = $1),
            (SELECT string_agg(to_jsonb(c) #>> '{}', ',' ORDER BY id) FROM conversations c WHERE account_id = $1),
            (SELECT string_agg(to_jsonb(e) #>> '{}', ',' ORDER BY e.id) FROM conversation_events e
               JOIN conversations c ON c.id = e.conversation_id WHERE c.account_id = $1))",
    )
    .bind(account)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Two accounts with identical data; returns (account, conversation, run).
async fn account_with_history(env: &Env) -> (Uuid, Uuid, fixture::Run) {
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    sqlx::query(
        "UPDATE conversations SET usage_summary = '{\"tokens\": 1200, \"cost_micros\": 3600}' WHERE id = $1",
    )
    .bind(conversation)
    .execute(&env.pool)
    .await
    .unwrap();
    let run = env
        .run(RunSpec::conversation(account, conversation, 45.0))
        .await;
    let fragment: Uuid = sqlx::query_scalar(
        "INSERT INTO fragments (account_id, content) VALUES ($1, 'kept text') RETURNING id",
    )
    .bind(account)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO follow_ups (variant_id, position, landed_at, body) VALUES ($1, 0, now(), $2)",
    )
    .bind(run.variant)
    .bind(json!({"fragments": [{"fragment_id": fragment, "upload_binding": null}]}))
    .execute(&env.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO usage_records (account_id, run_id, conversation_id, tokens, cost_micros) VALUES ($1, $2, $3, 1200, 3600)")
        .bind(account)
        .bind(run.id)
        .bind(conversation)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO conversation_events (conversation_id, run_id, kind, payload) VALUES ($1, $2, 'run.completed', '{\"preview\": \"x\"}')")
        .bind(conversation)
        .bind(run.id)
        .execute(&env.pool)
        .await
        .unwrap();
    (account, conversation, run)
}

#[sqlx::test]
async fn ex3_ex4_detail_goes_markers_are_set_and_everything_else_stays(pool: PgPool) {
    let env = Env::new(pool).await;
    let (account, _, run) = account_with_history(&env).await;
    let (other, _, other_run) = account_with_history(&env).await;
    let kept_before = kept_dump(&env.pool, account).await;
    let other_before = kept_dump(&env.pool, other).await;
    let file = env.output_file(account, run.id);
    assert!(file.is_file());

    let reports = env.pass(account).await;
    assert_eq!(reports.iter().map(|r| r.pruned).sum::<u64>(), 1);

    assert_eq!(fixture::detail_rows(&env.pool, run.id).await, 0);
    assert!(!file.exists(), "the owned output file is deleted");
    let expected =
        json!({"status": "unavailable", "runners": [], "reason": "execution_details_pruned"});
    let (run_at, run_effects): (Option<DateTime<Utc>>, serde_json::Value) =
        sqlx::query_as("SELECT details_pruned_at, runner_effects FROM runs WHERE id = $1")
            .bind(run.id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    let (variant_at, variant_effects): (Option<DateTime<Utc>>, serde_json::Value) =
        sqlx::query_as("SELECT details_pruned_at, runner_effects FROM variants WHERE id = $1")
            .bind(run.variant)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        run_at,
        Some(pass_start()),
        "marked with the job clock's now"
    );
    assert_eq!(variant_at, Some(pass_start()));
    assert_eq!(run_effects, expected);
    assert_eq!(variant_effects, expected);
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(pending, 0, "no file deletion left behind");

    assert_eq!(kept_dump(&env.pool, account).await, kept_before, "EX-4");
    assert_eq!(kept_dump(&env.pool, other).await, other_before);
    assert!(
        fixture::has_detail(&env.pool, other_run.id).await,
        "another account is untouched"
    );
    assert!(env.output_file(other, other_run.id).is_file());
}

#[sqlx::test]
async fn ex4_a_variant_of_another_account_is_never_marked(pool: PgPool) {
    let env = Env::new(pool).await;
    let other = fixture::account(&env.pool, None).await;
    let other_conversation = fixture::conversation(&env.pool, other).await;
    let theirs = env
        .run(RunSpec::conversation(other, other_conversation, 40.0))
        .await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let crossing = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let own_variant = crossing.variant.unwrap();
    sqlx::query("UPDATE runs SET variant_id = $2 WHERE id = $1")
        .bind(crossing.id)
        .bind(theirs.variant.unwrap())
        .execute(&env.pool)
        .await
        .unwrap();
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, crossing.id).await);
    let marked = |variant: Uuid| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT details_pruned_at IS NOT NULL FROM variants WHERE id = $1",
            )
            .bind(variant)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert!(
        !marked(theirs.variant.unwrap()).await,
        "another account's variant"
    );
    assert!(
        marked(control.variant.unwrap()).await,
        "the control's own variant"
    );
    assert!(
        !marked(own_variant).await,
        "not referenced by the pruned run"
    );
    assert!(!fixture::is_pruned(&env.pool, theirs.id).await);
}

#[sqlx::test]
async fn ex5_each_blocker_holds_its_run_back_until_it_resolves(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let old = RunSpec::conversation(account, conversation, 50.0);
    let attempt = env.run(old.clone()).await;
    sqlx::query(
        "INSERT INTO invocation_attempts (run_id, attempt, status) VALUES ($1, 2, 'running')",
    )
    .bind(attempt.id)
    .execute(&env.pool)
    .await
    .unwrap();
    let receipt = env.run(old.clone()).await;
    sqlx::query("INSERT INTO settlement_receipts (run_id, status) VALUES ($1, 'pending')")
        .bind(receipt.id)
        .execute(&env.pool)
        .await
        .unwrap();
    let delegating = env.run(old.clone()).await;
    sqlx::query("INSERT INTO delegations (parent_run_id, status) VALUES ($1, 'outstanding')")
        .bind(delegating.id)
        .execute(&env.pool)
        .await
        .unwrap();
    let source = env.run(old.clone()).await;
    let assembling = env
        .run(RunSpec::conversation(account, conversation, 1.0))
        .await;
    let request: Uuid = sqlx::query_scalar(
        "INSERT INTO history_requests (conversation_id, run_id, sealed_at) VALUES ($1, $2, NULL) RETURNING id",
    )
    .bind(conversation)
    .bind(assembling.id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO history_request_sources (history_request_id, source_run_id) VALUES ($1, $2)",
    )
    .bind(request)
    .bind(source.id)
    .execute(&env.pool)
    .await
    .unwrap();

    let reports = env.pass(account).await;
    for (run, reason) in [
        (attempt, RetainReason::PendingWork),
        (receipt, RetainReason::PendingSettlement),
        (delegating, RetainReason::OutstandingDelegation),
        (source, RetainReason::ActiveHistoryRequest),
    ] {
        // The fixture's one row per table, and the second attempt this case added.
        let expected = match reason {
            RetainReason::PendingWork => fixture::WITH_SECOND_ATTEMPT,
            _ => [1; 7],
        };
        assert_eq!(
            fixture::detail_counts(&env.pool, run.id).await,
            expected,
            "{reason:?}"
        );
        assert!(!fixture::is_pruned(&env.pool, run.id).await, "{reason:?}");
        assert_eq!(retained(&reports, reason), 1, "{reason:?} counted");
    }

    // The blockers resolve; the next nightly pass starts over and prunes them all.
    for statement in [
        "UPDATE invocation_attempts SET status = 'succeeded' WHERE status = 'running'",
        "UPDATE settlement_receipts SET status = 'settled', settled_at = now()",
        "UPDATE delegations SET status = 'returned'",
        "UPDATE history_requests SET sealed_at = now()",
    ] {
        sqlx::query(statement).execute(&env.pool).await.unwrap();
    }
    env.pass(account).await;
    for run in [attempt, receipt, delegating, source] {
        assert!(fixture::is_pruned(&env.pool, run.id).await);
        assert_eq!(fixture::detail_rows(&env.pool, run.id).await, 0);
    }
}

#[sqlx::test]
async fn ex5_a_source_inherited_through_a_fork_is_held_back(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let source_conversation = fixture::conversation(&env.pool, account).await;
    let inherited = env
        .run(RunSpec::conversation(account, source_conversation, 50.0))
        .await;
    let fork: Uuid = sqlx::query_scalar(
        "INSERT INTO conversations (account_id, forked_from_conversation_id, forked_at_position)
         VALUES ($1, $2, 1) RETURNING id",
    )
    .bind(account)
    .bind(source_conversation)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let first_round = env.run(RunSpec::conversation(account, fork, 0.5)).await;
    let request: Uuid = sqlx::query_scalar(
        "INSERT INTO history_requests (conversation_id, run_id, sealed_at) VALUES ($1, $2, NULL) RETURNING id",
    )
    .bind(fork)
    .bind(first_round.id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO history_request_sources (history_request_id, source_run_id) VALUES ($1, $2)",
    )
    .bind(request)
    .bind(inherited.id)
    .execute(&env.pool)
    .await
    .unwrap();
    let reports = env.pass(account).await;
    assert!(fixture::has_detail(&env.pool, inherited.id).await);
    assert_eq!(retained(&reports, RetainReason::ActiveHistoryRequest), 1);
}

#[sqlx::test]
async fn ex5_a_sealed_history_request_holds_nothing_back(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let source = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    let later = env
        .run(RunSpec::conversation(account, conversation, 1.0))
        .await;
    let request: Uuid = sqlx::query_scalar(
        "INSERT INTO history_requests (conversation_id, run_id, sealed_at) VALUES ($1, $2, now()) RETURNING id",
    )
    .bind(conversation)
    .bind(later.id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO history_request_sources (history_request_id, source_run_id) VALUES ($1, $2)",
    )
    .bind(request)
    .bind(source.id)
    .execute(&env.pool)
    .await
    .unwrap();
    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, source.id).await);
}

#[sqlx::test]
async fn ex5_pending_work_committed_while_an_owner_waits_for_its_run_wins(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.owner_lock_timeout = Duration::from_secs(30);
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    // A writer adds pending work: its foreign key holds the run until it commits.
    let mut writer = env.pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO invocation_attempts (run_id, attempt, status) VALUES ($1, 2, 'pending')",
    )
    .bind(run.id)
    .execute(&mut *writer)
    .await
    .unwrap();
    let elsewhere = fixture::conversation(&env.pool, account).await;
    let control = env
        .run(RunSpec::conversation(account, elsewhere, 41.0))
        .await;
    let hop = env.spawn_hop(Args::first(Some(account), pass_start()));
    common::wait_for_lock_waiter(&env.pool, "runs").await;
    writer.commit().await.unwrap();
    let report = hop.await.unwrap();
    assert!(
        !fixture::is_pruned(&env.pool, run.id).await,
        "the writer wins"
    );
    assert!(
        fixture::is_pruned(&env.pool, control.id).await,
        "an owner no writer held goes"
    );
    assert_eq!(report.retained(job::RetainReason::PendingWork), 1);
}
