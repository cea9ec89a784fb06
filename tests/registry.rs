//! The job registry's promises, for every registered kind: connections budgeted (FL-6), the
//! pass ledger behind the last-success gauge (OP-3) and `sexton status` (OP-1), and what a hop
//! committed counted even when its hand-over, or the hop itself, fails.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton::context::JobContext;
use sexton::event;
use sexton::registry::KINDS;
use sexton::tick::{self, NightlySlot};
use sexton_jobs::clock::ManualClock;
use sexton_jobs::job::Job;
use sexton_jobs::payload::V1;
use sexton_jobs::prune_execution_details::{Args, HopSettings, PruneExecutionDetails};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::process::{
    Proc, events, metric, poll_until, scrape, serving_fleet_worker, status_json, wait_until_idle,
};
use crate::common::{self};

const PED: &str = PruneExecutionDetails::NAME;

/// An account with `runs` conversation runs completed 40 days before the pass (retention 30).
async fn account_with_old_runs(pool: &PgPool, root: &std::path::Path, runs: usize) -> (Uuid, Uuid) {
    let account = fixture::account(pool, Some(30)).await;
    let conversation = fixture::conversation(pool, account).await;
    for i in 0..runs {
        let spec = RunSpec::conversation(account, conversation, 40.0 + i as f64);
        fixture::run(pool, root, spec).await;
    }
    (account, conversation)
}

/// The `hop done` events among a worker's log lines.
fn hop_events(lines: &[String]) -> Vec<serde_json::Value> {
    events(lines, event::HOP_DONE).collect()
}

