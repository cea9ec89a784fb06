//! `sexton status` (OP-1): what an operator reads at 9 am after the nightly pass — per job and
//! account the last pass from the ledger, each job's backlog and queue, the jobs failed for
//! good with their last error, the active holds (HD-5), the open erasure requests (RQ-7) and the
//! fleet's workers. What it reads
//! by default is bounded whatever the number of accounts — the latest fan-out of each job, the
//! passes that did not finish (through their partial index, capped), capped lists — so that
//! the status page serves the same read (OP-6); only `--all` reads every account's pass. The
//! backlogs are read per account (OP-3): the status page shows those its worker's gauges last
//! measured instead of reading them at every request.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use sexton_jobs::job::Scope;

use sexton_jobs::erasure::visible::{self, Open};

use crate::config::Settings;
use crate::holds;
use crate::http::Backlogs;
use crate::ledger::{self, Pass};
use crate::queue::{self, FailedJob, QueueCounts};
use crate::registry;
use crate::tick;

/// How many failed jobs are listed.
const FAILED_SHOWN: i64 = 50;

/// How many unfinished passes are listed per job (`--all` and `--account` list theirs whole).
pub const PASSES_SHOWN: i64 = 50;

/// How many unfinished passes of a job's latest slot are counted by state at most.
pub const PASSES_COUNTED: i64 = 10_000;

/// How many worker processes are listed, the most recently heard from first.
pub const WORKERS_SHOWN: i64 = 50;

/// How many active holds are listed, newest first: the rest are `sexton holds list`'s.
pub const HOLDS_SHOWN: i64 = 10;

/// How many open erasure requests are listed, the earliest due first: the rest are `sexton
/// erase status`'s.
pub const ERASURES_SHOWN: i64 = 20;

/// Everything `sexton status` reports; `--json` prints it as it is.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub at: DateTime<Utc>,
    /// When the jobs' backlogs were measured: `at` for `sexton status`, the gauges' last
    /// measurement for the status page (at most `http.refresh_interval_ms` earlier).
    pub backlogs_at: DateTime<Utc>,
    pub jobs: Vec<JobStatus>,
    /// The nightly slots' own queue.
    pub nightly: QueueCounts,
    /// Every sexton queue together.
    pub queue: QueueCounts,
    /// Jobs failed for good or killed, newest first (at most 50).
    pub failed_jobs: Vec<FailedJob>,
    /// Pending file deletions that failed and wait for the next drain, per root (OS-4: a key
    /// the object store refused to delete).
    pub retrying_files: std::collections::BTreeMap<String, i64>,
    /// Pending file deletions quarantined after their last attempt, per root (ER-3): files
    /// left on disk that an operator must look at.
    pub quarantined_files: std::collections::BTreeMap<String, i64>,
    /// How many holds are active (HD-5); `null` when the holds could not be read.
    pub holds_active: Option<i64>,
    /// The newest active holds, newest first, at most [`HOLDS_SHOWN`] (HD-5): what they cover
    /// stays whatever a window says; `sexton holds list` lists every one.
    pub holds: Vec<holds::Placed>,
    /// Why the holds could not be read, when they could not (the rest of the status is shown
    /// all the same; the jobs remove nothing meanwhile, HD-3).
    pub holds_error: Option<String>,
    /// How many erasure requests are open (RQ-7).
    pub erasures_open: i64,
    /// The open erasure requests, the earliest due first, at most [`ERASURES_SHOWN`]: ids,
    /// states, due dates and counts, never the subject's id (RQ-6); `sexton erase status` says
    /// more of each.
    pub erasures: Vec<Open>,
    /// The latest derivative cleanup that removed files, per root and reason (DC-5).
    pub orphans: Option<sexton_jobs::orphans::LatestScan>,
    /// How many worker processes have registered consumers of sexton's queues.
    pub workers_total: i64,
    /// The worker processes, the most recently heard from first, at most [`WORKERS_SHOWN`].
    pub workers: Vec<queue::FleetWorker>,
}

