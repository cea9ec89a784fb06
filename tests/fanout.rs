//! FL-8: a slot starts a pass for exactly the accounts that have something due, found by each
//! job's own discovery, and a slot job killed mid-fan-out and retried starts each once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use sexton::context::JobContext;
use sexton::preview::{self, Shown};
use sexton::tick::{self, NightlySlot};
use sexton_jobs::clock::ManualClock;
use sexton_jobs::job::Scope;
use sexton_jobs::payload::V1;
use sexton_jobs::record_expiry::ExpirySettings;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, days_before_pass, pass_start};
use crate::common::process::{self, Proc};

/// A small deterministic generator (xorshift64*): the seed is printed, a failure replays.
struct Dice(u64);

impl Dice {
    fn new() -> Self {
        let seed = std::env::var("SEXTON_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| Uuid::new_v4().as_u64_pair().0 | 1);
        println!("SEXTON_TEST_SEED={seed}");
        Self(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
}

/// One account with a random mix of everything each per-account job looks at.
async fn random_account(pool: &PgPool, root: &std::path::Path, dice: &mut Dice) -> Uuid {
    let window = dice.pick(&[
        None,
        Some(-3),
        Some(0),
        Some(30),
        Some(30),
        Some(30),
        Some(400),
    ]);
    let account = fixture::account(pool, window).await;
    let conversation = fixture::conversation(pool, account).await;
    for _ in 0..dice.below(3) {
        let days = dice.pick(&[5.0, 45.0, 45.0, 500.0]);
        let run = fixture::run(
            pool,
            root,
            RunSpec::conversation(account, conversation, days),
        )
        .await;
        if dice.below(3) == 0 {
            // Held back (EX-5): a settlement still pending.
            sqlx::query("INSERT INTO settlement_receipts (run_id, status) VALUES ($1, 'pending')")
                .bind(run.id)
                .execute(pool)
                .await
                .unwrap();
        }
    }
    if dice.below(4) == 0 {
        // A run of a kind that never ages (EX-2), old.
        let mut spec = RunSpec::conversation(account, conversation, 45.0);
        spec.kind = "standalone";
        fixture::run(pool, root, spec).await;
    }

    match dice.below(5) {
        0 => {}
        1 => {
            sqlx::query("INSERT INTO session_retention_policies (account_id) VALUES ($1)")
                .bind(account)
                .execute(pool)
                .await
                .unwrap();
        }
        2 => {
            sqlx::query(
                "INSERT INTO session_retention_policies (account_id, enabled, task_days)
                 VALUES ($1, true, -3)",
            )
            .bind(account)
            .execute(pool)
            .await
            .unwrap();
        }
        _ => {
            sqlx::query(
                "INSERT INTO session_retention_policies (account_id, enabled) VALUES ($1, true)",
            )
            .bind(account)
            .execute(pool)
            .await
            .unwrap();
        }
    }
    let agent = fixture::agent(pool, account).await;
    for _ in 0..dice.below(3) {
        let kind = dice.pick(&["main", "task", "subagent"]);
        let days = dice.pick(&[1, 20, 100]);
        let state = dice.pick(&["idle", "completed", "running"]);
        let session: Uuid = sqlx::query_scalar(
            "INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(account)
        .bind(agent)
        .bind(kind)
        .bind(state)
        .bind(pass_start() - chrono::Duration::days(days))
        .fetch_one(pool)
        .await
        .unwrap();
        if dice.below(4) == 0 {
            // Protected: the agent's current session.
            sqlx::query("UPDATE agents SET current_session_id = $1 WHERE id = $2")
                .bind(session)
                .bind(agent)
                .execute(pool)
                .await
                .unwrap();
        }
    }

    match dice.below(4) {
        0 => {
            sqlx::query(
                "INSERT INTO attachments (account_id, relative_path, bytes) VALUES ($1, $2, 1)",
            )
            .bind(account)
            .bind(format!("{account}/a.bin"))
            .execute(pool)
            .await
            .unwrap();
        }
        1 => {
            // Expired already: nothing left to look at.
            sqlx::query(
                "INSERT INTO attachments (account_id, relative_path, bytes, bytes_expired_at)
                 VALUES ($1, $2, 1, $3)",
            )
            .bind(account)
            .bind(format!("{account}/gone.bin"))
            .bind(days_before_pass(3.0))
            .execute(pool)
            .await
            .unwrap();
        }
        _ => {}
    }
    if dice.below(8) == 0 {
        // A removal that failed earlier and waits for the account's next hop.
        let relative = format!("{account}/left-behind.bin");
        let path = root.join(&relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"x").unwrap();
        sqlx::query(
            "INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
             VALUES ('outputs', $1, $2)",
        )
        .bind(account)
        .bind(relative)
        .execute(pool)
        .await
        .unwrap();
    }
    account
}

/// `sexton preview` agrees with the fan-out (FL-8, OP-1): `--all` lists exactly the accounts
/// whose passes started, the summary counts them, and no account whose own preview shows
/// something to remove was left out.
async fn preview_agrees(
    pool: &PgPool,
    settings: &sexton::config::Settings,
    started: &BTreeMap<String, BTreeSet<Uuid>>,
) {
    for root in [
        &settings.paths.attachments_root,
        &settings.paths.traces_root,
    ] {
        std::fs::create_dir_all(root).unwrap();
    }
    let mut conn = pool.acquire().await.unwrap();
    let read = |shown| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            let mut out = Vec::new();
            preview::write(&mut conn, settings, pass_start(), shown, true, &mut out)
                .await
                .unwrap();
            serde_json::from_slice::<Vec<serde_json::Value>>(&out).unwrap()
        }
    };
    let all = read(Shown::All).await;
    let summary = read(Shown::Summary).await;
    for (job, accounts) in started {
        let listed: BTreeSet<Uuid> = all
            .iter()
            .filter(|line| line["job"] == job.as_str())
            .map(|line| line["account_id"].as_str().unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            &listed, accounts,
            "{job}: preview --all lists the started passes"
        );
        let counted = summary
            .iter()
            .find(|line| line["job"] == job.as_str())
            .unwrap();
        assert_eq!(counted["due"], accounts.len(), "{job}: {counted}");
        let kind = sexton::registry::KINDS
            .iter()
            .find(|k| k.name() == job)
            .unwrap();
        for line in kind
            .preview(&mut conn, settings, pass_start(), None)
            .await
            .unwrap()
        {
            let removes = line
                .tally
                .iter()
                .any(|(what, n)| *n > 0 && (what.contains("eligible") || what == "expired"));
            let account: Uuid = line.json["account_id"].as_str().unwrap().parse().unwrap();
            assert!(
                !removes || accounts.contains(&account),
                "{job}: the preview of {account} removes something, its pass did not start: {}",
                line.text
            );
        }
    }
}

/// The accounts each per-account job has a pass row for at `slot`, by job, with `filter`.
async fn passes(pool: &PgPool, filter: &str) -> BTreeMap<String, BTreeSet<Uuid>> {
    let rows: Vec<(String, Uuid)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT job, scope FROM sexton.passes
         WHERE slot = $1 AND scope <> '00000000-0000-0000-0000-000000000000' AND ({filter})"
    )))
    .bind(pass_start())
    .fetch_all(pool)
    .await
    .unwrap();
    let mut by_job: BTreeMap<String, BTreeSet<Uuid>> = BTreeMap::new();
    for kind in sexton::registry::KINDS {
        if kind.scope() == Scope::Account {
            by_job.insert(kind.name().to_owned(), BTreeSet::new());
        }
    }
    for (job, account) in rows {
        by_job.entry(job).or_default().insert(account);
    }
    by_job
}

