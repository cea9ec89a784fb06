//! Short-lived records (SPEC §4, TTL-1 … TTL-5) and the queue's own retention (FL-7), against a
//! real PostgreSQL: every age on both sides of its boundary, pinned records, a held row, a
//! configured and a disabled kind, infinite and future times, a large pass, a SIGKILL mid-pass,
//! and `brain_memories` untouched by a full nightly pass.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::files::PathSettings;
use sexton_jobs::queue_retention::{self, QueueRetention, QueueRetentionSettings};
use sexton_jobs::record_expiry::{
    Args, ConversationEvents, DreamPreloads, Expire, ExpirySettings, Handoffs, Record,
    WorkingRecords,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, days_before_pass, pass_start};
use crate::common::process::{Proc, poll_until};
use crate::common::run;

fn settings() -> ExpirySettings {
    ExpirySettings {
        handoffs_days: 14,
        dream_preloads_days: 7,
        working_records_days: 90,
        conversation_events_days: 30,
        batch_size: 100,
        budget: Duration::from_secs(600),
    }
}

fn paths() -> PathSettings {
    let none = std::path::PathBuf::from("/nonexistent");
    PathSettings {
        output_root: none.clone(),
        attachments_root: none.clone(),
        artifacts_root: none.clone(),
        sessions_root: none.clone(),
        traces_root: none,
        objects: Vec::new(),
    }
}

/// A whole pass of record kind `R` from `args`; every hop's report.
async fn pass_from<R: Record>(
    pool: &PgPool,
    settings: &ExpirySettings,
    args: Args,
) -> Vec<run::Hopped<Expire<R>>> {
    run::pass::<Expire<R>>(pool, &paths(), settings, args).await
}

async fn pass<R: Record>(pool: &PgPool, settings: &ExpirySettings) -> Vec<run::Hopped<Expire<R>>> {
    pass_from::<R>(pool, settings, Args::first(None, pass_start())).await
}

fn pruned<R: Record>(reports: &[run::Hopped<Expire<R>>]) -> u64 {
    reports.iter().map(|r| r.pruned).sum()
}

fn busy<R: Record>(reports: &[run::Hopped<Expire<R>>]) -> u64 {
    reports.iter().map(|r| r.retained_total()).sum()
}

/// An account with an agent and a conversation, to hang records on.
struct World {
    account: Uuid,
    agent: Uuid,
    conversation: Uuid,
}

impl World {
    async fn new(pool: &PgPool, retention_days: Option<i32>) -> Self {
        common::migrate(pool).await;
        let account = fixture::account(pool, retention_days).await;
        let agent = fixture::agent(pool, account).await;
        let conversation = fixture::conversation(pool, account).await;
        Self {
            account,
            agent,
            conversation,
        }
    }

    /// A record of `table` aged from `at` (`created_at`, or `updated_at` for working records);
    /// its id as text.
    async fn record(&self, pool: &PgPool, table: &str, at: DateTime<Utc>) -> String {
        self.insert(pool, table, at, false).await
    }