/// Which passes `status` lists beside its summaries.
#[derive(Debug, Clone, Default)]
pub struct Listed {
    /// Every account's latest pass; by default only those that did not finish.
    pub all: bool,
    /// This account's latest passes, finished ones too.
    pub account: Option<uuid::Uuid>,
    /// Only this job.
    pub job: Option<String>,
}

impl Listed {
    fn lists(&self, pass: &Pass) -> bool {
        match self.account {
            Some(account) => pass.account_id == Some(account),
            None => self.all || pass.state != "finished",
        }
    }
}

/// A job's passes of its latest slot by state (`pending`, `running`, `failed`, `finished`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassStates {
    pub pending: u64,
    pub running: u64,
    pub failed: u64,
    /// The passes the latest fan-out started, less those that did not finish.
    pub finished: u64,
    /// The slot's unfinished passes were counted up to [`PASSES_COUNTED`]: there are more.
    pub capped: bool,
}

impl PassStates {
    fn total(&self) -> u64 {
        self.pending + self.running + self.failed + self.finished
    }
}

/// One job kind.
#[derive(Debug, Clone, Serialize)]
pub struct JobStatus {
    pub job: &'static str,
    /// `account` or `global`.
    pub scope: &'static str,
    /// The latest slot for which every pass finished.
    pub last_success_slot: Option<DateTime<Utc>>,
    /// How far past its cutoff the oldest eligible item is, if the job measures it.
    pub backlog_seconds: Option<f64>,
    pub queue: QueueCounts,
    /// The latest slot's fan-out: accounts looked at, passes started, accounts with nothing
    /// due (FL-8); `null` before the first.
    pub fan_out: Option<FanOutSummary>,
    /// The passes of the latest slot (one per account it started, or the one global pass),
    /// counted by state.
    pub pass_states: PassStates,
    /// The latest passes listed (see [`Listed`]): by default those that did not finish, at
    /// most [`PASSES_SHOWN`] of the newest slots.
    pub passes: Vec<Pass>,
}

/// One job's latest fan-out, as `status` summarises it.
#[derive(Debug, Clone, Serialize)]
pub struct FanOutSummary {
    pub slot: DateTime<Utc>,
    /// Whether discovery went through every account.
    pub complete: bool,
    pub accounts: i64,
    pub passes_started: i64,
    /// Accounts found with nothing due: no queue job, no hop, no ledger row; finished.
    pub nothing_due: i64,
}

