//! Configuration (OP-2): `config/default.toml` built in, a `--config` file over it, then
//! `SEXTON_<SECTION>__<SETTING>` environment variables; parsed once into typed settings and
//! validated together, so that every invalid value is reported at once.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Value};
use serde::Deserialize;

/// The defaults, one commented line per setting; also the list of every known setting.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of environment overrides; sections and settings are separated by a double underscore.
const ENV_PREFIX: &str = "SEXTON_";

/// Everything sexton is configured with, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub paths: PathSettings,
    pub schedule: ScheduleSettings,
    pub queue: QueueSettings,
    pub execution_details: ExecutionDetailsSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
}

#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub listen: std::net::SocketAddr,
    pub refresh_interval: Duration,
}

#[derive(Debug, Clone)]
pub struct ExecutionDetailsSettings {
    pub window_size: u32,
    pub owners_per_transaction: u32,
    pub transaction_target: Duration,
    pub hop_budget: Duration,
    pub owner_lock_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct DatabaseSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
    pub lock_timeout: Duration,
    pub connect_attempts: u32,
}

#[derive(Debug, Clone)]
pub struct PathSettings {
    pub output_root: PathBuf,
    pub attachments_root: PathBuf,
    pub artifacts_root: PathBuf,
    pub sessions_root: PathBuf,
    pub traces_root: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ScheduleSettings {
    pub cron: cron::Schedule,
    pub timezone: chrono_tz::Tz,
    pub catch_up: chrono::Duration,
}

#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// Empty when the name is to be derived from host and process.
    pub worker_name: String,
    pub poll_interval: Duration,
    pub concurrency: usize,
    pub heartbeat_interval: Duration,
    pub missed_heartbeats: u32,
    pub max_attempts: u32,
    pub retry_backoff: Duration,
    pub shutdown_grace: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct LogSettings {
    pub format: LogFormat,
    pub level: String,
}

/// One invalid setting: which, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub setting: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.message)
    }
}

/// Why configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {}: not found", .0.display())]
    FileNotFound(PathBuf),
    #[error("configuration could not be read: {0}")]
    Unreadable(#[source] Box<figment::Error>),
    #[error("invalid configuration ({} problem{}):\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, list(.0))]
    Invalid(Vec<Problem>),
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Settings {
    /// Loads defaults, then `file`, then the environment, and validates the result.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] lists every invalid or unknown setting at once.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::FileNotFound(path.to_owned()));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(
            Env::prefixed(ENV_PREFIX)
                .filter(|key| key.as_str().contains("__"))
                .split("__"),
        );
        Self::from_figment(&figment)
    }

    fn from_figment(figment: &Figment) -> Result<Self, ConfigError> {
        let defaults: Dict = Figment::from(Toml::string(DEFAULT_TOML))
            .extract()
            .map_err(|e| ConfigError::Unreadable(Box::new(e)))?;
        let merged: Dict = figment
            .extract()
            .map_err(|e| ConfigError::Unreadable(Box::new(e)))?;
        let mut problems = Vec::new();
        unknown_settings(&defaults, &merged, "", &mut problems);
        let raw: RawSettings = figment
            .extract()
            .map_err(|e| ConfigError::Unreadable(Box::new(e)))?;
        let settings = raw.validate(&mut problems);
        match settings {
            Some(settings) if problems.is_empty() => Ok(settings),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }
}

/// Every key present in `given` but absent from the defaults is a setting sexton does not know.
fn unknown_settings(defaults: &Dict, given: &Dict, prefix: &str, problems: &mut Vec<Problem>) {
    for (key, value) in given {
        let path = format!("{prefix}{key}");
        match (defaults.get(key), value) {
            (None, _) => problems.push(Problem {
                setting: path,
                message: "unknown setting (see config/default.toml for the settings sexton knows)"
                    .into(),
            }),
            (Some(Value::Dict(_, known)), Value::Dict(_, inner)) => {
                unknown_settings(known, inner, &format!("{path}."), problems)
            }
            (Some(Value::Dict(..)), _) => problems.push(Problem {
                setting: path,
                message: "expected a section (a table of settings)".into(),
            }),
            _ => {}
        }
    }
}

/// A leaf as given: either of the expected type or anything else, kept to be reported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Raw<T> {
    Typed(T),
    Other(Value),
}

