//! Configuration (OP-2): `config/default.toml` built in, a `--config` file over it, then
//! `SEXTON_<SECTION>__<SETTING>` environment variables; parsed once into typed settings and
//! validated together, so that every invalid value is reported at once.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Value};
use serde::Deserialize;
pub use sexton_jobs::files::PathSettings;
use sexton_jobs::health::HealthSettings;
pub use sexton_jobs::settings::Problem;
use sexton_jobs::settings::{Check, Raw};

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
    pub http: HttpSettings,
    pub log: LogSettings,
    /// Each job kind's own section, parsed by the job.
    pub jobs: JobSettings,
    /// Database health indicators every hop checks (`[health]`).
    pub health: HealthSettings,
}

/// A job kind's settings section, as configuration reads it: the registry hands one per kind
/// to [`Settings::load`], so that configuration never depends on the jobs themselves.
pub trait Section: Sync {
    /// The job it belongs to.
    fn job(&self) -> &'static str;
    /// The section's name in the configuration file.
    fn section(&self) -> &'static str;
    /// Connections one hop of this job holds at once.
    fn connections(&self) -> u32;
    /// Reads the section; problems go to `check`.
    fn parse(
        &self,
        section: &serde_json::Value,
        paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<Arc<dyn AnySettings>>;
}

/// A job's parsed settings, whatever their type.
pub trait AnySettings: Any + fmt::Debug + Send + Sync {}

impl<T: Any + fmt::Debug + Send + Sync> AnySettings for T {}

/// Every job kind's settings, by job name.
#[derive(Debug, Clone, Default)]
pub struct JobSettings(BTreeMap<&'static str, Arc<dyn AnySettings>>);

impl JobSettings {
    /// The settings of `job`, of the type its kind parses them into.
    ///
    /// # Panics
    /// When `job` was not loaded with [`Settings::load`] or `T` is not its settings type: a
    /// registration bug, not a configuration error.
    pub fn get<T: Any>(&self, job: &str) -> &T {
        let settings: &dyn Any = &**self
            .0
            .get(job)
            .unwrap_or_else(|| panic!("no settings were loaded for job {job}"));
        settings
            .downcast_ref()
            .unwrap_or_else(|| panic!("the settings of job {job} have another type"))
    }

    /// Whether settings of `job` were loaded.
    pub fn contains(&self, job: &str) -> bool {
        self.0.contains_key(job)
    }

    /// Replaces the settings of `job` (tests and tools that adjust one job).
    pub fn set<T: AnySettings>(&mut self, job: &'static str, settings: T) {
        self.0.insert(job, Arc::new(settings));
    }
}

/// Connections a worker holds besides its hops and its queues: the LISTEN connection that wakes
/// the queues, the schedule and its fan-out, and the gauges.
pub const FIXED_CONNECTIONS: u32 = 3;

/// Connections each queue consumer may hold at once for the queue's own bookkeeping (fetch,
/// heartbeat, acknowledgements): one each, every consumer at the same moment when the database
/// comes back after an outage and they all retry at once (ER-2).
pub const CONNECTIONS_PER_QUEUE: u32 = 1;

#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub listen: std::net::SocketAddr,
    pub refresh_interval: Duration,
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
    pub finished_job_retention: chrono::Duration,
    /// Accounts a slot's fan-out looks at per discovery statement, and so first hops it
    /// pushes per statement at most (FL-8).
    pub fan_out_batch: u32,
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
    /// Loads defaults, then `file`, then the environment, and validates the result, with the
    /// job sections of `jobs` (the registry's kinds).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] lists every invalid or unknown setting at once.
    pub fn load(file: Option<&Path>, jobs: &[&dyn Section]) -> Result<Self, ConfigError> {
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
        Self::from_figment(&figment, jobs)
    }

    fn from_figment(figment: &Figment, jobs: &[&dyn Section]) -> Result<Self, ConfigError> {
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
        let settings = raw
            .validate(&mut problems)
            .and_then(|settings| with_jobs(settings, &merged, jobs, &mut problems));
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

#[derive(Debug, Deserialize)]
struct RawSettings {
    database: RawDatabase,
    paths: RawPaths,
    schedule: RawSchedule,
    queue: RawQueue,
    http: RawHttp,
    log: RawLog,
}

#[derive(Debug, Deserialize)]
struct RawHttp {
    listen: Raw<String>,
    refresh_interval_ms: Raw<i64>,
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
    finished_job_retention_days: Raw<i64>,
    fan_out_batch: Raw<i64>,
}

#[derive(Debug, Deserialize)]
struct RawLog {
    format: Raw<String>,
    level: Raw<String>,
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
        let mut c = Check::new(problems);
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
        if let (Some(traces), Some(artifacts)) = (&traces_root, &artifacts_root)
            && overlap(traces, artifacts)
        {
            c.fail(
                "paths.traces_root",
                "a directory that neither contains nor lies inside paths.artifacts_root \
                 (generated artifacts have no TTL)",
                format!("{:?} and {:?}", traces, artifacts),
            );
        }
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
            "a five-field cron expression that fires, such as \"0 3 * * *\"",
            |expr| parse_cron(expr).filter(|cron| cron.upcoming(chrono::Utc).next().is_some()),
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
        if let (Some(interval), Some(missed)) = (heartbeat_interval, missed_heartbeats) {
            // apalis-postgres counts a worker's silence in whole seconds, rounded down, and
            // stamps a new worker's registration in whole seconds too, so up to a second old
            // before its first heartbeat, one interval later. A shorter bound takes running jobs
            // from live workers: under one second it is zero, and every heartbeat puts every
            // running job of its queue back, its own too.
            let bound = interval * missed;
            let counted = Duration::from_secs(bound.as_secs());
            let least = interval * 2 + Duration::from_secs(1);
            if counted < least {
                let seconds = least.as_millis().div_ceil(1000);
                c.fail(
                    "queue.missed_heartbeats",
                    &format!(
                        "a rescue bound (queue.heartbeat_interval_ms x this, counted in whole \
                         seconds, rounded down) of at least two heartbeats and a second, so \
                         {seconds} s: {} or more at {} ms",
                        (seconds * 1000).div_ceil(interval.as_millis()),
                        interval.as_millis()
                    ),
                    format!(
                        "{missed} x {} ms = {} ms, counted as {} s",
                        interval.as_millis(),
                        bound.as_millis(),
                        counted.as_secs()
                    ),
                );
            }
        }
        let max_attempts = c.int(
            "queue.max_attempts",
            &q.max_attempts,
            1..=100,
            "an integer from 1 to 100",
        );
        let fan_out_batch = c.int(
            "queue.fan_out_batch",
            &q.fan_out_batch,
            1..=100_000,
            "an integer from 1 to 100000",
        );
        let retry_backoff = c.millis("queue.retry_backoff_ms", &q.retry_backoff_ms);
        let shutdown_grace = c.millis("queue.shutdown_grace_ms", &q.shutdown_grace_ms);
        let finished_job_retention = c.finished_job_retention(&q.finished_job_retention_days);
        if let (Some(catch_up), Some(retention)) = (catch_up, finished_job_retention)
            && catch_up >= retention
        {
            c.fail(
                "schedule.catch_up_hours",
                &format!(
                    "fewer hours than queue.finished_job_retention_days keeps slots ({} h)",
                    retention.num_hours()
                ),
                catch_up.num_hours(),
            );
        }

        let h = &self.http;
        let listen = c.parsed(
            "http.listen",
            &h.listen,
            "a socket address such as \"127.0.0.1:9187\"",
            |s| s.parse().ok(),
        );
        let refresh_interval = c.millis("http.refresh_interval_ms", &h.refresh_interval_ms);

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
                finished_job_retention: finished_job_retention?,
                fan_out_batch: fan_out_batch?,
            },
            http: HttpSettings {
                listen: listen?,
                refresh_interval: refresh_interval?,
            },
            log: LogSettings {
                format: format?,
                level: level?,
            },
            jobs: JobSettings::default(),
            health: HealthSettings::OFF,
        })
    }
}

