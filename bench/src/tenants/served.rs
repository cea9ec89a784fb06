//! The status page after a night (OP-6: under 200 ms at 1 M accounts): one fleet worker
//! (`sexton worker`) serving HTTP on a free loopback port over the night's database, asked for
//! `/status` and `/status.json` a fixed number of times each once it is idle, then stopped by
//! SIGTERM as a fleet stops it.
//!
//! A fleet worker pushes work of its own on start: the catch-up of the last missed slot — off
//! here (`schedule.catch_up_hours = 0`; it would be the night's own slot, found done anyway) —
//! and the current period of each kind on a cadence of its own (erasure, a global pass that
//! finds no request). The requests start once that pass has finished and the queue is idle, so
//! that they read the night's end state with no hop running beside them. The worker's gauge
//! refresh (`http.refresh_interval_ms`) stays on, as in a fleet.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::disk;
use crate::sexton::sexton_env;

/// Requests timed per path, after one untimed warm-up request.
const REQUESTS: usize = 20;

/// The longest the worker may take to answer `/healthz`, and then to finish its own pass.
const START_LIMIT: Duration = Duration::from_secs(300);

/// The worker's two pages, each asked [`REQUESTS`] times.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Served {
    pub status: Answers,
    pub status_json: Answers,
    /// The 1-minute load average before and after the requests.
    pub load: String,
}

/// One path's answers: the time from connecting to the last byte of the body (HTTP/1.0, a
/// connection per request, over loopback) and the body's size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answers {
    pub requests: usize,
    pub median_ms: f64,
    pub max_ms: f64,
    pub bytes: u64,
}

impl Answers {
    /// Median / max ms and the body in KB.
    pub fn cell(&self) -> String {
        format!(
            "{:.0} / {:.0} / {:.1}",
            self.median_ms,
            self.max_ms,
            self.bytes as f64 / 1024.0
        )
    }
}

/// Starts `binary worker` on `db` serving HTTP, waits until it answers and is idle, asks both
/// pages, and stops it; its log (warnings and errors) goes to `log`.
pub async fn served(
    binary: &Path,
    db: &str,
    roots: &Path,
    pool: &PgPool,
    log: &Path,
) -> anyhow::Result<Served> {
    let address = format!("127.0.0.1:{}", free_port()?);
    let mut worker = tokio::process::Command::new(binary)
        .arg("worker")
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, roots))
        .env("SEXTON_HTTP__LISTEN", &address)
        .env("SEXTON_SCHEDULE__CATCH_UP_HOURS", "0")
        .env("SEXTON_LOG__LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true)
        .spawn()?;
    let pid = worker.id().context("the worker has no process id")?;
    let deadline = Instant::now() + START_LIMIT;
    let failed = |what: &str| format!("{what} (its log: {})", log.display());
    while get(&address, "/healthz").await.map(|a| a.0) != Some(200) {
        if let Some(status) = worker.try_wait()? {
            bail!(failed(&format!("the serving worker exited with {status}")));
        }
        if Instant::now() > deadline {
            bail!(failed("the serving worker did not answer /healthz"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while !idle(pool).await? {
        if Instant::now() > deadline {
            bail!(failed(
                "the serving worker did not finish its erasure period"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let load_before = disk::load_average();
    let status = answers(&address, "/status").await?;
    let status_json = answers(&address, "/status.json").await?;
    let load = format!("{load_before} / {}", disk::load_average());
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    if !stopped.success() {
        bail!("kill -TERM {pid} failed");
    }
    let exit = tokio::time::timeout(Duration::from_secs(60), worker.wait())
        .await
        .map_err(|_| anyhow::anyhow!(failed("the serving worker did not stop within 60 s")))??;
    if !exit.success() {
        bail!(failed(&format!("the serving worker exited with {exit}")));
    }
    Ok(Served {
        status,
        status_json,
        load,
    })
}

/// The worker's own pass (its erasure period) has finished and no sexton job is pending or
/// running.
async fn idle(pool: &PgPool) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sexton.fan_outs
                        WHERE job = 'erasure' AND finished_at IS NOT NULL)
            AND NOT EXISTS (SELECT 1 FROM apalis.jobs
                            WHERE job_type LIKE 'sexton.%'
                              AND status IN ('Pending', 'Queued', 'Running'))",
    )
    .fetch_one(pool)
    .await?)
}

/// `path` asked once untimed, then [`REQUESTS`] times; each must answer 200.
async fn answers(address: &str, path: &str) -> anyhow::Result<Answers> {
    let mut ms = Vec::with_capacity(REQUESTS);
    let mut bytes = 0;
    for i in 0..=REQUESTS {
        let started = Instant::now();
        let (code, body) = get(address, path)
            .await
            .with_context(|| format!("GET {path}: no answer"))?;
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        if code != 200 {
            bail!(
                "GET {path}: {code}: {}",
                String::from_utf8_lossy(&body[..body.len().min(500)])
            );
        }
        if i > 0 {
            ms.push(elapsed);
            bytes = body.len() as u64;
        }
    }
    ms.sort_by(f64::total_cmp);
    Ok(Answers {
        requests: REQUESTS,
        median_ms: (ms[(REQUESTS - 1) / 2] + ms[REQUESTS / 2]) / 2.0,
        max_ms: ms[REQUESTS - 1],
        bytes,
    })
}

/// A plain HTTP/1.0 GET (the server closes the connection after its answer): the status code
/// and the body, or `None` when nothing answers.
async fn get(address: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.ok()?;
    let head_end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&response[..head_end]).ok()?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, response[head_end + 4..].to_vec()))
}

/// A loopback port free at the moment of asking.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
