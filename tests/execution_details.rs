//! PruneExecutionDetails (SPEC §2): EX-1 … EX-8, hop by hop against a real PostgreSQL.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sexton_jobs::files::{self, Root};
use sexton_jobs::job::Job;
use sexton_jobs::prune_execution_details::{
    self as job, Args, HopOutcome, HopReport, RetainReason,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, days_before_pass, pass_start};
use crate::common::hops::Env;

fn retained(reports: &[HopReport], reason: RetainReason) -> u32 {
    reports
        .iter()
        .map(|r| r.retained.get(&reason).copied().unwrap_or_default())
        .sum()
}

#[sqlx::test]
async fn ex1_default_window_is_90_days(pool: PgPool) {
    let env = Env::new(pool).await;
    let account: Uuid = sqlx::query_scalar("INSERT INTO accounts DEFAULT VALUES RETURNING id")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let conversation = fixture::conversation(&env.pool, account).await;
    let old = env
        .run(RunSpec::conversation(account, conversation, 90.5))
        .await;
    let recent = env
        .run(RunSpec::conversation(account, conversation, 89.5))
        .await;
    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, old.id).await);
    assert_eq!(fixture::detail_rows(&env.pool, old.id).await, 0);
    assert!(!fixture::is_pruned(&env.pool, recent.id).await);
    assert!(fixture::has_detail(&env.pool, recent.id).await);
}

#[sqlx::test]
async fn ex1_custom_window(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let old = env
        .run(RunSpec::conversation(account, conversation, 31.0))
        .await;
    let recent = env
        .run(RunSpec::conversation(account, conversation, 29.0))
        .await;
    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, old.id).await);
    assert!(fixture::has_detail(&env.pool, recent.id).await);
}

#[sqlx::test]
async fn ex1_disabled_mid_pass_the_next_hop_prunes_nothing_and_ends_the_pass(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.window_size = 1;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let mut runs = Vec::new();
    for days in [100.0, 90.0, 80.0] {
        runs.push(
            env.run(RunSpec::conversation(account, conversation, days))
                .await,
        );
    }
    let first = env.hop(&Args::first(account, pass_start())).await;
    assert_eq!(first.pruned, 1);
    sqlx::query("UPDATE accounts SET execution_details_retention_days = NULL WHERE id = $1")
        .bind(account)
        .execute(&env.pool)
        .await
        .unwrap();
    let second = env.hop(first.next.as_ref().unwrap()).await;
    assert_eq!(second.outcome, HopOutcome::Disabled);
    assert!(second.next.is_none(), "the pass ends");
    assert_eq!(second.pruned, 0);
    assert!(fixture::is_pruned(&env.pool, runs[0].id).await);
    for run in &runs[1..] {
        assert!(fixture::has_detail(&env.pool, run.id).await);
    }
}

#[sqlx::test]
async fn ex1_window_raised_mid_pass_nothing_newer_than_the_stricter_bound_goes(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.window_size = 1;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let oldest = env
        .run(RunSpec::conversation(account, conversation, 100.0))
        .await;
    let middle = env
        .run(RunSpec::conversation(account, conversation, 60.0))
        .await;
    let newest = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let first = env.hop(&Args::first(account, pass_start())).await;
    assert_eq!(first.pruned, 1);
    sqlx::query("UPDATE accounts SET execution_details_retention_days = 90 WHERE id = $1")
        .bind(account)
        .execute(&env.pool)
        .await
        .unwrap();
    let mut next = first.next;
    while let Some(args) = next {
        next = env.hop(&args).await.next;
    }
    assert!(fixture::is_pruned(&env.pool, oldest.id).await);
    assert!(fixture::has_detail(&env.pool, middle.id).await);
    assert!(fixture::has_detail(&env.pool, newest.id).await);
}

#[sqlx::test]
async fn ex1_raising_or_disabling_restores_nothing_and_does_not_fail(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    env.pass(account).await;
    for days in [Some(365), None] {
        sqlx::query("UPDATE accounts SET execution_details_retention_days = $2 WHERE id = $1")
            .bind(account)
            .bind(days)
            .execute(&env.pool)
            .await
            .unwrap();
        env.pass(account).await;
        assert!(fixture::is_pruned(&env.pool, run.id).await);
        assert_eq!(fixture::detail_rows(&env.pool, run.id).await, 0);
    }
}

#[sqlx::test]
async fn ex2_conversation_runs_age_from_completed_at_not_delivered_at(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let mut spec = RunSpec::conversation(account, conversation, 5.0);
    spec.delivered_at = Some(days_before_pass(200.0));
    let late = env.run(spec).await;
    let mut spec = RunSpec::conversation(account, conversation, 0.0);
    spec.completed_at = None;
    let unfinished = env.run(spec).await;
    // The reverse: completed long ago, delivered just now: completed_at decides, it goes.
    let mut spec = RunSpec::conversation(account, conversation, 200.0);
    spec.delivered_at = Some(days_before_pass(1.0));
    let delivered_late = env.run(spec).await;
    env.pass(account).await;
    assert!(fixture::has_detail(&env.pool, late.id).await);
    assert!(fixture::has_detail(&env.pool, unfinished.id).await);
    assert!(fixture::is_pruned(&env.pool, delivered_late.id).await);
    assert_eq!(fixture::detail_rows(&env.pool, delivered_late.id).await, 0);
}