#[sqlx::test]
async fn fl6_every_job_kind_busy_at_once_fits_the_default_pool(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::every_job(common::settings(dir.path()));
    assert_eq!(
        (
            settings.database.max_connections,
            settings.queue.concurrency
        ),
        (24, 2),
        "the test runs the default pool and concurrency"
    );
    let mut conversations = Vec::new();
    for _ in 0..4 {
        let (_, conversation) = account_with_old_runs(&pool, &settings.paths.output_root, 2).await;
        conversations.push(conversation);
    }
    // Something due for every per-account kind too (FL-8): an old session, a live attachment.
    sqlx::raw_sql(
        "INSERT INTO session_retention_policies (account_id, enabled)
             SELECT id, true FROM accounts;
         INSERT INTO agents (account_id, name) SELECT id, 'agent' FROM accounts;
         INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
             SELECT account_id, id, 'task', 'idle', '2026-01-01' FROM agents;
         INSERT INTO attachments (account_id, relative_path, bytes)
             SELECT id, id || '/a.bin', 1 FROM accounts",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The application holds every conversation: each owner waits out its lock timeout, so every
    // hop is long and the worker runs as many at once as it may.
    let mut app = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversations WHERE id = ANY($1) FOR UPDATE")
        .bind(&conversations)
        .execute(&mut *app)
        .await
        .unwrap();
    common::start_every_pass(&pool, &settings, pass_start()).await;
    let url = common::database_url(&pool).await;
    let mut cmd = common::sexton(&url, dir.path());
    cmd.args(["worker", "--exit-when-idle"])
        .envs(common::EVERY_JOB_ENV);
    let (status, lines) = Proc::spawn(cmd).finish(Duration::from_secs(120)).await;
    app.rollback().await.unwrap();
    assert!(status.success(), "worker exited with {status}");

    let not_first_time: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE status <> 'Done' OR attempts > 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        not_first_time, 0,
        "no job failed, none for want of a connection"
    );
    assert!(!lines.iter().any(|l| l.contains("pool timed out")));

    let hops = hop_events(&lines);
    for kind in KINDS {
        assert!(
            hops.iter().any(|h| h["span"]["job"] == kind.name()),
            "{} ran",
            kind.name()
        );
    }
    let at = |h: &serde_json::Value, f: &str| -> DateTime<Utc> {
        h[f].as_str().unwrap().parse().unwrap()
    };
    // The kinds beside the shared budget (erasure) run in a slot of their own, budgeted apart.
    let shared: Vec<&str> = KINDS
        .iter()
        .filter(|kind| !kind.beside())
        .map(|kind| kind.name())
        .collect();
    let intervals: Vec<_> = hops
        .iter()
        .filter(|h| shared.iter().any(|name| h["span"]["job"] == *name))
        .map(|h| (at(h, "locked_at"), at(h, "unlocked_at")))
        .collect();
    let most_at_once = intervals
        .iter()
        .map(|(start, _)| {
            intervals
                .iter()
                .filter(|(s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap();
    assert_eq!(
        most_at_once, 2,
        "hops ran two at a time (queue.concurrency), never more"
    );
    let busy: u64 = hops
        .iter()
        .filter(|h| h["span"]["job"] == PED)
        .map(|h| h["retained"].as_u64().unwrap())
        .sum();
    assert_eq!(
        busy, 8,
        "every owner was busy under the application's locks"
    );
}

/// The last-success gauge of a fleet worker.
async fn last_success(address: &str) -> Option<f64> {
    metric(
        &scrape(address).await,
        &format!("sexton_last_success_timestamp_seconds{{kind=\"{PED}\"}}"),
    )
}

#[sqlx::test]
async fn op3_last_success_advances_only_when_every_accounts_pass_finished(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let outputs = &settings.paths.output_root;
    account_with_old_runs(&pool, outputs, 1).await;
    let (stuck, _) = account_with_old_runs(&pool, outputs, 1).await;
    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, dir.path());
    cmd.env("SEXTON_HTTP__REFRESH_INTERVAL_MS", "100")
        .env("SEXTON_QUEUE__MAX_ATTEMPTS", "2");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    let slots = [2, 1, 0].map(|d| pass_start() - chrono::Duration::days(d));

    tick::tick(&pool, &settings, slots[0]).await.unwrap();
    wait_until_idle(&pool).await;
    poll_until(Duration::from_secs(30), || async {
        last_success(&address).await == Some(slots[0].timestamp() as f64)
    })
    .await;

    // One account's pass keeps failing: a file is due under an output root that is gone.
    sqlx::query("INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path) VALUES ('outputs', $1, 'x.bin')")
        .bind(stuck)
        .execute(&pool)
        .await
        .unwrap();
    let parked = dir.path().join("outputs.parked");
    std::fs::rename(outputs, &parked).unwrap();
    tick::tick(&pool, &settings, slots[1]).await.unwrap();
    wait_until_idle(&pool).await;
    let (finished, failed): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE finished_at IS NOT NULL),
                count(*) FILTER (WHERE outcome = 'failed' AND scope = $2)
         FROM sexton.passes WHERE slot = $1 AND job = $3",
    )
    .bind(slots[1])
    .bind(stuck)
    .bind(PED)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (finished, failed),
        (0, 1),
        "the account with nothing due left has no pass (FL-8), the due one failed"
    );
    let (accounts, started): (i64, i64) = sqlx::query_as(
        "SELECT accounts, started FROM sexton.fan_outs WHERE slot = $1 AND job = $2",
    )
    .bind(slots[1])
    .bind(PED)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((accounts, started), (2, 1));
    assert_eq!(
        last_success(&address).await,
        Some(slots[0].timestamp() as f64),
        "one account's finished pass does not advance the gauge"
    );

    std::fs::rename(&parked, outputs).unwrap();
    tick::tick(&pool, &settings, slots[2]).await.unwrap();
    wait_until_idle(&pool).await;
    poll_until(Duration::from_secs(30), || async {
        last_success(&address).await == Some(slots[2].timestamp() as f64)
    })
    .await;
    worker.stop().await;
}

