//! Configuration (OP-2): `config/default.toml` built in, a `--config` file over it, then
//! `SEXTON_<SECTION>__<SETTING>` environment variables; parsed once into typed settings and
//! validated together, so that every invalid value is reported at once.
//!
//! As ripgrep separates low-level from high-level arguments: `raw` reads the layers into
//! what figment deserializes, `checks` turns that into the [`Settings`] defined here (every
//! problem collected), and `pool` computes the connections the registered jobs need at once.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use figment::Figment;
pub use sexton_jobs::files::PathSettings;
use sexton_jobs::files::{Root, Store};
use sexton_jobs::health::HealthSettings;
use sexton_jobs::settings::Check;
pub use sexton_jobs::settings::Problem;

mod checks;
mod pool;
mod raw;

pub use pool::{CONNECTIONS_PER_QUEUE, FIXED_CONNECTIONS, PoolBudget};
pub use raw::DEFAULT_TOML;

/// Everything sexton is configured with, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub paths: PathSettings,
    pub schedule: ScheduleSettings,
    pub queue: QueueSettings,
    pub http: HttpSettings,
    pub fleet: FleetSettings,
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
    /// Whether its hops run in the slot beside the shared budget (`Job::BESIDE`).
    fn beside(&self) -> bool;
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

/// The fleet as a whole (`[fleet]`).
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// Worker processes running against the database.
    pub replicas: u32,
}