fn context(pool: &PgPool, settings: &sexton::config::Settings) -> JobContext {
    JobContext::new(
        pool.clone(),
        Arc::new(settings.clone()),
        Arc::new(ManualClock::new(pass_start())),
    )
}

fn slot() -> NightlySlot {
    NightlySlot {
        version: V1,
        slot: pass_start(),
    }
}

#[sqlx::test]
async fn fl8_the_fan_out_starts_exactly_the_accounts_a_full_scan_finds_something_for(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    // The platform's own schema need not carry the reference CHECKs (EX-1, SS-1).
    sqlx::raw_sql(
        "ALTER TABLE accounts
             DROP CONSTRAINT accounts_execution_details_retention_days_positive;
         ALTER TABLE session_retention_policies
             DROP CONSTRAINT session_retention_policies_task_days_check",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut dice = Dice::new();
    let mut accounts = Vec::new();
    for _ in 0..70 {
        accounts.push(random_account(&pool, &settings.paths.output_root, &mut dice).await);
    }
    // OP-3 on the same mix: the backlogs read per account and in one scan agree.
    fixture::execution_backlog(&pool, pass_start()).await;
    fixture::session_backlog(&pool, pass_start()).await;
    let ctx = context(&pool, &settings);
    tick::fan_out(&ctx, &slot()).await.unwrap();
    let started = passes(&pool, "true").await;
    preview_agrees(&pool, &settings, &started).await;
    let queued: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs
         WHERE job_type IN ('sexton.prune_execution_details', 'sexton.session_retention',
                            'sexton.attachment_expiry')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        queued as usize,
        started.values().map(BTreeSet::len).sum::<usize>(),
        "one first hop per pass started"
    );

    // The full scan: every account's pass of every per-account job, as before FL-8.
    sqlx::query("DELETE FROM apalis.jobs")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM sexton.passes")
        .execute(&pool)
        .await
        .unwrap();
    for kind in sexton::registry::KINDS {
        if kind.scope() == Scope::Account {
            for account in &accounts {
                kind.push_first(&ctx, Some(*account), pass_start())
                    .await
                    .unwrap();
            }
        }
    }
    common::run_until_idle(&pool, dir.path()).await;
    let scanned = passes(
        &pool,
        "candidates > 0 OR pruned > 0 OR retained <> '{}' OR files_deleted > 0 OR file_errors > 0",
    )
    .await;
    for (job, found) in &scanned {
        assert_eq!(
            started[job].difference(found).count() + found.difference(&started[job]).count(),
            0,
            "{job}: started {:?}, a full scan found {:?}",
            started[job],
            found
        );
    }
    let every: usize = scanned.values().map(BTreeSet::len).sum();
    assert!(
        every > 0 && every < accounts.len() * scanned.len(),
        "a mix of due and quiet accounts ({every} passes with something)"
    );
}

