//! `sexton sessions prune [--confirm] [--account ID] [--json]` (SS-1, OP-1): SessionRetention
//! with ages from the environment — `SEXTON_SESSION_MAIN_DAYS`, `SEXTON_SESSION_TASK_DAYS`,
//! `SEXTON_SESSION_SUBAGENT_DAYS`, defaults 60/30/7 — whatever the persisted policies say.
//! Without `--confirm` it lists every target and deletes nothing; with it, it runs the job's
//! own hops, under the job's own scope lock, account by account.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use sexton_jobs::clock::SystemClock;
use sexton_jobs::files::FileCounts;
use sexton_jobs::health::Health;
use sexton_jobs::job::{Env, Job as _, Report};
use sexton_jobs::pass;
use sexton_jobs::session_retention::{
    self as job, Ages, Args, HopSettings, Policy, SessionReason, SessionRetention, Target,
};
use uuid::Uuid;

use crate::config::{ConfigError, Problem, Settings};
use crate::hop::ScopeLock;
use crate::{db, text};

/// The environment variables of the CLI's ages, with the default of each.
const VARIABLES: [(&str, i32); 3] = [
    ("SEXTON_SESSION_MAIN_DAYS", Ages::FALLBACK.main_days),
    ("SEXTON_SESSION_TASK_DAYS", Ages::FALLBACK.task_days),
    ("SEXTON_SESSION_SUBAGENT_DAYS", Ages::FALLBACK.subagent_days),
];

/// The CLI's ages from the environment.
///
/// # Errors
/// [`ConfigError::Invalid`] naming every variable that is not a whole number of days from 1
/// to 36500.
pub fn ages_from_env() -> Result<Ages, ConfigError> {
    let mut problems = Vec::new();
    let days: Vec<i32> = VARIABLES
        .iter()
        .map(|(name, default)| match std::env::var(name) {
            Err(_) => *default,
            Ok(value) => match value.trim().parse::<i32>() {
                Ok(days) if (1..=36_500).contains(&days) => days,
                _ => {
                    problems.push(Problem {
                        setting: (*name).to_owned(),
                        message: format!(
                            "expected a whole number of days from 1 to 36500, got {value:?}"
                        ),
                    });
                    *default
                }
            },
        })
        .collect();
    if !problems.is_empty() {
        return Err(ConfigError::Invalid(problems));
    }
    Ok(Ages {
        main_days: days[0],
        task_days: days[1],
        subagent_days: days[2],
    })
}

/// What one confirmed run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Deleted {
    pub sessions: u64,
    pub retained: BTreeMap<&'static str, u64>,
    pub rows: BTreeMap<&'static str, u64>,
    pub files_deleted: u64,
    pub bytes_reclaimed: u64,
    pub file_errors: u64,
    /// Accounts skipped because a nightly hop held them past the wait.
    pub accounts_busy: Vec<Uuid>,
}

/// Everything the command prints; `--json` prints it as it is.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub ages: Ages,
    pub at: DateTime<Utc>,
    pub targets: Vec<Target>,
    /// `null` without `--confirm`.
    pub deleted: Option<Deleted>,
}

/// Runs the command.
///
/// # Errors
/// Bad ages ([`ConfigError`], exit 2), or a database or file error.
pub async fn prune(
    settings: &Settings,
    account: Option<Uuid>,
    confirm: bool,
    json: bool,
) -> anyhow::Result<Outcome> {
    let ages = ages_from_env()?;
    if confirm {
        settings.check_dirs()?;
        settings.reach_stores().await?;
    }
    let pool = db::connect(
        &settings.database,
        if confirm {
            db::Access::Write
        } else {
            db::Access::Read
        },
    )
    .await?;
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&pool).await?;
    let targets = {
        let mut conn = pool.acquire().await?;
        job::targets(&mut conn, ages, at, account).await?
    };
    let deleted = if confirm {
        Some(delete(&pool, settings, ages, at, &targets, json).await?)
    } else {
        None
    };
    Ok(Outcome {
        ages,
        at,
        targets,
        deleted,
    })
}

