//! The queue (FL-1): a job on each queue runs and a worker exits when idle; what the queue cannot
//! decode, a payload the worker refuses and a hop that panics each fail alone, with a reason, and
//! the good work beside them completes.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use sexton::queue::{self, PushOptions, PushOutcome};
use sexton::registry::{self, KINDS};
use sexton::tick::NIGHTLY;
use sexton_jobs::clock::ManualClock;
use sexton_jobs::job::{Cadence, Job as _, Scope};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::process::{Proc, poll_until};

#[sqlx::test]
async fn fl1_a_job_on_each_queue_runs_and_the_worker_exits_when_idle(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    for (queue, payload) in sample_payloads() {
        let outcome = queue::push(
            &pool,
            queue,
            &settings.queue,
            &payload,
            PushOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(outcome, PushOutcome::Enqueued);
    }
    common::run_until_idle(&pool, dir.path()).await;
    for (queue, _) in sample_payloads() {
        // The nightly slot fans out one more first hop to every global kind (the database has
        // no accounts, so none to a per-account kind); two hops of one global kind that meet
        // each other's scope lock leave one more, deferred, job (FL-3).
        let fanned_out = registry::by_queue(queue).is_some_and(|k| {
            k.scope() == Scope::Global && k.cadence(&settings) == Cadence::Nightly
        });
        let (done, other): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'Done'), count(*) FILTER (WHERE status <> 'Done')
             FROM apalis.jobs WHERE job_type = $1",
        )
        .bind(queue)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(
            done > i64::from(fanned_out),
            "the job on {queue} ran ({done} done)"
        );
        assert_eq!(other, 0, "every job on {queue} is done");
    }
    let counts = queue::counts(&pool).await.unwrap();
    assert_eq!((counts.pending, counts.running, counts.failed), (0, 0, 0));
}

#[sqlx::test]
async fn fl1_a_malformed_payload_fails_its_job_and_the_worker_lives_on(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let bad = serde_json::json!({"version": 99, "slot": "2026-12-01T03:00:00Z"});
    queue::push(
        &pool,
        NIGHTLY,
        &settings.queue,
        &bad,
        PushOptions::default(),
    )
    .await
    .unwrap();
    let good = nightly_payload();
    queue::push(
        &pool,
        NIGHTLY,
        &settings.queue,
        &good,
        PushOptions::default(),
    )
    .await
    .unwrap();
    worker_until_idle(&pool, dir.path(), true).await;
    let (status, result): (String, String) = sqlx::query_as(
        "SELECT status, last_result::text FROM apalis.jobs WHERE convert_from(job, 'UTF8')::jsonb ->> 'version' = '99'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        status, "Killed",
        "a bad payload is failed for good, not retried"
    );
    assert!(
        result.contains("unsupported payload version 99"),
        "{result}"
    );
    let done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE job_type = 'sexton.nightly' AND status = 'Done'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(done, 1, "the good job beside it ran");
}

fn nightly_payload() -> serde_json::Value {
    serde_json::json!({"version": 1, "slot": "2026-12-01T03:00:00Z"})
}

/// One job for every queue a worker serves: a nightly slot, and a first hop of every kind.
fn sample_payloads() -> Vec<(&'static str, serde_json::Value)> {
    let slot = "2026-12-01T03:00:00Z".parse().unwrap();
    std::iter::once((NIGHTLY, nightly_payload()))
        .chain(KINDS.iter().map(|kind| {
            let payload = kind.first_payload(Some(uuid::Uuid::new_v4()), slot);
            (kind.queue(), payload)
        }))
        .collect()
}

/// Writes a queue row by hand, as an attacker or a broken producer would.
async fn raw_job(pool: &PgPool, id: &str, queue: &str, job: &[u8]) {
    sqlx::query(
        "INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts)
         VALUES ($1, $2, $3, 'Pending', 0, 2)",
    )
    .bind(job)
    .bind(id)
    .bind(queue)
    .execute(pool)
    .await
    .unwrap();
}

fn ulid(rng: &mut impl Rng) -> String {
    const CROCKFORD: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut id = String::from(char::from(b'0' + rng.random_range(0..8u8)));
    for _ in 0..25 {
        id.push(char::from(CROCKFORD[rng.random_range(0..32)]));
    }
    id
}

