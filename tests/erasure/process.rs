//! Erasure from the operator's side, on the real binary and real workers: `sexton erase` and its
//! bad input (RQ-1), a hold's release completing a request with no other command (RQ-4), and
//! workers killed with SIGKILL again and again during an account's erasure (RQ-3, EX-8).

use std::collections::BTreeSet;
use std::time::Duration;

use rand::SeedableRng as _;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::KEY;
use super::world::{self, Tenant, assert_exactly, snapshot};
use crate::common::fixture::{self, RunSpec};
use crate::common::{self, run};
use crate::crash::{kill_while_working, worker};

/// The test's database and roots, and the binary pointed at both with the receipt key set.
struct Cli {
    url: String,
    dir: tempfile::TempDir,
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Cli {
    async fn new(pool: &PgPool) -> (Self, Tenant, Tenant) {
        common::migrate(pool).await;
        let dir = common::backend::tempdir();
        let paths = run::roots(dir.path());
        let one = world::tenant(pool, &paths).await;
        let other = world::tenant(pool, &paths).await;
        let cli = Self {
            url: common::database_url(pool).await,
            dir,
        };
        (cli, one, other)
    }

    async fn run_with(&self, key: Option<&str>, args: &[&str]) -> Ran {
        let mut command = common::sexton(&self.url, self.dir.path());
        command.env_remove("SEXTON_ERASURE__RECEIPT_KEY");
        // The first hop `erase` pushes may die with its worker as often as the crash test's
        // workers' hops may (FL-4: a job out of attempts is failed for good).
        command.env("SEXTON_QUEUE__MAX_ATTEMPTS", "100");
        if let Some(key) = key {
            command.env("SEXTON_ERASURE__RECEIPT_KEY", key);
        }
        let output = command.args(args).output().await.unwrap();
        Ran {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    async fn run(&self, args: &[&str]) -> Ran {
        self.run_with(Some(KEY), args).await
    }

    /// `sexton erase --<scope> id --json`, which must succeed: its answer.
    async fn erase(&self, scope: &str, id: Uuid) -> Value {
        let ran = self
            .run(&[
                "erase",
                &format!("--{scope}"),
                &id.to_string(),
                "--ref",
                "DSR-2026-114",
                "--by",
                "privacy@example.com",
                "--json",
            ])
            .await;
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        serde_json::from_str(&ran.stdout).unwrap()
    }

    /// A worker run until the queue is idle, which must exit 0.
    async fn work(&self) {
        let mut child = worker(&self.url, self.dir.path(), true)
            .env("SEXTON_ERASURE__RECEIPT_KEY", KEY)
            .spawn()
            .unwrap();
        let status = common::wait(&mut child, Duration::from_secs(120)).await;
        assert!(status.success(), "the worker exited with {status}");
    }

    /// `sexton erase status ID --json`: the request.
    async fn status(&self, id: &str) -> Value {
        let ran = self.run(&["erase", "status", id, "--json"]).await;
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        let requests: Value = serde_json::from_str(&ran.stdout).unwrap();
        requests[0].clone()
    }
}

#[sqlx::test]
async fn rq1_erase_records_a_request_runs_it_at_once_and_a_scope_inside_an_open_one_gets_that_one(
    pool: PgPool,
) {
    let (cli, one, other) = Cli::new(&pool).await;
    let asked = cli.erase("agent", one.agent).await;
    assert_eq!(asked["state"], "received");
    assert_eq!(asked["existing"], false);
    let id = asked["id"].as_str().unwrap().to_owned();
    let due: chrono::DateTime<chrono::Utc> = asked["due_at"].as_str().unwrap().parse().unwrap();
    let days = (due - chrono::Utc::now()).num_hours() as f64 / 24.0;
    assert!(
        (29.0..=30.0).contains(&days),
        "due in [erasure] deadline_days: {days}"
    );
    // The same scope, and a session of the agent being erased: the open request, not a second.
    for (scope, scope_id) in [("agent", one.agent), ("session", one.session)] {
        let again = cli.erase(scope, scope_id).await;
        assert_eq!(
            (again["id"].as_str(), &again["existing"]),
            (Some(id.as_str()), &Value::Bool(true))
        );
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.erasures")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
    // Its pass was pushed at once: a worker run until idle completes it, no slot fired.
    cli.work().await;
    let done = cli.status(&id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["scope_id"], Value::Null);
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE agent_id = $1")
        .bind(one.agent)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    // The control: the other account's agent and the receipts' chain.
    let theirs: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE agent_id = $1")
        .bind(other.agent)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(theirs, 2);
    let verify = cli.run(&["receipts", "verify"]).await;
    assert_eq!(verify.code, Some(0), "{}{}", verify.stdout, verify.stderr);
    // A completed request's scope can be asked for again: a new request.
    let anew = cli.erase("agent", one.agent).await;
    assert_ne!(anew["id"].as_str(), Some(id.as_str()));
}

#[sqlx::test]
async fn rq1_bad_input_exits_2_naming_what_is_wrong_and_records_nothing(pool: PgPool) {
    let (cli, one, _other) = Cli::new(&pool).await;
    let id = one.conversation.to_string();
    let cases: Vec<(Option<&str>, Vec<&str>, &str)> = vec![
        (
            None,
            vec!["--conversation", &id, "--ref", "R", "--by", "B"],
            "erasure.receipt_key",
        ),
        (
            Some(KEY),
            vec!["--conversation", &id, "--ref", " ", "--by", "B"],
            "--ref",
        ),
        (Some(KEY), vec!["--conversation", &id, "--ref", "R"], "--by"),
        (Some(KEY), vec!["--ref", "R", "--by", "B"], "--account"),
        (
            Some(KEY),
            vec!["--conversation", "not-a-uuid", "--ref", "R", "--by", "B"],
            "not-a-uuid",
        ),
        (
            Some(KEY),
            vec![
                "--conversation",
                &id,
                "--ref",
                "R",
                "--by",
                "B",
                "--due",
                "2001-01-01T00:00:00Z",
            ],
            "--due",
        ),
        (
            Some(KEY),
            vec![
                "--conversation",
                &id,
                "--session",
                &id,
                "--ref",
                "R",
                "--by",
                "B",
            ],
            "--session",
        ),
        (
            Some(KEY),
            vec!["--conversation", &id, "--ref", "R", "--by", "B", "--colour"],
            "--colour",
        ),
        (
            Some("short"),
            vec!["--conversation", &id, "--ref", "R", "--by", "B"],
            "not shown",
        ),
    ];
    for (key, args, named) in cases {
        let mut all = vec!["erase"];
        all.extend(&args);
        let ran = cli.run_with(key, &all).await;
        assert_eq!(ran.code, Some(2), "{args:?}: {}{}", ran.stdout, ran.stderr);
        assert!(
            ran.stderr.contains(named),
            "{args:?} names {named}: {}",
            ran.stderr
        );
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.erasures")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "nothing recorded");
    // The control: the same request, well formed, is taken.
    let asked = cli.erase("conversation", one.conversation).await;
    assert_eq!(asked["state"], "received");
    let dry = cli
        .run(&[
            "erase",
            "--conversation",
            &id,
            "--ref",
            "R",
            "--by",
            "B",
            "--dry-run",
            "--json",
        ])
        .await;
    assert_eq!(dry.code, Some(0), "{}", dry.stderr);
    let dry: Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!(dry["rows"]["runs"], 4, "{dry}");
}

#[sqlx::test]
async fn rq4_a_holds_release_completes_a_waiting_request_with_no_other_command(pool: PgPool) {
    let (cli, one, _other) = Cli::new(&pool).await;
    let placed = cli
        .run(&[
            "holds",
            "place",
            "--session",
            &one.session.to_string(),
            "--case",
            "LIT-9",
            "--reason",
            "preserve",
            "--by",
            "legal",
        ])
        .await;
    assert_eq!(placed.code, Some(0), "{}", placed.stderr);
    let hold = placed.stdout.trim().to_owned();
    let asked = cli.erase("agent", one.agent).await;
    let id = asked["id"].as_str().unwrap().to_owned();
    cli.work().await;
    let waiting = cli.status(&id).await;
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    assert_eq!(waiting["withheld"]["legal_hold"], 1, "{waiting}");
    let text = cli.run(&["erase", "status", &id]).await.stdout;
    assert!(text.contains(&hold) && text.contains("LIT-9"), "{text}");
    // What the hold does not cover went: the agent's other session.
    let other_session: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE id = $1")
        .bind(one.other_session)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(other_session, 0);
    let released = cli.run(&["holds", "release", &hold, "--by", "legal"]).await;
    assert_eq!(released.code, Some(0), "{}", released.stderr);
    cli.work().await;
    let done = cli.status(&id).await;
    assert_eq!(done["state"], "completed", "{done}");
}

#[sqlx::test]
async fn rq3_workers_killed_with_sigkill_mid_erasure_lose_nothing_outside_it_and_it_completes(
    pool: PgPool,
) {
    let (cli, one, _other) = Cli::new(&pool).await;
    let paths = run::roots(cli.dir.path());
    // Enough of the account for many hops of one owner each.
    for _ in 0..40 {
        fixture::run(
            &pool,
            &paths.output_root,
            RunSpec::conversation(one.account, one.other_conversation, 3.0),
        )
        .await;
    }
    let before = snapshot(&pool).await;
    let asked = cli.erase("account", one.account).await;
    let id: Uuid = asked["id"].as_str().unwrap().parse().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(57);
    let (mut kills, mut mid_pass) = (0, 0);
    while mid_pass < 10 && kills < 60 {
        let cmd = {
            let mut cmd = worker(&cli.url, cli.dir.path(), false);
            cmd.env("SEXTON_ERASURE__RECEIPT_KEY", KEY)
                .env("SEXTON_ERASURE__BATCH_SIZE", "1")
                .env("SEXTON_ERASURE__HOP_BUDGET_MS", "30");
            cmd
        };
        let Some(caught) = kill_while_working(&pool, cmd, "sexton.erasure", &mut rng, 0..40).await
        else {
            break;
        };
        kills += 1;
        mid_pass += usize::from(caught);
    }
    assert!(
        mid_pass >= 10,
        "only {mid_pass} of {kills} kills landed mid-pass"
    );
    let state: String = sqlx::query_scalar("SELECT state FROM sexton.erasures WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_ne!(
        state, "completed",
        "the request completed before the kills did"
    );
    cli.work().await;
    let done = cli.status(&id.to_string()).await;
    assert_eq!(done["state"], "completed", "{done}");
    let scope: BTreeSet<Uuid> = [one.account].into_iter().collect();
    assert_exactly(
        &before,
        &snapshot(&pool).await,
        &scope,
        &["usage_records", "accounts"],
    );
    let failed: Vec<(String, i32, i32, Option<String>)> = sqlx::query_as(
        "SELECT job_type, attempts, max_attempts, last_result::text FROM apalis.jobs
         WHERE status IN ('Failed', 'Killed')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(failed, [], "jobs failed for good");
}

#[sqlx::test]
async fn rq3_a_row_the_platform_holds_past_the_lock_timeout_stays_busy_and_goes_on_retry(
    pool: PgPool,
) {
    let (cli, one, other) = Cli::new(&pool).await;
    // The platform holds a tool result of one run of the conversation, and the run itself of
    // another: the first makes the run's deletion wait out the lock timeout (FL-6), the second
    // is skipped as locked; neither stops the rest.
    let mut platform = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tool_results WHERE run_id = $1 FOR UPDATE")
        .bind(one.runs[0])
        .execute(&mut *platform)
        .await
        .unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(one.runs[2])
        .execute(&mut *platform)
        .await
        .unwrap();
    let asked = cli.erase("conversation", one.conversation).await;
    let id = asked["id"].as_str().unwrap().to_owned();
    let mut child = worker(&cli.url, cli.dir.path(), true)
        .env("SEXTON_ERASURE__RECEIPT_KEY", KEY)
        .env("SEXTON_DATABASE__LOCK_TIMEOUT_MS", "300")
        .spawn()
        .unwrap();
    let status = common::wait(&mut child, Duration::from_secs(120)).await;
    assert!(status.success(), "the worker exited with {status}");
    let waiting = cli.status(&id).await;
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    assert_eq!(
        waiting["withheld"]["busy"], 2,
        "both windows were hit: {waiting}"
    );
    let mut theirs = one.runs.clone();
    theirs.push(one.child_run);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM runs WHERE id = ANY($1) ORDER BY id")
        .bind(&theirs)
        .fetch_all(&pool)
        .await
        .unwrap();
    let mut held = vec![one.runs[0], one.runs[2]];
    held.sort();
    assert_eq!(left, held, "only the two held runs stay");
    platform.rollback().await.unwrap();
    let retried = cli.run(&["erase", "retry", &id]).await;
    assert_eq!(retried.code, Some(0), "{}", retried.stderr);
    cli.work().await;
    assert_eq!(cli.status(&id).await["state"], "completed");
    // The control: the other conversation of the account, and the other account, stay.
    let theirs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM runs WHERE conversation_id = ANY($1)")
            .bind([one.other_conversation, other.conversation])
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(theirs, 4);
}

#[sqlx::test]
async fn rq8_an_erasure_runs_beside_the_nightly_hops_never_in_their_slot(pool: PgPool) {
    let (cli, one, _other) = Cli::new(&pool).await;
    // The night's one slot (queue.concurrency = 1) is taken by a hop waiting on a conversation
    // the platform holds (its owner's lock timeout a minute).
    let paths = run::roots(cli.dir.path());
    let late = fixture::account(&pool, Some(30)).await;
    let held = fixture::conversation(&pool, late).await;
    fixture::run(
        &pool,
        &paths.output_root,
        RunSpec::conversation(late, held, 40.0),
    )
    .await;
    let mut platform = pool.begin().await.unwrap();
    fixture::lock_conversation(&mut platform, held).await;
    let settings = common::settings(cli.dir.path());
    sexton::tick::tick(&pool, &settings, crate::common::fixture::pass_start())
        .await
        .unwrap();
    let mut child = worker(&cli.url, cli.dir.path(), false)
        .env("SEXTON_ERASURE__RECEIPT_KEY", KEY)
        .env("SEXTON_QUEUE__CONCURRENCY", "1")
        .env("SEXTON_EXECUTION_DETAILS__OWNER_LOCK_TIMEOUT_MS", "60000")
        .spawn()
        .unwrap();
    common::wait_for_lock_waiter(&pool, "conversations").await;
    // While it waits, an erasure is asked for, and completes.
    let asked = cli.erase("session", one.session).await;
    let id = asked["id"].as_str().unwrap().to_owned();
    common::process::poll_until(Duration::from_secs(60), || async {
        cli.status(&id).await["state"] == "completed"
    })
    .await;
    let still_waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'
           AND query LIKE '%FROM conversations%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(still_waiting, 1, "the night's hop held its slot all along");
    platform.rollback().await.unwrap();
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}
