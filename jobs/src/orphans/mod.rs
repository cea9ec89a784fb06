//! Derivative cleanup (SPEC §12, DC-1 … DC-5): files that no row owns. In each file root an
//! orphan is an output file that no `output_files` row names under any spelling (EX-3's path
//! key and loose spellings) and no pending deletion covers; an attachment file that no live
//! `attachments` row names and no pending deletion covers; a session directory whose session
//! no longer exists; an archive frame `<session>/archive/<kind>-<archive id>.frame` of an
//! existing session with no `conversation_archives` row of that id; a trace directory
//! `<agent>/` whose agent no longer exists. Generated artifacts are never looked at (AT-1).
//!
//! Never a file in the making (DC-2): only what was last modified more than `[orphans]
//! grace_days` ago goes (for a directory, every entry in it), a hold on what its path names
//! keeps it, and just before each batch is unlinked — in one transaction through the hold gate
//! — its rows and holds are asked again (a row that appeared keeps its file: `row_appeared`) and
//! each file is looked at again (one that changed since it was judged is left for the next
//! scan: `changed`).
//!
//! Any size (DC-4): a root is walked as the trace cleaner walks one ([`crate::files::tree`]: one
//! directory at a time, no symlink followed, nothing outside the root), its entries asked about
//! in batches of [`BATCH`] through the path-key and primary-key indexes; an object-store root
//! is listed by prefix.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::files::{FileCounts, PathSettings, Root};
use crate::job::{Cadence, Inspect, Job, Look, Report, Scope};
use crate::owner_loop::{Bounds, End};
use crate::pass::{Now, Policy, Step};
use crate::settings::{Check, Raw};

mod frames;
mod judge;
mod local;
mod objects;
mod scan;
mod walk;
pub use scan::*;

/// Entries asked about, and unlinked, together.
pub const BATCH: usize = 1_000;

/// Deepest directory nesting walked below a root.
const MAX_DEPTH: usize = 32;

/// The roots a scan walks, in its order, by the names `status` uses (DC-3).
pub const ROOTS: [Root; 4] = [
    Root::Outputs,
    Root::Attachments,
    Root::Sessions,
    Root::Traces,
];

/// The per-root counts' labels (DC-5): `no_row` what no row owns, the others why some of it
/// stayed.
pub const REASONS: [&str; 5] = ["no_row", "grace", "legal_hold", "row_appeared", "changed"];

crate::reasons! {
    /// Why an orphan stayed (DC-2), as the background job's hops count it.
    pub enum OrphanReason {
        Grace = "grace",
        LegalHold = "legal_hold",
        RowAppeared = "row_appeared",
        Changed = "changed",
    }
}

/// `[orphans]` (DC-2, DC-3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanSettings {
    /// Whether the background job runs.
    pub enabled: bool,
    /// Only what was last modified more than this many days ago is an orphan.
    pub grace_days: i32,
    /// How often the background job runs when enabled.
    pub cadence: chrono::Duration,
}

/// The `[orphans]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    enabled: Raw<bool>,
    grace_days: Raw<i64>,
    cadence_minutes: Raw<i64>,
}

/// What a scan found and did in one root (DC-5). An entry is a file, or a whole directory (a
/// session's or an agent's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RootCounts {
    /// `scanned`; or why the root was not: `missing`, `not_directory`, `unreadable`.
    pub state: &'static str,
    /// Why, for people, when the root could not be scanned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Entries no row owns, by label ([`REASONS`]): `no_row` all of them, the others those
    /// that stayed and why.
    pub counts: BTreeMap<&'static str, u64>,
    /// Entries listed to go (a dry run), or that were to go (confirmed).
    pub listed: u64,
    pub listed_bytes: u64,
    /// Entries removed.
    pub gone: u64,
    /// Files unlinked (a directory's files each count), their bytes, and entries whose removal
    /// failed (counted, reported, the scan goes on).
    pub removed: FileCounts,
}

impl RootCounts {
    fn new() -> Self {
        Self {
            state: "scanned",
            counts: REASONS.iter().map(|reason| (*reason, 0)).collect(),
            ..Self::default()
        }
    }

    pub(crate) fn count(&mut self, reason: &'static str, n: u64) {
        *self.counts.entry(reason).or_default() += n;
    }

