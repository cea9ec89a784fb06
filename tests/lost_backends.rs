//! ER-7: the worker's backends terminated again and again during a pass (what a failover or an
//! operator's `pg_terminate_backend` does to it) cost retries, never a half-done owner or a file
//! of a row that stayed.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sexton::queue;
use sqlx::PgPool;

use crate::common::fixture::pass_start;
use crate::common::process::poll_until;
use crate::common::{self, audit};

/// Terminates every backend of sexton's (its `application_name`) on the test's database;
/// returns how many it terminated and how many of those were inside a transaction.
async fn terminate_backends(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "WITH sexton AS MATERIALIZED (
             SELECT pid, xact_start FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'sexton'
               AND pid <> pg_backend_pid())
         SELECT count(*), count(*) FILTER (WHERE xact_start IS NOT NULL)
         FROM sexton WHERE pg_terminate_backend(pid)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn er7_backends_terminated_mid_pass_cost_retries_and_lose_nothing(pool: PgPool) {
    let common::Backlog {
        dir,
        settings,
        before,
        url,
    } = common::seeded_backlog(&pool, 7).await;
    assert!(
        before.eligible.len() > 500,
        "a backlog worth terminating backends over"
    );
    let mut settings = settings;
    settings.queue.max_attempts = 100;
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    let mut cmd = crate::crash::worker(&url, dir.path(), false);
    cmd.env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "5")
        .env("SEXTON_QUEUE__RETRY_BACKOFF_MS", "200")
        .env("SEXTON_DATABASE__ACQUIRE_TIMEOUT_MS", "2000");
    let mut worker = cmd.spawn().unwrap();
    poll_until(Duration::from_secs(60), || async {
        audit::pruned_count(&pool).await > 0
    })
    .await;

    // Every 100–400 ms, whatever the worker is doing then, until backends were terminated in ten
    // rounds and inside a transaction three times (on a loaded machine that takes more rounds).
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (mut rounds, mut mid_transaction) = (0, 0);
    for _ in 0..120 {
        if rounds >= 10 && mid_transaction >= 3 {
            break;
        }
        // fault injection at a random instant, not synchronisation
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
        let (terminated, busy) = terminate_backends(&pool).await;
        rounds += usize::from(terminated > 0);
        mid_transaction += busy;
        audit::whole_or_pruned(&pool).await;
        audit::no_file_lost(&pool, &settings.paths.output_root, &before).await;
    }
    assert!(rounds >= 10, "backends were terminated only {rounds} times");
    assert!(
        mid_transaction >= 3,
        "only {mid_transaction} backends were terminated inside a transaction"
    );
    assert!(
        (audit::pruned_count(&pool).await as usize) < before.eligible.len(),
        "the pass ended before the terminations did"
    );

    poll_until(Duration::from_secs(180), || async {
        queue::counts(&pool).await.unwrap().idle()
    })
    .await;
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker process exited during the pass"
    );
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    audit::verify(&pool, &settings.paths.output_root, &before, true).await;
    let failed: Vec<(String, i32, i32)> = sqlx::query_as(
        "SELECT job_type, attempts, max_attempts FROM apalis.jobs
         WHERE status IN ('Failed', 'Killed')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(failed, [], "jobs failed for good");
}