#[sqlx::test]
async fn op3_a_hop_whose_next_push_fails_still_counts_its_rows_and_a_failed_hop(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    account_with_old_runs(&pool, &settings.paths.output_root, 5).await;
    let detail_rows = || async {
        let mut total = 0;
        for table in sexton_jobs::prune_execution_details::DETAIL_TABLES {
            let n: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            total += n;
        }
        total
    };
    let rows_before = detail_rows().await;
    // The queue refuses every second hop while the gate is shut.
    sqlx::query("CREATE TABLE push_gate (shut boolean NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO push_gate VALUES (true)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE FUNCTION refuse_second_hop() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.job_type = 'sexton.prune_execution_details'
                AND NEW.idempotency_key LIKE '%:1' AND (SELECT shut FROM push_gate) THEN
                 RAISE EXCEPTION 'the queue refuses this push';
             END IF;
             RETURN NEW;
         END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("CREATE TRIGGER refuse_second_hop BEFORE INSERT ON apalis.jobs FOR EACH ROW EXECUTE FUNCTION refuse_second_hop()")
        .execute(&pool)
        .await
        .unwrap();

    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, dir.path());
    cmd.env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "2")
        .env("SEXTON_QUEUE__MAX_ATTEMPTS", "100")
        // No retry while the figures are compared: a retried hop prunes two more owners (and
        // fails again) — with the default 5 s, on a loaded machine, between the scrape and the
        // count. The retry completes the pass once the gate opens.
        .env("SEXTON_QUEUE__RETRY_BACKOFF_MS", "30000");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    tick::tick(&pool, &settings, pass_start()).await.unwrap();
    let failed = format!("sexton_hops_total{{kind=\"{PED}\",outcome=\"failed\"}}");
    poll_until(Duration::from_secs(60), || async {
        metric(&scrape(&address).await, &failed).unwrap_or(0.0) >= 1.0
    })
    .await;
    let page = scrape(&address).await;
    let counted: f64 = sexton_jobs::prune_execution_details::DETAIL_TABLES
        .iter()
        .filter_map(|t| {
            metric(
                &page,
                &format!("sexton_rows_deleted_total{{kind=\"{PED}\",table=\"{t}\"}}"),
            )
        })
        .sum();
    let deleted = rows_before - detail_rows().await;
    assert!(
        deleted > 0,
        "the first hop pruned before its hand-over failed"
    );
    assert_eq!(counted, deleted as f64, "every deleted row is counted");
    assert_eq!(
        metric(
            &page,
            &format!("sexton_owners_pruned_total{{kind=\"{PED}\"}}")
        ),
        Some(2.0)
    );

    sqlx::query("UPDATE push_gate SET shut = false")
        .execute(&pool)
        .await
        .unwrap();
    wait_until_idle(&pool).await;
    let page = scrape(&address).await;
    assert_eq!(
        metric(
            &page,
            &format!("sexton_owners_pruned_total{{kind=\"{PED}\"}}")
        ),
        Some(5.0),
        "the pass completed once the queue took the hop"
    );
    assert_eq!(detail_rows().await, 0);
    worker.stop().await;
}

