//! Configuration as given, before anything is judged (the low level, as ripgrep's `lowargs`):
//! the layers figment merges — `config/default.toml` built in, a `--config` file over it, then
//! `SEXTON_<SECTION>__<SETTING>` environment variables — and the sections sexton's own settings
//! deserialize into. Every leaf is a [`Raw`], so that a value of the wrong type is reported by
//! the checks (`super::checks`) rather than refused by serde.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Value};
use serde::Deserialize;
use sexton_jobs::settings::{Problem, Raw};

use super::ConfigError;

/// The defaults, one commented line per setting; also the list of every known setting.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Prefix of environment overrides; sections and settings are separated by a double underscore.
const ENV_PREFIX: &str = "SEXTON_";

/// The built-in defaults alone.
pub(super) fn defaults() -> Figment {
    Figment::from(Toml::string(DEFAULT_TOML))
}

/// The layers merged, later ones winning: the defaults, `file`, then the environment.
///
/// # Errors
/// [`ConfigError::FileNotFound`] when `file` does not exist, [`ConfigError::Directory`] or
/// [`ConfigError::NotAFile`] when it is not a regular file.
pub(super) fn layers(file: Option<&Path>) -> Result<Figment, ConfigError> {
    let mut figment = defaults();
    if let Some(path) = file {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => {}
            Ok(meta) if meta.is_dir() => return Err(ConfigError::Directory(path.to_owned())),
            Ok(_) => return Err(ConfigError::NotAFile(path.to_owned())),
            Err(_) => return Err(ConfigError::FileNotFound(path.to_owned())),
        }
        figment = figment.merge(Toml::file_exact(path));
    }
    Ok(figment.merge(
        Env::prefixed(ENV_PREFIX)
            .filter(|key| key.as_str().contains("__"))
            .split("__"),
    ))
}

/// What the layers hold: sexton's own sections, and every section as given (the jobs' and
/// `[health]` among them, which their own code reads).
pub(super) struct Given {
    pub settings: RawSettings,
    pub merged: Dict,
}

/// Reads the merged layers; every setting they hold that the defaults do not goes to
/// `problems`.
///
/// # Errors
/// [`ConfigError::Unreadable`] when a layer cannot be parsed or sexton's own sections do not
/// have the shape of the defaults.
pub(super) fn read(figment: &Figment, problems: &mut Vec<Problem>) -> Result<Given, ConfigError> {
    let unreadable = |e| ConfigError::Unreadable(Box::new(e));
    let defaults: Dict = defaults().extract().map_err(unreadable)?;
    let merged: Dict = figment.extract().map_err(unreadable)?;
    unknown_settings(&defaults, &merged, "", problems);
    let settings = figment.extract().map_err(unreadable)?;
    Ok(Given { settings, merged })
}

/// The section `name` as given, as JSON (an empty object when absent).
pub(super) fn section(merged: &Dict, name: &str) -> serde_json::Value {
    merged
        .get(name)
        .map(|value| serde_json::to_value(value).unwrap_or_default())
        .unwrap_or_else(|| serde_json::json!({}))
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

/// sexton's own sections; the jobs' sections and `[health]` are read by their own code.
#[derive(Debug, Deserialize)]
pub(super) struct RawSettings {
    pub database: RawDatabase,
    pub paths: RawPaths,
    pub storage: RawStorage,
    pub schedule: RawSchedule,
    pub queue: RawQueue,
    pub http: RawHttp,
    pub fleet: RawFleet,
    pub log: RawLog,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawFleet {
    pub replicas: Raw<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawHttp {
    pub listen: Raw<String>,
    pub refresh_interval_ms: Raw<i64>,
    pub status_page: Raw<bool>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawDatabase {
    pub max_connections: Raw<i64>,
    pub acquire_timeout_ms: Raw<i64>,
    pub statement_timeout_ms: Raw<i64>,
    pub lock_timeout_ms: Raw<i64>,
    pub connect_attempts: Raw<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawPaths {
    pub output_root: Raw<String>,
    pub attachments_root: Raw<String>,
    pub artifacts_root: Raw<String>,
    pub sessions_root: Raw<String>,
    pub traces_root: Raw<String>,
}

/// `[storage]`: never printed as given, as it holds the secret.
#[derive(Deserialize)]
pub(super) struct RawStorage {
    pub endpoint: Raw<String>,
    pub region: Raw<String>,
    pub path_style: Raw<bool>,
    pub allow_http: Raw<bool>,
    pub access_key_id: Raw<String>,
    pub secret_access_key: Raw<String>,
    pub batch_delete: Raw<bool>,
    pub max_in_flight: Raw<i64>,
}

impl std::fmt::Debug for RawStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RawStorage { .. }")
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct RawSchedule {
    pub cron: Raw<String>,
    pub timezone: Raw<String>,
    pub catch_up_hours: Raw<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawQueue {
    pub worker_name: Raw<String>,
    pub poll_interval_ms: Raw<i64>,
    pub concurrency: Raw<i64>,
    pub heartbeat_interval_ms: Raw<i64>,
    pub missed_heartbeats: Raw<i64>,
    pub max_attempts: Raw<i64>,
    pub retry_backoff_ms: Raw<i64>,
    pub shutdown_grace_ms: Raw<i64>,
    pub finished_job_retention_days: Raw<i64>,
    pub fan_out_batch: Raw<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawLog {
    pub format: Raw<String>,
    pub level: Raw<String>,
}