    /// `n` conversation events a second apart, all past 30 days.
    async fn expired_events(&self, pool: &PgPool, n: i32) {
        sqlx::query(
            "INSERT INTO conversation_events (conversation_id, kind, created_at)
             SELECT $1, 'delta', $2 - g * interval '1 second' FROM generate_series(1, $3) g",
        )
        .bind(self.conversation)
        .bind(days_before_pass(31.0))
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn insert(&self, pool: &PgPool, table: &str, at: DateTime<Utc>, pinned: bool) -> String {
        let sql = match table {
            "handoffs" => {
                "INSERT INTO handoffs (account_id, agent_id, created_at) VALUES ($1, $2, $4)
                 RETURNING id::text"
            }
            "dream_preloads" => {
                "INSERT INTO dream_preloads (account_id, agent_id, created_at) VALUES ($1, $2, $4)
                 RETURNING id::text"
            }
            "working_records" => {
                "INSERT INTO working_records (account_id, agent_id, kind, pinned, updated_at)
                 VALUES ($1, $2, CASE WHEN $5 THEN 'card' ELSE 'record' END, $5, $4)
                 RETURNING id::text"
            }
            "conversation_events" => {
                "INSERT INTO conversation_events (conversation_id, kind, created_at)
                 VALUES ($3, 'delta', $4) RETURNING id::text"
            }
            other => panic!("no such record table {other}"),
        };
        sqlx::query_scalar(sql)
            .bind(self.account)
            .bind(self.agent)
            .bind(self.conversation)
            .bind(at)
            .bind(pinned)
            .fetch_one(pool)
            .await
            .unwrap()
    }
}

async fn exists(pool: &PgPool, table: &str, id: &str) -> bool {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE id::text = $1"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
        == 1
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A record one second past its age goes; one exactly at it, and one a second short, stay.
async fn boundary_holds<R: Record>(pool: PgPool, days: f64) {
    let world = World::new(&pool, Some(90)).await;
    let second = chrono::Duration::seconds(1);
    let cutoff = days_before_pass(days);
    let past = world.record(&pool, R::TABLE, cutoff - second).await;
    let long_past = world
        .record(&pool, R::TABLE, cutoff - chrono::Duration::days(400))
        .await;
    let at = world.record(&pool, R::TABLE, cutoff).await;
    let short = world.record(&pool, R::TABLE, cutoff + second).await;

    let reports = pass::<R>(&pool, &settings()).await;

    assert!(
        !exists(&pool, R::TABLE, &past).await,
        "{} past its age",
        R::TABLE
    );
    assert!(!exists(&pool, R::TABLE, &long_past).await);
    assert!(
        exists(&pool, R::TABLE, &at).await,
        "{} exactly at its age",
        R::TABLE
    );
    assert!(exists(&pool, R::TABLE, &short).await);
    assert_eq!(pruned(&reports), 2);
    assert_eq!(reports.last().unwrap().outcome.as_str(), "finished");
}

#[sqlx::test]
async fn ttl1_handoffs_expire_14_days_after_created_at(pool: PgPool) {
    boundary_holds::<Handoffs>(pool, 14.0).await;
}

#[sqlx::test]
async fn ttl2_dream_preloads_expire_7_days_after_created_at(pool: PgPool) {
    boundary_holds::<DreamPreloads>(pool, 7.0).await;
}

#[sqlx::test]
async fn ttl3_working_records_expire_90_days_after_updated_at(pool: PgPool) {
    boundary_holds::<WorkingRecords>(pool, 90.0).await;
}

#[sqlx::test]
async fn ttl4_conversation_events_expire_30_days_after_created_at(pool: PgPool) {
    boundary_holds::<ConversationEvents>(pool, 30.0).await;
}

#[sqlx::test]
async fn ttl3_pinned_records_and_cards_never_expire(pool: PgPool) {
    let world = World::new(&pool, Some(90)).await;
    let ancient = days_before_pass(3000.0);
    let pinned_card = world.insert(&pool, "working_records", ancient, true).await;
    let pinned_record: String = sqlx::query_scalar(
        "INSERT INTO working_records (account_id, agent_id, kind, pinned, updated_at)
         VALUES ($1, $2, 'record', true, $3) RETURNING id::text",
    )
    .bind(world.account)
    .bind(world.agent)
    .bind(ancient)
    .fetch_one(&pool)
    .await
    .unwrap();
    let unpinned_card: String = sqlx::query_scalar(
        "INSERT INTO working_records (account_id, agent_id, kind, pinned, updated_at)
         VALUES ($1, $2, 'card', false, $3) RETURNING id::text",
    )
    .bind(world.account)
    .bind(world.agent)
    .bind(ancient)
    .fetch_one(&pool)
    .await
    .unwrap();

    let reports = pass::<WorkingRecords>(&pool, &settings()).await;

    assert!(exists(&pool, "working_records", &pinned_card).await);
    assert!(exists(&pool, "working_records", &pinned_record).await);
    assert!(!exists(&pool, "working_records", &unpinned_card).await);
    assert_eq!(pruned(&reports), 1);
}

#[sqlx::test]
async fn ttl4_events_expire_where_execution_retention_is_disabled(pool: PgPool) {
    let world = World::new(&pool, None).await;
    let old = world
        .record(&pool, "conversation_events", days_before_pass(31.0))
        .await;
    let young = world
        .record(&pool, "conversation_events", days_before_pass(29.0))
        .await;

    pass::<ConversationEvents>(&pool, &settings()).await;

    let retention: Option<i32> =
        sqlx::query_scalar("SELECT execution_details_retention_days FROM accounts WHERE id = $1")
            .bind(world.account)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(retention, None, "the account's execution retention is off");
    assert!(!exists(&pool, "conversation_events", &old).await);
    assert!(exists(&pool, "conversation_events", &young).await);
}

#[sqlx::test]
async fn ttl5_a_configured_age_applies_and_a_disabled_kind_keeps_everything(pool: PgPool) {
    let world = World::new(&pool, Some(90)).await;
    let four_days = world.record(&pool, "handoffs", days_before_pass(4.0)).await;
    let two_days = world.record(&pool, "handoffs", days_before_pass(2.0)).await;
    let ancient_preload = world
        .record(&pool, "dream_preloads", days_before_pass(500.0))
        .await;
    let settings = ExpirySettings {
        handoffs_days: 3,
        dream_preloads_days: 0,
        ..settings()
    };

    pass::<Handoffs>(&pool, &settings).await;
    let disabled = pass::<DreamPreloads>(&pool, &settings).await;

    assert!(
        !exists(&pool, "handoffs", &four_days).await,
        "3 days configured"
    );
    assert!(exists(&pool, "handoffs", &two_days).await);
    assert!(exists(&pool, "dream_preloads", &ancient_preload).await);
    assert_eq!(disabled.len(), 1);
    assert_eq!(disabled[0].outcome.as_str(), "disabled");
    assert_eq!(disabled[0].candidates, 0);

    // The same preload goes once the kind is enabled again: the disabled pass was the reason.
    pass::<DreamPreloads>(&pool, &self::settings()).await;
    assert!(!exists(&pool, "dream_preloads", &ancient_preload).await);
}

#[sqlx::test]
async fn ttl5_a_row_an_application_holds_is_skipped_then_removed_next_pass(pool: PgPool) {
    let world = World::new(&pool, Some(90)).await;
    let held = world
        .record(&pool, "handoffs", days_before_pass(20.0))
        .await;
    let free = world
        .record(&pool, "handoffs", days_before_pass(21.0))
        .await;

    let mut app = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM handoffs WHERE id::text = $1 FOR UPDATE")
        .bind(&held)
        .execute(&mut *app)
        .await
        .unwrap();
    let first = pass::<Handoffs>(&pool, &settings()).await;
    assert!(
        exists(&pool, "handoffs", &held).await,
        "a held row is never waited on"
    );
    assert!(!exists(&pool, "handoffs", &free).await);
    assert_eq!(busy(&first), 1);
    app.commit().await.unwrap();

    let next_night = pass_from::<Handoffs>(
        &pool,
        &settings(),
        Args::first(None, pass_start() + chrono::Duration::days(1)),
    )
    .await;
    assert!(!exists(&pool, "handoffs", &held).await);
    assert_eq!((pruned(&next_night), busy(&next_night)), (1, 0));
}

#[sqlx::test]
async fn ttl5_infinite_times_are_never_candidates_and_the_pass_ends(pool: PgPool) {
    let world = World::new(&pool, Some(90)).await;
    let old = world
        .record(&pool, "handoffs", days_before_pass(20.0))
        .await;
    let mut infinite = Vec::new();
    for at in ["-infinity", "infinity"] {
        let id: String = sqlx::query_scalar(
            "INSERT INTO handoffs (account_id, agent_id, created_at)
             VALUES ($1, $2, $3::timestamptz) RETURNING id::text",
        )
        .bind(world.account)
        .bind(world.agent)
        .bind(at)
        .fetch_one(&pool)
        .await
        .unwrap();
        infinite.push(id);
    }

    let reports = pass::<Handoffs>(&pool, &settings()).await;

    assert!(!exists(&pool, "handoffs", &old).await);
    for id in &infinite {
        assert!(exists(&pool, "handoffs", id).await);
    }
    assert_eq!(reports.last().unwrap().outcome.as_str(), "finished");
}

#[sqlx::test]
async fn ttl5_a_pass_started_in_the_future_expires_nothing_early(pool: PgPool) {
    let world = World::new(&pool, Some(90)).await;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let ten_days = world
        .record(&pool, "handoffs", now - chrono::Duration::days(10))
        .await;
    let twenty_days = world
        .record(&pool, "handoffs", now - chrono::Duration::days(20))
        .await;

    pass_from::<Handoffs>(
        &pool,
        &settings(),
        Args::first(None, now + chrono::Duration::days(365)),
    )
    .await;

    assert!(
        exists(&pool, "handoffs", &ten_days).await,
        "the database's now caps the cutoff"
    );
    assert!(!exists(&pool, "handoffs", &twenty_days).await);
}

#[sqlx::test]
async fn ttl5_25000_expired_events_go_in_one_pass_of_bounded_hops(pool: PgPool) {
    let world = World::new(&pool, None).await;
    world.expired_events(&pool, 25000).await;
    let young = world
        .record(&pool, "conversation_events", days_before_pass(1.0))
        .await;
    let settings = ExpirySettings {
        batch_size: 1000,
        budget: Duration::from_millis(1),
        ..settings()
    };

    let reports = pass::<ConversationEvents>(&pool, &settings).await;

    assert_eq!(count(&pool, "conversation_events").await, 1);
    assert!(exists(&pool, "conversation_events", &young).await);
    assert_eq!(pruned(&reports), 25_000);
    assert!(
        reports.len() >= 25,
        "one batch per hop: {} hops",
        reports.len()
    );
    assert!(reports.iter().all(|r| r.candidates <= 1000));
    let cutoffs: std::collections::BTreeSet<_> = reports
        .iter()
        .filter_map(|r| r.next.as_ref()?.cutoff)
        .collect();
    assert_eq!(cutoffs.len(), 1, "the cutoff is carried unchanged");
}

/// The content of every `brain_memories` row, in one string.
async fn brain(pool: &PgPool) -> (i64, String) {
    sqlx::query_as(
        "SELECT count(*), COALESCE(md5(string_agg(b::text, '|' ORDER BY b.id)), '')
         FROM brain_memories b",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn ttl5_brain_memories_untouched_by_a_full_nightly_pass_of_every_job(pool: PgPool) {
    let backlog = common::seeded_backlog(&pool, 5).await;
    let brain_before = brain(&pool).await;
    assert!(brain_before.0 > 0, "the seed writes brain memories");
    let tables = [
        "handoffs",
        "dream_preloads",
        "working_records",
        "conversation_events",
    ];
    let mut before = Vec::new();
    for table in tables {
        before.push(count(&pool, table).await);
    }

    let settings = common::every_job(backlog.settings.clone());
    common::start_every_pass(&pool, &settings, pass_start()).await;
    let mut worker = common::sexton(&backlog.url, backlog.dir.path());
    worker
        .args(["worker", "--exit-when-idle"])
        .envs(common::EVERY_JOB_ENV);
    let status = common::wait(&mut worker.spawn().unwrap(), Duration::from_secs(120)).await;
    assert!(status.success());

    assert_eq!(brain(&pool).await, brain_before);
    for (table, before) in tables.iter().zip(before) {
        let after = count(&pool, table).await;
        assert!(
            after < before,
            "the pass expired {table} ({before} -> {after})"
        );
    }
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT job FROM sexton.passes WHERE finished_at IS NOT NULL ORDER BY job",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for kind in sexton::registry::KINDS {
        assert!(
            kinds.iter().any(|k| k == kind.name()),
            "{} ran a pass",
            kind.name()
        );
    }
}

#[sqlx::test]
async fn ttl5_workers_killed_with_sigkill_mid_pass_then_the_pass_completes(pool: PgPool) {
    let world = World::new(&pool, None).await;
    world.expired_events(&pool, 60000).await;
    let young = world
        .record(&pool, "conversation_events", days_before_pass(1.0))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let settings = common::settings(dir.path());
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    let worker = |exit_when_idle: bool| {
        let mut cmd = crate::crash::worker(&url, dir.path(), exit_when_idle);
        cmd.env("SEXTON_EXPIRY__BATCH_SIZE", "200")
            .env("SEXTON_EXPIRY__HOP_BUDGET_MS", "1");
        cmd
    };

    let mut kills_mid_pass = 0;
    for _ in 0..3 {
        let left = count(&pool, "conversation_events").await;
        let child = Proc::spawn(worker(false));
        // Kill once this worker has deleted something of what is left, before it is done.
        poll_until(Duration::from_secs(60), || async {
            count(&pool, "conversation_events").await < left
        })
        .await;
        child.kill().await;
        let now_left = count(&pool, "conversation_events").await;
        if now_left > 1 {
            kills_mid_pass += 1;
        }
    }
    assert!(
        kills_mid_pass >= 2,
        "only {kills_mid_pass} kills landed mid-pass"
    );

    let mut last = worker(true).spawn().unwrap();
    let status = common::wait(&mut last, Duration::from_secs(180)).await;
    assert!(status.success());
    assert_eq!(count(&pool, "conversation_events").await, 1);
    assert!(exists(&pool, "conversation_events", &young).await);
    let unfinished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sexton.passes
         WHERE job = 'expire_conversation_events' AND finished_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(unfinished, 0, "the pass finished after the kills");
}

// ---- FL-7: the queue keeps itself small --------------------------------------------------

/// A queue row as the queue would hold it: `age` ago by its finish (or its run time).
async fn queue_row(
    pool: &PgPool,
    job_type: &str,
    status: &str,
    attempts: i32,
    age: chrono::Duration,
    lock_by: Option<&str>,
) -> String {
    let id = Uuid::new_v4().simple().to_string();
    // The queue's guard kills a payload it cannot decode as it is written: the row is made
    // what the case needs afterwards, as the queue itself would update it.
    sqlx::query(
        "INSERT INTO apalis.jobs (job, id, job_type, max_attempts)
         VALUES (convert_to('{}', 'UTF8'), $1, $2, 5)",
    )
    .bind(&id)
    .bind(job_type)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE apalis.jobs
         SET status = $2, attempts = $3, run_at = $4, lock_by = $5,
             done_at = CASE WHEN $2 IN ('Done', 'Failed', 'Killed') THEN $4 END
         WHERE id = $1",
    )
    .bind(&id)
    .bind(status)
    .bind(attempts)
    .bind(pass_start() - age)
    .bind(lock_by)
    .execute(pool)
    .await
    .unwrap();
    id
}

async fn queue_has(pool: &PgPool, id: &str) -> bool {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM apalis.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
        == 1
}

async fn worker_row(pool: &PgPool, id: &str, worker_type: &str, seen_ago: chrono::Duration) {
    sqlx::query(
        "INSERT INTO apalis.workers (id, worker_type, storage_name, last_seen)
         VALUES ($1, $2, 'PgStorage', $3)",
    )
    .bind(id)
    .bind(worker_type)
    .bind(pass_start() - seen_ago)
    .execute(pool)
    .await
    .unwrap();
}

async fn worker_exists(pool: &PgPool, id: &str) -> bool {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM apalis.workers WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
        == 1
}

async fn queue_pass(pool: &PgPool) -> Vec<run::Hopped<QueueRetention>> {
    let settings = QueueRetentionSettings {
        retention: chrono::Duration::days(7),
    };
    run::pass::<QueueRetention>(
        pool,
        &paths(),
        &settings,
        queue_retention::Args::first(None, pass_start()),
    )
    .await
}

#[sqlx::test]
async fn fl7_finished_jobs_past_the_age_go_younger_and_unfinished_ones_stay(pool: PgPool) {
    common::migrate(&pool).await;
    let days = chrono::Duration::days;
    let q = "sexton.expire_handoffs";
    let gone = [
        queue_row(&pool, q, "Done", 1, days(8), None).await,
        queue_row(&pool, q, "Failed", 5, days(8), None).await,
        queue_row(&pool, q, "Killed", 0, days(30), None).await,
        queue_row(&pool, "sexton.nightly", "Done", 1, days(100), None).await,
    ];
    let kept = [
        // Finished, but younger than the retention: kept for inspection.
        queue_row(&pool, q, "Done", 1, days(6), None).await,
        queue_row(&pool, q, "Failed", 5, days(6), None).await,
        queue_row(&pool, q, "Killed", 0, days(6), None).await,
        // Not finished, however old.
        queue_row(&pool, q, "Failed", 2, days(30), None).await,
        queue_row(&pool, q, "Pending", 0, days(30), None).await,
        queue_row(&pool, q, "Running", 1, days(30), None).await,
        // Another application's queue in the same schema.
        queue_row(&pool, "billing.invoices", "Done", 1, days(30), None).await,
    ];

    let reports = queue_pass(&pool).await;

    for id in &gone {
        assert!(
            !queue_has(&pool, id).await,
            "finished job {id} past the age"
        );
    }
    for id in &kept {
        assert!(queue_has(&pool, id).await, "job {id} stays");
    }
    assert_eq!(reports.iter().map(|r| r.pruned).sum::<u64>(), 4);
}

#[sqlx::test]
async fn fl7_many_finished_jobs_go_in_bounded_batches(pool: PgPool) {
    common::migrate(&pool).await;
    sqlx::query(
        "INSERT INTO apalis.jobs (job, id, job_type, max_attempts)
         SELECT convert_to('{}', 'UTF8'), 'old' || g, 'sexton.nightly', 5
         FROM generate_series(1, 2500) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE apalis.jobs SET status = 'Done', attempts = 1, run_at = $1, done_at = $1")
        .bind(pass_start() - chrono::Duration::days(9))
        .execute(&pool)
        .await
        .unwrap();
    let young = queue_row(
        &pool,
        "sexton.nightly",
        "Done",
        1,
        chrono::Duration::days(1),
        None,
    )
    .await;

    let reports = queue_pass(&pool).await;

    assert_eq!(count(&pool, "apalis.jobs").await, 1);
    assert!(queue_has(&pool, &young).await);
    assert_eq!(reports.iter().map(|r| r.pruned).sum::<u64>(), 2500);
}

#[sqlx::test]
async fn fl7_stale_workers_go_live_ones_and_ones_a_job_names_stay(pool: PgPool) {
    common::migrate(&pool).await;
    let days = chrono::Duration::days;
    worker_row(&pool, "dead", "sexton.nightly", days(3)).await;
    worker_row(
        &pool,
        "live",
        "sexton.nightly",
        chrono::Duration::seconds(5),
    )
    .await;
    worker_row(&pool, "dead-but-named", "sexton.nightly", days(3)).await;
    worker_row(&pool, "other-app", "billing.invoices", days(3)).await;
    let named = queue_row(
        &pool,
        "sexton.nightly",
        "Done",
        1,
        days(2),
        Some("dead-but-named"),
    )
    .await;

    let reports = queue_pass(&pool).await;

    assert!(!worker_exists(&pool, "dead").await);
    assert!(worker_exists(&pool, "live").await);
    assert!(
        worker_exists(&pool, "dead-but-named").await,
        "rescue finds jobs through it"
    );
    assert!(worker_exists(&pool, "other-app").await);
    assert!(queue_has(&pool, &named).await);
    let workers: u64 = reports
        .iter()
        .flat_map(|r| &r.rows)
        .filter(|(t, _)| *t == "apalis.workers")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(workers, 1);
}

#[sqlx::test]
async fn fl7_check_config_refuses_a_catch_up_reaching_past_the_retention(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let refused = common::sexton(&url, dir.path())
        .arg("check-config")
        .env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "168")
        .env("SEXTON_QUEUE__FINISHED_JOB_RETENTION_DAYS", "7")
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("schedule.catch_up_hours"), "{stderr}");
    assert!(
        stderr.contains("queue.finished_job_retention_days"),
        "{stderr}"
    );