    /// How many were counted for `reason`.
    pub fn of(&self, reason: &str) -> u64 {
        self.counts.get(reason).copied().unwrap_or_default()
    }
}

/// What a scan found and did, root by root.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OrphanReport {
    /// Whether orphans were removed (`--confirm`, the background job) or only listed.
    pub confirmed: bool,
    pub grace_days: i32,
    pub roots: BTreeMap<&'static str, RootCounts>,
}

impl OrphanReport {
    /// `label`'s count over every root.
    pub fn total(&self, label: &str) -> u64 {
        self.roots.values().map(|root| root.of(label)).sum()
    }
}

/// Why a scan stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Files(#[from] crate::files::DrainError),
}

/// Reads `[orphans]`: a grace under a day is refused (DC-2).
pub fn settings(s: RawSettings, c: &mut Check<'_>) -> Option<OrphanSettings> {
    let enabled = c.flag("orphans.enabled", &s.enabled);
    let grace_days = c.int(
        "orphans.grace_days",
        &s.grace_days,
        1..=36_500,
        "a number of days from 1 to 36500 (a file younger than the grace may still be in the \
         making, DC-2)",
    );
    let cadence = c
        .int::<i64>(
            "orphans.cadence_minutes",
            &s.cadence_minutes,
            1..=525_600,
            "a number of minutes from 1 to 525600 (a year)",
        )
        .map(chrono::Duration::minutes);
    Some(OrphanSettings {
        enabled: enabled?,
        grace_days: grace_days?,
        cadence: cadence?,
    })
}

/// The background job (DC-3): global, on its own cadence, only when enabled; every root,
/// confirmed.
pub struct Orphans;

impl Job for Orphans {
    const NAME: &'static str = "orphans";
    const SCOPE: Scope = Scope::Global;
    const SECTION: &'static str = "orphans";

    type Reason = OrphanReason;
    /// None: the grace is measured when it runs.
    type Cutoff = ();
    /// None: a run walks every root.
    type Cursor = ();
    type Raw = RawSettings;
    type Settings = OrphanSettings;
    type Error = Error;

    fn settings(
        raw: RawSettings,
        _paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<OrphanSettings> {
        settings(raw, check)
    }

    fn cadence(settings: &OrphanSettings) -> Cadence {
        Cadence::every_while(settings.enabled, settings.cadence)
    }

    fn bounds(_settings: &OrphanSettings) -> Bounds {
        Bounds::whole()
    }

    async fn policy(now: Now<'_, Self>) -> Result<Policy<()>, Error> {
        Ok(Policy::while_enabled(now.settings.enabled, ()))
    }

    /// One scan of every root, confirmed, recorded in `sexton.orphan_scans`.
    async fn run(
        step: Step<'_, Self>,
        report: &mut Report<OrphanReason>,
    ) -> Result<End<()>, Error> {
        let conn = step.hop.conn;
        let started = std::time::Instant::now();
        let scan = Scan {
            paths: step.env.paths,
            roots: &ROOTS,
            grace_days: step.settings.grace_days,
            now: step.reference,
            confirm: true,
        };
        let done = scan.run(&mut *conn, &mut Quiet, step.env.stop).await?;
        record(&mut *conn, "orphans job", step.reference, &done).await?;
        report.owner_seconds = started.elapsed().as_secs_f64();
        report.candidates = done.total("no_row");
        report.pruned = done.roots.values().map(|root| root.gone).sum();
        for reason in <OrphanReason as crate::job::Reason>::ALL {
            report.retain(*reason, done.total(reason.as_str()));
        }
        for root in done.roots.values() {
            report.files.add(root.removed);
        }
        Ok(End::Finished)
    }
}

/// Writes what a scan found and did (DC-5).
///
/// # Errors
/// A database error.
pub async fn record(
    conn: &mut PgConnection,
    by: &str,
    started_at: DateTime<Utc>,
    report: &OrphanReport,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sexton.orphan_scans (started_at, by, confirmed, roots) VALUES ($1, $2, $3, $4)",
    )
    .bind(started_at)
    .bind(by)
    .bind(report.confirmed)
    .bind(sqlx::types::Json(&report.roots))
    .execute(conn)
    .await?;
    Ok(())
}

