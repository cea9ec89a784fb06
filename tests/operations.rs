//! Operating it (SPEC §6): bad configuration refused at start naming each setting (OP-2), the
//! CLI's output escaped (OP-1), the metrics a real Prometheus scrapes (OP-3), each hop a span in
//! the logs (OP-4), and the deploy's alert rules and grace (OP-5).

use std::collections::BTreeSet;
use std::time::Duration;

use sexton::event;
use sexton::registry::KINDS;
use sexton_jobs::job::Cadence;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::process::{Proc, events, free_port, http_get, poll_until, serving_fleet_worker};
use crate::common::prometheus::{Prometheus, alert_expr, alert_rules, sample_time};

const PED: &str = "prune_execution_details";

#[tokio::test]
async fn op2_three_invalid_values_exit_2_naming_all_three() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "[database]\nmax_connections = 0\n[schedule]\ntimezone = \"Mars/Olympus\"\n[queue]\nmax_attempts = \"many\"\n",
    )
    .unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_sexton"))
        .arg("check-config")
        .arg("--config")
        .arg(&file)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for setting in [
        "database.max_connections",
        "schedule.timezone",
        "queue.max_attempts",
    ] {
        assert!(stderr.contains(setting), "{setting} not named in: {stderr}");
    }
    assert!(
        stderr.contains("\"many\""),
        "the bad value is shown: {stderr}"
    );
}

#[tokio::test]
async fn op2_environment_overrides_are_validated_too() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_sexton"))
        .arg("check-config")
        .env("SEXTON_DATABASE__LOCK_TIMEOUT_MS", "-5")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("database.lock_timeout_ms"));
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

/// The dashboard's panels that a throttled hop alone raises above 0: after a clean pass they
/// show their series, every one at 0 (exported from start, OP-3; tests/health.rs scrapes a
/// throttle).
const PANELS_RAISED_ONLY_BY_A_THROTTLE: &[&str] =
    &["Throttled hops / h by kind and indicator (health-aware pruning)"];

/// Every panel of the Grafana dashboard with its queries, Grafana's interval variables replaced
/// by a concrete range.
fn dashboard_queries() -> Vec<(String, Vec<String>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/sexton.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    panels
        .iter()
        .map(|panel| {
            let title = panel["title"].as_str().unwrap().to_owned();
            let exprs = panel["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|target| {
                    let expr = ["$__rate_interval", "$__interval", "$__range"]
                        .iter()
                        .fold(target["expr"].as_str().unwrap().to_owned(), |e, v| {
                            e.replace(v, "1m")
                        });
                    assert!(
                        !expr.contains('$'),
                        "{title}: a Grafana variable this test does not know: {expr}"
                    );
                    expr
                })
                .collect();
            (title, exprs)
        })
        .collect()
}

/// A label of a series or sample's metric.
fn label<'a>(series: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    let metric = series.get("metric").unwrap_or(series);
    metric[name].as_str()
}

/// The `kind` labels of an instant query's samples.
async fn kinds_of(prometheus: &Prometheus, promql: &str) -> BTreeSet<String> {
    prometheus
        .query(promql)
        .await
        .iter()
        .map(|s| label(s, "kind").unwrap_or_default().to_owned())
        .collect()
}