#[derive(Debug, Deserialize)]
struct RawSettings {
    database: RawDatabase,
    paths: RawPaths,
    schedule: RawSchedule,
    queue: RawQueue,
    execution_details: RawExecutionDetails,
    http: RawHttp,
    log: RawLog,
}

#[derive(Debug, Deserialize)]
struct RawHttp {
    listen: Raw<String>,
    refresh_interval_ms: Raw<i64>,
}

#[derive(Debug, Deserialize)]
struct RawExecutionDetails {
    window_size: Raw<i64>,
    owners_per_transaction: Raw<i64>,
    transaction_target_ms: Raw<i64>,
    hop_budget_ms: Raw<i64>,
    owner_lock_timeout_ms: Raw<i64>,
}

#[derive(Debug, Deserialize)]
struct RawDatabase {
    max_connections: Raw<i64>,
    acquire_timeout_ms: Raw<i64>,
    statement_timeout_ms: Raw<i64>,
    lock_timeout_ms: Raw<i64>,
    connect_attempts: Raw<i64>,
}

#[derive(Debug, Deserialize)]
struct RawPaths {
    output_root: Raw<String>,
    attachments_root: Raw<String>,
    artifacts_root: Raw<String>,
    sessions_root: Raw<String>,
    traces_root: Raw<String>,
}

#[derive(Debug, Deserialize)]
struct RawSchedule {
    cron: Raw<String>,
    timezone: Raw<String>,
    catch_up_hours: Raw<i64>,
}

#[derive(Debug, Deserialize)]
struct RawQueue {
    worker_name: Raw<String>,
    poll_interval_ms: Raw<i64>,
    concurrency: Raw<i64>,
    heartbeat_interval_ms: Raw<i64>,
    missed_heartbeats: Raw<i64>,
    max_attempts: Raw<i64>,
    retry_backoff_ms: Raw<i64>,
    shutdown_grace_ms: Raw<i64>,
}

#[derive(Debug, Deserialize)]
struct RawLog {
    format: Raw<String>,
    level: Raw<String>,
}

/// Collects problems while turning raw leaves into typed values.
struct Check<'a> {
    problems: &'a mut Vec<Problem>,
}

impl Check<'_> {
    fn fail(&mut self, setting: &str, expected: &str, got: impl fmt::Display) {
        self.problems.push(Problem {
            setting: setting.to_owned(),
            message: format!("expected {expected}, got {got}"),
        });
    }

    /// An integer within `range`.
    fn int<T: TryFrom<i64>>(
        &mut self,
        setting: &str,
        raw: &Raw<i64>,
        range: std::ops::RangeInclusive<i64>,
        expected: &str,
    ) -> Option<T> {
        match raw {
            Raw::Typed(v) if range.contains(v) => T::try_from(*v).ok(),
            Raw::Typed(v) => {
                self.fail(setting, expected, v);
                None
            }
            Raw::Other(v) => {
                self.fail(setting, expected, shown(v));
                None
            }
        }
    }

    fn millis(&mut self, setting: &str, raw: &Raw<i64>) -> Option<Duration> {
        self.int(
            setting,
            raw,
            1..=86_400_000,
            "a positive number of milliseconds (at most one day)",
        )
        .map(Duration::from_millis)
    }

    /// A string that `parse` accepts.
    fn parsed<T>(
        &mut self,
        setting: &str,
        raw: &Raw<String>,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Option<T> {
        match raw {
            Raw::Typed(s) => match parse(s) {
                Some(v) => Some(v),
                None => {
                    self.fail(setting, expected, format!("{s:?}"));
                    None
                }
            },
            Raw::Other(v) => {
                self.fail(setting, expected, shown(v));
                None
            }
        }
    }

    fn path(&mut self, setting: &str, raw: &Raw<String>) -> Option<PathBuf> {
        self.parsed(setting, raw, "a non-empty path", |s| {
            (!s.trim().is_empty()).then(|| PathBuf::from(s))
        })
    }
}

fn shown(value: &Value) -> String {
    match value {
        Value::String(_, s) => format!("{s:?}"),
        other => serde_json::to_string(other).unwrap_or_else(|_| format!("{other:?}")),
    }
}

/// Parses a five-field cron expression (minute hour day month weekday) into a schedule.
pub fn parse_cron(expr: &str) -> Option<cron::Schedule> {
    if expr.split_whitespace().count() != 5 {
        return None;
    }
    cron::Schedule::from_str(&format!("0 {expr}")).ok()
}

