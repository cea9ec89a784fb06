//! Derivative cleanup through the `sexton` binary (DC-3, DC-4, DC-5): the CLI's dry run and
//! `--confirm`, its refusals, the background job in a fleet worker with its ledger, `status`
//! and metrics, and an orphan sexton's user cannot remove.

use std::path::Path;
use std::time::Duration;

use sqlx::PgPool;

use super::{World, output_row};
use crate::common::process::{
    Proc, http_get, metric, poll_until, scrape, serving_fleet_worker, status_json,
};
use crate::common::{self, backend};

/// `sexton orphans scan` lists and deletes nothing; `--confirm` removes exactly what it listed;
/// `--root` narrows the scan, and a name that is no root is refused with the known names.
#[sqlx::test]
async fn dc3_the_dry_run_deletes_nothing_and_lists_exactly_what_confirm_removes(pool: PgPool) {
    let w = World::at_database_now(&pool).await;
    let (a, r) = (w.account, w.run);
    output_row(&pool, r, &format!("{a}/{r}/kept.bin")).await;
    let kept = w.put("outputs", &format!("{a}/{r}/kept.bin"), 30.0);
    let orphans = [
        w.put("outputs", &format!("{a}/{r}/one.bin"), 30.0),
        w.put("outputs", &format!("{a}/{r}/two.bin"), 30.0),
    ];
    let attachment = w.put("attachments", &format!("{a}/orphan.bin"), 30.0);
    let url = common::database_url(&pool).await;
    let scan = |args: &[&str]| {
        let mut cmd = common::sexton(&url, w.dir.path());
        cmd.arg("orphans").arg("scan").args(args);
        cmd
    };
    let listed = |out: &std::process::Output| -> Vec<String> {
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut paths: Vec<String> = json["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| format!("{}:{}", f["root"], f["path"]))
            .collect();
        paths.sort();
        paths
    };

    // `preview` runs the same scan as a dry run (DC-3).
    let preview = common::sexton(&url, w.dir.path())
        .args(["preview", "--json"])
        .output()
        .await
        .unwrap();
    let lines: serde_json::Value = serde_json::from_slice(&preview.stdout).unwrap();
    let orphans_line = lines
        .as_array()
        .unwrap()
        .iter()
        .find(|line| line["job"] == "orphans")
        .expect("preview has a line for orphans");
    assert_eq!(orphans_line["roots"]["outputs"]["counts"]["no_row"], 2);
    assert_eq!(orphans_line["roots"]["attachments"]["listed"], 1);
    let dry = scan(&["--root", "outputs", "--json"])
        .output()
        .await
        .unwrap();
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(
        orphans.iter().all(|o| o.exists()),
        "a dry run deletes nothing"
    );
    let confirmed = scan(&["--root", "outputs", "--confirm", "--json"])
        .output()
        .await
        .unwrap();
    assert!(confirmed.status.success());
    assert_eq!(listed(&dry), listed(&confirmed));
    assert_eq!(listed(&dry).len(), 2);
    assert!(orphans.iter().all(|o| !o.exists()));
    assert!(kept.exists(), "the control: a named file stays");
    assert!(
        attachment.exists(),
        "--root outputs scans the outputs root alone"
    );

    let bad = scan(&["--root", "artifacts"]).output().await.unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("outputs, attachments, sessions, traces") && said.contains("artifacts"),
        "{said}"
    );
}

/// `[orphans] grace_days` below a day is refused at start, naming the setting.
#[sqlx::test]
async fn dc2_a_grace_under_a_day_is_a_configuration_error(pool: PgPool) {
    common::migrate(&pool).await;
    let url = common::database_url(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let out = common::sexton(&url, dir.path())
        .arg("check-config")
        .env("SEXTON_ORPHANS__GRACE_DAYS", "0")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("orphans.grace_days"), "{said}");
}