/// Reads every job's section and checks that the pool holds what the jobs need at once.
fn with_jobs(
    mut settings: Settings,
    merged: &Dict,
    jobs: &[&dyn Section],
    problems: &mut Vec<Problem>,
) -> Option<Settings> {
    let mut check = Check::new(problems);
    let mut parsed = JobSettings::default();
    for job in jobs {
        let section = merged
            .get(job.section())
            .map(|value| serde_json::to_value(value).unwrap_or_default())
            .unwrap_or_else(|| serde_json::json!({}));
        if let Some(settings) = job.parse(&section, &settings.paths, &mut check) {
            parsed.0.insert(job.job(), settings);
        }
    }
    // FL-6: no hop may fail for want of a connection. Hops of every queue together are bounded
    // by queue.concurrency, and the widest hop sets what each may hold.
    let widest = jobs.iter().map(|j| j.connections()).max().unwrap_or(1);
    // Every job kind's queue and the nightly one.
    let queues = jobs.len() as u64 + 1;
    let bookkeeping = queues * u64::from(CONNECTIONS_PER_QUEUE);
    let needed = settings.queue.concurrency as u64 * u64::from(widest)
        + u64::from(FIXED_CONNECTIONS)
        + bookkeeping;
    if u64::from(settings.database.max_connections) < needed {
        check.fail(
            "database.max_connections",
            &format!(
                "at least queue.concurrency ({}) x {widest} connections per hop + \
                 {FIXED_CONNECTIONS} for the listener, schedule and gauges + {bookkeeping} for \
                 the {queues} queues' bookkeeping = {needed}; raise it or lower \
                 queue.concurrency",
                settings.queue.concurrency
            ),
            settings.database.max_connections,
        );
    }
    settings.jobs = parsed;
    let health = merged
        .get("health")
        .map(|value| serde_json::to_value(value).unwrap_or_default())
        .unwrap_or_else(|| serde_json::json!({}));
    settings.health = sexton_jobs::health::settings(&health, &mut check)?;
    (parsed_all(jobs, &settings.jobs)).then_some(settings)
}