/// A real Prometheus scraping a worker as `job_name: sexton`, with the shipped rules loaded:
/// after a clean pass of every kind, the kinds are told apart by `kind` (no `exported_job`),
/// every dashboard panel shows data, and no alert is pending or firing.
#[sqlx::test]
async fn op3_a_real_prometheus_scrapes_the_contract_series(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    for days in [40.0, 50.0] {
        fixture::run(
            &pool,
            &settings.paths.output_root,
            RunSpec::conversation(account, conversation, days),
        )
        .await;
    }
    // Something due for every per-account kind too (FL-8): an old session, an attachment.
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
    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, dir.path());
    // The worker's own schedule catches up on the last hourly slot and runs the pass; trace
    // cleanup is on, so that every kind runs a hop; the health indicators are read (and never
    // red), so that their panel has data.
    cmd.env("SEXTON_HTTP__REFRESH_INTERVAL_MS", "200")
        .env("SEXTON_SCHEDULE__CRON", "0 * * * *")
        .env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "2")
        .env("SEXTON_HEALTH__MAX_REPLICATION_LAG_BYTES", "1099511627776")
        .envs(common::EVERY_JOB_ENV);
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    let prometheus = Prometheus::start(dir.path(), &address);
    let registered: BTreeSet<String> = KINDS.iter().map(|k| k.name().to_owned()).collect();

    // The pass is clean once every kind has a last success: every pass it started finished.
    // Each is one series, scraped under its own `kind`.
    let scraped_at = std::cell::Cell::new(0.0);
    poll_until(Duration::from_secs(90), || async {
        let samples = prometheus
            .query("sexton_last_success_timestamp_seconds")
            .await;
        scraped_at.set(samples.first().map_or(0.0, sample_time));
        samples.len() == registered.len()
    })
    .await;
    assert_eq!(
        kinds_of(&prometheus, "sexton_last_success_timestamp_seconds").await,
        registered
    );
    assert!(fixture::is_pruned_any(&pool).await);
    assert_eq!(http_get(&address, "/healthz").await.map(|r| r.0), Some(200));
    assert_eq!(http_get(&address, "/readyz").await.map(|r| r.0), Some(200));
    let ran: BTreeSet<String> = sqlx::query_scalar("SELECT DISTINCT job FROM sexton.passes")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(ran, registered, "every kind ran a pass");

    let series = prometheus.series("{__name__=~\"sexton_.+\"}").await;
    assert!(!series.is_empty());
    for s in &series {
        assert!(
            label(s, "exported_job").is_none(),
            "a kind labelled job: {s}"
        );
        assert_eq!(label(s, "job"), Some("sexton"), "the scrape's job: {s}");
    }
    for kind in &registered {
        for name in [
            "sexton_hops_total",
            "sexton_hop_duration_seconds_count",
            "sexton_job_runs_total",
            "sexton_owners_pruned_total",
            "sexton_bytes_reclaimed_total",
        ] {
            assert!(
                !prometheus
                    .query(&format!("{name}{{kind=\"{kind}\"}}"))
                    .await
                    .is_empty(),
                "{name} of {kind} under kind"
            );
        }
    }
    // RQ-7: every state of the erasure requests, the due date (+Inf: none open) and the
    // residues, scraped as the overdue alert reads them.
    let states: BTreeSet<String> = prometheus
        .query("sexton_erasures")
        .await
        .iter()
        .filter_map(|s| label(s, "state").map(str::to_owned))
        .collect();
    assert_eq!(
        states,
        sexton::telemetry::metrics::ERASURE_STATES
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    );
    let due = prometheus.query("min(sexton_erasure_due_seconds)").await;
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(due[0]["value"][1], "+Inf", "no open request: {due:?}");
    assert!(
        prometheus
            .shows("sexton_erasure_residues_total", Duration::from_secs(30))
            .await
    );
    // Grouped by kind, each kind is its own series, as the alerts and the dashboard group them.
    assert_eq!(
        kinds_of(
            &prometheus,
            "max by (kind) (sexton_last_success_timestamp_seconds)"
        )
        .await,
        registered
    );
    // The missed-pass alert's exclusion names a kind that is there to exclude.
    assert!(
        registered.contains("trace_cleanup")
            && !kinds_of(
                &prometheus,
                "sexton_last_success_timestamp_seconds{kind!=\"trace_cleanup\"}"
            )
            .await
            .contains("trace_cleanup")
    );

    // A rate shows once two scrapes are in: every panel shows data (every series is exported
    // from start, OP-3); those a throttle alone raises read 0.
    let panels = dashboard_queries();
    for (title, exprs) in &panels {
        for expr in exprs {
            assert!(
                prometheus.shows(expr, Duration::from_secs(30)).await,
                "dashboard panel {title:?} shows nothing after a clean pass: {expr}"
            );
            if PANELS_RAISED_ONLY_BY_A_THROTTLE.contains(&title.as_str()) {
                for sample in prometheus.query(expr).await {
                    assert_eq!(
                        sample["value"][1], "0",
                        "dashboard panel {title:?} above 0 with no throttle: {sample}"
                    );
                }
            }
        }
    }
    assert!(
        PANELS_RAISED_ONLY_BY_A_THROTTLE
            .iter()
            .all(|t| panels.iter().any(|(title, _)| title == t)),
        "every panel named is on the dashboard"
    );

    let rules = prometheus.rules_evaluated_after(scraped_at.get()).await;
    assert_eq!(
        rules.len(),
        std::fs::read_to_string(alert_rules())
            .unwrap()
            .matches("- alert:")
            .count()
    );
    for rule in &rules {
        assert_eq!(rule["state"], "inactive", "after a clean pass: {rule}");
    }
    assert_eq!(prometheus.alerts().await, Vec::<serde_json::Value>::new());
    prometheus.stop().await;
    worker.stop().await;
}

