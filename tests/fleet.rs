//! The fleet (SPEC §5): real worker processes on one database — each slot once (FL-2), one hop
//! per account at a time (FL-3), a dead worker's hop rescued (FL-4), SIGTERM within the grace
//! (FL-5), bounded connections (FL-6).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sexton::config::{ScheduleSettings, parse_cron};
use sexton::event;
use sexton::queue::{self, PushOutcome};
use sqlx::PgPool;
use tokio::process::Command;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::process::{
    Proc, RESCUE_BOUND_SECS, SHUTDOWN_GRACE, events, fleet_worker, poll_until, wait_until_idle,
    worker_like,
};
use crate::common::{self, audit};

#[sqlx::test]
async fn fl6_every_connection_carries_statement_and_lock_timeouts_and_compiles_nothing_just_in_time(
    pool: PgPool,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::settings(dir.path());
    settings.database.statement_timeout = Duration::from_millis(1234);
    settings.database.lock_timeout = Duration::from_millis(567);
    settings.database.max_connections = 3;
    let sexton_pool = sexton::db::connect(&settings.database, sexton::db::Access::Read)
        .await
        .unwrap();
    let server_default: String =
        sqlx::query_scalar("SELECT boot_val FROM pg_settings WHERE name = 'jit'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        server_default, "on",
        "the control: the server's own default compiles"
    );
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = sexton_pool.acquire().await.unwrap();
        let jit: String = sqlx::query_scalar("SHOW jit")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(jit, "off", "a bounded batch never repays its compilation");
        let statement: String = sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        let lock: String = sqlx::query_scalar("SHOW lock_timeout")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!((statement.as_str(), lock.as_str()), ("1234ms", "567ms"));
        held.push(conn);
    }
    let fourth = tokio::time::timeout(Duration::from_millis(200), sexton_pool.acquire()).await;
    assert!(
        fourth.is_err(),
        "the pool never grows past database.max_connections"
    );
    drop(held);
    drop(pool);
}