impl RawSettings {
    fn validate(self, problems: &mut Vec<Problem>) -> Option<Settings> {
        let mut c = Check { problems };
        let d = &self.database;
        let max_connections = c.int(
            "database.max_connections",
            &d.max_connections,
            1..=100,
            "an integer from 1 to 100",
        );
        let acquire_timeout = c.millis("database.acquire_timeout_ms", &d.acquire_timeout_ms);
        let statement_timeout = c.millis("database.statement_timeout_ms", &d.statement_timeout_ms);
        let lock_timeout = c.millis("database.lock_timeout_ms", &d.lock_timeout_ms);
        let connect_attempts = c.int(
            "database.connect_attempts",
            &d.connect_attempts,
            1..=1000,
            "an integer from 1 to 1000",
        );
        if let (Some(lock), Some(statement)) = (lock_timeout, statement_timeout)
            && lock > statement
        {
            c.fail(
                "database.lock_timeout_ms",
                "at most database.statement_timeout_ms",
                lock.as_millis(),
            );
        }

        let p = &self.paths;
        let output_root = c.path("paths.output_root", &p.output_root);
        let attachments_root = c.path("paths.attachments_root", &p.attachments_root);
        let artifacts_root = c.path("paths.artifacts_root", &p.artifacts_root);
        let sessions_root = c.path("paths.sessions_root", &p.sessions_root);
        let traces_root = c.path("paths.traces_root", &p.traces_root);
        if let (Some(attachments), Some(artifacts)) = (&attachments_root, &artifacts_root)
            && overlap(attachments, artifacts)
        {
            c.fail(
                "paths.attachments_root",
                "a directory that neither contains nor lies inside paths.artifacts_root \
                 (generated artifacts have no TTL, AT-1)",
                format!("{:?} and {:?}", attachments, artifacts),
            );
        }

        let s = &self.schedule;
        let cron = c.parsed(
            "schedule.cron",
            &s.cron,
            "a five-field cron expression such as \"0 3 * * *\"",
            parse_cron,
        );
        let timezone = c.parsed(
            "schedule.timezone",
            &s.timezone,
            "an IANA time zone such as \"UTC\" or \"Europe/Berlin\"",
            |s| s.parse().ok(),
        );
        let catch_up = c
            .int::<i64>(
                "schedule.catch_up_hours",
                &s.catch_up_hours,
                0..=24 * 30,
                "a number of hours from 0 to 720",
            )
            .map(chrono::Duration::hours);

        let q = &self.queue;
        let worker_name = c.parsed(
            "queue.worker_name",
            &q.worker_name,
            "empty or a name of 1-100 letters, digits, '-', '_' or '.'",
            |s| {
                (s.len() <= 100
                    && s.chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)))
                .then(|| s.to_owned())
            },
        );
        let poll_interval = c.millis("queue.poll_interval_ms", &q.poll_interval_ms);
        let concurrency = c.int(
            "queue.concurrency",
            &q.concurrency,
            1..=64,
            "an integer from 1 to 64",
        );
        let heartbeat_interval = c.millis("queue.heartbeat_interval_ms", &q.heartbeat_interval_ms);
        let missed_heartbeats = c.int(
            "queue.missed_heartbeats",
            &q.missed_heartbeats,
            1..=1000,
            "an integer from 1 to 1000",
        );
        let max_attempts = c.int(
            "queue.max_attempts",
            &q.max_attempts,
            1..=100,
            "an integer from 1 to 100",
        );
        let retry_backoff = c.millis("queue.retry_backoff_ms", &q.retry_backoff_ms);
        let shutdown_grace = c.millis("queue.shutdown_grace_ms", &q.shutdown_grace_ms);

        let h = &self.http;
        let listen = c.parsed(
            "http.listen",
            &h.listen,
            "a socket address such as \"127.0.0.1:9187\"",
            |s| s.parse().ok(),
        );
        let refresh_interval = c.millis("http.refresh_interval_ms", &h.refresh_interval_ms);

        let e = &self.execution_details;
        let window_size = c.int(
            "execution_details.window_size",
            &e.window_size,
            1..=100_000,
            "an integer from 1 to 100000",
        );
        let owners_per_transaction = c.int(
            "execution_details.owners_per_transaction",
            &e.owners_per_transaction,
            1..=10_000,
            "an integer from 1 to 10000",
        );
        let transaction_target = c.millis(
            "execution_details.transaction_target_ms",
            &e.transaction_target_ms,
        );
        let hop_budget = c.millis("execution_details.hop_budget_ms", &e.hop_budget_ms);
        let owner_lock_timeout = c.millis(
            "execution_details.owner_lock_timeout_ms",
            &e.owner_lock_timeout_ms,
        );

        let l = &self.log;
        let format = c.parsed(
            "log.format",
            &l.format,
            "\"text\" or \"json\"",
            |s| match s {
                "text" => Some(LogFormat::Text),
                "json" => Some(LogFormat::Json),
                _ => None,
            },
        );
        let level = c.parsed(
            "log.level",
            &l.level,
            "a tracing filter directive such as \"info\" or \"info,sexton=debug\"",
            |s| {
                tracing_subscriber::EnvFilter::try_new(s)
                    .ok()
                    .map(|_| s.to_owned())
            },
        );

        Some(Settings {
            database: DatabaseSettings {
                max_connections: max_connections?,
                acquire_timeout: acquire_timeout?,
                statement_timeout: statement_timeout?,
                lock_timeout: lock_timeout?,
                connect_attempts: connect_attempts?,
            },
            paths: PathSettings {
                output_root: output_root?,
                attachments_root: attachments_root?,
                artifacts_root: artifacts_root?,
                sessions_root: sessions_root?,
                traces_root: traces_root?,
            },
            schedule: ScheduleSettings {
                cron: cron?,
                timezone: timezone?,
                catch_up: catch_up?,
            },
            queue: QueueSettings {
                worker_name: worker_name?,
                poll_interval: poll_interval?,
                concurrency: concurrency?,
                heartbeat_interval: heartbeat_interval?,
                missed_heartbeats: missed_heartbeats?,
                max_attempts: max_attempts?,
                retry_backoff: retry_backoff?,
                shutdown_grace: shutdown_grace?,
            },
            http: HttpSettings {
                listen: listen?,
                refresh_interval: refresh_interval?,
            },
            execution_details: ExecutionDetailsSettings {
                window_size: window_size?,
                owners_per_transaction: owners_per_transaction?,
                transaction_target: transaction_target?,
                hop_budget: hop_budget?,
                owner_lock_timeout: owner_lock_timeout?,
            },
            log: LogSettings {
                format: format?,
                level: level?,
            },
        })
    }
}

