//! FL-5, kind by kind: a hop that starts while its worker is stopping takes nothing and hands
//! its whole pass to the next hop, which takes it. The owner loop decides this once for every
//! row-owning kind; each kind is run here through the `Job` trait, as the worker runs it.

use std::path::Path;

use chrono::Duration;
use sexton_jobs::attachment_expiry::AttachmentExpiry;
use sexton_jobs::health::Health;
use sexton_jobs::job::Job;
use sexton_jobs::pass::ArgsOf;
use sexton_jobs::prune_execution_details::PruneExecutionDetails;
use sexton_jobs::queue_retention::QueueRetention;
use sexton_jobs::record_expiry::{ConversationEvents, Expire, Handoffs};
use sexton_jobs::session_retention::SessionRetention;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, days_before_pass, pass_start};
use crate::common::{self, run};

/// Runs `J`'s first hop with the worker stopping, then the hop it handed over, counting what
/// `remaining` (a count) sees before, after the first and after the second.
async fn hands_over<J: Job>(pool: &PgPool, dir: &Path, account: Option<Uuid>, remaining: &str) {
    let settings = common::settings(dir);
    let job: &J::Settings = settings.jobs.get(J::NAME);
    let count = || async {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(remaining))
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let before = count().await;
    assert!(before > 0, "{}: the case has something to remove", J::NAME);
    let first = ArgsOf::<J>::first(account, pass_start());
    let health = Health::off();
    let stopped = run::hop_stopping::<J>(pool, &settings.paths, &health, job, &first, true).await;
    assert_eq!(stopped.outcome.as_str(), "continued", "{}", J::NAME);
    assert_eq!((stopped.candidates, stopped.pruned), (0, 0), "{}", J::NAME);
    assert_eq!(
        count().await,
        before,
        "{}: nothing went while stopping",
        J::NAME
    );
    let next = stopped
        .next
        .unwrap_or_else(|| panic!("{}: the pass is handed over", J::NAME));
    let (from, to) = (first.position(), next.position());
    assert_eq!(to.hop, from.hop + 1, "{}", J::NAME);
    assert_eq!(
        (to.account, to.pass_started_at),
        (from.account, from.pass_started_at),
        "{}: the same pass",
        J::NAME
    );
    // The control: the hop handed over takes what the stopped one left.
    let resumed = run::hop_with::<J>(pool, &settings.paths, &health, job, &next).await;
    assert!(resumed.pruned > 0, "{}: {resumed:?}", J::NAME);
    assert!(
        count().await < before,
        "{}: the next hop removed it",
        J::NAME
    );
}

#[sqlx::test]
async fn fl5_a_stopping_worker_takes_nothing_and_hands_the_pass_over_for_every_kind(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    for root in [
        &settings.paths.sessions_root,
        &settings.paths.attachments_root,
    ] {
        std::fs::create_dir_all(root).unwrap();
    }
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    fixture::run(
        &pool,
        &settings.paths.output_root,
        RunSpec::conversation(account, conversation, 90.0),
    )
    .await;
    hands_over::<PruneExecutionDetails>(
        &pool,
        dir.path(),
        Some(account),
        "SELECT count(*) FROM runs WHERE details_pruned_at IS NULL",
    )
    .await;

    sqlx::query("INSERT INTO session_retention_policies (account_id, enabled) VALUES ($1, true)")
        .bind(account)
        .execute(&pool)
        .await
        .unwrap();
    let agent = fixture::agent(&pool, account).await;
    fixture::session(&pool, account, agent, "main", 400, None).await;
    hands_over::<SessionRetention>(
        &pool,
        dir.path(),
        Some(account),
        "SELECT count(*) FROM sessions",
    )
    .await;

    let file = settings.paths.attachments_root.join("a/old.bin");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"bytes").unwrap();
    common::fixture::set_mtime(&file, days_before_pass(4000.0));
    sqlx::query("INSERT INTO attachments (account_id, relative_path) VALUES ($1, 'a/old.bin')")
        .bind(account)
        .execute(&pool)
        .await
        .unwrap();
    hands_over::<AttachmentExpiry>(
        &pool,
        dir.path(),
        Some(account),
        "SELECT count(*) FROM attachments WHERE bytes_expired_at IS NULL",
    )
    .await;

    sqlx::query("INSERT INTO handoffs (account_id, agent_id, created_at) VALUES ($1, $2, $3)")
        .bind(account)
        .bind(agent)
        .bind(days_before_pass(400.0))
        .execute(&pool)
        .await
        .unwrap();
    hands_over::<Expire<Handoffs>>(&pool, dir.path(), None, "SELECT count(*) FROM handoffs").await;
    sqlx::query(
        "INSERT INTO conversation_events (conversation_id, kind, created_at) VALUES ($1, 'x', $2)",
    )
    .bind(conversation)
    .bind(days_before_pass(400.0))
    .execute(&pool)
    .await
    .unwrap();
    hands_over::<Expire<ConversationEvents>>(
        &pool,
        dir.path(),
        None,
        "SELECT count(*) FROM conversation_events",
    )
    .await;

    sqlx::query(
        "INSERT INTO apalis.jobs (job, id, job_type, max_attempts)
         VALUES (convert_to('{}', 'UTF8'), 'finished-long-ago', 'sexton.nightly', 5)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE apalis.jobs SET status = 'Done', run_at = $1, done_at = $1
         WHERE id = 'finished-long-ago'",
    )
    .bind(pass_start() - Duration::days(400))
    .execute(&pool)
    .await
    .unwrap();
    hands_over::<QueueRetention>(
        &pool,
        dir.path(),
        None,
        "SELECT count(*) FROM apalis.jobs WHERE id = 'finished-long-ago'",
    )
    .await;
}
