//! Run traces (SPEC §4, TR-1 … TR-4): files named `*.trace.jsonl` under the traces root go when
//! older than `[traces] max_age_days`, then — oldest first — while the rest exceed
//! `max_bytes` of allocated space. The same cleaner serves `sexton traces clean` (a dry run
//! unless confirmed) and the background job, which runs on its own cadence when enabled.
//!
//! Safety (TR-3): the tree is walked one directory at a time, each opened relative to its
//! parent without following a symlink, so no symlink (file or directory) and no `..` lead out
//! of the root. A candidate is a regular file whose first line is a trace signature; anything
//! else is counted by reason and never deleted. With no quota a trace younger than the age limit
//! cannot go, and is not read: a run reads what is old, not what the root holds (on an object
//! store, a GET saved per young object each run). Just before deleting, each batch is checked
//! against the agents' current and main sessions (a live session's trace stays) and every file
//! is looked at again: one that vanished or changed since it was planned is re-evaluated, not
//! deleted blindly (ER-3). One cleaner at a time across processes: an exclusive `flock(2)` on
//! `<traces_root>/.sexton-traces.lease`, whose holder writes who it is into the file.
//!
//! Names are bytes: a file or directory name that is not UTF-8 is walked, checked and deleted
//! like any other, found again only by its bytes (relative to the directory descriptor it was
//! listed in); it is shown to people lossily ([`Planned::path`]), and that rendering is never
//! used to find a file.
//!
//! Memory stays bounded at any number of files: the age rule needs nothing kept; the quota
//! ("oldest first until within") is found from a histogram of allocated bytes by mtime with a
//! bounded number of buckets, then the one bucket where the quota line falls is sorted exactly
//! in a second walk, and a third walk deletes.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::files::{FileCounts, PathSettings, Root};
use crate::job::{Cadence, HopOutcome, Job, Report, Scope};
use crate::owner_loop::{Bounds, End};
use crate::pass::{Now, Policy, Step};
use crate::settings::{Check, Raw};
use crate::shown::Shown;

mod clean;
mod lease;
mod objects;
mod plan;
mod walk;
pub use clean::*;
pub use lease::*;
use walk::Seen;
pub(crate) use walk::{first_line, line_of, signature};

/// The lease file's name, directly under the traces root.
pub const LEASE_FILE: &str = ".sexton-traces.lease";

/// The trace signature's format (TR-3).
pub const FORMAT: &str = "run-trace/1";

/// How far into a file its first line is looked for.
pub(crate) const FIRST_LINE_LIMIT: usize = 64 * 1024;

/// Files whose sessions are checked and that are deleted together.
const BATCH: usize = 256;

/// Most buckets the quota histogram holds; past it, neighbouring buckets merge.
const BUCKETS: usize = 16_384;

/// Deepest directory nesting walked below the root.
const MAX_DEPTH: usize = 32;

crate::reasons! {
    /// Why a trace file was kept (TR-3, ER-3), as the background job's hops count it.
    pub enum TraceReason {
        LegalHold = "legal_hold",
        BadSignature = "bad_signature",
        NotRegular = "not_regular",
        OutsideRoot = "outside_root",
        Unreadable = "unreadable",
        LiveSession = "live_session",
        Changed = "changed",
        Vanished = "vanished",
        Error = "error",
    }
}

/// `[traces]` (TR-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Files whose mtime is older than this many days go; 0: no age limit.
    pub max_age_days: i32,
    /// Allocated bytes the remaining files may hold; 0: no quota.
    pub max_bytes: u64,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.max_age_days > 0 || self.max_bytes > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    pub enabled: bool,
    pub limits: Limits,
    /// How often the background job runs when enabled.
    pub cadence: chrono::Duration,
}

/// Why a file goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Age,
    Quota,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::Quota => "quota",
        }
    }
}

