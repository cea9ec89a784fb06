//! Operating it (SPEC §6): bad configuration refused at start naming each setting (OP-2), the
//! CLI's output escaped (OP-1), the metrics a real Prometheus scrapes (OP-3), each hop a span in
//! the logs (OP-4), and the deploy's alert rules and grace (OP-5).

use std::process::Stdio;
use std::time::Duration;

use sexton::event;
use sqlx::PgPool;
use tokio::process::Command;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec, pass_start};
use crate::common::process::{Proc, events, free_port, http_get, poll_until, serving_fleet_worker};

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

#[sqlx::test]
async fn op3_a_real_prometheus_scrapes_the_contract_series(pool: PgPool) {
    common::migrate(&pool).await;
    let prometheus = std::path::Path::new("/usr/bin/prometheus");
    assert!(
        prometheus.exists(),
        "Debian's prometheus package is needed (scripts/test.sh installs it)"
    );
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
    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, dir.path());
    // The worker's own schedule catches up on the last hourly slot and runs the pass.
    cmd.env("SEXTON_HTTP__REFRESH_INTERVAL_MS", "200")
        .env("SEXTON_SCHEDULE__CRON", "0 * * * *")
        .env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "2");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    poll_until(Duration::from_secs(60), || async {
        fixture::is_pruned_any(&pool).await
    })
    .await;
    assert_eq!(http_get(&address, "/healthz").await.map(|r| r.0), Some(200));
    assert_eq!(http_get(&address, "/readyz").await.map(|r| r.0), Some(200));

    let prom_port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sexton\n    static_configs:\n      - targets: ['{address}']\n"
        ),
    )
    .unwrap();
    let mut server = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let expected = [
        "sexton_owners_pruned_total",
        "sexton_owners_retained_total",
        "sexton_rows_deleted_total",
        "sexton_bytes_reclaimed_total",
        "sexton_hops_total",
        "sexton_hop_duration_seconds_bucket",
        "sexton_job_runs_total",
        "sexton_last_success_timestamp_seconds",
        "sexton_schedule_slots_total",
        "sexton_queue_jobs",
        "sexton_backlog_seconds",
        "sexton_holds_active",
    ];
    let prom = format!("127.0.0.1:{prom_port}");
    poll_until(Duration::from_secs(90), || async {
        let Some((200, body)) = http_get(&prom, "/api/v1/label/__name__/values").await else {
            return false;
        };
        expected
            .iter()
            .all(|name| body.contains(&format!("\"{name}\"")))
    })
    .await;
    server.start_kill().unwrap();
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