#[sqlx::test]
async fn fl8_a_slot_job_killed_mid_fan_out_and_retried_starts_every_due_pass_once(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    // Due accounts in several discovery batches.
    let batch = 40;
    let total = batch * 3;
    let due: Vec<Uuid> = sqlx::query_scalar(
        "WITH a AS (INSERT INTO accounts (name, execution_details_retention_days)
                    SELECT 'tenant', 30 FROM generate_series(1, $1) RETURNING id),
              c AS (INSERT INTO conversations (account_id) SELECT id FROM a RETURNING id, account_id)
         INSERT INTO runs (account_id, conversation_id, kind, status, requested_model,
                           completed_at)
         SELECT account_id, id, 'conversation', 'completed', 'm', $2 FROM c
         RETURNING account_id",
    )
    .bind(total as i32)
    .bind(days_before_pass(45.0))
    .fetch_all(&pool)
    .await
    .unwrap();
    // The control: a young run beside the old ones, which must keep its detail.
    let conversation = fixture::conversation(&pool, due[0]).await;
    let young = fixture::run(
        &pool,
        &settings.paths.output_root,
        RunSpec::conversation(due[0], conversation, 5.0),
    )
    .await;
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();

    // The slot job's worker dies while the fan-out pushes: its first batch is in, the second
    // waits on a pass row this test holds uncommitted for an account of that batch.
    let second: Uuid = sqlx::query_scalar("SELECT id FROM accounts ORDER BY id OFFSET $1 LIMIT 1")
        .bind(batch as i64)
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO sexton.passes (job, scope, slot) VALUES ('prune_execution_details', $1, $2)",
    )
    .bind(second)
    .bind(pass_start())
    .execute(&mut *holder)
    .await
    .unwrap();
    let mut worker = process::fleet_worker(&url, dir.path());
    worker.env("SEXTON_QUEUE__FAN_OUT_BATCH", batch.to_string());
    let worker = Proc::spawn(worker);
    process::poll_until(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT count(*) > 0 FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%INSERT INTO sexton.passes%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    worker.kill().await;
    holder.rollback().await.unwrap();
    let pushed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE job_type = 'sexton.prune_execution_details'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        pushed, batch as i64,
        "killed mid-fan-out, after its first batch"
    );

    // Another worker rescues the slot job (FL-4) and finishes the night.
    let mut rescuer = process::fleet_worker(&url, dir.path());
    rescuer
        .arg("--exit-when-idle")
        .env("SEXTON_QUEUE__FAN_OUT_BATCH", batch.to_string());
    let (status, lines) = Proc::spawn(rescuer).finish(Duration::from_secs(300)).await;
    assert!(status.success(), "{lines:?}");
    let hops: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT (convert_from(job, 'UTF8')::jsonb ->> 'account_id')::uuid, count(*)
         FROM apalis.jobs
         WHERE job_type = 'sexton.prune_execution_details'
           AND (convert_from(job, 'UTF8')::jsonb ->> 'hop')::int = 0
         GROUP BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(hops.len(), total, "every due account's pass started");
    assert!(hops.iter().all(|(_, n)| *n == 1), "none started twice");
    let unpruned: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM runs WHERE details_pruned_at IS NULL")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        unpruned,
        [young.id],
        "every old run pruned, the young one kept"
    );
    assert!(fixture::has_detail(&pool, young.id).await);
    let finished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sexton.passes
         WHERE job = 'prune_execution_details' AND slot = $1 AND finished_at IS NOT NULL",
    )
    .bind(pass_start())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(finished as usize, due.len());
}