#[sqlx::test]
async fn fl2_each_slot_is_enqueued_exactly_once_across_the_fleet(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    let workers: Vec<Proc> = (0..3)
        .map(|_| Proc::spawn(fleet_worker(&url, dir.path())))
        .collect();
    for worker in &workers {
        worker.wait_for(event::WORKER_STARTED).await;
    }
    let slots: Vec<DateTime<Utc>> = (0..50)
        .map(|day| pass_start() + chrono::Duration::days(day))
        .collect();

    // Three `sexton tick` processes and this process fire every slot at once.
    let mut tickers = Vec::new();
    for _ in 0..3 {
        let (url, dir, slots) = (url.clone(), dir.path().to_owned(), slots.clone());
        tickers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for slot in slots {
                let out = common::sexton(&url, &dir)
                    .env("SEXTON_SCHEDULE__CRON", "0 3 * * *")
                    .args(["tick", "--json", "--at", &slot.to_rfc3339()])
                    .output()
                    .await
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                outcomes.push((
                    v["slot"].as_str().unwrap().to_owned(),
                    v["outcome"].as_str().unwrap().to_owned(),
                ));
            }
            outcomes
        }));
    }
    let mut enqueued: BTreeMap<String, usize> = BTreeMap::new();
    for slot in &slots {
        let outcome = sexton::tick::enqueue_slot(&pool, &settings, *slot)
            .await
            .unwrap();
        if outcome == PushOutcome::Enqueued {
            *enqueued
                .entry(slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .or_default() += 1;
        }
    }
    for ticker in tickers {
        for (slot, outcome) in ticker.await.unwrap() {
            assert!(outcome == "enqueued" || outcome == "duplicate", "{outcome}");
            if outcome == "enqueued" {
                let slot: DateTime<Utc> = slot.parse().unwrap();
                *enqueued
                    .entry(slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .or_default() += 1;
            }
        }
    }
    // The clock steps backwards: the same slots again, newest first.
    for slot in slots.iter().rev() {
        let outcome = sexton::tick::enqueue_slot(&pool, &settings, *slot)
            .await
            .unwrap();
        assert_eq!(outcome, PushOutcome::Duplicate);
    }
    assert_eq!(enqueued.len(), 50);
    assert!(enqueued.values().all(|n| *n == 1), "{enqueued:?}");
    let jobs: Vec<(String, i64)> = sqlx::query_as(
        "SELECT idempotency_key, count(*) FROM apalis.jobs WHERE job_type = 'sexton.nightly' GROUP BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(jobs.len(), 50);
    assert!(jobs.iter().all(|(_, n)| *n == 1));
    wait_until_idle(&pool).await;
    let names: BTreeSet<String> =
        sqlx::query_scalar("SELECT id FROM apalis.workers WHERE worker_type = 'sexton.nightly'")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(names.len(), 3, "three distinct worker names: {names:?}");
    for worker in workers {
        worker.stop().await;
    }
}

#[sqlx::test]
async fn fl2_a_fleet_started_late_catches_up_only_the_latest_missed_slot_once(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let schedule = ScheduleSettings {
        cron: parse_cron("0 * * * *").unwrap(),
        timezone: chrono_tz::UTC,
        catch_up: chrono::Duration::hours(3),
    };
    let started = Utc::now();
    let latest = sexton::schedule::slot_at(&schedule, started).unwrap();
    let workers: Vec<Proc> = (0..3)
        .map(|_| {
            let mut cmd = fleet_worker(&url, dir.path());
            cmd.env("SEXTON_SCHEDULE__CRON", "0 * * * *")
                .env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "3");
            Proc::spawn(cmd)
        })
        .collect();
    for worker in &workers {
        worker.wait_for(event::SLOT_CAUGHT_UP).await;
    }
    for worker in workers {
        worker.stop().await;
    }
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT idempotency_key FROM apalis.jobs WHERE job_type = 'sexton.nightly'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let key = |slot: DateTime<Utc>| format!("nightly:{}", slot.to_rfc3339());
    assert_eq!(
        keys.iter().filter(|k| **k == key(latest)).count(),
        1,
        "{keys:?}"
    );
    for missed in 1..=2 {
        let older = key(latest - chrono::Duration::hours(missed));
        assert!(
            !keys.contains(&older),
            "an older missed slot was backfilled: {keys:?}"
        );
    }
    // Only the latest slot, or the next one if the hour turned during the test.
    let next = key(latest + chrono::Duration::hours(1));
    assert!(
        keys.iter().all(|k| *k == key(latest) || *k == next),
        "{keys:?}"
    );
}

/// When a hop held its account's lock: from taking it to releasing it.
type Interval = (DateTime<Utc>, DateTime<Utc>);

/// Hop intervals per account, from the workers' JSON logs.
fn hop_intervals(lines: &[String]) -> BTreeMap<String, Vec<Interval>> {
    let mut intervals: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for event in events(lines, event::HOP_DONE) {
        if event["span"]["job"] != "prune_execution_details" {
            continue;
        }
        let at = |field: &str| -> DateTime<Utc> { event[field].as_str().unwrap().parse().unwrap() };
        let account = event["span"]["account"].as_str().unwrap().to_owned();
        intervals
            .entry(account)
            .or_default()
            .push((at("locked_at"), at("unlocked_at")));
    }
    intervals
}

#[sqlx::test]
async fn fl3_hops_of_one_account_never_overlap_across_the_fleet(pool: PgPool) {
    let common::Backlog {
        dir,
        settings,
        before,
        url,
    } = common::seeded_backlog(&pool, 5).await;
    let workers: Vec<Proc> = (0..3)
        .map(|_| {
            let mut cmd = fleet_worker(&url, dir.path());
            cmd.env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "20");
            Proc::spawn(cmd)
        })
        .collect();
    // One account's scope is held, as a hop of another replica would hold it, until a worker
    // has met it busy: the contention is certain, not left to timing.
    // An account both slots start a pass for (FL-8): one with a run old at either.
    let held: Uuid = sqlx::query_scalar(
        "SELECT a.id FROM accounts a
         WHERE a.execution_details_retention_days > 0
           AND EXISTS (SELECT 1 FROM runs r
                       WHERE r.account_id = a.id AND r.kind = 'conversation'
                         AND r.conversation_id IS NOT NULL AND r.details_pruned_at IS NULL
                         AND r.completed_at < $1 - make_interval(
                             days => a.execution_details_retention_days))
         ORDER BY a.id LIMIT 1",
    )
    .bind(pass_start() - chrono::Duration::days(1))
    .fetch_one(&pool)
    .await
    .unwrap();
    let lock = sexton::hop::ScopeLock::try_take(&pool, "prune_execution_details", Some(held))
        .await
        .unwrap()
        .expect("the scope is free before any worker runs");
    // Two passes at once for every account: yesterday's slot and today's.
    for slot in [pass_start() - chrono::Duration::days(1), pass_start()] {
        sexton::tick::tick(&pool, &settings, slot).await.unwrap();
    }
    poll_until(Duration::from_secs(60), || async {
        workers.iter().any(|w| w.saw(event::HOP_DEFERRED))
    })
    .await;
    lock.release().await;
    wait_until_idle(&pool).await;
    let mut lines = Vec::new();
    for worker in workers {
        lines.extend(worker.stop().await);
    }
    let busy: Vec<serde_json::Value> = events(&lines, event::HOP_DEFERRED)
        .filter(|e| e["span"]["job"] == "prune_execution_details")
        .collect();
    assert!(
        busy.iter()
            .any(|e| e["span"]["account"] == held.to_string().as_str()),
        "a hop met the held account busy and was deferred"
    );
    let intervals = hop_intervals(&lines);
    let started: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT scope) FROM sexton.passes WHERE job = 'prune_execution_details'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        intervals.len() as i64,
        started,
        "hops of every account with a pass were logged"
    );
    for (account, mut hops) in intervals {
        hops.sort();
        for pair in hops.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "account {account}: hops overlap: {pair:?}"
            );
        }
    }
    audit::verify(&pool, &settings.paths.output_root, &before, true).await;
}