#[sqlx::test]
async fn ex2_direct_replies_age_from_terminal_at_once_settled(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let reply = |terminal: f64, settled: Option<f64>| RunSpec {
        kind: "direct_reply",
        completed_at: Some(days_before_pass(200.0)),
        terminal_at: Some(days_before_pass(terminal)),
        settled_at: settled.map(days_before_pass),
        ..RunSpec::conversation(account, conversation, 0.0)
    };
    let unsettled = env.run(reply(100.0, None)).await;
    let settled_old = env.run(reply(100.0, Some(99.0))).await;
    let settled_late = env.run(reply(100.0, Some(1.0))).await;
    let settled_recent = env.run(reply(10.0, Some(9.0))).await;
    env.pass(account).await;
    assert!(fixture::has_detail(&env.pool, unsettled.id).await);
    assert!(fixture::is_pruned(&env.pool, settled_old.id).await);
    assert!(fixture::is_pruned(&env.pool, settled_late.id).await);
    assert!(fixture::has_detail(&env.pool, settled_recent.id).await);
}

#[sqlx::test]
async fn ex2_standalone_and_inference_runs_are_never_touched(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let mut untouched = Vec::new();
    for kind in ["standalone", "inference"] {
        let spec = RunSpec {
            kind,
            conversation: None,
            terminal_at: Some(days_before_pass(300.0)),
            settled_at: Some(days_before_pass(300.0)),
            ..RunSpec::conversation(account, conversation, 300.0)
        };
        untouched.push(env.run(spec).await);
    }
    // A conversation-kind run without a conversation is not an owner either.
    let spec = RunSpec {
        conversation: None,
        ..RunSpec::conversation(account, conversation, 300.0)
    };
    untouched.push(env.run(spec).await);
    // The control: a conversation run as old as they are goes.
    let owner = env
        .run(RunSpec::conversation(account, conversation, 300.0))
        .await;
    env.pass(account).await;
    for run in untouched {
        assert!(fixture::has_detail(&env.pool, run.id).await);
        assert!(!fixture::is_pruned(&env.pool, run.id).await);
    }
    assert!(fixture::is_pruned(&env.pool, owner.id).await);
    assert_eq!(fixture::detail_rows(&env.pool, owner.id).await, 0);
}