/// Reads the status; the backlogs as `backlogs` measured them, or (without) anew.
///
/// # Errors
/// A database error.
pub async fn read(
    pool: &sqlx::PgPool,
    settings: &Settings,
    at: DateTime<Utc>,
    listed: &Listed,
    backlogs: Option<&Backlogs>,
) -> anyhow::Result<Status> {
    let names: Vec<&str> = registry::KINDS.iter().map(|kind| kind.name()).collect();
    let latest = match listed.account {
        Some(account) => ledger::latest_of(pool, account).await?,
        None if listed.all => ledger::latest(pool).await?,
        None => ledger::unfinished(pool, &names, PASSES_SHOWN).await?,
    };
    let successes = ledger::last_success(pool).await?;
    let by_queue = queue::counts_by_queue(pool).await?;
    let fan_outs = ledger::latest_fan_outs(pool).await?;
    let (workers_total, workers) = queue::workers(pool, WORKERS_SHOWN).await?;
    let (holds_active, holds, holds_error) = match active_holds(pool).await {
        Ok((count, newest)) => (Some(count), newest, None),
        Err(err) => (
            None,
            Vec::new(),
            Some(format!("{:#}", anyhow::Error::new(err))),
        ),
    };
    let mut jobs = Vec::new();
    for kind in registry::KINDS {
        if listed.job.as_deref().is_some_and(|job| job != kind.name()) {
            continue;
        }
        let fan_out = fan_outs.iter().find(|f| f.job == kind.name());
        let mut pass_states = PassStates::default();
        if let Some(f) = fan_out {
            let mut unfinished = 0;
            for (state, n) in
                ledger::unfinished_states(pool, kind.name(), f.slot, PASSES_COUNTED).await?
            {
                unfinished += n;
                *match state.as_str() {
                    "pending" => &mut pass_states.pending,
                    "running" => &mut pass_states.running,
                    _ => &mut pass_states.failed,
                } += u64::try_from(n).unwrap_or_default();
            }
            pass_states.capped = unfinished >= PASSES_COUNTED;
            pass_states.finished = u64::try_from(f.started - unfinished).unwrap_or_default();
        }
        let mut passes: Vec<Pass> = latest
            .iter()
            .filter(|p| p.job == kind.name() && listed.lists(p))
            .cloned()
            .collect();
        passes
            .sort_by(|a, b| (&a.account_name, a.account_id).cmp(&(&b.account_name, b.account_id)));
        jobs.push(JobStatus {
            job: kind.name(),
            scope: match kind.scope() {
                Scope::Account => "account",
                Scope::Global => "global",
            },
            last_success_slot: successes
                .iter()
                .find(|(job, _)| job == kind.name())
                .map(|(_, slot)| *slot),
            // A backlog measured through the holds is not known while they cannot be read.
            backlog_seconds: match backlogs {
                Some(measured) => measured.seconds.get(kind.name()).copied(),
                None => match kind.backlog(pool, settings, at).await {
                    Ok(seconds) => seconds,
                    Err(_) if holds_error.is_some() => None,
                    Err(err) => return Err(err),
                },
            },
            queue: by_queue.get(kind.queue()).copied().unwrap_or_default(),
            fan_out: fan_out.map(|f| FanOutSummary {
                slot: f.slot,
                complete: f.finished_at.is_some(),
                accounts: f.accounts,
                passes_started: f.started,
                nothing_due: (f.accounts - f.started).max(0),
            }),
            pass_states,
            passes,
        });
    }
    let failing = sexton_jobs::files::failing(pool).await?;
    let (erasures_open, erasures) =
        visible::open(&mut *pool.acquire().await?, at, ERASURES_SHOWN).await?;
    Ok(Status {
        at,
        backlogs_at: backlogs.map_or(at, |measured| measured.at),
        jobs,
        nightly: by_queue.get(tick::NIGHTLY).copied().unwrap_or_default(),
        // Every sexton queue's counts, added up rather than counted again.
        queue: by_queue
            .values()
            .fold(QueueCounts::default(), |all, q| QueueCounts {
                pending: all.pending + q.pending,
                running: all.running + q.running,
                done: all.done + q.done,
                failed: all.failed + q.failed,
            }),
        failed_jobs: queue::failed(pool, FAILED_SHOWN).await?,
        retrying_files: failing.retrying,
        quarantined_files: failing.quarantined,
        holds_active,
        holds,
        holds_error,
        erasures_open,
        erasures,
        orphans: sexton_jobs::orphans::latest(pool).await?,
        workers_total,
        workers,
    })
}

/// How many holds are active, and the newest of them.
async fn active_holds(pool: &sqlx::PgPool) -> Result<(i64, Vec<holds::Placed>), holds::Error> {
    Ok((
        holds::active_count(pool).await?,
        holds::active(pool, HOLDS_SHOWN).await?,
    ))
}

fn time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

fn counts(queue: &QueueCounts) -> String {
    format!(
        "{} pending, {} running, {} done, {} failed",
        queue.pending, queue.running, queue.done, queue.failed
    )
}

fn pairs(value: &serde_json::Value) -> String {
    match value.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "none".to_owned(),
    }
}

