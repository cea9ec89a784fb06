//! Attachment bytes (SPEC §4, AT-1): per account, in the nightly fan-out, an attachment whose
//! file was last modified more than `[attachments] max_age_days` ago loses its file and gets
//! `attachments.bytes_expired_at` set; the row stays. The file's mtime decides, not the row's
//! `created_at`.
//!
//! A pass is a chain of hops over the account's live attachments (`bytes_expired_at IS NULL`)
//! in id order. Each row's path is resolved under the attachments root one component at a time
//! without following a symlink: an absolute path, `..`, or a symlink anywhere on the way is
//! never followed — counted `outside_root`. A row whose file is missing is counted `missing`
//! and left unmarked (nothing says how old its bytes were; a restored file is judged next
//! night). Expired rows are marked, and their files recorded for removal, in one short
//! transaction that skips rows an application holds (`busy`); the files go after commit through
//! the shared mechanism (`files::drain`), which keeps a file another live attachment still
//! names. The artifacts root is never touched.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rustix::fs::FileType;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::cutoff::{self, days_before};
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::files::{self, DrainError, PathSettings, Root};
use crate::job::{AccountRange, Env, HopOutcome, Job, Position, Report, Scope};
use crate::owner_loop::{Bounds, Candidates, Chunks, Files, Hop, Taken, Window, Windowed};
use crate::payload::V1;
use crate::settings::{Check, Raw};

/// `[attachments]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentSettings {
    /// Files older than this many days (by mtime) expire; 0 disables.
    pub max_age_days: i32,
    /// Rows looked at per hop.
    pub window_size: u32,
    /// A hop stops after this long and hands the rest to the next hop.
    pub budget: Duration,
}

/// Why an attachment kept its bytes this pass.
pub const RETAIN_REASONS: [&str; 5] = [
    "outside_root",
    "not_regular",
    "missing",
    "unreadable",
    "busy",
];

/// Rows marked together in one transaction.
const CHUNK: usize = 200;

/// One hop's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    pub version: V1,
    pub account_id: Uuid,
    pub pass_started_at: DateTime<Utc>,
    /// Fixed by the first hop and carried.
    pub cutoff: Option<DateTime<Utc>>,
    /// The last attachment looked at.
    pub after: Option<Uuid>,
    /// 0 for the first hop of a pass.
    pub hop: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Files(#[from] DrainError),
}

/// What a row's file is, as far as expiry goes.
enum Verdict {
    Expired,
    Young,
    Kept(&'static str),
}

fn judge(root: &std::os::fd::OwnedFd, relative: &str, cutoff: DateTime<Utc>) -> Verdict {
    match files::stat_under(root, relative) {
        Ok(Some(stat)) => match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {
                let mtime = DateTime::from_timestamp(stat.st_mtime, 0).unwrap_or(cutoff);
                if mtime < cutoff {
                    Verdict::Expired
                } else {
                    Verdict::Young
                }
            }
            FileType::Symlink => Verdict::Kept("outside_root"),
            _ => Verdict::Kept("not_regular"),
        },
        Ok(None) => Verdict::Kept("missing"),
        Err(err) if err.kind() == std::io::ErrorKind::InvalidInput => Verdict::Kept("outside_root"),
        Err(_) => Verdict::Kept("unreadable"),
    }
}