#[sqlx::test]
async fn op1_status_shows_a_pass_mid_way_and_after_with_the_jobs_kept_failed(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::settings(dir.path());
    let (account, _) = account_with_old_runs(&pool, &settings.paths.output_root, 5).await;
    let hop = HopSettings {
        window_size: 2,
        ..settings.jobs.get::<HopSettings>(PED).clone()
    };
    settings.jobs.set(PED, hop);
    let ctx = JobContext::new(
        pool.clone(),
        Arc::new(settings.clone()),
        Arc::new(ManualClock::new(pass_start())),
    );
    // Mid-pass: the slot fanned out and the first hop ran; the second waits in the queue.
    tick::fan_out(
        &ctx,
        &NightlySlot {
            version: V1,
            slot: pass_start(),
        },
    )
    .await
    .unwrap();
    sexton::hop::run::<PruneExecutionDetails>(&ctx, Args::first(Some(account), pass_start()))
        .await
        .unwrap();
    sexton::queue::push(
        &pool,
        sexton_jobs::job::queue(PruneExecutionDetails::NAME),
        &settings.queue,
        &serde_json::json!({"version": 7}),
        sexton::queue::PushOptions::default(),
    )
    .await
    .unwrap();
    let url = common::database_url(&pool).await;

    let mid = status_json(&url, dir.path()).await;
    let job = &mid["jobs"][0];
    assert_eq!(job["job"], PED);
    let pass = &job["passes"][0];
    assert_eq!(pass["account_id"], account.to_string());
    assert_eq!(
        pass["slot"],
        pass_start().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    assert_eq!(
        (
            pass["state"].as_str(),
            pass["hops"].as_i64(),
            pass["pruned"].as_i64()
        ),
        (Some("running"), Some(1), Some(2))
    );
    assert!(pass["finished_at"].is_null());
    assert!(job["queue"]["pending"].as_i64().unwrap() >= 2, "{job}");
    assert!(job["last_success_slot"].is_null());

    let mut cmd = common::sexton(&url, dir.path());
    cmd.args(["worker", "--exit-when-idle"])
        .env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "2");
    let (status, _) = Proc::spawn(cmd).finish(Duration::from_secs(120)).await;
    assert_eq!(
        status.code(),
        Some(1),
        "a job it ran failed for good (OP-1)"
    );

    let after = status_json(&url, dir.path()).await;
    let job = &after["jobs"][0];
    let pass = &job["passes"][0];
    assert_eq!(
        (pass["state"].as_str(), pass["outcome"].as_str()),
        (Some("finished"), Some("finished"))
    );
    assert_eq!(
        pass["pruned"], 5,
        "the re-delivered first hop's own work is counted, nothing twice"
    );
    assert_eq!(
        job["last_success_slot"]
            .as_str()
            .map(|s| s.parse::<DateTime<Utc>>().unwrap()),
        Some(pass_start())
    );
    assert_eq!(job["queue"]["pending"], 0);
    let failed = after["failed_jobs"].as_array().unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0]["queue"],
        sexton_jobs::job::queue(PruneExecutionDetails::NAME)
    );
    assert!(
        failed[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("bad payload"),
        "{}",
        failed[0]
    );

    let output = common::sexton(&url, dir.path())
        .args(["status", "--all"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains(&format!("account t ({account}): slot")),
        "{text}"
    );
    assert!(text.contains("finished (last hop finished)"), "{text}");
    assert!(
        text.contains("failed for good, kept for inspection"),
        "{text}"
    );
}

#[sqlx::test]
async fn op1_the_demo_runs_every_job_kind_and_reports_each(pool: PgPool) {
    let url = common::database_url(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    // The slot due now: the demo's data is seeded around now (FL-8 starts what is due).
    let output = common::sexton(&url, dir.path())
        .arg("demo")
        .env("SEXTON_SCHEDULE__CRON", "* * * * *")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed: {stdout}");
    let files = stdout
        .lines()
        .find_map(|l| l.strip_prefix("files were written under "))
        .and_then(|l| l.strip_suffix("; delete it when done."))
        .expect("the report names its files");
    std::fs::remove_dir_all(files).ok();
    assert!(stdout.contains("pass finished in"), "{stdout}");
    for kind in KINDS {
        // The passes table: the job's name, then eight counts.
        let (line, numbers) = stdout
            .lines()
            .find_map(|l| {
                let mut fields = l.split_whitespace();
                (fields.next() == Some(kind.name())).then_some(())?;
                let numbers: Vec<u64> = fields.map(|n| n.parse().ok()).collect::<Option<_>>()?;
                (numbers.len() == 8).then_some((l, numbers))
            })
            .unwrap_or_else(|| panic!("no line for {} in the report:\n{stdout}", kind.name()));
        let (passes, finished) = (numbers[0], numbers[1]);
        assert!(passes >= 1 && finished == passes, "{line}");
    }
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(accounts > 0, "the demo seeded");
    // HD-1: the demo held one conversation before its pass, and says so.
    let held: Vec<(Uuid, String, Option<String>)> = sqlx::query_as(
        "SELECT scope_id, scope, released_by FROM sexton.holds WHERE placed_by = 'demo'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(held.len(), 1, "one hold");
    let (conversation, scope, released) = &held[0];
    assert_eq!((scope.as_str(), released), ("conversation", &None));
    assert!(
        stdout.contains(&format!(
            "on conversation {conversation} (case DEMO-1, by demo)"
        )) && stdout.contains(&format!("held conversation {conversation}: ")),
        "{stdout}"
    );
    let pruned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE conversation_id = $1 AND details_pruned_at IS NOT NULL",
    )
    .bind(conversation)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pruned, 0, "what the demo held stays (HD-3): {stdout}");

    // RQ-1 … RQ-6: then it erased one conversation and one session through the queue, both
    // completed, printed their receipts and the chain whole — and never its receipt key.
    let erased: Vec<(&str, Uuid)> = stdout
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("erasing ")?.split_whitespace();
            Some((words.next()?, words.next()?.parse().ok()?))
        })
        .collect();
    let scopes: Vec<&str> = erased.iter().map(|(scope, _)| *scope).collect();
    assert_eq!(scopes, ["conversation", "session"], "{stdout}");
    for (scope, id) in &erased {
        let table = if *scope == "conversation" {
            "conversations"
        } else {
            "sessions"
        };
        let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE id = $1"
        )))
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 0, "the demo's erasure of {scope} {id}: {stdout}");
    }
    let completed: Vec<(String, Option<Uuid>)> =
        sqlx::query_as("SELECT state, scope_id FROM sexton.erasures ORDER BY received_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        completed,
        [
            ("completed".to_owned(), None),
            ("completed".to_owned(), None)
        ],
        "{stdout}"
    );
    let receipts = stdout
        .lines()
        .filter(|l| l.starts_with("{\"seq\":"))
        .count();
    assert_eq!(
        receipts, 2,
        "the receipts, as receipts export prints them: {stdout}"
    );
    assert!(
        stdout.contains("the receipt chain is whole: 2 receipts"),
        "{stdout}"
    );
    assert!(stdout.contains("demo-only key"), "{stdout}");
    assert!(!stdout.contains(sexton::demo::DEMO_RECEIPT_KEY), "{stdout}");

    let again = common::sexton(&url, dir.path())
        .arg("demo")
        .output()
        .await
        .unwrap();
    assert_eq!(again.status.code(), Some(1), "a database in use is refused");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds"));
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
async fn op1_the_ledger_counts_what_a_failed_hop_had_committed(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    let root = &settings.paths.output_root;
    let mut due = Vec::new();
    for days in [45.0, 44.0, 43.0, 42.0, 41.0] {
        due.push(
            fixture::run(
                &pool,
                root,
                RunSpec::conversation(account, conversation, days),
            )
            .await,
        );
    }
    // The youngest due owner's transaction fails, after the four before it committed one by one.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION fail_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.run_id = '{}' THEN RAISE EXCEPTION 'injected failure'; END IF;
             RETURN OLD;
         END $$",
        due[4].id
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER fail_on_delete BEFORE DELETE ON tool_results
         FOR EACH ROW EXECUTE FUNCTION fail_on_delete()",
    )
    .execute(&pool)
    .await
    .unwrap();
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();

    let mut cmd = common::sexton(&url, dir.path());
    cmd.args(["worker", "--exit-when-idle"])
        .env("SEXTON_QUEUE__MAX_ATTEMPTS", "1")
        .env("SEXTON_EXECUTION_DETAILS__OWNERS_PER_TRANSACTION", "1");
    let (status, lines) = Proc::spawn(cmd).finish(Duration::from_secs(120)).await;
    assert_eq!(
        status.code(),
        Some(1),
        "its one job failed for good: {lines:?}"
    );
    let mut pruned = 0;
    for run in &due {
        pruned += i64::from(fixture::is_pruned(&pool, run.id).await);
    }
    assert_eq!(pruned, 4, "the failing owner stays, the others went");
    let (recorded, error): (i64, Option<String>) = sqlx::query_as(
        "SELECT pruned, last_error FROM sexton.passes
         WHERE job = 'prune_execution_details' AND scope = $1",
    )
    .bind(account)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(recorded, pruned, "the ledger counts what was done");
    assert!(error.unwrap_or_default().contains("injected failure"));
}

