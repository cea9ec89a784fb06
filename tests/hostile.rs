//! Hostile input (issue: files outside the root, a slot in the future, absurd settings,
//! poisoned queue rows): each case breaks the rule it is named after on a naive build.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::{Rng, SeedableRng};
use sexton::event;
use sexton_jobs::clock::ManualClock;
use sexton_jobs::job::Job as _;
use sexton_jobs::prune_execution_details::{self as job, Args, HopOutcome};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::hops::{Env, run_at};
use crate::common::process::{Proc, events, free_port, http_get, poll_until};

async fn database_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn set_path(pool: &PgPool, run: Uuid, path: &str) {
    sqlx::query("UPDATE output_files SET relative_path = $2 WHERE run_id = $1")
        .bind(run)
        .bind(path)
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test]
async fn ex3_a_symlinked_directory_in_the_output_root_is_never_followed(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let secret = elsewhere.path().join("secret.txt");
    std::fs::write(&secret, b"keep me").unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), env.root().join("evil")).unwrap();
    let evil = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    set_path(&env.pool, evil.id, "evil/secret.txt").await;
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;
    let control_file = env.root().join(format!("{account}/{}/out.bin", control.id));

    let reports = env.pass(account).await;
    assert!(
        secret.exists(),
        "a file outside the output root was deleted"
    );
    assert!(
        !control_file.exists(),
        "the control's file inside the root went"
    );
    assert!(fixture::is_pruned(&env.pool, evil.id).await);
    assert_eq!(reports.iter().map(|r| r.file_errors).sum::<u64>(), 1);
    assert_eq!(reports.iter().map(|r| r.files_deleted).sum::<u64>(), 1);
}

#[sqlx::test]
async fn ex3_a_file_still_referenced_by_a_surviving_run_stays(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let old = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let shared = format!("{account}/{}/out.bin", young.id);
    set_path(&env.pool, old.id, &shared).await;
    let alone = env
        .run(RunSpec::conversation(account, conversation, 45.0))
        .await;

    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, old.id).await);
    assert!(!fixture::is_pruned(&env.pool, young.id).await);
    assert!(
        env.root().join(&shared).exists(),
        "the young run's file is still referenced and stays"
    );
    assert!(
        !env.root()
            .join(format!("{account}/{}/out.bin", alone.id))
            .exists(),
        "an unshared file of a pruned run goes"
    );
}

#[sqlx::test]
async fn op3_bytes_reclaimed_counts_what_was_unlinked(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let present = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let missing = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;
    sqlx::query("UPDATE output_files SET bytes = 999999")
        .execute(&env.pool)
        .await
        .unwrap();
    let present_file = env.root().join(format!("{account}/{}/out.bin", present.id));
    std::fs::write(&present_file, b"twelve bytes").unwrap();
    std::fs::remove_file(env.root().join(format!("{account}/{}/out.bin", missing.id))).unwrap();

    let reports = env.pass(account).await;
    assert!(!present_file.exists());
    assert_eq!(reports.iter().map(|r| r.files_deleted).sum::<u64>(), 1);
    assert_eq!(
        reports.iter().map(|r| r.bytes_reclaimed).sum::<u64>(),
        12,
        "the bytes of the one file unlinked, not what the rows said"
    );
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
    env.pass_from(Args::first(account, future)).await;
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
        ..Args::first(account, far)
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

    let mut conn = env.pool.acquire().await.unwrap();
    let previews = job::preview(&mut conn, pass_start(), None).await.unwrap();
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

    let mut conn = env.pool.acquire().await.unwrap();
    let preview = job::preview(&mut conn, pass_start(), Some(&[account]))
        .await
        .unwrap();
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
async fn er3_a_missing_output_root_fails_the_hop_and_forgets_nothing(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let file = env.root().join(format!("{account}/{}/out.bin", run.id));
    let parked = env.dir.path().join("parked");
    std::fs::rename(env.root(), &parked).unwrap();

    let err = env
        .try_hop(&Args::first(account, pass_start()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot be opened"), "{err}");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(pending, 1, "the file is not forgotten as already gone");

    std::fs::rename(&parked, env.root()).unwrap();
    assert!(file.exists());
    env.pass(account).await;
    assert!(!file.exists(), "the retried hop deletes it");
}

#[tokio::test]
async fn op2_a_missing_root_is_refused_at_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::sexton("postgres://127.0.0.1:1/x", dir.path())
        .arg("worker")
        .env("SEXTON_PATHS__OUTPUT_ROOT", dir.path().join("nowhere"))
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("paths.output_root"), "{stderr}");
    assert!(stderr.contains("nowhere"), "{stderr}");
    // The control: the same roots, all present, pass.
    let valid = common::sexton("postgres://127.0.0.1:1/x", dir.path())
        .arg("check-config")
        .output()
        .await
        .unwrap();
    assert!(valid.status.success(), "{valid:?}");
}

#[tokio::test]
async fn op2_a_schedule_that_never_fires_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::sexton("postgres://127.0.0.1:1/x", dir.path())
        .arg("check-config")
        .env("SEXTON_SCHEDULE__CRON", "0 3 31 2 *")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("schedule.cron"));
    // The control: February 29th fires, if rarely.
    let rare = common::sexton("postgres://127.0.0.1:1/x", dir.path())
        .arg("check-config")
        .env("SEXTON_SCHEDULE__CRON", "0 3 29 2 *")
        .output()
        .await
        .unwrap();
    assert!(rare.status.success(), "{rare:?}");
}