/// How many consumers of `queue` whose names are `LIKE` `like` have heartbeaten `seconds` or
/// more after `since`.
async fn beaten_since(
    pool: &PgPool,
    queue: &str,
    like: &str,
    since: DateTime<Utc>,
    seconds: f64,
) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM apalis.workers
         WHERE worker_type = $1 AND id LIKE $2 AND last_seen >= $3 + make_interval(secs => $4)",
    )
    .bind(queue)
    .bind(like)
    .bind(since)
    .bind(seconds)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Starts the nightly pass, lets `worker`'s hop wait on the conversation `writer` holds, kills
/// the worker with SIGKILL there, then lets the platform's writer go.
async fn die_waiting(
    pool: &PgPool,
    settings: &sexton::config::Settings,
    mut worker: Proc,
    writer: sqlx::Transaction<'_, sqlx::Postgres>,
) {
    sexton::tick::tick(pool, settings, pass_start())
        .await
        .unwrap();
    common::wait_for_lock_waiter(pool, "conversations").await;
    worker.child.start_kill().unwrap();
    worker.child.wait().await.unwrap();
    writer.rollback().await.unwrap();
}

/// An account with a run due for pruning, and a young one beside it that must keep its detail,
/// in a conversation `writer` holds, as the platform would: a hop on that account waits.
struct Held {
    account: Uuid,
    /// Due: the pass must prune it.
    run: Uuid,
    /// Within the retention: the pass must leave it whole.
    young: Uuid,
}

impl Held {
    async fn new(
        pool: &PgPool,
        settings: &sexton::config::Settings,
        writer: &mut sqlx::PgConnection,
    ) -> Self {
        let account = fixture::account(pool, Some(30)).await;
        let conversation = fixture::conversation(pool, account).await;
        let root = &settings.paths.output_root;
        let run = fixture::run(
            pool,
            root,
            RunSpec::conversation(account, conversation, 50.0),
        )
        .await;
        let young = fixture::run(
            pool,
            root,
            RunSpec::conversation(account, conversation, 5.0),
        )
        .await;
        fixture::lock_conversation(writer, conversation).await;
        Self {
            account,
            run: run.id,
            young: young.id,
        }
    }

