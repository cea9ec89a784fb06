//! From configuration as given to settings sexton runs with (the high level, as ripgrep's
//! `hiargs`): each section's checks in the order the problems are listed, the checks across
//! settings, then the jobs' own sections, `[health]`, and the pool they all need at once.
//! Every problem is collected; a value is only built once every setting it depends on is valid.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use figment::value::Dict;
use sexton_jobs::files::Root;
use sexton_jobs::files::object::{self, ObjectRoot, StorageSettings};
use sexton_jobs::settings::{Check, Problem, Raw};

use super::raw::{
    self, RawDatabase, RawHttp, RawLog, RawPaths, RawQueue, RawSchedule, RawSettings, RawStorage,
};
use super::{
    DatabaseSettings, FleetSettings, HttpSettings, JobSettings, LogFormat, LogSettings,
    PathSettings, PoolBudget, QueueSettings, ScheduleSettings, Section, Settings, parse_cron,
};

/// sexton's own settings, checked; `None` when any is invalid (each problem in `problems`).
pub(super) fn settings(raw: &RawSettings, problems: &mut Vec<Problem>) -> Option<Settings> {
    let mut c = Check::new(problems);
    let database = database(&raw.database, &mut c);
    let storage = storage(&raw.storage, &mut c);
    let paths = storage.and_then(|storage| paths(&raw.paths, &storage, &mut c));
    let (schedule, catch_up) = schedule(&raw.schedule, &mut c);
    let queue = queue(&raw.queue, catch_up, &mut c);
    let http = http(&raw.http, &mut c);
    let fleet = c
        .int(
            "fleet.replicas",
            &raw.fleet.replicas,
            1..=1000,
            "a whole number of worker processes from 1 to 1000",
        )
        .map(|replicas| FleetSettings { replicas });
    let log = log(&raw.log, &mut c);
    Some(Settings {
        database: database?,
        paths: paths?,
        schedule: schedule?,
        queue: queue?,
        http: http?,
        fleet: fleet?,
        log: log?,
        jobs: JobSettings::default(),
        health: sexton_jobs::health::HealthSettings::OFF,
    })
}

fn database(d: &RawDatabase, c: &mut Check<'_>) -> Option<DatabaseSettings> {
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
    Some(DatabaseSettings {
        max_connections: max_connections?,
        acquire_timeout: acquire_timeout?,
        statement_timeout: statement_timeout?,
        lock_timeout: lock_timeout?,
        connect_attempts: connect_attempts?,
    })
}

/// What a root that must not overlap the artifacts is expected to be.
const APART_FROM_ARTIFACTS: &str =
    "a directory that neither contains nor lies inside paths.artifacts_root";

/// `[storage]`, how object-store roots are reached (OS-1).
fn storage(s: &RawStorage, c: &mut Check<'_>) -> Option<StorageSettings> {
    let endpoint = c.text("storage.endpoint", &s.endpoint);
    let region = c.text("storage.region", &s.region);
    let path_style = c.flag("storage.path_style", &s.path_style);
    let allow_http = c.flag("storage.allow_http", &s.allow_http);
    let access_key_id = c.text("storage.access_key_id", &s.access_key_id);
    // Never shown, even when of the wrong type.
    let secret_access_key = match &s.secret_access_key {
        Raw::Typed(secret) => Some((!secret.is_empty()).then(|| secret.clone())),
        Raw::Other(_) => {
            c.fail("storage.secret_access_key", "a string", "another type");
            None
        }
    };
    let batch_delete = c.flag("storage.batch_delete", &s.batch_delete);
    let max_in_flight = c.int(
        "storage.max_in_flight",
        &s.max_in_flight,
        1..=1000,
        "an integer from 1 to 1000",
    );
    Some(StorageSettings {
        endpoint: endpoint?,
        region: region?,
        path_style: path_style?,
        allow_http: allow_http?,
        access_key_id: access_key_id?,
        secret_access_key: secret_access_key?,
        batch_delete: batch_delete?,
        max_in_flight: max_in_flight?,
    })
}