impl Status {
    /// The report for people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "sexton status at {}", time(Some(self.at)));
        for job in &self.jobs {
            render_job(&mut out, job);
        }
        let _ = writeln!(out, "\nnightly slots: {}", counts(&self.nightly));
        let _ = writeln!(out, "all queues: {}", counts(&self.queue));
        if self.failed_jobs.is_empty() {
            let _ = writeln!(out, "no job failed for good");
        } else {
            let _ = writeln!(out, "failed for good, kept for inspection (newest first):");
            for job in &self.failed_jobs {
                let _ = writeln!(
                    out,
                    "  {} {} {} after {}/{} attempts, due {}: {}",
                    job.id,
                    job.queue,
                    job.status,
                    job.attempts,
                    job.max_attempts,
                    time(Some(job.run_at)),
                    job.last_error
                        .as_deref()
                        .map_or_else(|| "(no error recorded)".to_owned(), crate::text::one_line),
                );
            }
        }
        for (root, n) in &self.retrying_files {
            let _ = writeln!(
                out,
                "{n} file deletions of root {root} failed and wait for the next drain: see \
                 sexton.pending_file_deletions (attempts, last_error)"
            );
        }
        for (root, n) in &self.quarantined_files {
            let _ = writeln!(
                out,
                "{n} file deletions of root {root} quarantined after their last attempt: see \
                 sexton.pending_file_deletions (quarantined_at, last_error)"
            );
        }
        match (self.holds_active, &self.holds_error) {
            (_, Some(error)) => {
                let _ = writeln!(
                    out,
                    "the holds could not be read: {error}\n  (no job removes anything while \
                     they cannot, HD-3; grant sexton's role SELECT on sexton.holds, or run \
                     `sexton migrate`)"
                );
            }
            (None | Some(0), None) => {
                let _ = writeln!(out, "no active hold");
            }
            (Some(n), None) => {
                let shown = self.holds.len() as i64;
                let plural = if n == 1 { "" } else { "s" };
                let _ = if shown < n {
                    writeln!(
                        out,
                        "{n} active hold{plural}, the newest {shown} first (what they cover stays):"
                    )
                } else {
                    writeln!(
                        out,
                        "{n} active hold{plural}, newest first (what they cover stays; sexton \
                         holds list):"
                    )
                };
                for hold in &self.holds {
                    let _ = writeln!(out, "  {}", holds::line(hold));
                }
                if shown < n {
                    let _ = writeln!(
                        out,
                        "  … and {} more: sexton holds list shows every one",
                        n - shown
                    );
                }
            }
        }
        render_erasures(&mut out, self);
        if let Some(scan) = &self.orphans {
            let _ = writeln!(out, "{scan}");
        }
        render_workers(&mut out, self);
        crate::text::printable(&out)
    }
}

/// The open erasure requests' lines of [`Status::render`] (RQ-7).
fn render_erasures(out: &mut String, status: &Status) {
    let n = status.erasures_open;
    if n == 0 {
        let _ = writeln!(out, "no open erasure request");
        return;
    }
    let shown = status.erasures.len() as i64;
    let _ = writeln!(
        out,
        "{n} open erasure request{}, the earliest due first{} (sexton erase status ID says more):",
        if n == 1 { "" } else { "s" },
        if shown < n {
            format!(", the first {shown}")
        } else {
            String::new()
        }
    );
    for request in &status.erasures {
        let _ = writeln!(out, "  {}", erasure_line(request, status.at));
    }
    if shown < n {
        let _ = writeln!(
            out,
            "  … and {} more: sexton erase status lists every one",
            n - shown
        );
    }
}

/// One open request: its id, scope kind, state, due date (and how late or how near), what it
/// withholds by reason and the holds that withhold it.
fn erasure_line(request: &Open, at: DateTime<Utc>) -> String {
    let days = (request.due_at - at).num_hours() as f64 / 24.0;
    let mut line = format!(
        "{} {}: {}, due {} ({})",
        request.id,
        request.scope,
        request.state.as_str(),
        time(Some(request.due_at)),
        if request.overdue {
            format!("OVERDUE by {:.1} days", -days)
        } else {
            format!("in {days:.1} days")
        }
    );
    if !request.withheld.0.is_empty() {
        let withheld: Vec<String> = request
            .withheld
            .0
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        let _ = write!(line, "; withheld: {}", withheld.join(", "));
    }
    if !request.holds.is_empty() {
        let holds: Vec<String> = request.holds.iter().map(ToString::to_string).collect();
        let _ = write!(line, "; by hold {}", holds.join(", "));
    }
    if request.residues > 0 {
        let _ = write!(line, "; {} residues found", request.residues);
    }
    line
}