/// A file the cleaner plans to delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Planned {
    /// Relative to the traces root, for people: rendered lossily where a name is not UTF-8, so
    /// never a way to find the file ([`raw_path`](Self::raw_path) is).
    pub path: String,
    /// Relative to the traces root, its exact bytes.
    #[serde(skip)]
    raw: Vec<u8>,
    /// Allocated bytes (blocks × 512).
    pub bytes: u64,
    pub mtime: DateTime<Utc>,
    pub reason: Reason,
    pub agent_id: String,
    pub session_id: Uuid,
    #[serde(skip)]
    seen: Seen,
}

/// What a run found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TraceReport {
    /// Regular files named `*.trace.jsonl` with a valid signature — and, when no quota is set,
    /// those younger than the age limit, which are not read (they cannot go).
    pub candidates: u64,
    /// Their allocated bytes before the run.
    pub candidate_bytes: u64,
    /// Planned (a dry run) or deleted (confirmed), by reason.
    pub planned: BTreeMap<&'static str, u64>,
    pub planned_bytes: u64,
    pub deleted: u64,
    pub deleted_bytes: u64,
    /// Left in place, by the label of its [`TraceReason`].
    pub kept: BTreeMap<&'static str, u64>,
    /// Whether files were deleted (`--confirm`, the background job) or only planned.
    pub confirmed: bool,
}

impl TraceReport {
    fn keep(&mut self, reason: &'static str) {
        *self.kept.entry(reason).or_default() += 1;
    }
}

/// Sees each planned file, and each batch just before it is deleted.
pub trait Observer: Send {
    /// A file planned to go (the dry run's line).
    fn planned(&mut self, _file: &Planned) {}
    /// A batch about to be checked and deleted (confirmed runs only).
    fn before_delete(&mut self, _batch: &[Planned]) {}
    /// A file under the root that stays, and why (the first walk only); its path relative to
    /// the root, exactly as it is on disk.
    fn kept(&mut self, _path: &Path, _reason: &'static str) {}
}

/// An observer that looks at nothing.
pub struct Quiet;

impl Observer for Quiet {}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("traces root {}: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("another trace cleaner holds the lease ({holder})")]
    LeaseHeld { holder: String },
    #[error("lease file {}: {source}", path.display())]
    Lease {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Another cleaner took over an expired row lease: nothing more is deleted.
    #[error("the trace cleaner's lease on {root} was taken over by another cleaner")]
    LeaseLost { root: String },
    /// The object store does not answer for the traces root.
    #[error("traces root {root} cannot be read: {why}")]
    Store { root: String, why: String },
    #[error(transparent)]
    Files(#[from] crate::files::DrainError),
}

/// The `[traces]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    enabled: Raw<bool>,
    max_age_days: Raw<i64>,
    max_bytes: Raw<i64>,
    cadence_minutes: Raw<i64>,
}

/// Reads `[traces]`; enabled with no limit is refused, naming both (TR-1).
pub fn settings(s: RawSettings, c: &mut Check<'_>) -> Option<TraceSettings> {
    let enabled = c.flag("traces.enabled", &s.enabled);
    let max_age_days = c.int(
        "traces.max_age_days",
        &s.max_age_days,
        0..=36_500,
        "a number of days from 0 (no age limit) to 36500",
    );
    let max_bytes = c.int(
        "traces.max_bytes",
        &s.max_bytes,
        0..=i64::MAX,
        "a number of bytes, 0 (no quota) or more",
    );
    let cadence = c
        .int::<i64>(
            "traces.cadence_minutes",
            &s.cadence_minutes,
            1..=525_600,
            "a number of minutes from 1 to 525600 (a year)",
        )
        .map(chrono::Duration::minutes);
    let limits = Limits {
        max_age_days: max_age_days?,
        max_bytes: max_bytes?,
    };
    if enabled == Some(true) && !limits.any() {
        c.fail(
            "traces.enabled",
            "traces.max_age_days or traces.max_bytes above 0 when trace retention is enabled \
             (TR-1)",
            "traces.max_age_days = 0 and traces.max_bytes = 0",
        );
        return None;
    }
    Some(TraceSettings {
        enabled: enabled?,
        limits,
        cadence: cadence?,
    })
}

/// What a run would do now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub enabled: bool,
    pub limits: Limits,
    #[serde(flatten)]
    pub report: TraceReport,
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.enabled {
            "enabled"
        } else {
            "disabled (`sexton traces clean` applies the limits on demand)"
        };
        write!(
            f,
            "traces (TR-1 … TR-4), {state}, max_age_days {} / max_bytes {}: {} candidates ({} \
             bytes), {} would go ({} bytes)",
            self.limits.max_age_days,
            self.limits.max_bytes,
            self.report.candidates,
            self.report.candidate_bytes,
            self.report.planned.values().sum::<u64>(),
            self.report.planned_bytes
        )?;
        for (reason, n) in &self.report.planned {
            write!(f, "\n  by {reason:<20} {n:>10}")?;
        }
        for (reason, n) in &self.report.kept {
            write!(f, "\n  kept {reason:<18} {n:>10}")?;
        }
        Ok(())
    }
}