/// One hop over one window of an account's live attachments (the owner loop, [`Hop::run`]).
///
/// # Errors
/// [`Error`]; what was committed stays, and the hop can be run again.
pub async fn hop(
    env: Env<'_>,
    settings: &AttachmentSettings,
    args: &Args,
    report: &mut Report<Args>,
) -> Result<(), Error> {
    let root_path = &env.paths.attachments_root;
    *report = Report::new(&RETAIN_REASONS);
    // Rows are marked, never deleted: what expired is counted in `pruned` and the files.
    report.window = settings.window_size;
    let bounds = Bounds {
        window: Some(settings.window_size),
        budget: settings.budget,
    };
    let files = Files {
        root: Root::Attachments,
        path: root_path,
        scope: Some(args.account_id),
        beside: None,
    };
    let hop = Hop::start(env.conn, env.health, env.stop, bounds, Some(files), report).await?;
    let (database_now, exists): (DateTime<Utc>, bool) =
        sqlx::query_as("SELECT now(), EXISTS (SELECT 1 FROM accounts WHERE id = $1)")
            .bind(args.account_id)
            .fetch_one(&mut *hop.conn)
            .await?;
    if !exists {
        report.outcome = HopOutcome::AccountGone.as_str();
        return Ok(());
    }
    if settings.max_age_days == 0 {
        report.outcome = HopOutcome::Disabled.as_str();
        return Ok(());
    }
    let current = days_before(
        cutoff::reference(args.pass_started_at, database_now),
        settings.max_age_days,
    );
    let cutoff = match args.cutoff {
        Some(carried) => current.map(|c| c.min(carried)),
        None => current,
    };
    let Some(cutoff) = cutoff else {
        return Ok(());
    };
    let root = files::open_root(root_path).map_err(|source| DrainError::Root {
        path: root_path.clone(),
        source,
    })?;
    let mut live = Windowed::new(
        Live {
            account_id: args.account_id,
            cutoff,
            root,
        },
        Chunks::Fixed(CHUNK),
    );
    let end = hop.run(&mut live, args.after, report).await?;
    report.outcome = end.outcome().as_str();
    report.next = end.next().map(|after| Args {
        version: V1,
        account_id: args.account_id,
        pass_started_at: args.pass_started_at,
        cutoff: Some(cutoff),
        after,
        hop: args.hop + 1,
    });
    Ok(())
}

/// An account's live attachments, in id order, as the owner loop takes them.
struct Live {
    account_id: Uuid,
    cutoff: DateTime<Utc>,
    root: std::os::fd::OwnedFd,
}

impl Window for Live {
    /// An attachment and the path it names.
    type Candidate = (Uuid, String);
    /// The last attachment looked at.
    type Cursor = Uuid;
    type Report = Report<Args>;
    type Error = Error;

    const TABLES: &'static [&'static str] = &["attachments", "pending_file_deletions"];

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Uuid>,
        room: u32,
        _report: &mut Report<Args>,
    ) -> Result<Candidates<(Uuid, String), Uuid>, Error> {
        let candidates = sqlx::query_as(
            "SELECT id, relative_path FROM attachments
             WHERE account_id = $1 AND bytes_expired_at IS NULL AND id > $2
             ORDER BY id LIMIT $3",
        )
        .bind(self.account_id)
        .bind(at.copied().unwrap_or_default())
        .bind(i64::from(room))
        .fetch_all(&mut *conn)
        .await?;
        Ok(Candidates {
            candidates,
            tail: None,
        })
    }

    fn cursor(&self, (id, _): &(Uuid, String)) -> Uuid {
        *id
    }

    async fn take(
        &mut self,
        conn: &mut PgConnection,
        chunk: &[(Uuid, String)],
        report: &mut Report<Args>,
    ) -> Result<Taken, Error> {
        let (mut expired, mut judged) = (Vec::new(), Vec::new());
        for (id, path) in chunk {
            match judge(&self.root, path, self.cutoff) {
                Verdict::Expired => {
                    expired.push(*id);
                    judged.push(path.clone());
                }
                Verdict::Young => {}
                Verdict::Kept(reason) => retain(report, reason),
            }
        }
        if expired.is_empty() {
            return Ok(Taken::default());
        }
        let marked: Vec<Uuid> = sqlx::query_scalar(MARK_EXPIRED)
            .bind(&expired)
            .bind(&judged)
            .bind(self.account_id)
            .fetch_all(&mut *conn)
            .await?;
        for _ in marked.len()..expired.len() {
            retain(report, "busy");
        }
        report.pruned += marked.len() as u64;
        Ok(Taken {
            recorded: marked.len() as u64,
            sized_by: None,
        })
    }
}