    let accepted = common::sexton(&url, dir.path())
        .arg("check-config")
        .env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "167")
        .env("SEXTON_QUEUE__FINISHED_JOB_RETENTION_DAYS", "7")
        .output()
        .await
        .unwrap();
    assert_eq!(accepted.status.code(), Some(0));
}

#[sqlx::test]
async fn ttl5_an_invalid_age_is_refused_naming_the_setting(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let refused = common::sexton(&url, dir.path())
        .arg("check-config")
        .env("SEXTON_EXPIRY__HANDOFFS_DAYS", "-3")
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("expiry.handoffs_days"), "{stderr}");
    assert_eq!(
        stderr.matches("expiry.handoffs_days").count(),
        1,
        "reported once though four jobs read [expiry]: {stderr}"
    );

    let accepted = common::sexton(&url, dir.path())
        .arg("check-config")
        .env("SEXTON_EXPIRY__HANDOFFS_DAYS", "0")
        .output()
        .await
        .unwrap();
    assert_eq!(accepted.status.code(), Some(0));
}

#[sqlx::test]
async fn ttl5_the_cursor_follows_numeric_ids_so_each_row_is_counted_once(pool: PgPool) {
    let world = World::new(&pool, None).await;
    // Equally old events whose ids sort differently as text ("999" after "2000").
    sqlx::query(
        "INSERT INTO conversation_events (conversation_id, kind, created_at)
         SELECT $1, 'delta', $2 FROM generate_series(1, 2500)",
    )
    .bind(world.conversation)
    .bind(days_before_pass(40.0))
    .execute(&pool)
    .await
    .unwrap();
    let mut app = pool.begin().await.unwrap();
    sqlx::query(
        "SELECT 1 FROM conversation_events WHERE id IN (SELECT id FROM conversation_events
                                                        ORDER BY id LIMIT 100) FOR UPDATE",
    )
    .execute(&mut *app)
    .await
    .unwrap();
    let settings = ExpirySettings {
        batch_size: 1000,
        ..settings()
    };

    let reports = pass::<ConversationEvents>(&pool, &settings).await;
    app.commit().await.unwrap();

    let candidates: u64 = reports.iter().map(|r| r.candidates).sum();
    assert_eq!(candidates, 2500, "every row read once");
    assert_eq!((pruned(&reports), busy(&reports)), (2400, 100));
    assert_eq!(count(&pool, "conversation_events").await, 100);
}
