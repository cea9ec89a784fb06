//! How a hop fails (EX-8): a failure a retry may cure is retried; the database refusing the
//! statement itself (a column missing, a privilege not granted) fails the hop for good, so that
//! the operator sees it at once instead of after every retry.

use std::sync::atomic::AtomicBool;

use sexton_jobs::attachment_expiry::AttachmentExpiry;
use sexton_jobs::clock::ManualClock;
use sexton_jobs::health::Health;
use sexton_jobs::job::{Env, Job, Report};
use sexton_jobs::record_expiry::{Expire, Handoffs};
use sqlx::PgPool;

use crate::common::{self, fixture};

/// `J`'s first hop, its error if it fails.
async fn first_hop<J: Job>(
    pool: &PgPool,
    settings: &sexton::config::Settings,
    account: Option<uuid::Uuid>,
) -> Result<(), J::Error> {
    let mut conn = pool.acquire().await.unwrap();
    let env = Env {
        conn: &mut conn,
        pool,
        clock: &ManualClock::new(fixture::pass_start()),
        stop: &AtomicBool::new(false),
        paths: &settings.paths,
        health: &Health::off(),
    };
    let mut report = Report::new(J::RETAIN_REASONS);
    let args = J::first(account, fixture::pass_start());
    J::run(env, settings.jobs.get(J::NAME), &args, &mut report).await
}

#[sqlx::test]
async fn ex8_a_statement_the_database_refuses_fails_for_good_others_are_retried(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let account = fixture::account(&pool, Some(30)).await;

    // Transient: the attachments root is not there (yet): a retry may find it mounted.
    let missing_root = first_hop::<AttachmentExpiry>(&pool, &settings, Some(account))
        .await
        .expect_err("the attachments root does not exist");
    assert!(AttachmentExpiry::retryable(&missing_root), "{missing_root}");

    // For good: the platform's table lacks the column the statement names.
    sqlx::query("ALTER TABLE handoffs RENAME COLUMN created_at TO made_at")
        .execute(&pool)
        .await
        .unwrap();
    let refused = first_hop::<Expire<Handoffs>>(&pool, &settings, None)
        .await
        .expect_err("the column is missing");
    assert!(!Expire::<Handoffs>::retryable(&refused), "{refused}");
}