fn retain(report: &mut Report<Args>, reason: &'static str) {
    count(&mut report.retained, reason);
}

/// Adds one to `reason`'s count in a list of [`RETAIN_REASONS`] counts.
fn count(counts: &mut [(&'static str, u64)], reason: &'static str) {
    if let Some((_, n)) = counts.iter_mut().find(|(r, _)| *r == reason) {
        *n += 1;
    }
}

/// Marks the attachments `$1` of account `$3` expired — each only if still live and still
/// naming the path `$2` it was judged by, so that a row repointed at a fresh file meanwhile is
/// left for the next pass — and records their files for removal, in one statement and so one
/// short transaction; a row an application holds is skipped. Returns the rows marked.
const MARK_EXPIRED: &str = "
    WITH judged AS (
        SELECT * FROM unnest($1::uuid[], $2::text[]) AS j (id, relative_path)),
    locked AS (
        SELECT a.id FROM attachments a JOIN judged j ON j.id = a.id
        WHERE a.account_id = $3 AND a.bytes_expired_at IS NULL
          AND a.relative_path = j.relative_path
        ORDER BY a.id
        FOR UPDATE OF a SKIP LOCKED),
    marked AS (
        UPDATE attachments a SET bytes_expired_at = now()
        FROM locked WHERE a.id = locked.id
        RETURNING a.id, a.relative_path),
    recorded AS (
        INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
        SELECT 'attachments', $3, relative_path FROM marked)
    SELECT id FROM marked";

/// The job's verdict on one attachment, from the same judgement of its file.
async fn explain_attachment(
    conn: &mut PgConnection,
    settings: &AttachmentSettings,
    paths: &PathSettings,
    now: DateTime<Utc>,
    id: Uuid,
) -> Result<Option<Explanation>, Error> {
    type Row = (Uuid, String, Option<DateTime<Utc>>);
    let row: Option<Row> = sqlx::query_as(
        "SELECT account_id, relative_path, bytes_expired_at FROM attachments WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((account, path, expired_at)) = row else {
        return Ok(None);
    };
    let cutoff = match settings.max_age_days {
        0 => None,
        days => days_before(now, days),
    };
    let root = files::open_root(&paths.attachments_root).map_err(|source| DrainError::Root {
        path: paths.attachments_root.clone(),
        source,
    })?;
    let mtime = files::stat_under(&root, &path)
        .ok()
        .flatten()
        .and_then(|stat| DateTime::from_timestamp(stat.st_mtime, 0));
    let mut explanation = Explanation {
        job: AttachmentExpiry::NAME,
        subject: "attachment",
        id: id.to_string(),
        account_id: Some(account),
        policy: match settings.max_age_days {
            0 => "[attachments] max_age_days = 0: attachment expiry is off".into(),
            days => format!("[attachments] max_age_days = {days}"),
        },
        measured_from: Some(format!("the modification time of {path}")),
        age_at: mtime,
        cutoff,
        verdict: ExplainVerdict::Retained,
        reasons: Vec::new(),
        removed_at: None,
        removed_by: None,
    };
    if let Some(at) = expired_at {
        explanation.verdict = ExplainVerdict::Removed;
        explanation.removed_at = Some(at);
        explanation.reasons.push(ExplainReason::new(
            "AT-1",
            "bytes_expired",
            "its file was deleted and bytes_expired_at set; the row stays",
        ));
        return Ok(Some(explanation));
    }
    let Some(cutoff) = cutoff else {
        explanation.reasons.push(ExplainReason::new(
            "AT-1",
            "disabled",
            "attachment expiry is off, or its age reaches back past the calendar",
        ));
        return Ok(Some(explanation));
    };
    match judge(&root, &path, cutoff) {
        Verdict::Expired => {
            explanation.verdict = ExplainVerdict::Eligible;
            explanation.reasons.push(ExplainReason::new(
                "AT-1",
                "expired",
                "its file is older than the age: the next pass deletes it and marks the row",
            ));
        }
        Verdict::Young => explanation.reasons.push(ExplainReason::new(
            "AT-1",
            "not_expired",
            "its file was modified after the cutoff",
        )),
        Verdict::Kept(reason) => explanation.reasons.push(ExplainReason::new(
            "AT-1",
            reason,
            match reason {
                "outside_root" => format!(
                    "{path:?} leaves the attachments root (absolute, `..` or a symlink): never followed"
                ),
                "missing" => format!("no file at {path:?}: counted, the row left unmarked"),
                "not_regular" => format!("{path:?} is not a regular file"),
                _ => format!("{path:?} cannot be read"),
            },
        )),
    }
    Ok(Some(explanation))
}

/// The `[attachments]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    max_age_days: Raw<i64>,
    window_size: Raw<i64>,
    hop_budget_ms: Raw<i64>,
}

/// What a pass would do for one account now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub account_id: Uuid,
    pub max_age_days: i32,
    pub cutoff: Option<DateTime<Utc>>,
    /// Live attachments whose file is past the age.
    pub expired: u64,
    /// Live attachments left, by reason.
    pub kept: Vec<(&'static str, u64)>,
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cutoff {
            None => write!(
                f,
                "account {}: attachment expiry disabled, nothing goes",
                self.account_id
            ),
            Some(cutoff) => {
                write!(
                    f,
                    "account {}: {} attachments' bytes older than {} days (mtime before {}) expire",
                    self.account_id,
                    self.expired,
                    self.max_age_days,
                    cutoff.format("%Y-%m-%dT%H:%M:%SZ")
                )?;
                for (reason, n) in self.kept.iter().filter(|(_, n)| *n > 0) {
                    write!(f, "\n  kept {reason:<18} {n:>10}")?;
                }
                Ok(())
            }
        }
    }
}

