//! Archive frames of existing sessions (DC-1): `<session>/archive/<kind>-<archive id>.frame`
//! with no `conversation_archives` row of that id (seed 002: a crash after the frame was
//! written and before the journal committed). Gathered across sessions into batches of
//! [`BATCH`], each judged with one statement; found again by their path under the root.

use std::os::fd::OwnedFd;

use uuid::Uuid;

use super::judge::{self, Kind, Subject};
use super::local::{asked_again, frames_in, remove_frame, unremovable, young_and_held};
use super::scan::Ctx;
use super::{BATCH, Error};

/// A frame: its archive id, its session, its path under the root, and how it looked (inode,
/// size, time).
struct Frame {
    archive: Uuid,
    session: Uuid,
    path: String,
    seen: (u64, i64, i128),
}

fn subject(frame: &Frame) -> Subject {
    Subject {
        text: Some(frame.path.clone()),
        id: Some(frame.archive),
        ids: vec![frame.session],
    }
}

/// The frames gathered and not yet judged.
#[derive(Default)]
pub(super) struct Frames {
    batch: Vec<Frame>,
}

impl Frames {
    /// Gathers the frames of the existing `session`, judging a batch once it is full.
    ///
    /// # Errors
    /// A database error.
    pub(super) async fn of_session(
        &mut self,
        ctx: &mut Ctx<'_>,
        root: &OwnedFd,
        session: Uuid,
    ) -> Result<(), Error> {
        let name = session.to_string();
        for (archive, file, seen) in frames_in(root, &name) {
            self.batch.push(Frame {
                archive,
                session,
                path: format!("{name}/archive/{file}"),
                seen,
            });
            if self.batch.len() >= BATCH {
                judge_frames(ctx, root, std::mem::take(&mut self.batch)).await?;
            }
        }
        Ok(())
    }

    /// Judges what is left.
    ///
    /// # Errors
    /// A database error.
    pub(super) async fn finish(self, ctx: &mut Ctx<'_>, root: &OwnedFd) -> Result<(), Error> {
        judge_frames(ctx, root, self.batch).await
    }
}

async fn judge_frames(ctx: &mut Ctx<'_>, root: &OwnedFd, batch: Vec<Frame>) -> Result<(), Error> {
    if batch.is_empty() {
        return Ok(());
    }
    let subjects: Vec<Subject> = batch.iter().map(subject).collect();
    let named = judge::named(ctx.conn, Kind::Frame, &subjects).await?;
    let orphans: Vec<Frame> = batch
        .into_iter()
        .zip(named)
        .filter_map(|(frame, named)| (!named).then_some(frame))
        .collect();
    let orphans = young_and_held(ctx, Kind::Frame, orphans, subject, |f| f.seen.2).await?;
    for frame in &orphans {
        ctx.list(
            frame.path.as_bytes(),
            false,
            frame.seen.1.max(0) as u64,
            frame.seen.2,
        );
    }
    if !ctx.confirm || orphans.is_empty() {
        return Ok(());
    }
    let mut tx = crate::gate::begin(ctx.conn, "").await?;
    let orphans = asked_again(&mut tx, ctx.counts, Kind::Frame, orphans, subject).await?;
    for frame in orphans {
        match remove_frame(root, &frame.path, frame.seen) {
            Ok(true) => {
                ctx.counts.gone += 1;
                ctx.counts.removed.deleted += 1;
                ctx.counts.removed.bytes += frame.seen.1.max(0) as u64;
            }
            Ok(false) => ctx.counts.count("changed", 1),
            Err(why) => unremovable(ctx.counts, ctx.root, frame.path.as_bytes(), &why),
        }
    }
    Ok(tx.commit().await?)
}