/// The background cleaner (TR-4), as the worker registers it: global, on its own cadence, and
/// only when enabled.
pub struct TraceCleanup;

impl Job for TraceCleanup {
    const NAME: &'static str = "trace_cleanup";
    const SCOPE: Scope = Scope::Global;
    const SECTION: &'static str = "traces";

    type Reason = TraceReason;
    /// None: its limits are measured when it runs (TR-1).
    type Cutoff = ();
    /// None: a run walks the whole root.
    type Cursor = ();
    type Raw = RawSettings;
    type Settings = TraceSettings;
    type Error = Error;

    fn settings(
        raw: RawSettings,
        _paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<TraceSettings> {
        settings(raw, check)
    }

    fn cadence(settings: &TraceSettings) -> Cadence {
        Cadence::every_while(settings.enabled, settings.cadence)
    }

    fn bounds(_settings: &TraceSettings) -> Bounds {
        Bounds::whole()
    }

    async fn policy(now: Now<'_, Self>) -> Result<Policy<()>, Error> {
        Ok(Policy::while_enabled(now.settings.enabled, ()))
    }

    /// One run under the lease, the whole root.
    async fn run(step: Step<'_, Self>, report: &mut Report<TraceReason>) -> Result<End<()>, Error> {
        let settings = step.settings;
        let root = step.env.paths.store(Root::Traces);
        let conn = step.hop.conn;
        let now = step.reference;
        let holder = holder("sexton worker (trace_cleanup)", now);
        let mut lease = match Lease::take(&mut *conn, &root, &holder).await {
            Ok(lease) => lease,
            Err(Error::LeaseHeld { holder }) => {
                tracing::info!(holder = %Shown(&holder), "another trace cleaner holds the lease; nothing deleted");
                report.outcome = HopOutcome::LeaseHeld;
                return Ok(End::Finished);
            }
            Err(err) => return Err(err),
        };
        let started = std::time::Instant::now();
        let done = clean(
            &mut *conn,
            &root,
            settings.limits,
            now,
            Some(&mut lease),
            &mut Quiet,
            step.env.stop,
        )
        .await;
        lease.release(conn).await?;
        let done = done?;
        report.owner_seconds = started.elapsed().as_secs_f64();
        report.candidates = done.candidates;
        report.pruned = done.deleted;
        for (label, n) in &done.kept {
            let reason = <TraceReason as crate::job::Reason>::ALL
                .iter()
                .find(|r| r.as_str() == *label);
            debug_assert!(reason.is_some(), "{label} is not a TraceReason");
            report.retain(reason.copied().unwrap_or(TraceReason::Error), *n);
        }
        report.files = FileCounts {
            deleted: done.deleted,
            bytes: done.deleted_bytes,
            errors: report.retained(TraceReason::Error),
        };
        Ok(End::Finished)
    }
}