/// Runs a pass with the CLI's ages for every account that has targets.
async fn delete(
    pool: &sqlx::PgPool,
    settings: &Settings,
    ages: Ages,
    at: DateTime<Utc>,
    targets: &[Target],
    json: bool,
) -> anyhow::Result<Deleted> {
    let hop_settings = HopSettings {
        policy: Policy::Fixed(ages),
        ..settings
            .jobs
            .get::<HopSettings>(SessionRetention::NAME)
            .clone()
    };
    let progress = progress(targets.len() as u64, json);
    let mut accounts: Vec<Uuid> = targets.iter().map(|t| t.account_id).collect();
    accounts.sort();
    accounts.dedup();
    let stop = AtomicBool::new(false);
    let health = Health::new(settings.health.clone());
    let mut deleted = Deleted::default();
    for account in accounts {
        let Some(mut lock) = take_lock(pool, account).await? else {
            deleted.accounts_busy.push(account);
            continue;
        };
        let mut args = Args::first(Some(account), at);
        loop {
            let mut report = Report::new(SessionRetention::TABLES);
            let env = Env {
                conn: lock.conn(),
                pool,
                clock: &SystemClock,
                stop: &stop,
                paths: &settings.paths,
                health: &health,
            };
            let next = pass::hop::<SessionRetention>(env, &hop_settings, &args, &mut report).await;
            deleted.add(&report);
            let next = match next {
                Ok(next) => next,
                Err(err) => {
                    lock.release().await;
                    return Err(err.into());
                }
            };
            progress.inc(report.pruned + report.retained_total());
            if let Some(indicator) = report.throttled {
                // As a nightly pass would: wait, then go on where it stopped.
                progress.println(format!(
                    "the database is unhealthy ({}); waiting {} s",
                    indicator.as_str(),
                    settings.health.backoff.as_secs()
                ));
                tokio::time::sleep(settings.health.backoff).await;
            }
            match next {
                Some(next) => args = next,
                None => break,
            }
        }
        lock.release().await;
    }
    progress.finish_and_clear();
    Ok(deleted)
}

/// The progress of deleting `sessions`, shown on a terminal unless the output is JSON.
fn progress(sessions: u64, json: bool) -> ProgressBar {
    let progress = if json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(sessions)
    };
    progress.set_style(
        ProgressStyle::with_template(
            "deleting {bar:40} {pos}/{len} sessions ({per_sec}, eta {eta})",
        )
        .expect("a valid progress template"),
    );
    progress
}

impl Deleted {
    /// Adds what one hop did.
    fn add(&mut self, report: &Report<SessionReason>) {
        self.sessions += report.pruned;
        for (reason, n) in report.retained_by_label() {
            *self.retained.entry(reason).or_default() += n;
        }
        for (table, n) in &report.rows {
            *self.rows.entry(table).or_default() += n;
        }
        let FileCounts {
            deleted: files,
            bytes,
            errors,
        } = report.files;
        self.files_deleted += files;
        self.bytes_reclaimed += bytes;
        self.file_errors += errors;
    }
}

/// The job's scope lock for `account`, waiting up to 30 s for a nightly hop that holds it.
async fn take_lock(pool: &sqlx::PgPool, account: Uuid) -> anyhow::Result<Option<ScopeLock>> {
    for _ in 0..30 {
        if let Some(lock) = ScopeLock::try_take(pool, SessionRetention::NAME, Some(account)).await?
        {
            return Ok(Some(lock));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(None)
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl Outcome {
    /// The report for people, control characters escaped.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "sexton sessions prune at {}: main {} / task {} / subagent {} days \
             (SEXTON_SESSION_*_DAYS), persisted policies not consulted",
            time(self.at),
            self.ages.main_days,
            self.ages.task_days,
            self.ages.subagent_days
        );
        let _ = writeln!(
            out,
            "{:<36}  {:<36}  {:<36}  {:<8}  {:<20}  evidence",
            "session", "agent", "account", "kind", "last activity"
        );
        for t in &self.targets {
            let _ = writeln!(
                out,
                "{:<36}  {:<36}  {:<36}  {:<8}  {:<20}  {}",
                t.session_id,
                t.agent_id,
                t.account_id,
                t.kind,
                time(t.last_activity_at),
                t.evidence
            );
        }
        let _ = writeln!(out, "{} sessions to delete", self.targets.len());
        match &self.deleted {
            None => {
                let _ = writeln!(
                    out,
                    "nothing deleted: run again with --confirm to delete them"
                );
            }
            Some(d) => {
                let _ = writeln!(
                    out,
                    "deleted {} sessions, {} archive frame files ({} bytes, {} file errors)",
                    d.sessions, d.files_deleted, d.bytes_reclaimed, d.file_errors
                );
                for (table, n) in &d.rows {
                    let _ = writeln!(out, "  rows     {table:<30} {n:>10}");
                }
                for (reason, n) in &d.retained {
                    let _ = writeln!(out, "  kept     {reason:<30} {n:>10}");
                }
                for account in &d.accounts_busy {
                    let _ = writeln!(
                        out,
                        "  account {account} skipped: a nightly hop held it for 30 s"
                    );
                }
            }
        }
        text::printable(&out)
    }
}

/// `sexton sessions prune`: the sessions the ages would delete, deleted with `confirm`.
///
/// # Errors
/// As [`prune`].
pub async fn run(
    settings: &Settings,
    account: Option<uuid::Uuid>,
    confirm: bool,
    json: bool,
) -> anyhow::Result<()> {
    let outcome = prune(settings, account, confirm, json).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        print!("{}", outcome.render());
    }
    Ok(())
}