    /// The due run went, the young one stayed.
    async fn assert_pruned_exactly(&self, pool: &PgPool) {
        assert!(
            fixture::is_pruned(pool, self.run).await,
            "the due run was pruned"
        );
        assert!(
            fixture::has_detail(pool, self.young).await,
            "the young run kept its detail"
        );
        assert!(!fixture::is_pruned(pool, self.young).await);
    }
}

/// A [`fleet_worker`] whose hops wait a minute for an owner's locks.
fn patient_worker(url: &str, dir: &std::path::Path) -> Command {
    let mut cmd = fleet_worker(url, dir);
    cmd.env("SEXTON_EXECUTION_DETAILS__OWNER_LOCK_TIMEOUT_MS", "60000");
    cmd
}

#[sqlx::test]
async fn fl4_a_dead_workers_hop_is_rescued_by_another_replica(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;

    // The hop of worker A waits on a conversation the platform holds; A dies meanwhile.
    let mut writer = pool.begin().await.unwrap();
    let held = Held::new(&pool, &settings, &mut writer).await;
    die_waiting(
        &pool,
        &settings,
        Proc::spawn(patient_worker(&url, dir.path())),
        writer,
    )
    .await;

    // B rescues it within heartbeat_interval x missed_heartbeats plus a poll.
    let b = Proc::spawn(fleet_worker(&url, dir.path()));
    let done = "SELECT lock_by FROM apalis.jobs
                WHERE job_type = 'sexton.prune_execution_details' AND status = 'Done'";
    poll_until(Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, String>(done)
            .fetch_optional(&pool)
            .await
            .unwrap()
            .is_some()
    })
    .await;
    held.assert_pruned_exactly(&pool).await;
    let lock_by: String = sqlx::query_scalar(done).fetch_one(&pool).await.unwrap();
    assert!(
        lock_by.contains(&format!("-{}.", b.pid())),
        "rescued by B, got {lock_by}"
    );
    b.stop().await;
}

#[sqlx::test]
async fn fl4_a_replica_restarted_under_its_name_has_its_dead_predecessors_hop_rescued(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    // A Kubernetes container restarted in its pod keeps the pod's name.
    let pod = || {
        let mut cmd = patient_worker(&url, dir.path());
        cmd.env("SEXTON_QUEUE__WORKER_NAME", "sexton-0");
        Proc::spawn(cmd)
    };

    let mut writer = pool.begin().await.unwrap();
    let held = Held::new(&pool, &settings, &mut writer).await;
    die_waiting(&pool, &settings, pod(), writer).await;

    // The restarted process must not take over the dead one's registration, and with it the
    // hop the dead one held: the hop is rescued and the pass completes.
    let second = pod();
    poll_until(Duration::from_secs(60), || async {
        queue::counts(&pool).await.unwrap().idle()
    })
    .await;
    held.assert_pruned_exactly(&pool).await;
    second.stop().await;
}

#[sqlx::test]
async fn fl4_a_live_workers_hop_outlasting_the_rescue_bound_is_not_taken_from_it(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    let job_type = "sexton.prune_execution_details";

    // The hop waits on a conversation the platform holds, while two live replicas heartbeat.
    let mut writer = pool.begin().await.unwrap();
    let held = Held::new(&pool, &settings, &mut writer).await;
    let worker = || Proc::spawn(patient_worker(&url, dir.path()));
    let (a, b) = (worker(), worker());
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    common::wait_for_lock_waiter(&pool, "conversations").await;
    // Held until both replicas' consumers of the queue have beaten a rescue bound after the hop
    // began to wait: a bound that took live workers' jobs would have put this one back meanwhile.
    let waiting_since: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    poll_until(Duration::from_secs(60), || async {
        beaten_since(&pool, job_type, "%", waiting_since, RESCUE_BOUND_SECS).await >= 2
    })
    .await;
    writer.rollback().await.unwrap();
    wait_until_idle(&pool).await;

    held.assert_pruned_exactly(&pool).await;
    let jobs: Vec<(String, i32, Option<String>)> = sqlx::query_as(
        "SELECT status, attempts, idempotency_key FROM apalis.jobs WHERE job_type = $1",
    )
    .bind(job_type)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(jobs.len(), 1, "one hop, never a deferred copy: {jobs:?}");
    assert_eq!((jobs[0].0.as_str(), jobs[0].1), ("Done", 1), "{jobs:?}");
    for lines in [a.stop().await, b.stop().await] {
        assert!(
            !lines.iter().any(|l| l.contains("Re-enqueued")),
            "a live worker's job was put back"
        );
    }
}