/// Good work beside the bad rows: an old run whose pass must complete.
async fn good_work(pool: &PgPool, dir: &std::path::Path) -> Uuid {
    let account = fixture::account(pool, Some(30)).await;
    let conversation = fixture::conversation(pool, account).await;
    let run = fixture::run(
        pool,
        &dir.join("outputs"),
        RunSpec::conversation(account, conversation, 40.0),
    )
    .await;
    let settings = common::settings(dir);
    sexton::tick::tick(pool, &settings, pass_start())
        .await
        .unwrap();
    run.id
}

/// `sexton worker --exit-when-idle`'s lines; it exits 1, saying so, when a job it ran
/// `failed_for_good` (OP-1), 0 otherwise.
async fn worker_until_idle(
    pool: &PgPool,
    dir: &std::path::Path,
    failed_for_good: bool,
) -> Vec<String> {
    let url = common::database_url(pool).await;
    let mut cmd = common::sexton(&url, dir);
    cmd.args(["worker", "--exit-when-idle"]);
    let (status, lines) = Proc::spawn(cmd).finish(Duration::from_secs(120)).await;
    if failed_for_good {
        assert_eq!(status.code(), Some(1), "worker exited with {status}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("this worker ran failed for good")),
            "{lines:#?}"
        );
    } else {
        assert!(status.success(), "worker exited with {status}");
    }
    lines
}

#[sqlx::test]
async fn fl1_rows_the_queue_cannot_decode_end_killed_with_a_reason_alone(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    raw_job(
        &pool,
        &ulid(&mut rng),
        "sexton.prune_execution_details",
        b"\xff not json",
    )
    .await;
    raw_job(
        &pool,
        "not-a-ulid",
        "sexton.nightly",
        br#"{"version":1,"slot":"2026-11-01T03:00:00Z"}"#,
    )
    .await;
    // JSON that PostgreSQL reads but the worker's decoder refuses: too deep, too large.
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    raw_job(
        &pool,
        &ulid(&mut rng),
        "sexton.prune_execution_details",
        deep.as_bytes(),
    )
    .await;
    raw_job(
        &pool,
        &ulid(&mut rng),
        "sexton.nightly",
        br#"{"version":1,"slot":1e400}"#,
    )
    .await;
    let run = good_work(&pool, dir.path()).await;

    let lines = worker_until_idle(&pool, dir.path(), false).await;
    assert!(
        lines.len() < 500,
        "no restart loop: {} log lines",
        lines.len()
    );
    let killed: Vec<(String, String)> = sqlx::query_as(
        "SELECT id, last_result ->> 'Err' FROM apalis.jobs WHERE status = 'Killed' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(killed.len(), 4, "{killed:?}");
    assert_eq!(
        killed
            .iter()
            .filter(|(_, why)| why.contains("payload is not JSON"))
            .count(),
        3,
        "{killed:?}"
    );
    assert!(
        killed
            .iter()
            .any(|(_, why)| why.contains("payload is not JSON")),
        "{killed:?}"
    );
    assert!(
        killed.iter().any(|(_, why)| why.contains("is not a ULID")),
        "{killed:?}"
    );
    assert!(
        fixture::is_pruned(&pool, run).await,
        "the good work beside them completed"
    );
}

#[sqlx::test]
async fn fl1_random_payload_bytes_and_ids_fail_alone_and_good_work_completes(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1234);
    let queues = ["sexton.nightly", "sexton.prune_execution_details"];
    const BAD: usize = 120;
    for i in 0..BAD {
        let id = if rng.random_bool(0.7) {
            ulid(&mut rng)
        } else {
            let len = rng.random_range(0..40);
            (0..len)
                .map(|_| char::from(rng.random_range(32u8..127)))
                .collect()
        };
        let job: Vec<u8> = match rng.random_range(0..4) {
            0 => (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
            1 => serde_json::to_vec(&serde_json::json!({
                "version": rng.random_range(0..4),
                "account_id": if rng.random_bool(0.5) { serde_json::json!(rng.random::<u32>()) } else { serde_json::json!("x") },
                "slot": rng.random::<i64>(),
            }))
            .unwrap(),
            2 => serde_json::to_vec(&serde_json::json!([i, rng.random::<f64>(), null])).unwrap(),
            _ => format!("{{\"version\":1,\"slot\":\"{}\"", rng.random::<u16>()).into_bytes(),
        };
        let queue = queues[rng.random_range(0..queues.len())];
        // A colliding random id is just skipped.
        let _ = sqlx::query(
            "INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts)
             VALUES ($1, $2, $3, 'Pending', 0, 2) ON CONFLICT DO NOTHING",
        )
        .bind(&job)
        .bind(&id)
        .bind(queue)
        .execute(&pool)
        .await
        .unwrap();
    }
    let run = good_work(&pool, dir.path()).await;

    // Payloads that reach the handler and are rejected fail for good.
    worker_until_idle(&pool, dir.path(), true).await;
    let (left, unexplained): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status NOT IN ('Done', 'Killed', 'Failed')),
                count(*) FILTER (WHERE status IN ('Killed', 'Failed') AND last_result IS NULL)
         FROM apalis.jobs",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (left, unexplained),
        (0, 0),
        "every bad row ended failed, with a reason"
    );
    let bad_done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE status = 'Done' AND idempotency_key IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(bad_done, 0, "no random row was taken for a job");
    assert!(
        fixture::is_pruned(&pool, run).await,
        "the good work completed"
    );
}