#[sqlx::test]
async fn ex2_regenerated_candidates_and_delegated_children_age_on_their_own(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let original = env
        .run(RunSpec::conversation(account, conversation, 60.0))
        .await;
    let regenerated = env
        .run(RunSpec {
            turn: original.turn,
            ..RunSpec::conversation(account, conversation, 10.0)
        })
        .await;
    let parent = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let child = env
        .run(RunSpec {
            parent: Some(parent.id),
            ..RunSpec::conversation(account, conversation, 45.0)
        })
        .await;
    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, original.id).await);
    assert!(fixture::has_detail(&env.pool, regenerated.id).await);
    assert!(fixture::is_pruned(&env.pool, child.id).await);
    assert!(fixture::has_detail(&env.pool, parent.id).await);
}

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
    assert_eq!(reports.iter().map(|r| r.pruned).sum::<u32>(), 1);

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
    let hop = env.spawn_hop(Args::first(account, pass_start()));
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
    assert_eq!(report.retained.get(&RetainReason::PendingWork), Some(&1));
    assert_eq!(
        fixture::detail_counts(&env.pool, run.id).await,
        fixture::WITH_SECOND_ATTEMPT
    );
    assert!(!fixture::is_pruned(&env.pool, run.id).await);
}

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
    let per_hop: Vec<u32> = reports.iter().map(|r| r.pruned).collect();
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
    let first = env.hop(&Args::first(account, pass_start())).await;
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
    let args = Args::first(account, pass_start());
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
    let first = env.hop(&Args::first(account, pass_start())).await;
    sqlx::query("DELETE FROM accounts WHERE id = $1")
        .bind(account)
        .execute(&env.pool)
        .await
        .unwrap();
    let second = env.hop(first.next.as_ref().unwrap()).await;
    assert_eq!(second.outcome, HopOutcome::AccountGone);
    assert!(second.next.is_none());
}

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
    let stop = AtomicBool::new(false);
    let args = |account| Args::first(account, pass_start());

    let exact = sized(declared).await;
    let report = job::run(&exact, &env.clock, &env.settings, &args(accounts[0]), &stop)
        .await
        .unwrap();
    assert_eq!(
        (report.pruned, report.files_deleted),
        (OWNERS as u32, OWNERS as u64)
    );
    assert_eq!(files_left(accounts[0]), 0);

    exact.close().await;

    let short = sized(declared - 1).await;
    let failed = job::run(&short, &env.clock, &env.settings, &args(accounts[1]), &stop).await;
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
    assert_eq!(report.files_deleted, recorded as u64);
    assert_eq!(files_left(accounts[1]), 0);
    assert!(
        young.iter().all(|file| file.exists()),
        "young runs' files stay"
    );
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
fn spawn_pass(env: &Env, account: Uuid) -> tokio::task::JoinHandle<u32> {
    let (pool, clock, settings) = (env.pool.clone(), env.clock.clone(), env.settings.clone());
    tokio::spawn(async move {
        let mut args = Args::first(account, pass_start());
        let mut pruned = 0;
        loop {
            let report = job::run(&pool, &clock, &settings, &args, &AtomicBool::new(false))
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
        pass: &tokio::task::JoinHandle<u32>,
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

    let mut conn = env.pool.acquire().await.unwrap();
    let previews = job::preview(&mut conn, pass_start(), Some(&[account]))
        .await
        .unwrap();
    drop(conn);
    let reports = env.pass(account).await;

    assert_eq!(previews.len(), 1);
    let preview = &previews[0];
    let pruned: u32 = reports.iter().map(|r| r.pruned).sum();
    assert_eq!((preview.eligible_owners, pruned), (3, 3));
    for reason in [
        RetainReason::PendingWork,
        RetainReason::PendingSettlement,
        RetainReason::OutstandingDelegation,
    ] {
        assert_eq!(
            preview.retained.get(&reason).copied().unwrap_or_default(),
            i64::from(retained(&reports, reason)),
            "{reason:?}"
        );
        assert_eq!(retained(&reports, reason), 1, "{reason:?}");
    }
    for (table, expected) in &preview.rows {
        let deleted: u64 = reports.iter().filter_map(|r| r.rows.get(table)).sum();
        assert_eq!(*expected as u64, deleted, "{table}");
    }
    assert_eq!(preview.rows.values().sum::<i64>(), 3 * 7);
    let bytes: u64 = reports.iter().map(|r| r.bytes_reclaimed).sum();
    assert_eq!(
        (preview.bytes, bytes),
        (15, 15),
        "five bytes per output file"
    );
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

/// The platform's own schema need not carry the reference CHECK (EX-1).
async fn without_window_check(pool: &PgPool) {
    sqlx::query(
        "ALTER TABLE accounts DROP CONSTRAINT accounts_execution_details_retention_days_positive",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test]
async fn ex1_a_window_of_zero_or_less_means_nothing_is_old(pool: PgPool) {
    let env = Env::new(pool).await;
    without_window_check(&env.pool).await;
    let mut kept = Vec::new();
    let mut absurd = Vec::new();
    for days in [-5, 0] {
        let account = fixture::account(&env.pool, Some(days)).await;
        let conversation = fixture::conversation(&env.pool, account).await;
        for age in [1.0 / 24.0, 1.0, 400.0, -1.0] {
            kept.push((
                account,
                env.run(RunSpec::conversation(account, conversation, age))
                    .await,
            ));
        }
        absurd.push(account);
    }
    let normal = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, normal).await;
    let control = env
        .run(RunSpec::conversation(normal, conversation, 40.0))
        .await;

    let mut conn = env.pool.acquire().await.unwrap();
    let previews = job::preview(&mut conn, pass_start(), None).await.unwrap();
    for account in &absurd {
        let p = previews.iter().find(|p| p.account_id == *account).unwrap();
        assert_eq!((p.cutoff, p.eligible_owners), (None, 0), "{p:?}");
        assert_eq!(p.retained.get(&RetainReason::InvalidWindow), Some(&1));
    }
    let backlog = fixture::execution_backlog(&env.pool, pass_start()).await;
    assert!(
        (backlog - 10.0 * 86_400.0).abs() < 1.0,
        "only the normal account's backlog counts: {backlog}"
    );
    let paths = common::run::roots(env.dir.path());
    for (_, run) in &kept {
        let explained = job::PruneExecutionDetails::explain(
            &mut conn,
            &env.settings,
            &paths,
            pass_start(),
            "run",
            &run.id.to_string(),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(
            explained.reasons.iter().any(|r| r.code == "invalid_window"),
            "{explained:?}"
        );
    }
    for account in &absurd {
        let reports = env.pass(*account).await;
        assert_eq!(reports.len(), 1, "the pass ends at once");
        assert_eq!(retained(&reports, RetainReason::InvalidWindow), 1);
        assert_eq!(reports[0].pruned, 0);
    }
    for (account, run) in &kept {
        assert!(!fixture::is_pruned(&env.pool, run.id).await, "{run:?}");
        assert!(fixture::has_detail(&env.pool, run.id).await);
        assert!(env.output_file(*account, run.id).exists());
    }
    env.pass(normal).await;
    assert!(
        fixture::is_pruned(&env.pool, control.id).await,
        "the control account's old run goes"
    );
    assert!(!env.output_file(normal, control.id).exists());
}