/// One account's pass held back (its hop waits on a conversation the platform holds) with the
/// last complete slot more than 26 hours old: the shipped missed-pass expression, evaluated by a
/// real Prometheus on the scraped series, is true for that kind alone (the kinds whose passes
/// finished are not), and the alert is pending.
#[sqlx::test]
async fn op3_a_held_pass_makes_the_missed_pass_alert_true_for_its_kind_alone(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let outputs = &settings.paths.output_root;
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    fixture::run(
        &pool,
        outputs,
        RunSpec::conversation(account, conversation, 40.0),
    )
    .await;
    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, dir.path());
    cmd.env("SEXTON_HTTP__REFRESH_INTERVAL_MS", "200")
        .env("SEXTON_EXECUTION_DETAILS__OWNER_LOCK_TIMEOUT_MS", "60000");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;

    // A pass of every kind finished for the nightly slot before 30 hours ago.
    let now = chrono::Utc::now();
    let old = sexton::tick::tick(&pool, &settings, now - chrono::Duration::hours(30))
        .await
        .unwrap();
    let nightly: Vec<&str> = KINDS
        .iter()
        .filter(|k| k.cadence(&settings) == Cadence::Nightly)
        .map(|k| k.name())
        .collect();
    // Kinds on a cadence of their own (erasure) finish passes of their own periods.
    poll_until(Duration::from_secs(90), || async {
        let done = sexton::ledger::last_success(&pool).await.unwrap();
        let done: Vec<_> = done
            .iter()
            .filter(|(kind, _)| nightly.contains(&kind.as_str()))
            .collect();
        done.len() == nightly.len() && done.iter().all(|(_, slot)| *slot == old.slot)
    })
    .await;
    assert!(fixture::is_pruned_any(&pool).await);

    // The latest slot: a new account's pass waits on a conversation the platform holds.
    let held = fixture::account(&pool, Some(30)).await;
    let held_conversation = fixture::conversation(&pool, held).await;
    let held_run = fixture::run(
        &pool,
        outputs,
        RunSpec::conversation(held, held_conversation, 40.0),
    )
    .await;
    let mut writer = pool.begin().await.unwrap();
    fixture::lock_conversation(&mut writer, held_conversation).await;
    let latest = sexton::tick::tick(&pool, &settings, now).await.unwrap();
    assert!(latest.slot > old.slot);
    common::wait_for_lock_waiter(&pool, "conversations").await;

    let prometheus = Prometheus::start(dir.path(), &address);
    let missed = alert_expr("SextonNoSuccessfulPass");
    poll_until(Duration::from_secs(60), || async {
        !prometheus.query(&missed).await.is_empty()
    })
    .await;
    assert_eq!(
        kinds_of(&prometheus, &missed).await,
        BTreeSet::from([PED.to_owned()]),
        "{missed}: the held kind alone"
    );
    // The other kinds finished the latest slot, under the same scrape.
    let finished = prometheus
        .query(&format!(
            "sexton_last_success_timestamp_seconds == {}",
            latest.slot.timestamp()
        ))
        .await;
    assert!(finished.len() > 1, "{finished:?}");
    assert!(
        prometheus
            .query(&alert_expr("SextonNoPassEverRecorded"))
            .await
            .is_empty(),
        "a pass was recorded"
    );
    poll_until(Duration::from_secs(30), || async {
        prometheus.alerts().await.iter().any(|a| {
            a["labels"]["alertname"] == "SextonNoSuccessfulPass"
                && a["labels"]["kind"] == PED
                && a["state"] == "pending"
        })
    })
    .await;
    assert!(
        !fixture::is_pruned(&pool, held_run.id).await,
        "the pass was held throughout"
    );

    writer.rollback().await.unwrap();
    prometheus.stop().await;
    worker.stop().await;
}