#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub listen: std::net::SocketAddr,
    pub refresh_interval: Duration,
    /// Whether `/status` and `/status.json` are served (OP-6).
    pub status_page: bool,
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
    /// Due accounts a slot's fan-out takes from a kind's discovery at a time, and so first
    /// hops it pushes per transaction at most (FL-8).
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
    #[error("configuration file {}: is a directory; expected a TOML file", .0.display())]
    Directory(PathBuf),
    #[error("configuration file {}: not a regular file; expected a TOML file", .0.display())]
    NotAFile(PathBuf),
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
        Self::from_figment(&raw::layers(file)?, jobs)
    }

    /// The built-in defaults alone, with no file or environment over them: what the docs and
    /// the deploy files describe (what `sexton generate` renders into them).
    ///
    /// # Errors
    /// As [`Settings::load`], only if `config/default.toml` itself is invalid.
    pub fn defaults(jobs: &[&dyn Section]) -> Result<Self, ConfigError> {
        Self::from_figment(&raw::defaults(), jobs)
    }

    fn from_figment(figment: &Figment, jobs: &[&dyn Section]) -> Result<Self, ConfigError> {
        let mut problems = Vec::new();
        let given = raw::read(figment, &mut problems)?;
        let settings = checks::settings(&given.settings, &mut problems)
            .and_then(|settings| checks::with_jobs(settings, &given.merged, jobs, &mut problems));
        match settings {
            Some(settings) if problems.is_empty() => Ok(settings),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }

    /// The file roots with the settings that name them, and the kind of files each holds
    /// (artifacts: none sexton removes).
    fn roots(&self) -> [(&'static str, Option<Root>, &Path); 5] {
        let p = &self.paths;
        [
            ("paths.output_root", Some(Root::Outputs), &p.output_root),
            (
                "paths.attachments_root",
                Some(Root::Attachments),
                &p.attachments_root,
            ),
            ("paths.artifacts_root", None, &p.artifacts_root),
            (
                "paths.sessions_root",
                Some(Root::Sessions),
                &p.sessions_root,
            ),
            ("paths.traces_root", Some(Root::Traces), &p.traces_root),
        ]
    }

    /// Refuses directory roots that do not exist or are not directories (OP-2, ER-3): under a
    /// missing root every file would look "already deleted". For the commands that remove
    /// files, and `check-config`. Object-store roots are [`Settings::reach_stores`]'.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming every such root.
    pub fn check_dirs(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        for (setting, root, path) in self.roots() {
            if let Some(Store::Object(_)) = root.map(|root| self.paths.store(root)) {
                continue;
            }
            let message = match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => continue,
                Ok(_) => format!("expected an existing directory, got {path:?} (not a directory)"),
                Err(err) => format!("expected an existing directory, got {path:?} ({err})"),
            };
            problems.push(Problem {
                setting: setting.to_owned(),
                message,
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Reaches every object-store root once (OS-1): one listing of at most a key each, within
    /// `database.acquire_timeout_ms`. A store that does not answer is an outage, not a setting:
    /// a worker retries it at start as it retries the database (ER-2), a one-shot command fails
    /// (exit 1) naming the root.
    ///
    /// # Errors
    /// [`Unreachable`] naming every root the store did not answer for, and why.
    pub async fn reach_stores(&self) -> Result<(), Unreachable> {
        let mut unreached = Vec::new();
        for (setting, root, _) in self.roots() {
            let Some(Store::Object(objects)) = root.map(|root| self.paths.store(root)) else {
                continue;
            };
            // The store's client retries a refused connection for minutes: an attempt is bounded
            // as one at the database is.
            let limit = self.database.acquire_timeout;
            let why = match tokio::time::timeout(limit, objects.reach()).await {
                Ok(Ok(())) => continue,
                Ok(Err(why)) => why,
                Err(_) => format!(
                    "no answer within database.acquire_timeout_ms = {}",
                    limit.as_millis()
                ),
            };
            unreached.push(Problem {
                setting: setting.to_owned(),
                message: format!("{objects}: {why}"),
            });
        }
        if unreached.is_empty() {
            Ok(())
        } else {
            Err(Unreachable(unreached))
        }
    }
}

/// Object-store roots whose store did not answer (OS-1): an outage (exit 1), not an invalid
/// setting.
#[derive(Debug, thiserror::Error)]
#[error(
    "the object store did not answer for {} root{} (an outage, not a setting: check that the \
     store is up and reachable from here, and its credentials):\n{}",
    .0.len(),
    if .0.len() == 1 { "" } else { "s" },
    list(.0)
)]
pub struct Unreachable(pub Vec<Problem>);

/// Parses a five-field cron expression (minute hour day month weekday) into a schedule.
pub fn parse_cron(expr: &str) -> Option<cron::Schedule> {
    if expr.split_whitespace().count() != 5 {
        return None;
    }
    cron::Schedule::from_str(&format!("0 {expr}")).ok()
}

#[cfg(test)]
mod tests {
    use figment::providers::{Format, Toml};

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
    fn op2_a_window_of_no_requests_is_refused_naming_storage_max_in_flight() {
        for bad in ["0", "-3", "\"many\"", "1001"] {
            let err = load(&format!("[storage]\nmax_in_flight = {bad}\n")).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("storage.max_in_flight"), "{text}");
            assert!(text.contains("an integer from 1 to 1000"), "{text}");
        }
        assert!(load("[storage]\nmax_in_flight = 1\n").is_ok());
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

    #[tokio::test]
    async fn op2_a_missing_root_or_a_file_as_root_is_refused_naming_the_setting() {
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
            objects: Vec::new(),
        };
        let text = settings.check_dirs().unwrap_err().to_string();
        assert!(text.contains("paths.output_root"), "{text}");
        assert!(
            text.contains("paths.sessions_root") && text.contains("not a directory"),
            "{text}"
        );
        assert!(!text.contains("paths.traces_root"), "{text}");
        settings.paths.output_root = dir.path().join("outputs");
        settings.paths.sessions_root = dir.path().join("sessions");
        assert!(settings.check_dirs().is_ok());
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
    fn at1_an_artifacts_root_overlapping_any_root_sexton_deletes_in_is_refused() {
        let roots = [
            ("output_root", "paths.output_root"),
            ("attachments_root", "paths.attachments_root"),
            ("sessions_root", "paths.sessions_root"),
            ("traces_root", "paths.traces_root"),
        ];
        for (key, setting) in roots {
            for (root, artifacts) in [
                ("/srv/r", "/srv/r/gen"),
                ("/srv/r/gen", "/srv/r"),
                ("/srv/r", "/srv/r"),
                ("s3://b/r", "s3://b/r/gen"),
                ("s3://b/r/gen", "s3://b/r"),
                ("s3://b", "s3://b/gen"),
            ] {
                let err = load(&format!(
                    "[paths]\n{key} = \"{root}\"\nartifacts_root = \"{artifacts}\"\n"
                ))
                .unwrap_err()
                .to_string();
                assert!(
                    err.contains(setting) && err.contains("AT-1"),
                    "{root} and artifacts {artifacts}: {err}"
                );
            }
            // The control: siblings, a shared name's prefix, another bucket.
            for (root, artifacts) in [
                ("/srv/r", "/srv/gen"),
                ("/srv/r", "/srv/r2"),
                ("s3://b/r", "s3://b/r2"),
                ("s3://b/r", "s3://c/r"),
            ] {
                let loaded = load(&format!(
                    "[paths]\n{key} = \"{root}\"\nartifacts_root = \"{artifacts}\"\n"
                ));
                if let Err(err) = loaded {
                    assert!(
                        !err.to_string().contains("AT-1"),
                        "{root}, {artifacts}: {err}"
                    );
                }
            }
        }
    }

    #[test]
    fn at1_overlapping_attachments_and_artifacts_are_refused() {
        let err = load("[paths]\nattachments_root = \"/srv/a\"\nartifacts_root = \"/srv/a/gen\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("paths.attachments_root"), "{err}");
    }
}