/// `sexton status` with `args`, as JSON: the entry of prune_execution_details.
async fn status_of_pruning(url: &str, dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let output = common::sexton(url, dir)
        .args(["status", "--json"])
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "prune_execution_details")
        .cloned()
        .expect("the job in status")
}

#[sqlx::test]
async fn fl8_op1_status_sums_up_the_fan_out_and_lists_the_passes_that_did_not_finish(pool: PgPool) {
    use sexton_jobs::prune_execution_details::{Args, PruneExecutionDetails};
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    let root = &settings.paths.output_root;
    let mut due = Vec::new();
    for _ in 0..2 {
        let account = fixture::account(&pool, Some(30)).await;
        let conversation = fixture::conversation(&pool, account).await;
        fixture::run(
            &pool,
            root,
            RunSpec::conversation(account, conversation, 45.0),
        )
        .await;
        due.push(account);
    }
    let quiet = fixture::account(&pool, Some(30)).await;
    let ctx = context(&pool, &settings);
    tick::fan_out(&ctx, &slot()).await.unwrap();
    // One due account's pass runs to its end; the other's first hop waits in the queue.
    sexton::hop::run::<PruneExecutionDetails>(&ctx, Args::first(Some(due[0]), pass_start()))
        .await
        .unwrap();

    let job = status_of_pruning(&url, dir.path(), &[]).await;
    assert_eq!(
        (
            &job["fan_out"]["accounts"],
            &job["fan_out"]["passes_started"],
            &job["fan_out"]["nothing_due"],
            &job["fan_out"]["complete"]
        ),
        (&3.into(), &2.into(), &1.into(), &true.into())
    );
    assert_eq!(
        (
            &job["pass_states"]["finished"],
            &job["pass_states"]["pending"]
        ),
        (&1.into(), &1.into())
    );
    let listed: Vec<&str> = job["passes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["account_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [due[1].to_string()],
        "only the pass that did not finish"
    );

    let all = status_of_pruning(&url, dir.path(), &["--all"]).await;
    assert_eq!(all["passes"].as_array().unwrap().len(), 2);
    let one = status_of_pruning(&url, dir.path(), &["--account", &due[0].to_string()]).await;
    assert_eq!(one["passes"][0]["state"], "finished");
    assert_eq!(one["passes"].as_array().unwrap().len(), 1);
    let none = status_of_pruning(&url, dir.path(), &["--account", &quiet.to_string()]).await;
    assert!(
        none["passes"].as_array().unwrap().is_empty(),
        "nothing due, no pass"
    );

    let output = common::sexton(&url, dir.path())
        .args(["status", "--job", "no_such_job"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--job: expected one of"));
}

#[sqlx::test]
async fn ttl5_a_kind_set_to_0_days_starts_no_pass_while_the_others_start_theirs(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::settings(dir.path());
    let off = ExpirySettings {
        dream_preloads_days: 0,
        ..settings
            .jobs
            .get::<ExpirySettings>("expire_dream_preloads")
            .clone()
    };
    for job in [
        "expire_handoffs",
        "expire_dream_preloads",
        "expire_working_records",
        "expire_conversation_events",
    ] {
        settings.jobs.set(job, off.clone());
    }

    tick::fan_out(&context(&pool, &settings), &slot())
        .await
        .unwrap();

    let started: Vec<String> =
        sqlx::query_scalar("SELECT job FROM sexton.passes WHERE job LIKE 'expire_%' ORDER BY job")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        started,
        [
            "expire_conversation_events",
            "expire_handoffs",
            "expire_working_records"
        ]
    );
    let queued: Vec<String> = sqlx::query_scalar(
        "SELECT job_type FROM apalis.jobs WHERE job_type LIKE 'sexton.expire_%' ORDER BY job_type",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        queued,
        [
            "sexton.expire_conversation_events",
            "sexton.expire_handoffs",
            "sexton.expire_working_records"
        ],
        "one first hop per pass started, none for the kind that is off"
    );
}

#[sqlx::test]
async fn fl6_a_slot_fans_out_on_the_one_connection_the_schedule_is_budgeted(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    // A due account, whose one run is past its 30 days, and the control: an account whose one
    // run is young has nothing due and starts no pass.
    let mut accounts = Vec::new();
    for age_days in [45.0, 5.0] {
        let account = fixture::account(&pool, Some(30)).await;
        let conversation = fixture::conversation(&pool, account).await;
        fixture::run(
            &pool,
            dir.path(),
            RunSpec::conversation(account, conversation, age_days),
        )
        .await;
        accounts.push(account);
    }
    // The fan-out counts as one of the worker's fixed connections (FL-6): on a pool of one it
    // goes through, where a second connection held at once would never come.
    let one = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();

    tick::fan_out(&context(&one, &settings), &slot())
        .await
        .unwrap();

    let started: Vec<Uuid> =
        sqlx::query_scalar("SELECT scope FROM sexton.passes WHERE job = 'prune_execution_details'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        started,
        accounts[..1],
        "the due account's pass is started, the quiet one's not"
    );
    let unfinished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sexton.fan_outs WHERE finished_at IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(unfinished, 0, "every kind's fan-out went through");
    one.close().await;
}
