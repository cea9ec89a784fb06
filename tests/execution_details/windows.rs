//! EX-1, EX-2: an owner goes once it is older than its account's window (default 90 days; none,
//! zero or beyond the calendar: nothing is old), aged from its own timestamps.

use chrono::{DateTime, Utc};
use sexton_jobs::prune_execution_details::{self as job, Args, HopOutcome, RetainReason};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, days_before_pass, pass_start};
use crate::common::hops::{Env, retained, run_at};

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
    let first = env.hop(&Args::first(Some(account), pass_start())).await;
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
    let first = env.hop(&Args::first(Some(account), pass_start())).await;
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

    let previews = env.preview(pass_start(), None).await;
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
    for (_, run) in &kept {
        let explained = common::run::explain::<job::PruneExecutionDetails>(
            &env.pool,
            &env.settings,
            env.dir.path(),
            pass_start(),
            "run",
            &run.id.to_string(),
        )
        .await
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

async fn database_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
async fn ex1_a_slot_in_the_future_prunes_nothing_inside_the_window(pool: PgPool) {
    let env = Env::new(pool).await;
    let now = database_now(&env.pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let young = env
        .run(run_at(
            account,
            conversation,
            now - chrono::Duration::days(1),
        ))
        .await;
    let old = env
        .run(run_at(
            account,
            conversation,
            now - chrono::Duration::days(40),
        ))
        .await;
    let future: DateTime<Utc> = "2027-06-01T03:00:00Z".parse().unwrap();
    env.clock.set(future);
    env.pass_from(Args::first(Some(account), future)).await;
    assert!(
        !fixture::is_pruned(&env.pool, young.id).await,
        "a run one day old stays"
    );
    assert!(
        fixture::is_pruned(&env.pool, old.id).await,
        "the control goes"
    );

    // A hand-written payload: a pass start and a carried cutoff in the year 262000.
    let far = DateTime::<Utc>::from_timestamp(8_205_000_000_000, 0).unwrap();
    let payload = Args {
        cutoff: Some(far),
        ..Args::first(Some(account), far)
    };
    env.clock.set(far);
    let reports = env.pass_from(payload).await;
    assert!(!fixture::is_pruned(&env.pool, young.id).await);
    assert_eq!(reports.last().unwrap().outcome, HopOutcome::Finished);
}

#[sqlx::test]
async fn ex1_a_window_beyond_the_calendar_means_nothing_is_old_enough(pool: PgPool) {
    let env = Env::new(pool).await;
    let ancient: DateTime<Utc> = "1000-01-01T00:00:00Z".parse().unwrap();
    let mut absurd = Vec::new();
    for days in [100_000_000, 3_000_000] {
        let account = fixture::account(&env.pool, Some(days)).await;
        let conversation = fixture::conversation(&env.pool, account).await;
        let run = env.run(run_at(account, conversation, ancient)).await;
        absurd.push((account, run.id));
    }
    let normal = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, normal).await;
    let control = env
        .run(RunSpec::conversation(normal, conversation, 40.0))
        .await;
    let waiting = env
        .run(RunSpec::conversation(normal, conversation, 45.0))
        .await;

    let previews = env.preview(pass_start(), None).await;
    assert_eq!(previews.len(), 3, "the preview covers every account");
    for (account, _) in &absurd {
        let p = previews.iter().find(|p| p.account_id == *account).unwrap();
        assert_eq!((p.cutoff, p.eligible_owners), (None, 0));
    }
    let backlog = fixture::execution_backlog(&env.pool, pass_start()).await;
    assert!(
        (backlog - 15.0 * 86_400.0).abs() < 1.0,
        "the gauge still measures the normal account: {backlog}"
    );
    for (account, run) in &absurd {
        let reports = env.pass(*account).await;
        assert_eq!(reports.last().unwrap().outcome, HopOutcome::Finished);
        assert!(!fixture::is_pruned(&env.pool, *run).await);
    }
    env.pass(normal).await;
    assert!(fixture::is_pruned(&env.pool, control.id).await);
    assert!(fixture::is_pruned(&env.pool, waiting.id).await);
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

#[sqlx::test]
async fn ex2_very_old_and_infinite_timestamps_are_pruned_or_counted(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let year_900 = env
        .run(run_at(
            account,
            conversation,
            "0900-06-01T00:00:00Z".parse().unwrap(),
        ))
        .await;
    let infinite = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    sqlx::query("UPDATE runs SET completed_at = '-infinity' WHERE id = $1")
        .bind(infinite.id)
        .execute(&env.pool)
        .await
        .unwrap();

    let preview = env.preview(pass_start(), Some(&[account])).await;
    assert_eq!(preview[0].eligible_owners, 1, "the year-900 run");
    assert_eq!(
        preview[0]
            .retained
            .get(&job::RetainReason::NotEligible)
            .copied(),
        Some(1),
        "the infinite one is counted, not eligible"
    );
    let backlog = fixture::execution_backlog(&env.pool, pass_start()).await;
    assert!(backlog > 1000.0 * 365.0 * 86_400.0, "{backlog}");

    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, year_900.id).await);
    assert!(!fixture::is_pruned(&env.pool, infinite.id).await);
    let backlog = fixture::execution_backlog(&env.pool, pass_start()).await;
    assert_eq!(backlog, 0.0);
}
