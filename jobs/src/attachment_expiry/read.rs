//! What attachment expiry reads without deleting: `sexton explain attachment` and
//! `sexton preview`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::cutoff::days_before;
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::files::{Entry, Opened, Root};
use crate::job::{ACCOUNTS_NAMED, Inspect, Job, Look, Reason};

use super::{
    AttachmentExpiry, AttachmentReason, AttachmentSettings, Error, Verdict, count, judge, judge_all,
};

/// The mtime decides (AT-1): measuring a backlog would mean a stat per live attachment at every
/// refresh of the gauge, so the kind reports none.
impl Inspect for AttachmentExpiry {
    const SUBJECTS: &'static [&'static str] = &["attachment"];

    type Preview = Preview;

    async fn explain(
        look: Look<'_, AttachmentSettings>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        match Uuid::parse_str(id) {
            Ok(id) => explain_attachment(look, id).await,
            Err(_) => Ok(None),
        }
    }

    /// Each account's live attachments judged as the pass judges them, page by page.
    async fn preview(
        look: Look<'_, AttachmentSettings>,
        accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let Look {
            conn,
            settings,
            paths,
            now,
        } = look;
        let ids: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {ACCOUNTS_NAMED} a ORDER BY id"
        )))
        .bind(accounts)
        .fetch_all(&mut *conn)
        .await?;
        let cutoff = match settings.max_age_days {
            0 => None,
            days => days_before(now, days),
        };
        let root = Opened::open(&paths.store(Root::Attachments))?;
        // A hold on the account keeps every attachment of it (HD-2).
        let held: Vec<Uuid> = sqlx::query_scalar(
            "SELECT a FROM unnest($1::uuid[]) AS a WHERE EXISTS (SELECT 1 FROM sexton.account_holds(a))",
        )
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
        let mut previews: Vec<Preview> = ids
            .iter()
            .map(|account_id| Preview {
                account_id: *account_id,
                max_age_days: settings.max_age_days,
                cutoff,
                expired: 0,
                kept: <AttachmentReason as Reason>::ALL
                    .iter()
                    .map(|r| (r.as_str(), 0))
                    .collect(),
            })
            .collect();
        // Page by page over every account asked about, through the pass's own index: an
        // account may hold millions.
        let mut after = (Uuid::nil(), Uuid::nil());
        while let Some(cutoff) = cutoff {
            let rows: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
                "SELECT account_id, id, relative_path FROM attachments
                 WHERE ($1::uuid[] IS NULL OR account_id = ANY($1))
                   AND sexton.attachment_live(bytes_expired_at) AND (account_id, id) > ($2, $3)
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
            let paths: Vec<&str> = rows.iter().map(|(_, _, path)| path.as_str()).collect();
            let verdicts = judge_all(&root, &paths, cutoff).await;
            for ((account, _, _), verdict) in rows.iter().zip(verdicts) {
                let Ok(at) = ids.binary_search(account) else {
                    continue;
                };
                let preview = &mut previews[at];
                match verdict {
                    Verdict::Expired(_) if held.contains(account) => {
                        count(&mut preview.kept, AttachmentReason::LegalHold);
                    }
                    Verdict::Expired(_) => preview.expired += 1,
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

/// The job's verdict on one attachment, from the same judgement of its file.
async fn explain_attachment(
    look: Look<'_, AttachmentSettings>,
    id: Uuid,
) -> Result<Option<Explanation>, Error> {
    let Look {
        conn,
        settings,
        paths,
        now,
    } = look;
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
    let root = Opened::open(&paths.store(Root::Attachments))?;
    let mtime = match root.entry(&path).await {
        Ok(Some(Entry::File { modified, .. })) => Some(modified),
        _ => None,
    };
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
    let (verdict, reason) = verdict(&root, &path, cutoff).await;
    // Whatever its file says, every hold on its account keeps it, and is named (HD-5).
    let id = account.to_string();
    let holds = crate::explain::holds(conn, "sexton.account_holds($1::uuid)", &[&id]).await?;
    explanation.verdict = match verdict {
        ExplainVerdict::Eligible if !holds.is_empty() => ExplainVerdict::Retained,
        verdict => verdict,
    };
    explanation.reasons.extend(holds);
    explanation.reasons.push(reason);
    Ok(Some(explanation))
}

/// The job's own verdict on the file at `path` under `root` against `cutoff`, with its reason.
async fn verdict(
    root: &Opened,
    path: &str,
    cutoff: DateTime<Utc>,
) -> (ExplainVerdict, ExplainReason) {
    let reason = match judge(root, path, cutoff).await {
        Verdict::Expired(_) => {
            let reason = ExplainReason::new(
                "AT-1",
                "expired",
                "its file is older than the age: the next pass deletes it and marks the row",
            );
            return (ExplainVerdict::Eligible, reason);
        }
        Verdict::Young => ExplainReason::new(
            "AT-1",
            "not_expired",
            "its file was modified after the cutoff",
        ),
        Verdict::Kept(reason) => ExplainReason::new(
            "AT-1",
            reason.as_str(),
            match reason {
                AttachmentReason::OutsideRoot => format!(
                    "{path:?} leaves the attachments root (absolute, `..` or a symlink): never followed"
                ),
                AttachmentReason::Missing => {
                    format!("no file at {path:?}: counted, the row left unmarked")
                }
                AttachmentReason::NotRegular => format!("{path:?} is not a regular file"),
                _ => format!("{path:?} cannot be read"),
            },
        ),
    };
    (ExplainVerdict::Retained, reason)
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