/// The latest scan (DC-5, `status`): when it finished, by whom, whether confirmed, and its
/// counts per root.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct LatestScan {
    pub finished_at: DateTime<Utc>,
    pub by: String,
    pub confirmed: bool,
    pub roots: sqlx::types::Json<serde_json::Value>,
}

impl std::fmt::Display for LatestScan {
    /// One line per root: what no row owned, why some of it stayed, what went.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.confirmed {
            "confirmed"
        } else {
            "dry run"
        };
        write!(
            f,
            "orphans (DC-5): last scan {} by {} ({how})",
            self.finished_at.format("%Y-%m-%dT%H:%M:%SZ"),
            self.by
        )?;
        let Some(roots) = self.roots.as_object() else {
            return Ok(());
        };
        for (root, counts) in roots {
            let number = |key: &str| counts.get(key).and_then(serde_json::Value::as_u64);
            let state = counts.get("state").and_then(|s| s.as_str()).unwrap_or("");
            write!(f, "\n  {root:<12} {state}")?;
            for reason in REASONS {
                let n = counts
                    .get("counts")
                    .and_then(|c| c.get(reason))
                    .and_then(serde_json::Value::as_u64);
                write!(f, ", {reason} {}", n.unwrap_or(0))?;
            }
            write!(f, ", removed {}", number("gone").unwrap_or(0))?;
        }
        Ok(())
    }
}

/// The latest scan recorded, if any.
///
/// # Errors
/// A database error.
pub async fn latest<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<Option<LatestScan>, sqlx::Error> {
    sqlx::query_as(
        "SELECT finished_at, by, confirmed, roots FROM sexton.orphan_scans
         ORDER BY finished_at DESC, id DESC LIMIT 1",
    )
    .fetch_optional(db)
    .await
}

/// The counts of every confirmed scan, per root and label (`no_row`, the reasons, `removed`):
/// the database's totals, the same on every replica (the metrics, DC-5).
///
/// # Errors
/// A database error.
pub async fn totals<'e>(
    db: impl sqlx::PgExecutor<'e>,
) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.key, c.key, sum(c.value::bigint)::bigint
         FROM sexton.orphan_scans s, jsonb_each(s.roots) r,
              jsonb_each_text(r.value -> 'counts') c
         WHERE s.confirmed
         GROUP BY 1, 2
         UNION ALL
         SELECT r.key, 'removed', sum((r.value ->> 'gone')::bigint)::bigint
         FROM sexton.orphan_scans s, jsonb_each(s.roots) r
         WHERE s.confirmed
         GROUP BY 1",
    )
    .fetch_all(db)
    .await
}

/// What a scan would do now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub enabled: bool,
    #[serde(flatten)]
    pub report: OrphanReport,
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.enabled {
            "enabled"
        } else {
            "disabled (`sexton orphans scan` lists and removes on demand)"
        };
        write!(
            f,
            "orphans (DC-1 … DC-5), {state}, grace_days {}: {} no row owns, {} would go",
            self.report.grace_days,
            self.report.total("no_row"),
            self.report.roots.values().map(|r| r.listed).sum::<u64>(),
        )?;
        for (root, counts) in &self.report.roots {
            write!(f, "\n  {root:<12} {}", counts.state)?;
            for (reason, n) in &counts.counts {
                write!(f, "  {reason} {n}")?;
            }
        }
        Ok(())
    }
}

/// Measuring a backlog would mean walking every root at every refresh of the gauge: the scan
/// reports none.
impl Inspect for Orphans {
    type Preview = Preview;

    async fn preview(
        look: Look<'_, OrphanSettings>,
        _accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let Look {
            conn,
            settings,
            paths,
            now,
        } = look;
        let scan = Scan {
            paths,
            roots: &ROOTS,
            grace_days: settings.grace_days,
            now,
            confirm: false,
        };
        let report = scan
            .run(conn, &mut Quiet, &std::sync::atomic::AtomicBool::new(false))
            .await?;
        Ok(vec![Preview {
            enabled: settings.enabled,
            report,
        }])
    }

    fn tally(preview: &Preview) -> Vec<(String, i64)> {
        REASONS
            .iter()
            .map(|reason| {
                let n = preview.report.total(reason);
                (
                    format!("orphans {reason}"),
                    i64::try_from(n).unwrap_or(i64::MAX),
                )
            })
            .collect()
    }
}