#[sqlx::test]
async fn op4_each_hop_is_a_span_with_account_pass_hop_window_and_outcome(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    fixture::run(
        &pool,
        &settings.paths.output_root,
        RunSpec::conversation(account, conversation, 40.0),
    )
    .await;
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    let url = common::database_url(&pool).await;
    let mut cmd = common::sexton(&url, dir.path());
    cmd.args(["worker", "--exit-when-idle"])
        .env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "7");
    let (status, lines) = Proc::spawn(cmd).finish(Duration::from_secs(60)).await;
    assert!(status.success());
    let hop: serde_json::Value = events(&lines, event::HOP_DONE)
        .find(|e| e["span"]["job"] == "prune_execution_details")
        .expect("a structured hop event");
    let span = &hop["span"];
    assert_eq!(span["name"], "hop");
    assert_eq!(span["account"], account.to_string());
    assert_eq!(span["pass"], pass_start().to_rfc3339());
    assert_eq!(span["hop"], 0);
    assert_eq!(span["window"], 7);
    assert_eq!(span["outcome"], "finished");
    assert_eq!(hop["pruned"], 1);
}

#[sqlx::test]
async fn op4_a_stored_path_with_a_line_break_forges_no_line_of_the_text_log(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    fixture::run(
        &pool,
        &settings.paths.output_root,
        RunSpec::conversation(account, conversation, 40.0),
    )
    .await;
    // Records the account's hop drains and refuses (they climb out of the root), each logged
    // with its path: one forging a log line and reordering it, and a plain one (the control).
    let forging = "../x.out\n2026-11-01T03:00:00.000000Z ERROR sexton: FORGED \u{202e}tuo.x";
    sqlx::query(
        "INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
         SELECT 'outputs', $1, p FROM unnest($2::text[]) p",
    )
    .bind(account)
    .bind([forging, "../plain.out"])
    .execute(&pool)
    .await
    .unwrap();
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    let url = common::database_url(&pool).await;
    let output = common::sexton(&url, dir.path())
        .args(["worker", "--exit-when-idle"])
        .env("SEXTON_LOG__FORMAT", "text")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let log = without_colours(&String::from_utf8(output.stderr).unwrap());

    let refusals: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("file not deleted"))
        .collect();
    assert_eq!(refusals.len(), 2, "both records logged: {log}");
    assert!(
        refusals
            .iter()
            .any(|line| line.contains("path=../plain.out ")),
        "the control logged as it is: {log}"
    );
    assert!(
        refusals.iter().any(|line| line.contains(
            r"path=../x.out\u{a}2026-11-01T03:00:00.000000Z ERROR sexton: FORGED \u{202e}tuo.x"
        )),
        "the forging path logged escaped on its refusal's line: {log}"
    );
    assert!(
        log.lines()
            .filter(|line| line.contains("FORGED"))
            .all(|line| line.contains("file not deleted")),
        "a stored line break started a line of its own: {log}"
    );
    assert!(
        !log.chars().any(sexton_jobs::shown::is_bidi_control),
        "a stored bidi control reached the log: {log:?}"
    );
}