/// A Prometheus page's samples: series (name and labels, as printed) to value.
fn samples(page: &str) -> std::collections::BTreeMap<String, f64> {
    page.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// A worker that has run nothing exports every counter and gauge of OP-3 at 0, for each
/// registered kind and each outcome, reason, table and state; after a pass of every kind that
/// had something due, every series it exports was there from the start (the control: the
/// labels declared are the labels the hops use).
#[sqlx::test]
async fn op3_every_series_is_exported_from_start_at_zero(pool: PgPool) {
    use sexton::telemetry::metrics::{
        ERASURE_STATES, JOB_RUN_OUTCOMES, QUEUE_STATES, SLOT_OUTCOMES,
    };
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, dir.path());
    // No catch-up slot at start: the worker runs nothing until the tick below.
    cmd.env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "0");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    let at_start = samples(&scrape(&address).await);

    let mut expected: Vec<String> = Vec::new();
    for kind in KINDS {
        let labels = kind.labels();
        let k = labels.kind;
        for name in [
            "sexton_owners_pruned_total",
            "sexton_bytes_reclaimed_total",
            "sexton_file_errors_total",
            "sexton_hop_duration_seconds_count",
        ] {
            expected.push(format!("{name}{{kind=\"{k}\"}}"));
        }
        for outcome in ["finished", "continued", "throttled", "failed"] {
            assert!(labels.outcomes.contains(&outcome), "{k}: {outcome}");
        }
        for outcome in &labels.outcomes {
            expected.push(format!(
                "sexton_hops_total{{kind=\"{k}\",outcome=\"{outcome}\"}}"
            ));
        }
        for reason in labels.reasons {
            expected.push(format!(
                "sexton_owners_retained_total{{kind=\"{k}\",reason=\"{reason}\"}}"
            ));
        }
        for table in labels.tables {
            expected.push(format!(
                "sexton_rows_deleted_total{{kind=\"{k}\",table=\"{table}\"}}"
            ));
        }
        for indicator in ["replication_lag", "vacuum"] {
            expected.push(format!(
                "sexton_throttled_total{{kind=\"{k}\",indicator=\"{indicator}\"}}"
            ));
        }
    }
    let consumers = KINDS.iter().map(|kind| kind.name()).chain(["nightly"]);
    for (k, outcome) in consumers.flat_map(|k| JOB_RUN_OUTCOMES.map(|o| (k, o))) {
        expected.push(format!(
            "sexton_job_runs_total{{kind=\"{k}\",outcome=\"{outcome}\"}}"
        ));
    }
    for outcome in SLOT_OUTCOMES {
        expected.push(format!(
            "sexton_schedule_slots_total{{outcome=\"{outcome}\"}}"
        ));
    }
    for state in QUEUE_STATES {
        expected.push(format!("sexton_queue_jobs{{state=\"{state}\"}}"));
    }
    expected.push("sexton_holds_active".to_owned());
    for state in ERASURE_STATES {
        expected.push(format!("sexton_erasures{{state=\"{state}\"}}"));
    }
    // The database's totals, read before the first job: nothing found yet on a new database.
    expected.push("sexton_erasure_residues_total".to_owned());
    for root in ["outputs", "sessions", "attachments", "traces"] {
        expected.push(format!("sexton_orphans_removed_total{{root=\"{root}\"}}"));
        for reason in sexton_jobs::orphans::REASONS {
            expected.push(format!(
                "sexton_orphans_total{{root=\"{root}\",reason=\"{reason}\"}}"
            ));
        }
    }
    assert!(
        expected
            .iter()
            .any(|s| s == "sexton_hops_total{kind=\"prune_execution_details\",outcome=\"failed\"}")
    );
    assert!(expected.iter().any(|s| s
        == "sexton_owners_retained_total{kind=\"prune_execution_details\",reason=\"legal_hold\"}"));
    for series in &expected {
        assert_eq!(
            at_start.get(series),
            Some(&0.0),
            "{series} at 0 from start; the page: {at_start:#?}"
        );
    }
    // RQ-7: no open erasure request, no due date: +Inf, which no alert threshold is above.
    assert_eq!(
        at_start.get("sexton_erasure_due_seconds"),
        Some(&f64::INFINITY),
        "{at_start:#?}"
    );

    // The control: a pass of every kind with something due adds no series of its own.
    account_with_old_runs(&pool, &settings.paths.output_root, 2).await;
    sqlx::raw_sql(
        "INSERT INTO session_retention_policies (account_id, enabled) SELECT id, true FROM accounts;
         INSERT INTO agents (account_id, name) SELECT id, 'agent' FROM accounts;
         INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
             SELECT account_id, id, 'task', 'idle', '2026-01-01' FROM agents;
         INSERT INTO attachments (account_id, relative_path, bytes)
             SELECT id, id || '/a.bin', 1 FROM accounts",
    )
    .execute(&pool)
    .await
    .unwrap();
    tick::tick(&pool, &settings, pass_start()).await.unwrap();
    wait_until_idle(&pool).await;
    let after = samples(&scrape(&address).await);
    let ran = |name: &str| {
        after
            .iter()
            .filter(|(s, _)| s.starts_with(name))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    for kind in [
        PED,
        "session_retention",
        "attachment_expiry",
        "queue_retention",
    ] {
        assert!(
            ran(&format!("sexton_hops_total{{kind=\"{kind}\"")) > 0.0,
            "{kind} ran a hop: {after:#?}"
        );
    }
    assert!(ran("sexton_rows_deleted_total{kind=\"prune_execution_details\"") > 0.0);
    for series in after.keys() {
        if series.starts_with("sexton_last_success_timestamp_seconds")
            || series.starts_with("sexton_backlog_seconds")
            || !series.starts_with("sexton_")
        {
            continue;
        }
        assert!(
            at_start.contains_key(series),
            "{series} appeared only after a hop"
        );
    }
    worker.stop().await;
}