#[tokio::test]
async fn op2_a_malformed_database_url_is_bad_configuration_and_a_refused_connection_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let malformed = common::sexton("postgres://user@host:notaport/db", dir.path())
        .arg("migrate")
        .output()
        .await
        .unwrap();
    assert_eq!(malformed.status.code(), Some(2), "{malformed:?}");
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("DATABASE_URL"));

    let closed = free_port();
    let refused = common::sexton(&format!("postgres://u:p@127.0.0.1:{closed}/db"), dir.path())
        .arg("migrate")
        .env("SEXTON_DATABASE__ACQUIRE_TIMEOUT_MS", "2000")
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(
        stderr.contains("connection refused"),
        "the cause is named: {stderr}"
    );
    assert!(!stderr.contains("pool timed out"), "{stderr}");
}

#[sqlx::test]
async fn op1_control_characters_in_account_names_are_escaped(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let account: Uuid = sqlx::query_scalar("INSERT INTO accounts (name) VALUES ($1) RETURNING id")
        .bind("acme\u{1b}]0;PWNED\u{7}")
        .fetch_one(&pool)
        .await
        .unwrap();
    let url = common::database_url(&pool).await;
    let account = account.to_string();
    for command in ["preview", "status"] {
        let output = common::sexton(&url, dir.path())
            .arg(command)
            .args(["--account", &account])
            .output()
            .await
            .unwrap();
        assert!(output.status.success(), "{command}: {output:?}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            !stdout.contains('\u{1b}') && !stdout.contains('\u{7}'),
            "{command}: {stdout:?}"
        );
        if command == "preview" {
            assert!(stdout.contains("acme\\u{1b}]0;PWNED\\u{7}"), "{stdout}");
        }
    }
}