fn parsed_all(jobs: &[&dyn Section], parsed: &JobSettings) -> bool {
    jobs.iter().all(|job| parsed.contains(job.job()))
}

impl Settings {
    /// Refuses file roots that do not exist or are not directories (OP-2, ER-3): under a
    /// missing root every file would look "already deleted". For the commands that remove files.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming every such root.
    pub fn check_roots(&self) -> Result<(), ConfigError> {
        let p = &self.paths;
        let problems: Vec<Problem> = [
            ("paths.output_root", &p.output_root),
            ("paths.attachments_root", &p.attachments_root),
            ("paths.artifacts_root", &p.artifacts_root),
            ("paths.sessions_root", &p.sessions_root),
            ("paths.traces_root", &p.traces_root),
        ]
        .into_iter()
        .filter_map(|(setting, path)| {
            let why = match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => return None,
                Ok(_) => "not a directory".to_owned(),
                Err(err) => err.to_string(),
            };
            Some(Problem {
                setting: setting.to_owned(),
                message: format!("expected an existing directory, got {path:?} ({why})"),
            })
        })
        .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
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
        Settings::from_figment(
            &Figment::from(Toml::string(DEFAULT_TOML)).merge(Toml::string(toml)),
            &[],
        )
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
    fn fl6_a_pool_too_small_for_the_hops_is_refused_naming_both_settings() {
        let err = load("[database]\nmax_connections = 5\n[queue]\nconcurrency = 2\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("database.max_connections"), "{text}");
        assert!(text.contains("queue.concurrency (2)"), "{text}");
        assert!(load("[database]\nmax_connections = 6\n[queue]\nconcurrency = 2\n").is_ok());
    }

    #[test]
    fn op2_a_schedule_that_never_fires_is_refused() {
        let err = load("[schedule]\ncron = \"0 3 31 2 *\"\n").unwrap_err();
        assert!(err.to_string().contains("schedule.cron"), "{err}");
        assert!(load("[schedule]\ncron = \"0 3 29 2 *\"\n").is_ok());
    }

    #[test]
    fn op2_a_missing_root_or_a_file_as_root_is_refused_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let mut settings = load("").unwrap();
        for root in ["outputs", "attachments", "artifacts", "sessions", "traces"] {
            std::fs::create_dir(dir.path().join(root)).unwrap();
        }
        settings.paths = PathSettings {
            output_root: dir.path().join("gone"),
            attachments_root: dir.path().join("attachments"),
            artifacts_root: dir.path().join("artifacts"),
            sessions_root: file.clone(),
            traces_root: dir.path().join("traces"),
        };
        let text = settings.check_roots().unwrap_err().to_string();
        assert!(text.contains("paths.output_root"), "{text}");
        assert!(
            text.contains("paths.sessions_root") && text.contains("not a directory"),
            "{text}"
        );
        assert!(!text.contains("paths.traces_root"), "{text}");
        settings.paths.output_root = dir.path().join("outputs");
        settings.paths.sessions_root = dir.path().join("sessions");
        assert!(settings.check_roots().is_ok());
    }

    #[test]
    fn fl4_a_rescue_bound_under_two_heartbeats_and_a_second_in_whole_seconds_is_refused() {
        let queue = |interval: u32, missed: u32| {
            load(&format!(
                "[queue]\nheartbeat_interval_ms = {interval}\nmissed_heartbeats = {missed}\n"
            ))
        };
        let text = queue(300, 2).unwrap_err().to_string();
        assert!(text.contains("queue.missed_heartbeats"), "{text}");
        assert!(text.contains("so 2 s: 7 or more at 300 ms"), "{text}");
        assert!(
            text.contains("2 x 300 ms = 600 ms, counted as 0 s"),
            "{text}"
        );
        assert!(queue(300, 7).is_ok());
        assert!(queue(300, 6).is_err());
        // 1 s: a worker registered in the second's last moment is stale at once.
        assert!(queue(500, 2).is_err());
        // 2.75 s counts as 2 s, less than two heartbeats of 550 ms and a second.
        assert!(queue(550, 5).is_err());
        assert!(queue(5000, 2).is_err());
        assert!(queue(500, 4).is_ok());
        assert!(queue(5000, 3).is_ok());
        assert!(queue(5000, 6).is_ok());
    }

    #[test]
    fn at1_overlapping_attachments_and_artifacts_are_refused() {
        let err = load("[paths]\nattachments_root = \"/srv/a\"\nartifacts_root = \"/srv/a/gen\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("paths.attachments_root"), "{err}");
    }
}