/// Where one root is: a directory, or a bucket and prefix (OS-1).
enum Place {
    Dir(PathBuf),
    Bucket(String, String),
}

impl Place {
    /// Whether one place contains the other: directories compared lexically, and canonically
    /// where both exist, so that a symlinked root is caught too; buckets by bucket and prefix.
    fn overlaps(&self, other: &Place) -> bool {
        match (self, other) {
            (Place::Dir(a), Place::Dir(b)) => overlap(a, b),
            (Place::Bucket(a, p), Place::Bucket(b, q)) => {
                a == b && (Path::new(p).starts_with(q) || Path::new(q).starts_with(p))
            }
            _ => false,
        }
    }
}

fn place(setting: &str, raw: &Raw<String>, c: &mut Check<'_>) -> Option<Place> {
    let text = match raw {
        Raw::Typed(text) => text,
        Raw::Other(_) => return c.path(setting, raw).map(Place::Dir),
    };
    match object::parse_url(text) {
        Some(Ok((bucket, prefix))) => Some(Place::Bucket(bucket, prefix)),
        Some(Err(expected)) => {
            c.fail(setting, &expected, format!("{text:?}"));
            None
        }
        None => c.path(setting, raw).map(Place::Dir),
    }
}

fn paths(p: &RawPaths, storage: &StorageSettings, c: &mut Check<'_>) -> Option<PathSettings> {
    let roots = [
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
    ];
    let places: Vec<Option<Place>> = roots
        .iter()
        .map(|(setting, _, raw)| place(setting, raw, c))
        .collect();
    apart_from_artifacts(&roots, &places, c);
    let mut objects = Vec::new();
    let mut located = Vec::new();
    for ((setting, root, raw), place) in roots.iter().zip(places) {
        located.push(match place? {
            Place::Dir(path) => path,
            Place::Bucket(bucket, prefix) => {
                match ObjectRoot::new(&bucket, &prefix, storage) {
                    Ok(objects_root) => {
                        if let Some(root) = root {
                            objects.push((*root, Arc::new(objects_root)));
                        }
                    }
                    Err(why) => {
                        c.fail(
                            setting,
                            &format!("an object-store root that can be reached ({why})"),
                            format!("{:?}", shown_raw(raw)),
                        );
                        return None;
                    }
                }
                PathBuf::from(shown_raw(raw))
            }
        });
    }
    let [
        output_root,
        attachments_root,
        artifacts_root,
        sessions_root,
        traces_root,
    ]: [PathBuf; 5] = located.try_into().ok()?;
    Some(PathSettings {
        output_root,
        attachments_root,
        artifacts_root,
        sessions_root,
        traces_root,
        objects,
    })
}

/// Refuses a root sexton deletes in (outputs, attachments, sessions, traces) that contains, lies
/// inside or is the artifacts root, in either direction (AT-1: generated artifacts have no TTL).
fn apart_from_artifacts(
    roots: &[(&str, Option<Root>, &Raw<String>); 5],
    places: &[Option<Place>],
    c: &mut Check<'_>,
) {
    if let Some(artifacts) = &places[2] {
        let why = "(generated artifacts have no TTL, AT-1)";
        for at in [0, 1, 3, 4] {
            if let Some(root) = &places[at]
                && root.overlaps(artifacts)
            {
                c.fail(
                    roots[at].0,
                    &format!("{APART_FROM_ARTIFACTS} {why}"),
                    format!(
                        "{:?} and {:?}",
                        shown_raw(roots[at].2),
                        shown_raw(roots[2].2)
                    ),
                );
            }
        }
    }
}

