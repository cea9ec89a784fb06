//! EX-8 for real: worker processes killed with SIGKILL at random points of a pass.

use std::ops::Range;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sexton::queue;
use sqlx::PgPool;

use crate::common::fixture::pass_start;
use crate::common::process::{fleet_worker, poll_until, worker_like};
use crate::common::{self, audit};

/// A fleet worker of the kill tests: quiet, small windows, attempts enough for every kill.
pub fn worker(url: &str, dir: &std::path::Path, exit_when_idle: bool) -> tokio::process::Command {
    let mut cmd = fleet_worker(url, dir);
    cmd.env("SEXTON_QUEUE__MAX_ATTEMPTS", "100")
        .env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "10")
        .env("SEXTON_LOG__LEVEL", "warn")
        .stderr(std::process::Stdio::null());
    if exit_when_idle {
        cmd.arg("--exit-when-idle");
    }
    cmd
}

/// Starts `cmd` and, once it holds a job of `job_type` — a rescued one, or one nobody held —
/// kills it with SIGKILL at a random instant of `within` milliseconds later. Returns whether the
/// kill caught it holding such a job, which it then leaves running for a replica to rescue;
/// `None` when the queue had nothing left to run.
pub async fn kill_while_working(
    pool: &PgPool,
    mut cmd: tokio::process::Command,
    job_type: &str,
    rng: &mut ChaCha8Rng,
    within: Range<u64>,
) -> Option<bool> {
    let mut child = cmd.spawn().unwrap();
    let held = worker_like(child.id().unwrap());
    let holds = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM apalis.jobs
                            WHERE job_type = $1 AND status = 'Running' AND lock_by LIKE $2)",
        )
        .bind(job_type)
        .bind(&held)
        .fetch_one(pool)
        .await
        .unwrap()
    };
    poll_until(Duration::from_secs(60), || async {
        holds().await || queue::counts(pool).await.unwrap().idle()
    })
    .await;
    let working = holds().await;
    if working {
        let delay = Duration::from_millis(rng.random_range(within));
        tokio::time::sleep(delay).await; // fault injection at a random instant, not synchronisation
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    if !working {
        return None;
    }
    Some(holds().await)
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
    // The slot job may die with its worker again and again too: as many attempts as the
    // workers' hops have, or its rescue would fail it for good (FL-4).
    let mut settings = settings;
    settings.queue.max_attempts = 100;
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();

    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let mut kills_mid_hop = 0;
    for _ in 0..10 {
        let cmd = worker(&url, dir.path(), false);
        let job_type = "sexton.prune_execution_details";
        let Some(caught) = kill_while_working(&pool, cmd, job_type, &mut rng, 0..50).await else {
            break;
        };
        kills_mid_hop += usize::from(caught);
        // Between kills the state must already be sound: nothing half-pruned, files agree.
        audit::verify(&pool, &settings.paths.output_root, &before, false).await;
    }
    assert!(
        kills_mid_hop >= 3,
        "only {kills_mid_hop} kills caught a worker in a hop"
    );
    assert!(
        (audit::pruned_count(&pool).await as usize) < before.eligible.len(),
        "the pass ended before the kills did"
    );

    let mut child = worker(&url, dir.path(), true).spawn().unwrap();
    let status = common::wait(&mut child, Duration::from_secs(180)).await;
    assert!(status.success(), "the last worker exited with {status}");
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