/// The background job: a fleet worker runs its period on start; what it found and did per root
/// and reason is in the hop's ledger, `sexton.orphan_scans`, `status` and the metrics.
#[sqlx::test]
async fn dc5_the_jobs_counts_per_root_and_reason_reach_the_ledger_status_and_metrics(pool: PgPool) {
    let w = World::at_database_now(&pool).await;
    let (a, r) = (w.account, w.run);
    let old = w.put("outputs", &format!("{a}/{r}/old.bin"), 30.0);
    let young = w.put("outputs", &format!("{a}/{r}/young.bin"), 1.0);
    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, w.dir.path());
    cmd.env("SEXTON_ORPHANS__ENABLED", "true")
        .env("SEXTON_HTTP__REFRESH_INTERVAL_MS", "200");
    let worker = Proc::spawn(cmd);
    poll_until(Duration::from_secs(60), || async { !old.exists() }).await;
    common::process::wait_until_idle(&pool).await;
    let series = |labels: &str| format!("sexton_orphans_total{{{labels}}}");
    poll_until(Duration::from_secs(60), || async {
        let page = scrape(&address).await;
        metric(&page, &series("root=\"outputs\",reason=\"grace\"")) == Some(1.0)
            && metric(&page, "sexton_orphans_removed_total{root=\"outputs\"}") == Some(1.0)
    })
    .await;
    let (code, page) = http_get(&address, "/status").await.unwrap();
    worker.stop().await;
    assert_eq!(code, 200);
    let orphans = page
        .split("<section id=\"orphans\">")
        .nth(1)
        .expect("the section");
    let outputs = orphans
        .split("<tr>")
        .find(|row| row.contains(">outputs</td>"))
        .expect("a row for outputs");
    let shown = |label: &str| {
        let cell = outputs.split(&format!("data-label=\"{label}\"")).nth(1)?;
        cell.split("</td>")
            .next()?
            .rsplit('>')
            .next()?
            .parse::<u64>()
            .ok()
    };
    for (label, n) in [("no_row", 2), ("grace", 1), ("removed", 1), ("failed", 0)] {
        assert_eq!(shown(label), Some(n), "{label}: {outputs}");
    }

    assert!(young.exists(), "the control: a young orphan stays");
    let (pruned, retained): (i64, serde_json::Value) = sqlx::query_as(
        "SELECT pruned, retained FROM sexton.passes WHERE job = 'orphans' AND finished_at IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pruned, 1);
    assert_eq!(retained["grace"], 1, "{retained}");
    let status = status_json(&url, w.dir.path()).await;
    let outputs = &status["orphans"]["roots"]["outputs"];
    assert_eq!(outputs["counts"]["no_row"], 2, "{status}");
    assert_eq!(outputs["counts"]["grace"], 1, "{status}");
    assert_eq!(outputs["gone"], 1, "{status}");
    assert_eq!(status["orphans"]["confirmed"], true);

    // OP-3: a worker started again exports the database's totals from its start, never 0 first
    // (which `increase()` would read as every orphan found again).
    let (mut cmd, address) = serving_fleet_worker(&url, w.dir.path());
    cmd.env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "0");
    let again = Proc::spawn(cmd);
    again.wait_for(sexton::event::WORKER_STARTED).await;
    let page = scrape(&address).await;
    again.stop().await;
    assert_eq!(
        metric(&page, "sexton_orphans_removed_total{root=\"outputs\"}"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        metric(&page, &series("root=\"outputs\",reason=\"grace\"")),
        Some(1.0)
    );
    assert_eq!(
        metric(&page, &series("root=\"traces\",reason=\"legal_hold\"")),
        Some(0.0),
        "the control: a pair no scan counted reads 0 from the start"
    );
}

/// A file that cannot be removed (its directory is not sexton's user's to write) is counted and
/// reported, and the scan goes on with the next. Run as `nobody` when the tests run as root, as
/// a worker would run under its own user.
#[sqlx::test]
async fn dc4_an_unremovable_orphan_is_counted_and_the_scan_goes_on(pool: PgPool) {
    use std::os::unix::fs::PermissionsExt as _;

    if backend::server().is_some() {
        return; // A store has no directory permissions: nothing here to make unremovable.
    }
    let w = World::at_database_now(&pool).await;
    let (a, r) = (w.account, w.run);
    let mode = |path: &Path, bits| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(bits)).unwrap();
    };
    let locked = w.put("outputs", &format!("{a}/{r}/locked/stays.bin"), 30.0);
    let free = w.put("outputs", &format!("{a}/{r}/free/goes.bin"), 30.0);
    let binary = w.dir.path().join("sexton");
    std::fs::copy(env!("CARGO_BIN_EXE_sexton"), &binary).unwrap();
    for path in [
        w.dir.path().to_owned(),
        binary.clone(),
        w.path("outputs", ""),
        w.path("outputs", &a.to_string()),
        w.path("outputs", &format!("{a}/{r}")),
    ] {
        mode(&path, 0o755);
    }
    mode(&w.path("outputs", &format!("{a}/{r}/free")), 0o777);
    mode(&w.path("outputs", &format!("{a}/{r}/locked")), 0o555);
    let root_user = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap();
    let mut cmd = if root_user {
        let mut cmd = tokio::process::Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&binary);
        cmd
    } else {
        tokio::process::Command::new(&binary)
    };
    let url = common::database_url(&pool).await;
    let out = cmd
        .args([
            "orphans",
            "scan",
            "--root",
            "outputs",
            "--confirm",
            "--json",
        ])
        .env("DATABASE_URL", &url)
        .envs(backend::env(w.dir.path()))
        .output()
        .await
        .unwrap();
    mode(&w.path("outputs", &format!("{a}/{r}/locked")), 0o755);

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let outputs = &json["totals"]["roots"]["outputs"];
    assert_eq!(outputs["removed"]["errors"], 1, "{json}");
    assert_eq!(outputs["gone"], 1, "{json}");
    assert!(
        locked.exists(),
        "the file that could not be removed is still there"
    );
    assert!(
        !free.exists(),
        "the control: the scan went on and removed the next"
    );
}