#[sqlx::test]
async fn fl4_a_worker_whose_hops_all_wait_keeps_heartbeating_with_more_jobs_due(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let kind = sexton::registry::by_queue("sexton.prune_execution_details").unwrap();
    let mut writer = pool.begin().await.unwrap();
    let mut hops = Vec::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        let account = Held::new(&pool, &settings, &mut writer).await;
        hops.push(kind.first_payload(Some(account.account), pass_start()));
        held.push(account);
    }
    let url = common::database_url(&pool).await;
    let replica = || Proc::spawn(patient_worker(&url, dir.path()));
    let worker = replica();
    let push = |payload: serde_json::Value, run_after: Option<Duration>| {
        let options = queue::PushOptions {
            run_after,
            ..Default::default()
        };
        let (pool, settings) = (&pool, &settings.queue);
        async move { queue::push(pool, kind.queue(), settings, &payload, options).await }
    };
    // One hop waits; two more fall due at one instant, when one of its two slots is free: the
    // worker takes one, which waits too, and must not hold the other back unseen meanwhile.
    push(hops[0].clone(), None).await.unwrap();
    common::wait_for_lock_waiter(&pool, "conversations").await;
    for hop in &hops[1..] {
        push(hop.clone(), Some(Duration::from_secs(3600)))
            .await
            .unwrap();
    }
    sqlx::query("UPDATE apalis.jobs SET run_at = now() WHERE status = 'Pending' AND job_type = $1")
        .bind(kind.queue())
        .execute(&pool)
        .await
        .unwrap();
    common::wait_for_lock_waiters(&pool, "conversations", 2).await;
    // The case at hand, counted: both of the worker's slots hold a waiting hop, a third is due.
    let (held_by_worker, due): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'Running' AND lock_by LIKE $2),
                count(*) FILTER (WHERE status IN ('Pending', 'Queued') AND run_at <= now())
         FROM apalis.jobs WHERE job_type = $1",
    )
    .bind(kind.queue())
    .bind(worker_like(worker.pid()))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((held_by_worker, due), (2, 1));
    let waiting_since: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    // Another replica's consumer beats a rescue bound and more meanwhile: it would take the
    // hops of a consumer silent that long.
    let other = replica();
    let other_like = worker_like(other.pid());
    poll_until(Duration::from_secs(60), || async {
        let bound = 2.0 * RESCUE_BOUND_SECS;
        beaten_since(&pool, kind.queue(), &other_like, waiting_since, bound).await >= 1
    })
    .await;
    writer.rollback().await.unwrap();
    wait_until_idle(&pool).await;
    for account in &held {
        account.assert_pruned_exactly(&pool).await;
    }
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT attempts FROM apalis.jobs WHERE job_type = $1")
            .bind(kind.queue())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        [1, 1, 1],
        "each hop ran once, none was taken from its worker"
    );
    worker.stop().await;
    other.stop().await;
}

/// What a worker may take past its grace to end the process: it stops its HTTP server and
/// background tasks, and its runtime gets up to a second (`SHUTDOWN_WAIT` in `main.rs`) for tasks
/// still on it — none here, so the process ends some 50 ms past the grace; the rest is this
/// machine's scheduling. A worker that waited for the hop instead would take as long as the hop's
/// lock wait: 30 s, where the statement timeout ends it.
const PAST_THE_GRACE: Duration = Duration::from_secs(1);

