//! The object store failing the worker at start (ER-2, OS-1): a store that does not answer is
//! an outage, as a database down at start is — retried with backoff, `/readyz` false meanwhile,
//! then either the worker ready once the store answers or a clear error (exit 1), never
//! "invalid configuration" (exit 2). `check-config` names the root it cannot reach.

use std::time::Duration;

use sexton::event;
use sqlx::PgPool;

use crate::common::process::{Proc, free_port, http_get, poll_until, serving_fleet_worker};
use crate::common::{self, backend};

/// The bucket of the tests' store.
const BUCKET: &str = "sexton";

/// `cmd` with every file root of sexton's in [`BUCKET`] of a store at `127.0.0.1:port`.
fn roots_in_store(cmd: &mut tokio::process::Command, port: u16) {
    for (setting, prefix) in [
        ("OUTPUT_ROOT", "outputs"),
        ("ATTACHMENTS_ROOT", "attachments"),
        ("SESSIONS_ROOT", "sessions"),
        ("TRACES_ROOT", "traces"),
    ] {
        cmd.env(
            format!("SEXTON_PATHS__{setting}"),
            format!("s3://{BUCKET}/{prefix}"),
        );
    }
    cmd.env(
        "SEXTON_STORAGE__ENDPOINT",
        format!("http://127.0.0.1:{port}"),
    )
    .env("SEXTON_STORAGE__REGION", "us-east-1")
    .env("SEXTON_STORAGE__PATH_STYLE", "true")
    .env("SEXTON_STORAGE__ALLOW_HTTP", "true")
    .env("SEXTON_STORAGE__ACCESS_KEY_ID", backend::ACCESS_KEY)
    .env("SEXTON_STORAGE__SECRET_ACCESS_KEY", backend::SECRET_KEY)
    .env("SEXTON_DATABASE__ACQUIRE_TIMEOUT_MS", "1000");
}

#[tokio::test]
async fn er2_an_object_store_down_at_start_is_retried_with_readyz_false_then_a_clear_outage_error()
{
    let dir = tempfile::tempdir().unwrap();
    let closed = free_port();
    // The database is down too: the store is what the worker waits for first.
    let (mut cmd, address) = serving_fleet_worker(
        &format!("postgres://sexton:x@127.0.0.1:{}/platform", free_port()),
        dir.path(),
    );
    roots_in_store(&mut cmd, closed);
    cmd.env("SEXTON_DATABASE__CONNECT_ATTEMPTS", "3");
    let worker = Proc::spawn(cmd);
    poll_until(Duration::from_secs(30), || async {
        http_get(&address, "/healthz").await.is_some()
    })
    .await;
    assert_eq!(http_get(&address, "/readyz").await.map(|r| r.0), Some(503));
    let (status, lines) = worker.finish(Duration::from_secs(60)).await;
    assert_eq!(
        status.code(),
        Some(1),
        "an outage, not a setting: {lines:#?}"
    );
    let unreachable = crate::common::process::events(&lines, event::OBJECT_STORE_UNREACHABLE);
    assert_eq!(unreachable.count(), 2, "each retry logged: {lines:#?}");
    let said = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(
        said("the object store did not answer for 4 roots")
            && said(&format!("paths.output_root: s3://{BUCKET}/outputs"))
            && said(&format!("paths.traces_root: s3://{BUCKET}/traces")),
        "the final error names each root: {lines:#?}"
    );
    assert!(!said("invalid configuration"), "{lines:#?}");

    // check-config says the same, once, as a failure (exit 1), not as a bad setting (exit 2).
    let mut check = common::sexton("postgres://unused", dir.path());
    check.arg("check-config");
    roots_in_store(&mut check, closed);
    let output = check.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("paths.output_root: s3://{BUCKET}/outputs"))
            && !stderr.contains("invalid configuration"),
        "{stderr}"
    );
    // Control: a root that is a bad setting stays one (exit 2).
    let mut bad = common::sexton("postgres://unused", dir.path());
    bad.arg("check-config");
    roots_in_store(&mut bad, closed);
    bad.env("SEXTON_PATHS__ARTIFACTS_ROOT", dir.path().join("missing"));
    let output = bad.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("paths.artifacts_root"), "{stderr}");
}

#[sqlx::test]
async fn er2_a_worker_waits_for_an_object_store_down_at_start_and_is_ready_once_it_answers(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let port = free_port();
    let (mut cmd, address) = serving_fleet_worker(&url, dir.path());
    roots_in_store(&mut cmd, port);
    // More attempts than the wait below needs: the bound is not what is tested here.
    cmd.env("SEXTON_DATABASE__CONNECT_ATTEMPTS", "20");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::OBJECT_STORE_UNREACHABLE).await;
    assert_eq!(http_get(&address, "/readyz").await.map(|r| r.0), Some(503));

    // The store comes up: a real S3-compatible server on the port the worker retries.
    let binary = std::env::var("SEXTON_TEST_S3S_FS").unwrap_or_else(|_| {
        let home = std::env::var("CARGO_HOME")
            .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap()));
        format!("{home}/bin/s3s-fs")
    });
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir(data.path().join(BUCKET)).unwrap();
    let mut server = tokio::process::Command::new(&binary)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", backend::ACCESS_KEY])
        .args(["--secret-key", backend::SECRET_KEY])
        .arg(data.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| panic!("s3s-fs at {binary} (scripts/test.sh installs it): {err}"));
    poll_until(Duration::from_secs(60), || async {
        http_get(&address, "/readyz").await.map(|r| r.0) == Some(200)
    })
    .await;
    assert!(
        worker.saw(event::WORKER_STARTED),
        "the worker consumes its queues"
    );
    worker.stop().await;
    server.kill().await.unwrap();
}