/// A root's text as given.
fn shown_raw(raw: &Raw<String>) -> String {
    match raw {
        Raw::Typed(text) => text.clone(),
        Raw::Other(value) => value.to_string(),
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

/// The schedule, and its catch-up window alone too: the queue's retention bounds it, whether
/// or not the rest of the schedule is valid.
fn schedule(
    s: &RawSchedule,
    c: &mut Check<'_>,
) -> (Option<ScheduleSettings>, Option<chrono::Duration>) {
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
    let settings = match (cron, timezone, catch_up) {
        (Some(cron), Some(timezone), Some(catch_up)) => Some(ScheduleSettings {
            cron,
            timezone,
            catch_up,
        }),
        _ => None,
    };
    (settings, catch_up)
}

/// The queue's settings; `catch_up` is the schedule's window, which must end before the
/// finished jobs holding the slot keys are deleted.
fn queue(
    q: &RawQueue,
    catch_up: Option<chrono::Duration>,
    c: &mut Check<'_>,
) -> Option<QueueSettings> {
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
        rescue_bound(interval, missed, c);
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
    if let (Some(catch_up), Some(retention)) = (catch_up, finished_job_retention) {
        catch_up_within_retention(catch_up, retention, c);
    }
    Some(QueueSettings {
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
    })
}

/// FL-4: the silence after which a worker's running jobs are rescued must not take them from
/// a live worker.
fn rescue_bound(interval: Duration, missed: u32, c: &mut Check<'_>) {
    // apalis-postgres counts a worker's silence in whole seconds, rounded down, and stamps a
    // new worker's registration in whole seconds too, so up to a second old before its first
    // heartbeat, one interval later. A shorter bound takes running jobs from live workers:
    // under one second it is zero, and every heartbeat puts every running job of its queue
    // back, its own too.
    let bound = interval * missed;
    let counted = Duration::from_secs(bound.as_secs());
    let least = interval * 2 + Duration::from_secs(1);
    if counted < least {
        let seconds = least.as_millis().div_ceil(1000);
        c.fail(
            "queue.missed_heartbeats",
            &format!(
                "a rescue bound (queue.heartbeat_interval_ms x this, counted in whole seconds, \
                 rounded down) of at least two heartbeats and a second, so {seconds} s: {} or \
                 more at {} ms",
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

/// FL-7: a slot caught up on after its key was deleted with the finished jobs would run twice.
fn catch_up_within_retention(
    catch_up: chrono::Duration,
    retention: chrono::Duration,
    c: &mut Check<'_>,
) {
    if catch_up >= retention {
        c.fail(
            "schedule.catch_up_hours",
            &format!(
                "fewer hours than queue.finished_job_retention_days keeps slots ({} h)",
                retention.num_hours()
            ),
            catch_up.num_hours(),
        );
    }
}

fn http(h: &RawHttp, c: &mut Check<'_>) -> Option<HttpSettings> {
    let listen = c.parsed(
        "http.listen",
        &h.listen,
        "a socket address such as \"127.0.0.1:9187\"",
        |s| s.parse().ok(),
    );
    let refresh_interval = c.millis("http.refresh_interval_ms", &h.refresh_interval_ms);
    let status_page = c.flag("http.status_page", &h.status_page);
    Some(HttpSettings {
        listen: listen?,
        refresh_interval: refresh_interval?,
        status_page: status_page?,
    })
}

fn log(l: &RawLog, c: &mut Check<'_>) -> Option<LogSettings> {
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
    Some(LogSettings {
        format: format?,
        level: level?,
    })
}

/// Reads every job's section and `[health]`, and checks that the pool holds what the jobs need
/// at once (FL-6).
pub(super) fn with_jobs(
    mut settings: Settings,
    merged: &Dict,
    jobs: &[&dyn Section],
    problems: &mut Vec<Problem>,
) -> Option<Settings> {
    let mut check = Check::new(problems);
    for job in jobs {
        let section = raw::section(merged, job.section());
        if let Some(parsed) = job.parse(&section, &settings.paths, &mut check) {
            settings.jobs.0.insert(job.job(), parsed);
        }
    }
    let budget = PoolBudget::new(settings.queue.concurrency, jobs);
    if u64::from(settings.database.max_connections) < budget.needed() {
        check.fail(
            "database.max_connections",
            &budget.expected(),
            settings.database.max_connections,
        );
    }
    let health = raw::section(merged, "health");
    settings.health = sexton_jobs::health::settings(&health, &mut check)?;
    jobs.iter()
        .all(|job| settings.jobs.contains(job.job()))
        .then_some(settings)
}