/// The fleet's workers' lines of [`Status::render`].
fn render_workers(out: &mut String, status: &Status) {
    if status.workers.is_empty() {
        let _ = writeln!(out, "no worker has registered with the queue");
        return;
    }
    let _ = writeln!(
        out,
        "{} worker processes, the most recently heard from first:",
        status.workers_total
    );
    for worker in &status.workers {
        let _ = writeln!(
            out,
            "  {}: {} consumers, last heartbeat {}, started {}",
            crate::text::one_line(&worker.name),
            worker.consumers,
            time(Some(worker.last_heartbeat)),
            time(worker.started_at),
        );
    }
    if status.workers_total > status.workers.len() as i64 {
        let _ = writeln!(
            out,
            "  … and {} more (apalis.workers)",
            status.workers_total - status.workers.len() as i64
        );
    }
}

/// One job's lines of [`Status::render`]: its last complete slot and backlog, its queue, its
/// latest fan-out, its passes by state and the passes listed.
fn render_job(out: &mut String, job: &JobStatus) {
    let _ = writeln!(
        out,
        "\n{} ({}): last complete slot {}, backlog {}",
        job.job,
        if job.scope == "global" {
            "one global pass per slot"
        } else {
            "one pass per account per slot"
        },
        time(job.last_success_slot),
        job.backlog_seconds
            .map_or_else(|| "not measured".to_owned(), |s| format!("{s:.0} s")),
    );
    let _ = writeln!(out, "  queue: {}", counts(&job.queue));
    if let Some(f) = &job.fan_out {
        let _ = writeln!(
            out,
            "  slot {}: {} accounts looked at{}, {} passes started, {} with nothing due",
            time(Some(f.slot)),
            f.accounts,
            if f.complete {
                ""
            } else {
                " so far (fan-out not finished)"
            },
            f.passes_started,
            f.nothing_due,
        );
    }
    let s = &job.pass_states;
    if s.total() == 0 {
        let _ = writeln!(out, "  no pass yet");
    } else {
        let _ = writeln!(
            out,
            "  latest passes: {} finished, {} running, {} pending, {} failed{}{}",
            s.finished,
            s.running,
            s.pending,
            s.failed,
            if s.capped { " (counted so far)" } else { "" },
            if job.passes.len() as u64 == s.total() {
                ""
            } else {
                " (sexton status --all lists every one)"
            },
        );
    }
    for pass in &job.passes {
        render_pass(out, pass);
    }
}

/// One listed pass's lines of [`Status::render`].
fn render_pass(out: &mut String, pass: &Pass) {
    let who = match (&pass.account_name, pass.account_id) {
        (Some(name), Some(id)) => format!("account {} ({id})", crate::text::one_line(name)),
        (None, Some(id)) => format!("account {id} (deleted)"),
        _ => "global".to_owned(),
    };
    let _ = writeln!(
        out,
        "  {who}: slot {}, {} (last hop {}), {} hops, started {}, finished {}",
        time(Some(pass.slot)),
        pass.state,
        pass.outcome,
        pass.hops,
        time(pass.started_at),
        time(pass.finished_at),
    );
    let _ = writeln!(
        out,
        "    {} candidates, {} pruned; retained: {}; rows deleted: {}; {} files ({} bytes) deleted, {} file errors",
        pass.candidates,
        pass.pruned,
        pairs(&pass.retained),
        pairs(&pass.rows_deleted),
        pass.files_deleted,
        pass.bytes_reclaimed,
        pass.file_errors,
    );
    if let Some(error) = &pass.last_error {
        let _ = writeln!(out, "    last error: {}", crate::text::one_line(error));
    }
    if pass.throttles > 0 {
        let _ = writeln!(
            out,
            "    throttled {} times, last at {} by {} (the database was unhealthy; \
             hops wait [health] backoff_ms)",
            pass.throttles,
            time(pass.last_throttled_at),
            pass.last_throttled_by.as_deref().unwrap_or("?"),
        );
    }
}
