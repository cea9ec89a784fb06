//! OP-6: the status page of a real worker process — `/status` rendered by a real headless
//! browser (Debian's `chromium`), `/status.json` the same as `sexton status --json`,
//! `[http] status_page = false` turning both off — and the HTTP server unharmed by a query
//! string, an unknown path, a huge header or a slow client.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sexton::event;
use sexton::registry::KINDS;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec};
use crate::common::process::{Proc, http_get, poll_until, serving_fleet_worker};
use crate::common::{self};

/// The job failed for good, by its id in the queue.
const FAILED_JOB: &str = "01J0000000000000000000STAT";

/// The hold's case reference, which the page shows, and its reason, which it never does.
const CASE: &str = "LIT-OP6-<7>";
const REASON: &str = "reason-never-shown";

/// A database after a pass: an account with a run (held by a hold), the nightly slot's passes
/// run by `sexton worker --exit-when-idle`, and a job failed for good.
async fn after_a_pass(pool: &PgPool, dir: &std::path::Path) -> (String, Uuid) {
    common::migrate(pool).await;
    let url = common::database_url(pool).await;
    let settings = common::settings(dir);
    let account = fixture::account(pool, Some(30)).await;
    let conversation = fixture::conversation(pool, account).await;
    fixture::run(
        pool,
        &settings.paths.output_root,
        RunSpec::conversation(account, conversation, 45.0),
    )
    .await;
    let placed = common::sexton(&url, dir)
        .args([
            "holds",
            "place",
            "--account",
            &account.to_string(),
            "--case",
            CASE,
            "--reason",
            REASON,
            "--by",
            "legal",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        placed.status.success(),
        "{}",
        String::from_utf8_lossy(&placed.stderr)
    );
    sexton::tick::tick(pool, &settings, fixture::pass_start())
        .await
        .unwrap();
    // A payload the handler rejects: failed for good, kept.
    sqlx::query(
        "INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts)
         VALUES ('{}'::bytea, $1, 'sexton.prune_execution_details', 'Pending', 0, 2)",
    )
    .bind(FAILED_JOB)
    .execute(pool)
    .await
    .unwrap();
    let mut worker = common::sexton(&url, dir);
    worker.args(["worker", "--exit-when-idle"]);
    let status = common::wait(&mut worker.spawn().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(
        status.code(),
        Some(1),
        "the rejected payload failed for good"
    );
    (url, account)
}

/// A fleet worker serving HTTP, started and answering `/healthz`.
async fn serving(url: &str, dir: &std::path::Path, env: &[(&str, &str)]) -> (Proc, String) {
    let (mut cmd, address) = serving_fleet_worker(url, dir);
    cmd.envs(env.iter().copied());
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    poll_until(Duration::from_secs(30), || async {
        http_get(&address, "/healthz").await.map(|r| r.0) == Some(200)
    })
    .await;
    (worker, address)
}

/// Debian's `chromium`, which `scripts/test.sh` installs: the test fails, saying so, without it.
fn chromium() -> &'static str {
    let found = std::process::Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "chromium is not installed: this test loads the status page in a real headless browser \
         (OP-6). Install Debian's package `chromium` (scripts/test.sh does: ensure_chromium)"
    );
    "chromium"
}

/// The DOM a headless Chromium renders of `url`, with a profile of its own.
async fn dump_dom(url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut browser = tokio::process::Command::new(chromium());
    browser
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--dump-dom", url])
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), browser.output())
        .await
        .expect("chromium answers within 120 s")
        .unwrap();
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// After a pass with a hold placed and a job failed for good, a real headless browser renders
/// `/status` with a row and a section for every registered kind, the hold's case reference and
/// the failed job's id — and not the hold's reason (row content), nor any script. A query
/// string is ignored, an unknown path is 404.
#[sqlx::test]
async fn op6_the_status_page_in_a_headless_browser_shows_every_kind_the_hold_and_the_failed_job(
    pool: PgPool,
) {
    let dir = tempfile::tempdir().unwrap();
    let (url, account) = after_a_pass(&pool, dir.path()).await;
    let (worker, address) = serving(&url, dir.path(), &[]).await;

    let dom = dump_dom(&format!("http://{address}/status")).await;
    for kind in KINDS {
        let name = kind.name();
        assert!(
            dom.contains(&format!("id=\"row-kind-{name}\"")),
            "no row for {name}: {dom}"
        );
        assert!(
            dom.contains(&format!("id=\"kind-{name}\"")),
            "no section for {name}: {dom}"
        );
        assert!(
            dom.contains(&format!("href=\"#kind-{name}\"")),
            "no link to {name}'s section"
        );
    }
    assert!(dom.contains("LIT-OP6-&lt;7&gt;"), "the hold's case: {dom}");
    assert!(
        dom.contains(&account.to_string()),
        "the held account: {dom}"
    );
    assert!(dom.contains(FAILED_JOB), "the failed job: {dom}");
    assert!(dom.contains("sexton status"), "{dom}");
    // Control: counts and ids, never a hold's reason; nothing to run, nothing from elsewhere.
    assert!(!dom.contains(REASON), "a hold's reason on the page: {dom}");
    assert!(!dom.contains("<script"), "{dom}");
    assert!(
        !dom.contains("http://") && !dom.contains("https://"),
        "{dom}"
    );

    let (code, plain) = http_get(&address, "/status").await.unwrap();
    assert_eq!(code, 200);
    let (code, queried) = http_get(&address, "/status?job=%3Cscript%3E&all=1")
        .await
        .unwrap();
    assert_eq!(code, 200, "a query string is ignored");
    assert!(!queried.contains("<script>"));
    // The same page but for its time and the heartbeats.
    assert_eq!(plain.matches("<tr").count(), queried.matches("<tr").count());
    for path in ["/nope", "/status/", "/status.html", "/STATUS"] {
        assert_eq!(
            http_get(&address, path).await.map(|r| r.0),
            Some(404),
            "{path}"
        );
    }
    worker.stop().await;
}