/// A job kind whose hop panics, to prove what the runtime does with it.
struct Panicking;

impl sexton_jobs::job::Job for Panicking {
    const NAME: &'static str = "test_panicking";
    const SECTION: &'static str = "test_panicking";
    type Reason = sexton_jobs::job::NoReason;
    type Cutoff = ();
    type Cursor = ();
    type Raw = serde_json::Value;
    type Settings = ();
    type Error = sexton_jobs::owner_loop::Error;

    fn settings(
        _: serde_json::Value,
        _: &sexton_jobs::files::PathSettings,
        _: &mut sexton_jobs::settings::Check<'_>,
    ) -> Option<()> {
        Some(())
    }

    fn bounds(_: &()) -> sexton_jobs::owner_loop::Bounds {
        sexton_jobs::owner_loop::Bounds {
            window: None,
            budget: Duration::from_secs(1),
        }
    }

    async fn policy(
        _: sexton_jobs::pass::Now<'_, Self>,
    ) -> Result<sexton_jobs::pass::Policy<()>, sexton_jobs::owner_loop::Error> {
        Ok(sexton_jobs::pass::Policy::Cutoff(()))
    }

    async fn run(
        _: sexton_jobs::pass::Step<'_, Self>,
        _: &mut sexton_jobs::job::Report<sexton_jobs::job::NoReason>,
    ) -> Result<sexton_jobs::owner_loop::End<()>, sexton_jobs::owner_loop::Error> {
        panic!("a bug in a job");
    }
}

impl sexton_jobs::job::Inspect for Panicking {
    type Preview = String;

    async fn preview(
        _: sexton_jobs::job::Look<'_, ()>,
        _: Option<&[Uuid]>,
    ) -> Result<Vec<String>, sexton_jobs::owner_loop::Error> {
        Ok(Vec::new())
    }
}

#[sqlx::test]
async fn ex1_a_panicking_hop_fails_its_job_and_never_keeps_its_lock(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::settings(dir.path());
    settings.jobs.set(Panicking::NAME, ());
    let ctx = sexton::context::JobContext::new(
        pool.clone(),
        std::sync::Arc::new(settings),
        std::sync::Arc::new(ManualClock::new(pass_start())),
    );
    let account = Uuid::new_v4();
    for _ in 0..2 {
        let args = sexton_jobs::pass::Args::first(Some(account), pass_start());
        let err = sexton::hop::run::<Panicking>(&ctx, args).await.unwrap_err();
        assert!(format!("{err:#}").contains("a bug in a job"), "{err:#}");
        // The lock died with the connection that held it: another session takes it.
        poll_until(Duration::from_secs(10), || async {
            let free: bool = sqlx::query_scalar(
                "SELECT count(*) = 0 FROM pg_locks WHERE locktype = 'advisory' AND granted",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            free
        })
        .await;
    }
    let failed: (String, String) = sqlx::query_as(
        "SELECT outcome, last_error FROM sexton.passes WHERE job = $1 AND scope = $2",
    )
    .bind(Panicking::NAME)
    .bind(account)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(failed.0, "failed");
    assert!(failed.1.contains("panicked"), "{}", failed.1);
}