#[sqlx::test]
async fn fl5_sigterm_mid_pass_exits_within_the_grace_and_the_pass_resumes(pool: PgPool) {
    let common::Backlog {
        dir,
        settings,
        before,
        url,
    } = common::seeded_backlog(&pool, 6).await;
    // A hop that cannot finish within the grace: its owner waits (until the 30 s statement
    // timeout) on a conversation the platform holds, so that the grace, not the hop, ends the
    // worker.
    let held: Uuid = sqlx::query_scalar(
        "SELECT conversation_id FROM runs WHERE id = ANY($1) ORDER BY account_id, id LIMIT 1",
    )
    .bind(&before.eligible)
    .fetch_one(&pool)
    .await
    .unwrap();
    let mut writer = pool.begin().await.unwrap();
    fixture::lock_conversation(&mut writer, held).await;
    let mut cmd = patient_worker(&url, dir.path());
    cmd.env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "50");
    let mut worker = Proc::spawn(cmd);
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    poll_until(Duration::from_secs(60), || async {
        audit::pruned_count(&pool).await > 0
    })
    .await;
    common::wait_for_lock_waiter(&pool, "conversations").await;
    let signalled = Instant::now();
    worker.sigterm();
    // A hang guard past the held hop's wait, so that a worker waiting for it is measured.
    let status = common::wait(&mut worker.child, Duration::from_secs(90)).await;
    let took = signalled.elapsed();
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(
        took <= SHUTDOWN_GRACE + PAST_THE_GRACE,
        "exited {took:?} after SIGTERM, with a grace of {SHUTDOWN_GRACE:?}"
    );
    // The case at hand: the held hop was still running when the worker went, left to be resumed.
    let abandoned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs
         WHERE job_type = 'sexton.prune_execution_details' AND status = 'Running'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(abandoned >= 1, "no hop outlasted the grace");
    assert!(
        (audit::pruned_count(&pool).await as usize) < before.eligible.len(),
        "stopped mid-pass"
    );
    audit::verify(&pool, &settings.paths.output_root, &before, false).await;
    writer.rollback().await.unwrap();

    // A replica of the fleet rescues the abandoned hop (within the rescue bound) and completes
    // the pass.
    let mut resume = fleet_worker(&url, dir.path());
    resume.arg("--exit-when-idle");
    let (status, lines) = Proc::spawn(resume).finish(Duration::from_secs(120)).await;
    assert!(status.success(), "worker exited with {status}: {lines:?}");
    audit::verify(&pool, &settings.paths.output_root, &before, true).await;
}

#[sqlx::test]
async fn fl4_a_hop_rescued_on_its_last_attempt_is_failed_for_good_never_run_again(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;

    // A pushes the hop with one attempt, takes it, and dies during it.
    let mut writer = pool.begin().await.unwrap();
    let held = Held::new(&pool, &settings, &mut writer).await;
    let mut a = patient_worker(&url, dir.path());
    a.env("SEXTON_QUEUE__MAX_ATTEMPTS", "1");
    die_waiting(&pool, &settings, Proc::spawn(a), writer).await;

    // B's heartbeat rescues it: its one attempt is spent, so it fails for good instead of
    // running again (before: Pending, attempt 2 of 1, and run).
    let b = Proc::spawn(fleet_worker(&url, dir.path()));
    let hop = "SELECT status, attempts, last_result ->> 'Err' FROM apalis.jobs
               WHERE job_type = 'sexton.prune_execution_details'";
    poll_until(Duration::from_secs(20), || async {
        let (status, _, _): (String, i32, Option<String>) =
            sqlx::query_as(hop).fetch_one(&pool).await.unwrap();
        status != "Running"
    })
    .await;
    let (status, attempts, error): (String, i32, Option<String>) =
        sqlx::query_as(hop).fetch_one(&pool).await.unwrap();
    assert_eq!((status.as_str(), attempts), ("Failed", 1), "{error:?}");
    assert!(error.unwrap_or_default().contains("worker died"));
    assert!(
        !fixture::is_pruned(&pool, held.run).await,
        "the hop was never run again"
    );

    // The control: the next slot's pass runs on B and prunes what was due.
    sexton::tick::tick(&pool, &settings, pass_start() + chrono::Duration::days(1))
        .await
        .unwrap();
    poll_until(Duration::from_secs(20), || async {
        fixture::is_pruned(&pool, held.run).await
    })
    .await;
    held.assert_pruned_exactly(&pool).await;
    b.stop().await;
}