/// The job kind, as the worker registers it.
pub struct AttachmentExpiry;

impl Job for AttachmentExpiry {
    const NAME: &'static str = "attachment_expiry";
    const QUEUE: &'static str = "sexton.attachment_expiry";
    const SCOPE: Scope = Scope::Account;
    const SECTION: &'static str = "attachments";
    const SUBJECTS: &'static [&'static str] = &["attachment"];
    const RETAIN_REASONS: &'static [&'static str] = &RETAIN_REASONS;

    type Args = Args;
    type Settings = AttachmentSettings;
    type Preview = Preview;
    type Error = Error;

    fn settings(
        section: &serde_json::Value,
        _paths: &PathSettings,
        c: &mut Check<'_>,
    ) -> Option<AttachmentSettings> {
        let s: RawSettings = c.section(Self::SECTION, section)?;
        let max_age_days = c.int(
            "attachments.max_age_days",
            &s.max_age_days,
            0..=36_500,
            "a number of days from 0 (never expire) to 36500",
        );
        let window_size = c.int(
            "attachments.window_size",
            &s.window_size,
            1..=100_000,
            "an integer from 1 to 100000",
        );
        let budget = c.millis("attachments.hop_budget_ms", &s.hop_budget_ms);
        Some(AttachmentSettings {
            max_age_days: max_age_days?,
            window_size: window_size?,
            budget: budget?,
        })
    }

    /// The file's mtime decides (AT-1), not a column: an account with any live attachment is
    /// due while the job is on, and one with attachment files waiting to be removed always.
    async fn due(
        conn: &mut PgConnection,
        settings: &AttachmentSettings,
        _slot: DateTime<Utc>,
        range: AccountRange,
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        let sql = format!(
            "SELECT a.id FROM accounts a
             WHERE ($1::uuid IS NULL OR a.id > $1) AND a.id <= $2
               AND (($3 AND EXISTS (SELECT 1 FROM attachments t
                                    WHERE t.account_id = a.id AND t.bytes_expired_at IS NULL))
                    OR {})
             ORDER BY a.id",
            files::waiting_sql(Root::Attachments, "a.id")
        );
        range
            .query(&sql)
            .bind(settings.max_age_days != 0)
            .fetch_all(conn)
            .await
    }

    fn first(account: Option<Uuid>, slot: DateTime<Utc>) -> Args {
        Args {
            version: V1,
            account_id: account.unwrap_or_default(),
            pass_started_at: slot,
            cutoff: None,
            after: None,
            hop: 0,
        }
    }

    fn position(args: &Args) -> Position {
        Position {
            account: Some(args.account_id),
            pass_started_at: args.pass_started_at,
            hop: args.hop,
        }
    }

    async fn run(
        env: Env<'_>,
        settings: &AttachmentSettings,
        args: &Args,
        report: &mut Report<Args>,
    ) -> Result<(), Error> {
        hop(env, settings, args, report).await
    }

    async fn backlog_seconds(
        _pool: &PgPool,
        _settings: &AttachmentSettings,
        _now: DateTime<Utc>,
    ) -> Result<Option<f64>, Error> {
        // The mtime decides: measuring it means a stat per live attachment, not every refresh.
        Ok(None)
    }

    async fn explain(
        conn: &mut PgConnection,
        settings: &AttachmentSettings,
        paths: &PathSettings,
        now: DateTime<Utc>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        match Uuid::parse_str(id) {
            Ok(id) => explain_attachment(conn, settings, paths, now, id).await,
            Err(_) => Ok(None),
        }
    }

    async fn preview(
        conn: &mut PgConnection,
        settings: &AttachmentSettings,
        paths: &PathSettings,
        now: DateTime<Utc>,
        accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM accounts WHERE $1::uuid[] IS NULL OR id = ANY($1) ORDER BY id",
        )
        .bind(accounts)
        .fetch_all(&mut *conn)
        .await?;
        let cutoff = match settings.max_age_days {
            0 => None,
            days => days_before(now, days),
        };
        let root =
            files::open_root(&paths.attachments_root).map_err(|source| DrainError::Root {
                path: paths.attachments_root.clone(),
                source,
            })?;
        let mut previews: Vec<Preview> = ids
            .iter()
            .map(|account_id| Preview {
                account_id: *account_id,
                max_age_days: settings.max_age_days,
                cutoff,
                expired: 0,
                kept: RETAIN_REASONS.iter().map(|r| (*r, 0)).collect(),
            })
            .collect();
        // Page by page over every account asked about, through the pass's own index: an
        // account may hold millions.
        let mut after = (Uuid::nil(), Uuid::nil());
        while let Some(cutoff) = cutoff {
            let rows: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
                "SELECT account_id, id, relative_path FROM attachments
                 WHERE ($1::uuid[] IS NULL OR account_id = ANY($1))
                   AND bytes_expired_at IS NULL AND (account_id, id) > ($2, $3)
                 ORDER BY account_id, id LIMIT 1000",
            )
            .bind(accounts)
            .bind(after.0)
            .bind(after.1)
            .fetch_all(&mut *conn)
            .await?;
            let Some((account, last, _)) = rows.last() else {
                break;
            };
            after = (*account, *last);
            for (account, _, path) in rows {
                let Ok(at) = ids.binary_search(&account) else {
                    continue;
                };
                let preview = &mut previews[at];
                match judge(&root, &path, cutoff) {
                    Verdict::Expired => preview.expired += 1,
                    Verdict::Young => {}
                    Verdict::Kept(reason) => count(&mut preview.kept, reason),
                }
            }
        }
        Ok(previews)
    }

    fn tally(p: &Preview) -> Vec<(String, i64)> {
        let mut tally = vec![("expired".to_owned(), p.expired as i64)];
        tally.extend(p.kept.iter().map(|(r, n)| (format!("kept {r}"), *n as i64)));
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_matches_its_golden_file() {
        crate::golden::check("attachment_expiry/mark_expired", MARK_EXPIRED);
    }
}