/// `log` without the colours the text format paints its field names in (`ESC [ … m`): what
/// comes from the database is escaped, so every ESC left is the format's own.
fn without_colours(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut rest = log;
    while let Some(at) = rest.find('\u{1b}') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        rest = rest.find('m').map_or("", |end| &rest[end + 1..]);
    }
    out.push_str(rest);
    out
}

#[test]
fn op5_alert_rules_pass_promtool_and_the_pod_grace_outlasts_the_shutdown_grace() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = root.join("deploy/prometheus");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts_test.yml"],
    ] {
        let status = std::process::Command::new("promtool")
            .args(&args)
            .current_dir(&rules)
            .status()
            .expect("promtool (Debian package prometheus; scripts/test.sh installs it)");
        assert!(status.success(), "promtool {args:?}");
    }
    let manifest = std::fs::read_to_string(root.join("deploy/kubernetes/sexton.yaml")).unwrap();
    let number = |key: &str| -> u64 {
        let line = manifest
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap();
        line.split(['=', ':'])
            .nth(1)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let pod_grace_s = number("terminationGracePeriodSeconds");
    let shutdown_grace_ms = number("shutdown_grace_ms");
    assert!(
        shutdown_grace_ms < pod_grace_s * 1000,
        "FL-5: the pod must outlast the worker's grace ({shutdown_grace_ms} ms vs {pod_grace_s} s)"
    );
    assert!(manifest.contains("replicas: 3"));
    assert!(manifest.contains("path: /readyz") && manifest.contains("path: /healthz"));
}

/// `sexton tick --at` a moment outside the years a schedule names (1970 to 2100), or before the
/// schedule's first slot, is a usage error: exit 2 naming the accepted range, nothing enqueued
/// (9999 used to enqueue a slot in 2100, 0001 to exit 1). The control: a moment in 2100 ticks.
#[sqlx::test]
async fn op1_tick_at_a_moment_outside_the_schedules_years_is_a_usage_error(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let tick = |at: &'static str| {
        let mut cmd = common::sexton(&url, dir.path());
        cmd.args(["tick", "--json", "--at", at])
            .env("SEXTON_SCHEDULE__CRON", "0 3 * * *");
        async move { cmd.output().await.unwrap() }
    };
    let slots = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM apalis.jobs WHERE job_type = 'sexton.nightly'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    for at in [
        "9999-12-31T23:59:59Z",
        "0001-01-01T00:00:00Z",
        "2101-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
    ] {
        let output = tick(at).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "--at {at}: {stderr}");
        assert!(
            stderr.contains("1970-01-01T00:00:00+00:00")
                && stderr.contains("2100-12-31T23:59:59+00:00"),
            "--at {at} names the range: {stderr}"
        );
    }
    // In range, but before the schedule's first slot (03:00 UTC).
    let output = tick("1970-01-01T01:00:00Z").await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("first slot"), "{stderr}");
    assert_eq!(slots().await, 0, "nothing enqueued");

    let output = tick("2100-12-31T23:59:59Z").await;
    assert!(output.status.success(), "{output:?}");
    let ticked: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(ticked["slot"], "2100-12-31T03:00:00Z");
    assert_eq!(slots().await, 1);
}

/// `--config` naming a directory says so and that a file was expected, exit 2 (it used to say
/// "not found"); the control: a path that does not exist is still "not found".
#[tokio::test]
async fn op2_a_config_path_naming_a_directory_is_refused_as_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let check = |path: std::path::PathBuf| async move {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_sexton"))
            .arg("check-config")
            .arg("--config")
            .arg(&path)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), stderr)
    };
    let (code, stderr) = check(dir.path().to_owned()).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("is a directory") && stderr.contains("expected a TOML file"),
        "{stderr}"
    );
    assert!(!stderr.contains("not found"), "{stderr}");

    let (code, stderr) = check(dir.path().join("missing.toml")).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not found"), "{stderr}");
}
