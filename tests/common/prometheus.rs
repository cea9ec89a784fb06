//! A real Prometheus (Debian's `/usr/bin/prometheus`) scraping a worker as a platform's would —
//! `job_name: sexton`, the shipped alert rules loaded — and read back through its HTTP API.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::process::{free_port, http_get, poll_until};

/// The shipped alert rules.
pub fn alert_rules() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yml")
}

/// The expression of alert `name` in the shipped rules, as written there.
pub fn alert_expr(name: &str) -> String {
    let rules = std::fs::read_to_string(alert_rules()).unwrap();
    let start = format!("- alert: {name}\n");
    let rule = &rules[rules
        .find(&start)
        .unwrap_or_else(|| panic!("no alert {name} in alerts.yml"))
        + start.len()..];
    let expr = rule
        .lines()
        .take_while(|l| !l.trim_start().starts_with("- alert:"))
        .find_map(|l| l.trim().strip_prefix("expr:"))
        .unwrap_or_else(|| panic!("alert {name} has no expr"));
    expr.trim().to_owned()
}

pub struct Prometheus {
    server: Child,
    address: String,
}

impl Prometheus {
    /// Scrapes `target` every second as `job_name: sexton`, evaluating the shipped rules every
    /// second; its data lives under `dir`.
    pub fn start(dir: &Path, target: &str) -> Self {
        let prometheus = Path::new("/usr/bin/prometheus");
        assert!(
            prometheus.exists(),
            "Debian's prometheus package is needed (scripts/test.sh installs it)"
        );
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: sexton\n    static_configs:\n      - targets: ['{target}']\n",
                rules = alert_rules().display()
            ),
        )
        .unwrap();
        let address = format!("127.0.0.1:{}", free_port());
        let server = Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { server, address }
    }

    /// The `data` of a successful API answer to `path` (with its query string encoded), or None
    /// while Prometheus does not answer.
    pub async fn api(&self, path: &str, params: &[(&str, &str)]) -> Option<serde_json::Value> {
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        let (status, body) =
            http_get(&self.address, &format!("{path}?{}", query.join("&"))).await?;
        let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
        assert_eq!(status, 200, "{path} {params:?}: {answer}");
        assert_eq!(answer["status"], "success", "{path} {params:?}: {answer}");
        Some(answer["data"].clone())
    }

    /// An instant query's result vector (`[]` while Prometheus does not answer).
    pub async fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/query", &[("query", promql)]).await;
        match data {
            Some(data) => {
                assert_eq!(data["resultType"], "vector", "{promql}: {data}");
                data["result"].as_array().unwrap().clone()
            }
            None => Vec::new(),
        }
    }

    /// Whether `promql` returns data within `limit` (re-queried until it does: a hang guard).
    pub async fn shows(&self, promql: &str, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if !self.query(promql).await.is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every series matching `selector`.
    pub async fn series(&self, selector: &str) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/series", &[("match[]", selector)]).await;
        data.map(|d| d.as_array().unwrap().clone())
            .unwrap_or_default()
    }

    /// The alerts pending or firing.
    pub async fn alerts(&self) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/alerts", &[]).await.unwrap();
        data["alerts"].as_array().unwrap().clone()
    }

    /// Waits until every rule group of the shipped rules has been evaluated, healthy, after
    /// `after` (Unix seconds, as Prometheus reports them), and returns the rules.
    pub async fn rules_evaluated_after(&self, after: f64) -> Vec<serde_json::Value> {
        poll_until(Duration::from_secs(30), || async {
            let Some(data) = self.api("/api/v1/rules", &[]).await else {
                return false;
            };
            let groups = data["groups"].as_array().unwrap();
            !groups.is_empty()
                && groups.iter().all(|g| {
                    let at = g["lastEvaluation"].as_str().unwrap();
                    at.parse::<chrono::DateTime<chrono::Utc>>()
                        .is_ok_and(|at| at.timestamp_millis() as f64 / 1000.0 > after)
                })
        })
        .await;
        let data = self.api("/api/v1/rules", &[]).await.unwrap();
        let rules: Vec<serde_json::Value> = data["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        for rule in &rules {
            assert_eq!(rule["health"], "ok", "{rule}");
        }
        rules
    }

    pub async fn stop(mut self) {
        self.server.kill().await.unwrap();
    }
}

/// Percent-encodes a query-string value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The time of an instant query's sample (Unix seconds).
pub fn sample_time(sample: &serde_json::Value) -> f64 {
    sample["value"][0].as_f64().unwrap()
}