/// Whether one directory contains the other (compared lexically, and canonically where both
/// exist, so that a symlinked root is caught too).
fn overlap(a: &Path, b: &Path) -> bool {
    let lexical = a.starts_with(b) || b.starts_with(a);
    let canonical = match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a.starts_with(&b) || b.starts_with(&a),
        _ => false,
    };
    lexical || canonical
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml: &str) -> Result<Settings, ConfigError> {
        Settings::from_figment(&Figment::from(Toml::string(DEFAULT_TOML)).merge(Toml::string(toml)))
    }

    #[test]
    fn op2_defaults_are_valid() {
        let settings = load("").expect("defaults load");
        assert_eq!(settings.database.lock_timeout, Duration::from_secs(2));
        assert_eq!(settings.schedule.timezone, chrono_tz::UTC);
    }

    #[test]
    fn op2_every_problem_is_reported_at_once() {
        let err = load(
            "[database]\nmax_connections = 0\n[schedule]\ncron = \"every night\"\n\
             [queue]\nconcurrency = \"lots\"\nbogus = 1\n",
        )
        .unwrap_err();
        let ConfigError::Invalid(problems) = err else {
            panic!("expected Invalid, got {err}");
        };
        let settings: Vec<_> = problems.iter().map(|p| p.setting.as_str()).collect();
        assert_eq!(
            settings,
            [
                "queue.bogus",
                "database.max_connections",
                "schedule.cron",
                "queue.concurrency"
            ]
        );
        assert!(problems[3].message.contains("\"lots\""));
    }

    #[test]
    fn at1_overlapping_attachments_and_artifacts_are_refused() {
        let err = load("[paths]\nattachments_root = \"/srv/a\"\nartifacts_root = \"/srv/a/gen\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("paths.attachments_root"), "{err}");
    }
}
