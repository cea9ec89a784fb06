//! One hop over an account's live attachments: each chunk's files judged by their mtime under
//! the root, the expired rows marked and their files recorded in one statement.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::files::{Entry, Opened, Root, Unseen};
use crate::job::Report;
use crate::owner_loop::{Candidates, Chunks, End, Taken, Window, Windowed};
use crate::pass::Step;

use super::{AttachmentExpiry, AttachmentReason, CHUNK, Error};

/// What a row's file is, as far as expiry goes.
pub(super) enum Verdict {
    /// With the ETag the store gave the object judged (OS-2: what was judged is what the drain
    /// compares before it deletes).
    Expired(Option<String>),
    Young,
    Kept(AttachmentReason),
}

pub(super) async fn judge(root: &Opened, relative: &str, cutoff: DateTime<Utc>) -> Verdict {
    verdict(root.entry(relative).await, cutoff)
}

/// [`judge`] of each of `relatives`, their files looked at [`files::AT_ONCE`] at a time; in
/// their order.
pub(super) async fn judge_all(
    root: &Opened,
    relatives: &[&str],
    cutoff: DateTime<Utc>,
) -> Vec<Verdict> {
    let entries = root.entries(relatives).await;
    entries
        .into_iter()
        .map(|entry| verdict(entry, cutoff))
        .collect()
}

fn verdict(entry: Result<Option<Entry>, Unseen>, cutoff: DateTime<Utc>) -> Verdict {
    match entry {
        Ok(Some(Entry::File { modified, etag })) if modified < cutoff => Verdict::Expired(etag),
        Ok(Some(Entry::File { .. })) => Verdict::Young,
        Ok(Some(Entry::Symlink)) | Err(Unseen::OutsideRoot) => {
            Verdict::Kept(AttachmentReason::OutsideRoot)
        }
        Ok(Some(Entry::Other)) => Verdict::Kept(AttachmentReason::NotRegular),
        Ok(None) => Verdict::Kept(AttachmentReason::Missing),
        Err(Unseen::Unreadable) => Verdict::Kept(AttachmentReason::Unreadable),
    }
}

/// One hop over one window of an account's live attachments (the owner loop,
/// [`crate::owner_loop::Hop::run`]).
///
/// # Errors
/// [`Error`]; what was committed stays, and the hop can be run again.
pub async fn hop(
    step: Step<'_, AttachmentExpiry>,
    report: &mut Report<AttachmentReason>,
) -> Result<End<Uuid>, Error> {
    let store = step.env.paths.store(Root::Attachments);
    let root = Opened::open(&store)?;
    let mut live = Windowed::new(
        Live {
            account_id: step.account.unwrap_or_default(),
            cutoff: step.cutoff,
            root,
        },
        Chunks::Fixed(CHUNK),
    );
    step.hop.run(&mut live, step.cursor, report).await
}

/// An account's live attachments, in id order, as the owner loop takes them.
pub(super) struct Live {
    account_id: Uuid,
    cutoff: DateTime<Utc>,
    root: Opened,
}

impl Window for Live {
    /// An attachment and the path it names.
    type Candidate = (Uuid, String);
    /// The last attachment looked at.
    type Cursor = Uuid;
    type Report = Report<AttachmentReason>;

    const TABLES: &'static [&'static str] = &["attachments", "pending_file_deletions"];

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Uuid>,
        room: u32,
        _report: &mut Report<AttachmentReason>,
    ) -> Result<Candidates<(Uuid, String), Uuid>, Error> {
        let candidates = sqlx::query_as(
            "SELECT id, relative_path FROM attachments
             WHERE account_id = $1 AND sexton.attachment_live(bytes_expired_at) AND id > $2
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
        report: &mut Report<AttachmentReason>,
    ) -> Result<Taken, Error> {
        let (mut expired, mut judged, mut etags) = (Vec::new(), Vec::new(), Vec::new());
        let paths: Vec<&str> = chunk.iter().map(|(_, path)| path.as_str()).collect();
        let verdicts = judge_all(&self.root, &paths, self.cutoff).await;
        for ((id, path), verdict) in chunk.iter().zip(verdicts) {
            match verdict {
                Verdict::Expired(etag) => {
                    expired.push(*id);
                    judged.push(path.clone());
                    etags.push(etag);
                }
                Verdict::Young => {}
                Verdict::Kept(reason) => report.retain(reason, 1),
            }
        }
        if expired.is_empty() {
            return Ok(Taken::default());
        }
        // Through the hold gate (HD-3): a hold placed meanwhile waits for this statement.
        let mut tx = crate::owner_loop::begin(conn, None, true).await?;
        let (held, marked): (bool, Vec<Uuid>) = sqlx::query_as(MARK_EXPIRED)
            .bind(&expired)
            .bind(&judged)
            .bind(self.account_id)
            .bind(&etags)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        let unmarked = (expired.len() - marked.len()) as u64;
        let reason = if held {
            AttachmentReason::LegalHold
        } else {
            AttachmentReason::Busy
        };
        report.retain(reason, unmarked);
        report.pruned += marked.len() as u64;
        Ok(Taken {
            recorded: marked.len() as u64,
            sized_by: None,
        })
    }
}

/// Adds one to `reason`'s count in a list of counts by label.
pub(super) fn count(counts: &mut [(&'static str, u64)], reason: AttachmentReason) {
    if let Some((_, n)) = counts.iter_mut().find(|(r, _)| *r == reason.as_str()) {
        *n += 1;
    }
}

/// Marks the attachments `$1` of account `$3` expired — each only if still live and still
/// naming the path `$2` it was judged by, so that a row repointed at a fresh file meanwhile is
/// left for the next pass — and records their files for removal with the ETag `$4` each
/// object had when it was judged (NULL on a local root), so that the drain deletes only the
/// bytes that were judged (OS-2), in one statement and so one short transaction; a row an application holds is skipped, and an account a hold covers
/// marks nothing (HD-3). Returns whether a hold covers the account, and the rows marked.
pub(super) const MARK_EXPIRED: &str = include_str!("mark_expired.sql");
