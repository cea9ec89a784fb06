//! EX-8 for real: worker processes killed with SIGKILL at random points of a pass.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use sqlx::PgPool;

use crate::common::fixture::pass_start;
use crate::common::process::{HEARTBEAT_MS, MISSED_HEARTBEATS};
use crate::common::{self, audit};

pub fn worker(url: &str, dir: &std::path::Path, exit_when_idle: bool) -> tokio::process::Command {
    let mut cmd = common::sexton(url, dir);
    cmd.arg("worker")
        .env(
            "SEXTON_QUEUE__HEARTBEAT_INTERVAL_MS",
            HEARTBEAT_MS.to_string(),
        )
        .env(
            "SEXTON_QUEUE__MISSED_HEARTBEATS",
            MISSED_HEARTBEATS.to_string(),
        )
        .env("SEXTON_QUEUE__MAX_ATTEMPTS", "100")
        .env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "10")
        .env("SEXTON_LOG__LEVEL", "warn")
        .stderr(std::process::Stdio::null());
    if exit_when_idle {
        cmd.arg("--exit-when-idle");
    }
    cmd
}

#[sqlx::test]
async fn ex8_workers_killed_with_sigkill_mid_pass_lose_nothing_and_the_pass_completes(
    pool: PgPool,
) {
    let common::Backlog {
        dir,
        settings,
        before,
        url,
    } = common::seeded_backlog(&pool, 3).await;
    assert!(
        before.eligible.len() > 500,
        "a backlog worth killing workers over"
    );
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
    let mut kills_mid_pass = 0;
    for _ in 0..20 {
        let mut child = worker(&url, dir.path(), false).spawn().unwrap();
        let delay = Duration::from_millis(rng.random_range(100..700));
        tokio::time::sleep(delay).await; // fault injection at a random instant, not synchronisation
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        // Between kills the state must already be sound: nothing half-pruned, files agree.
        audit::verify(&pool, &settings.paths.output_root, &before, false).await;
        if (audit::pruned_count(&pool).await as usize) < before.eligible.len() {
            kills_mid_pass += 1;
        }
    }
    assert!(
        kills_mid_pass >= 5,
        "only {kills_mid_pass} kills landed mid-pass"
    );

    let mut child = worker(&url, dir.path(), true).spawn().unwrap();
    let status = common::wait(&mut child, Duration::from_secs(180)).await;
    assert!(status.success(), "the last worker exited with {status}");
    audit::verify(&pool, &settings.paths.output_root, &before, true).await;
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM apalis.jobs WHERE status IN ('Failed', 'Killed')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failed, 0);
}