#[sqlx::test]
async fn op1_seed_refuses_a_database_that_holds_accounts(pool: PgPool) {
    common::migrate(&pool).await;
    fixture::account(&pool, Some(30)).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let output = common::sexton(&url, dir.path())
        .args(["seed", "--scale", "1", "--json"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--force"));
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(accounts, 1, "nothing was written");
    // The control: --force seeds all the same.
    let forced = common::sexton(&url, dir.path())
        .args(["seed", "--scale", "1", "--json", "--force"])
        .output()
        .await
        .unwrap();
    assert!(forced.status.success(), "{forced:?}");
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(accounts > 1, "seeded beside the existing account");
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

async fn worker_until_idle(pool: &PgPool, dir: &std::path::Path) -> Vec<String> {
    let url = common::database_url(pool).await;
    let mut cmd = common::sexton(&url, dir);
    cmd.args(["worker", "--exit-when-idle"]);
    let (status, lines) = Proc::spawn(cmd).finish(Duration::from_secs(120)).await;
    assert!(status.success(), "worker exited with {status}");
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

    let lines = worker_until_idle(&pool, dir.path()).await;
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

    worker_until_idle(&pool, dir.path()).await;
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

#[sqlx::test]
async fn er2_a_role_without_grants_restarts_paced_and_readyz_says_not_ready(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let role = format!("sexton_nogrants_{}", Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'pw'"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let url = common::database_url(&pool).await;
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let address = format!("127.0.0.1:{}", free_port());
    let mut cmd = common::sexton(&format!("{scheme}://{role}:pw@{host}"), dir.path());
    cmd.arg("worker").env("SEXTON_HTTP__LISTEN", &address);
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::CONSUMER_RESTARTING).await;
    poll_until(Duration::from_secs(30), || async {
        http_get(&address, "/readyz").await.map(|r| r.0) == Some(503)
    })
    .await;
    // Fault injection: let the failing worker run for a while, then count what it did.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(http_get(&address, "/readyz").await.map(|r| r.0), Some(503));
    let lines = worker.stop().await;
    // apalis's own line, which names no event.
    let restarts = lines
        .iter()
        .filter(|l| l.contains("restarting worker"))
        .count();
    let logged = events(&lines, event::CONSUMER_RESTARTING).count();
    // Each consumer (the nightly queue and one per job kind) restarts on its own pace.
    let consumers = sexton::registry::KINDS.len() + 1;
    assert!(
        restarts < 10 * consumers && logged < 10,
        "restarts are paced ({restarts} in the run) and a repeated error is logged once per \
         interval ({logged} lines)"
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(&pool)
        .await
        .unwrap();
}

/// A job kind whose hop panics, to prove what the runtime does with it.
struct Panicking;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct PanickingArgs {
    account: Uuid,
}

impl sexton_jobs::job::Job for Panicking {
    const NAME: &'static str = "test_panicking";
    const QUEUE: &'static str = "sexton.test_panicking";
    const SCOPE: sexton_jobs::job::Scope = sexton_jobs::job::Scope::Account;
    const SECTION: &'static str = "test_panicking";
    const RETAIN_REASONS: &'static [&'static str] = &[];
    type Args = PanickingArgs;
    type Settings = ();
    type Preview = String;
    type Error = std::io::Error;

    fn settings(
        _: &serde_json::Value,
        _: &sexton_jobs::files::PathSettings,
        _: &mut sexton_jobs::settings::Check<'_>,
    ) -> Option<()> {
        Some(())
    }

    fn first(account: Option<Uuid>, _: DateTime<Utc>) -> PanickingArgs {
        PanickingArgs {
            account: account.unwrap_or_default(),
        }
    }

    fn position(args: &PanickingArgs) -> sexton_jobs::job::Position {
        sexton_jobs::job::Position {
            account: Some(args.account),
            pass_started_at: pass_start(),
            hop: 0,
        }
    }

    async fn run(
        _: sexton_jobs::job::Env<'_>,
        _: &(),
        _: &PanickingArgs,
        _: &mut sexton_jobs::job::Report<PanickingArgs>,
    ) -> Result<(), std::io::Error> {
        panic!("a bug in a job");
    }

    async fn backlog_seconds(
        _: &PgPool,
        _: &(),
        _: DateTime<Utc>,
    ) -> Result<Option<f64>, std::io::Error> {
        Ok(None)
    }

    async fn preview(
        _: &mut sqlx::PgConnection,
        _: &(),
        _: &sexton_jobs::files::PathSettings,
        _: DateTime<Utc>,
        _: Option<&[Uuid]>,
    ) -> Result<Vec<String>, std::io::Error> {
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
        let err = sexton::hop::run::<Panicking>(&ctx, PanickingArgs { account })
            .await
            .unwrap_err();
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

#[sqlx::test]
async fn ex3_an_output_path_naming_a_directory_never_removes_a_tree(pool: PgPool) {
    let env = Env::new(pool).await;
    let other = fixture::account(&env.pool, Some(30)).await;
    let other_conversation = fixture::conversation(&env.pool, other).await;
    let theirs = env
        .run(RunSpec::conversation(other, other_conversation, 5.0))
        .await;
    let their_file = env.output_file(other, theirs.id);
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let hostile = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    set_path(&env.pool, hostile.id, &other.to_string()).await;
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    let reports = env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, hostile.id).await);
    assert!(
        their_file.exists(),
        "another account's directory was removed"
    );
    assert!(
        !env.output_file(account, control.id).exists(),
        "the control's own file goes"
    );
    assert_eq!(reports.iter().map(|r| r.file_errors).sum::<u64>(), 1);
}

#[sqlx::test]
async fn ex3_another_spelling_of_a_referenced_path_is_never_deleted(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let young_file = env.output_file(account, young.id);
    let old = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    set_path(
        &env.pool,
        old.id,
        &format!("./{account}//{}/out.bin", young.id),
    )
    .await;
    // A record made before a surviving row took the path (a crash, a late writer): the drain
    // checks again just before unlinking.
    sqlx::query("INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path) VALUES ('outputs', $1, $2)")
        .bind(account)
        .bind(format!("{account}/{}/out.bin", young.id))
        .execute(&env.pool)
        .await
        .unwrap();

    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, old.id).await);
    assert!(young_file.exists(), "a surviving run's file was deleted");
    assert!(
        !env.output_file(account, control.id).exists(),
        "an unreferenced file in canonical spelling goes"
    );
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
    let hop = env.spawn_hop(Args::first(account, pass_start()));
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
    assert_eq!(
        report
            .retained
            .get(&job::RetainReason::PendingWork)
            .copied(),
        Some(1)
    );
}

#[sqlx::test]
async fn ex6_a_detail_row_an_application_holds_is_busy_not_a_failed_hop(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let held = env
        .run(RunSpec::conversation(account, conversation, 40.0))
        .await;
    let free = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;
    let mut app = env.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tool_results WHERE run_id = $1 FOR UPDATE")
        .bind(held.id)
        .execute(&mut *app)
        .await
        .unwrap();
    let report = env.hop(&Args::first(account, pass_start())).await;
    app.rollback().await.unwrap();
    assert!(!fixture::is_pruned(&env.pool, held.id).await);
    assert!(
        fixture::is_pruned(&env.pool, free.id).await,
        "the other owner still goes"
    );
    assert_eq!(
        report.retained.get(&job::RetainReason::Busy).copied(),
        Some(1)
    );
}

#[sqlx::test]
async fn ex7_a_spent_budget_still_moves_every_hop_forward(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.budget = Duration::from_millis(1);
    env.settings.owners_per_transaction = 1;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let mut runs = Vec::new();
    for days in [40.0, 41.0, 42.0] {
        runs.push(
            env.run(RunSpec::conversation(account, conversation, days))
                .await
                .id,
        );
    }
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let mut args = Args::first(account, pass_start());
    for _ in 0..20 {
        let report = env.hop(&args).await;
        match report.next {
            Some(next) => args = next,
            None => break,
        }
    }
    for run in runs {
        assert!(
            fixture::is_pruned(&env.pool, run).await,
            "the pass got through"
        );
    }
    assert!(
        !fixture::is_pruned(&env.pool, young.id).await,
        "inside its window"
    );
}

#[sqlx::test]
async fn op3_a_slot_ticked_ahead_of_time_is_never_the_last_success(pool: PgPool) {
    common::migrate(&pool).await;
    let account = fixture::account(&pool, Some(30)).await;
    for slot in ["2026-11-01T03:00:00Z", "2030-01-01T03:00:00Z"] {
        sqlx::query(
            "INSERT INTO sexton.passes (job, scope, slot, finished_at, outcome)
             VALUES ('prune_execution_details', $1, $2::timestamptz, now(), 'finished')",
        )
        .bind(account)
        .bind(slot)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO sexton.fan_outs (job, slot, finished_at, accounts, started)
             VALUES ('prune_execution_details', $1::timestamptz, now(), 1, 1)",
        )
        .bind(slot)
        .execute(&pool)
        .await
        .unwrap();
    }
    let last = sexton::ledger::last_success(&pool).await.unwrap();
    assert_eq!(last, [("prune_execution_details".to_owned(), pass_start())]);
}

#[sqlx::test]
async fn ex3_a_retained_run_naming_the_file_another_way_keeps_it(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let spellings = [
        "{a}//{r}/out.bin",
        "./{a}/{r}/out.bin",
        "{a}/./{r}/out.bin",
        "{a}/{r}//out.bin",
        ".//{a}/././{r}/out.bin/",
    ];
    let mut shared = Vec::new();
    for spelling in spellings {
        let old = env
            .run(RunSpec::conversation(account, conversation, 40.0))
            .await;
        let young = env
            .run(RunSpec::conversation(account, conversation, 5.0))
            .await;
        let path = spelling
            .replace("{a}", &account.to_string())
            .replace("{r}", &old.id.to_string());
        set_path(&env.pool, young.id, &path).await;
        shared.push((old, young, env.output_file(account, old.id)));
    }
    let control = env
        .run(RunSpec::conversation(account, conversation, 41.0))
        .await;

    env.pass(account).await;
    for (old, young, file) in &shared {
        assert!(fixture::is_pruned(&env.pool, old.id).await);
        assert!(!fixture::is_pruned(&env.pool, young.id).await);
        assert!(file.exists(), "a retained run's file went: {file:?}");
    }
    assert!(
        !env.output_file(account, control.id).exists(),
        "an unreferenced file goes"
    );

    // Once the last row naming it goes, so does the file, whichever spelling recorded it.
    sqlx::query("UPDATE accounts SET execution_details_retention_days = 1 WHERE id = $1")
        .bind(account)
        .execute(&env.pool)
        .await
        .unwrap();
    let reports = env.pass(account).await;
    for (_, young, file) in &shared {
        assert!(fixture::is_pruned(&env.pool, young.id).await);
        assert!(!file.exists(), "left forever: {file:?}");
    }
    assert_eq!(reports.iter().map(|r| r.file_errors).sum::<u64>(), 0);
}
