//! Worker processes for the fleet tests: spawned with their log lines collected and read as
//! events (`sexton::event`), polled with a hang guard, scraped over HTTP.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sexton::queue;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// A worker process logging JSON, whose lines are collected as they come, and its events (the
/// lines with an `event` field, parsed) beside them.
pub struct Proc {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
    events: Arc<Mutex<Vec<serde_json::Value>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .env("SEXTON_LOG__FORMAT", "json")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let events: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let stderr = child.stderr.take().unwrap();
        let (line_sink, event_sink) = (lines.clone(), events.clone());
        let reader = tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Some(event) = event(&line) {
                    event_sink.lock().unwrap().push(event);
                }
                line_sink.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            lines,
            events,
            reader,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// Whether the worker has logged the event `name` (a `sexton::event` constant).
    pub fn saw(&self, name: &str) -> bool {
        self.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e["event"] == name)
    }

    /// Waits until the worker logs the event `name` (a hang guard bounds the wait).
    /// On the guard, it fails with the worker's last lines.
    pub async fn wait_for(&self, name: &str) {
        self.wait_until(name, |e| e["event"] == name).await;
    }

    /// Waits until the worker logs the event `name` of the job kind `job`.
    pub async fn wait_for_job(&self, name: &str, job: &str) {
        self.wait_until(&format!("{name} of {job}"), |e| {
            e["event"] == name && e["job"] == job
        })
        .await;
    }

    async fn wait_until(&self, what: &str, seen: impl Fn(&serde_json::Value) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !self.events.lock().unwrap().iter().any(&seen) {
            if tokio::time::Instant::now() >= deadline {
                let lines = self.lines.lock().unwrap();
                let tail = &lines[lines.len().saturating_sub(40)..];
                panic!("the worker never logged {what:?} within 60 s; its last lines: {tail:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn sigterm(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit by itself (a hang guard bounds the wait) and returns its
    /// exit status and every line it logged.
    pub async fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, Vec<String>) {
        let status = super::wait(&mut self.child, limit).await;
        self.reader.await.unwrap();
        let lines = self.lines.lock().unwrap().clone();
        (status, lines)
    }

    /// SIGKILL: the process ends wherever it is, with no chance to clean up.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
        self.reader.await.unwrap();
    }

    pub async fn stop(mut self) -> Vec<String> {
        self.sigterm();
        let status = super::wait(&mut self.child, Duration::from_secs(60)).await;
        assert!(status.success(), "worker exited with {status}");
        // The reader ends at the end of stderr: every line is in.
        self.reader.await.unwrap();
        self.lines.lock().unwrap().clone()
    }
}

/// A JSON log line with an `event` field, parsed.
fn event(line: &str) -> Option<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    value["event"].is_string().then_some(value)
}

/// The events named `name` (a `sexton::event` constant) among a [`Proc`]'s log lines.
pub fn events<'a>(
    lines: &'a [String],
    name: &'a str,
) -> impl Iterator<Item = serde_json::Value> + 'a {
    lines
        .iter()
        .filter_map(|line| event(line))
        .filter(move |e| e["event"] == name)
}

/// Re-checks `condition` until it holds; panics after `limit` (a hang guard, not a timing test).
pub async fn poll_until<F, Fut>(limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A test fleet's heartbeat. Its rescue bound, 3 s, is a second more than the least the
/// configuration accepts at this interval: a second for a loaded machine.
pub const HEARTBEAT_MS: u64 = 500;
pub const MISSED_HEARTBEATS: u64 = 6;

/// The test fleet's rescue bound, in seconds.
pub const RESCUE_BOUND_SECS: f64 = (HEARTBEAT_MS * MISSED_HEARTBEATS) as f64 / 1000.0;

/// A test fleet worker's shutdown grace (FL-5).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A `LIKE` pattern for the names the worker process `pid` registers and locks jobs under.
pub fn worker_like(pid: u32) -> String {
    format!("%-{pid}.%")
}

pub fn fleet_worker(url: &str, dir: &std::path::Path) -> Command {
    let mut cmd = super::sexton(url, dir);
    cmd.arg("worker")
        .env(
            "SEXTON_QUEUE__HEARTBEAT_INTERVAL_MS",
            HEARTBEAT_MS.to_string(),
        )
        .env(
            "SEXTON_QUEUE__MISSED_HEARTBEATS",
            MISSED_HEARTBEATS.to_string(),
        )
        .env(
            "SEXTON_QUEUE__SHUTDOWN_GRACE_MS",
            SHUTDOWN_GRACE.as_millis().to_string(),
        );
    cmd
}

/// A [`fleet_worker`] serving its HTTP endpoints on a free local port, and that address.
pub fn serving_fleet_worker(url: &str, dir: &std::path::Path) -> (Command, String) {
    let address = format!("127.0.0.1:{}", free_port());
    let mut cmd = fleet_worker(url, dir);
    cmd.env("SEXTON_HTTP__LISTEN", &address);
    (cmd, address)
}

pub async fn wait_until_idle(pool: &PgPool) {
    poll_until(Duration::from_secs(180), || async {
        queue::counts(pool).await.unwrap().idle()
    })
    .await;
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.0 GET: status and body, or None if nothing answers.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// The value of `series` (a metric name with its labels) on a Prometheus page.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// A worker's `/metrics` page.
pub async fn scrape(address: &str) -> String {
    let (status, body) = http_get(address, "/metrics").await.expect("metrics answer");
    assert_eq!(status, 200);
    body
}

/// `sexton status --json`, parsed.
pub async fn status_json(url: &str, dir: &std::path::Path) -> serde_json::Value {
    let output = super::sexton(url, dir)
        .args(["status", "--json", "--all"])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}