/// `cmd` run under a host clock `shift` away from the database's (Debian's faketime; the
/// monotonic clock is left alone, so the process's timers run as usual).
fn shifted(cmd: Command, shift: &str) -> Command {
    let program = cmd.as_std().get_program().to_owned();
    let mut shifted = Command::new("faketime");
    shifted
        .arg("-f")
        .arg(shift)
        .arg(program)
        .args(cmd.as_std().get_args())
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in cmd.as_std().get_envs() {
        match value {
            Some(value) => shifted.env(key, value),
            None => shifted.env_remove(key),
        };
    }
    shifted
}

#[sqlx::test]
async fn fl2_ex1_a_replica_whose_clock_runs_40_days_ahead_previews_and_runs_the_pass_now(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    let root = dir.path().join("outputs");
    let due = |days| RunSpec {
        completed_at: Some(now - chrono::Duration::days(days)),
        ..RunSpec::conversation(account, conversation, 0.0)
    };
    let old = fixture::run(&pool, &root, due(40)).await;
    // Young by the database's clock, and 40 days old by the replica's.
    let young = fixture::run(&pool, &root, due(5)).await;

    // The slot due now by the database's clock, not 40 days out.
    let mut tick = common::sexton(&url, dir.path());
    tick.args(["tick", "--json"])
        .env("SEXTON_SCHEDULE__CRON", "* * * * *");
    let output = shifted(tick, "+40d").output().await.unwrap();
    assert!(output.status.success(), "{output:?}");
    let ticked: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let slot: DateTime<Utc> = ticked["slot"].as_str().unwrap().parse().unwrap();
    assert!(
        slot <= now + chrono::Duration::minutes(5) && slot > now - chrono::Duration::minutes(5),
        "slot {slot} is not the database's now {now}"
    );

    // The preview judges by the database's clock too: one owner is due, not two.
    let mut preview = common::sexton(&url, dir.path());
    preview.args(["preview", "--json", "--account", &account.to_string()]);
    let output = shifted(preview, "+40d").output().await.unwrap();
    assert!(output.status.success(), "{output:?}");
    let lines: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let owners: Vec<i64> = lines
        .iter()
        .filter_map(|line| line["eligible_owners"].as_i64())
        .collect();
    assert_eq!(owners, [1], "{lines:?}");

    let mut worker = common::sexton(&url, dir.path());
    worker.args(["worker", "--exit-when-idle"]);
    let mut child = shifted(worker, "+40d").spawn().unwrap();
    let status = common::wait(&mut child, Duration::from_secs(120)).await;
    assert!(status.success(), "worker exited with {status}");
    let late: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE run_at > now() + interval '1 hour'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(late, 0, "no job was pushed to run days out");
    assert!(fixture::is_pruned(&pool, old.id).await, "the due run went");
    assert!(
        fixture::has_detail(&pool, young.id).await,
        "the run young by the database's clock stayed"
    );
}

#[sqlx::test]
async fn fl5_a_run_until_idle_waits_for_a_hop_whose_row_was_deleted_by_hand(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    let mut writer = pool.begin().await.unwrap();
    let held = Held::new(&pool, &settings, &mut writer).await;
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    // One owner per hop: the held hop has a next hop to push once it is through.
    let mut cmd = patient_worker(&url, dir.path());
    cmd.args(["--exit-when-idle"])
        .env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "1");
    let worker = Proc::spawn(cmd);
    common::wait_for_lock_waiter(&pool, "conversations").await;
    // Every unfinished row of the held hop's queue: on a loaded machine a late heartbeat may have
    // put a copy of the waiting hop back to Pending, which would keep the queue from looking idle.
    sqlx::query(
        "DELETE FROM apalis.jobs WHERE job_type = 'sexton.prune_execution_details'
           AND status IN ('Pending', 'Queued', 'Running')",
    )
    .execute(&pool)
    .await
    .unwrap();
    worker.wait_for(event::WAITING_FOR_OWN_JOBS).await;
    writer.rollback().await.unwrap();

    let (status, lines) = worker.finish(Duration::from_secs(120)).await;
    assert!(status.success(), "{lines:?}");
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE status IN ('Pending', 'Queued', 'Running')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "it exited with work left in the queue");
    held.assert_pruned_exactly(&pool).await;
}