/// Every key of `value`'s objects, as paths (arrays by their first element).
fn keys(value: &Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let here = format!("{path}.{k}");
                out.insert(here.clone());
                // Objects of counts (by table, by reason, by root) have data for keys.
                if !matches!(k.as_str(), "retained" | "rows_deleted") && !k.ends_with("_files") {
                    keys(v, &here, out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first() {
                keys(first, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// `/status.json` is what `sexton status --json` prints — the same keys, the same jobs, the same
/// holds and failed jobs; with `[http] status_page = false`, `/status` and `/status.json` are
/// 404 while `/metrics` still answers (the control).
#[sqlx::test]
async fn op6_status_json_is_sexton_status_json_and_status_page_false_turns_it_off(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = after_a_pass(&pool, dir.path()).await;
    let (worker, address) = serving(&url, dir.path(), &[]).await;
    // The worker starts the current period's pass of the kinds on a cadence of their own
    // (erasure): the two reads compare once it has ended.
    poll_until(Duration::from_secs(60), || async {
        let started: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sexton.fan_outs WHERE job = 'erasure' AND finished_at IS NOT NULL)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        started && sexton::queue::counts(&pool).await.unwrap().idle()
    })
    .await;
    let (code, body) = http_get(&address, "/status.json").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    let output = common::sexton(&url, dir.path())
        .args(["status", "--json"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
    keys(&served, "", &mut a);
    keys(&printed, "", &mut b);
    assert_eq!(a, b);
    assert!(a.contains(".jobs[].pass_states.finished") && a.contains(".workers[].last_heartbeat"));
    // The page's backlogs are its gauges' last measurement, never later than its read; the
    // command's are read with the rest.
    let at = |v: &Value, key: &str| v[key].as_str().unwrap().parse::<DateTime<Utc>>().unwrap();
    assert!(at(&served, "backlogs_at") <= at(&served, "at"));
    assert_eq!(at(&printed, "backlogs_at"), at(&printed, "at"));
    for field in ["jobs", "failed_jobs", "holds", "holds_active", "queue"] {
        let strip = |v: &Value| -> Value {
            let mut v = v[field].clone();
            if let Some(jobs) = v.as_array_mut() {
                for job in jobs {
                    // The backlog moves with the clock between the two reads.
                    job.as_object_mut().map(|j| j.remove("backlog_seconds"));
                }
            }
            v
        };
        assert_eq!(strip(&served), strip(&printed), "{field}");
    }
    worker.stop().await;

    let (off, address) = serving(&url, dir.path(), &[("SEXTON_HTTP__STATUS_PAGE", "false")]).await;
    for path in ["/status", "/status.json"] {
        assert_eq!(
            http_get(&address, path).await.map(|r| r.0),
            Some(404),
            "{path}"
        );
    }
    assert_eq!(http_get(&address, "/metrics").await.map(|r| r.0), Some(200));
    off.stop().await;
}

/// A request head of a megabyte is refused (431) and a client that sends half a head and then
/// nothing is disconnected; meanwhile, and after, `/status` answers as usual.
#[sqlx::test]
async fn op6_a_huge_header_or_a_slow_client_leaves_the_status_page_unharmed(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let (worker, address) = serving(&url, dir.path(), &[]).await;

    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();

    let mut huge = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "GET /status HTTP/1.1\r\nHost: x\r\nX-Huge: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    // The server may close before it has read it all.
    let _ = huge.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), huge.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );

    let (code, page) = http_get(&address, "/status").await.unwrap();
    assert_eq!(
        code, 200,
        "answered while a slow client holds its connection"
    );
    assert!(page.contains("sexton status"));

    // The slow client is cut off (15 s for a head); the hang guard is twice that.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), slow.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "a slow client's connection was never closed");
    assert_eq!(http_get(&address, "/status").await.map(|r| r.0), Some(200));
    worker.stop().await;
}
