//! Object-store roots (DC-4, §10): the root's prefix listed once — an outputs or attachments
//! root in key ranges side by side — as a stream read a batch ahead of the judging (the
//! store's next pages come while a batch is judged and deleted).
//! Outputs and attachments are judged object by object; the objects of a sessions or traces root are
//! grouped by their first segment (a listing is in key order, so a directory's objects come
//! together) into directories summed up as they go — their size, their newest `LastModified` —
//! and an existing session's frames gathered on the way. A key that is no path of the root's own
//! (OS-3) is never judged. Confirmed, each object is read again (HEAD) just before its delete and
//! compared with what was judged (ETag, size, `LastModified`, OS-2), a directory listed again
//! and compared with its summary; the deletes go in batches of at most 1,000 keys (OS-4), a key
//! whose delete failed counted and reported.

use std::sync::Arc;

use object_store::ObjectMeta;
use object_store::path::Path as Key;
use uuid::Uuid;

use crate::files::object::{LastLook, ObjectRoot, Version, read_ahead};

use super::judge::{self, Kind, Subject};
use super::local::{asked_again, unremovable, young_and_held};
use super::scan::{Ctx, kinds, time_ns};
use super::{BATCH, Error};

/// An object as it was judged.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Judged {
    key: Key,
    /// Relative to the root.
    path: String,
    size: u64,
    modified_ns: i128,
    etag: Option<String>,
    /// For a frame: its archive and its session.
    frame: Option<(Uuid, Uuid)>,
}

impl Judged {
    fn of(root: &ObjectRoot, meta: &ObjectMeta) -> Option<Self> {
        Some(Self {
            path: root.relative(&meta.location)?,
            key: meta.location.clone(),
            size: meta.size,
            modified_ns: time_ns(meta.last_modified),
            etag: meta.e_tag.clone(),
            frame: None,
        })
    }

    fn subject(&self) -> Subject {
        match self.frame {
            Some((archive, session)) => Subject {
                text: Some(self.path.clone()),
                id: Some(archive),
                ids: vec![session],
            },
            None => Subject {
                text: Some(self.path.clone()),
                id: None,
                ids: judge::ids_in(self.path.as_bytes()),
            },
        }
    }

    /// The version judged, for its last look (OS-2).
    fn version(&self) -> Version {
        Version {
            size: self.size,
            modified_ns: self.modified_ns,
            etag: self.etag.clone(),
        }
    }
}

/// A directory of a sessions or traces root, summed up from the listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Directory {
    id: Uuid,
    objects: u64,
    bytes: u64,
    newest_ns: i128,
    /// The frames under its `archive/`, for an existing session.
    frames: Vec<Judged>,
}

impl Directory {
    fn subject(&self) -> Subject {
        Subject {
            text: Some(self.id.to_string()),
            id: Some(self.id),
            ids: vec![self.id],
        }
    }

    fn add(&mut self, judged: Judged) {
        self.objects += 1;
        self.bytes += judged.size;
        self.newest_ns = self.newest_ns.max(judged.modified_ns);
        let name = judged.path.strip_prefix(&format!("{}/archive/", self.id));
        let archive = name
            .and_then(|name| {
                ["compaction-", "reset-"]
                    .iter()
                    .find_map(|kind| name.strip_prefix(kind))
            })
            .and_then(|rest| rest.strip_suffix(".frame"))
            .and_then(|id| judge::uuid_named(id.as_bytes()));
        if let Some(archive) = archive {
            self.frames.push(Judged {
                frame: Some((archive, self.id)),
                ..judged
            });
        }
    }
}

/// Scans the object root `objects` into `ctx` (see [`super::Scan::run`]).
///
/// # Errors
/// A database error.
pub(super) async fn scan_root(ctx: &mut Ctx<'_>, objects: &Arc<ObjectRoot>) -> Result<(), Error> {
    let kind = kinds(ctx.root);
    // Outputs and attachments are judged object by object: their listing's order decides
    // nothing, and its ranges are listed side by side. A sessions or traces root's directories
    // are summed up as their objects come, in key order, from one listing.
    let listing = if matches!(kind, Kind::Output | Kind::Attachment) {
        objects.list_unordered()
    } else {
        objects.list_all()
    };
    let mut listed = read_ahead(listing, BATCH);
    let mut files: Vec<Judged> = Vec::new();
    let mut directories: Vec<Directory> = Vec::new();
    let mut frames: Vec<Judged> = Vec::new();
    loop {
        let meta = match listed.recv().await.transpose() {
            Ok(meta) => meta,
            Err(err) => {
                // What was listed since the last batch is not judged: nothing more goes.
                tracing::warn!(root = ctx.root.as_str(), store = %objects, error = %err, "orphans: root not scanned whole");
                ctx.counts.state = "unreadable";
                ctx.counts.error = Some(format!("{objects}: {err}"));
                return Ok(());
            }
        };
        let Some(meta) = meta else {
            break;
        };
        let Some(judged) = Judged::of(objects, &meta) else {
            continue;
        };
        if matches!(kind, Kind::Output | Kind::Attachment) {
            files.push(judged);
            if files.len() >= BATCH {
                judge_objects(ctx, objects, kind, std::mem::take(&mut files)).await?;
            }
            continue;
        }
        let top = judged.path.split('/').next().unwrap_or_default();
        // An object at the top, or under a name that is no UUID: no session's, no agent's.
        let Some(id) = judge::uuid_named(top.as_bytes()).filter(|_| judged.path.contains('/'))
        else {
            continue;
        };
        if directories.last().is_none_or(|last| last.id != id) {
            if directories.len() >= BATCH {
                let batch = std::mem::take(&mut directories);
                judge_directories(ctx, objects, kind, batch, &mut frames).await?;
            }
            directories.push(Directory {
                id,
                ..Directory::default()
            });
        }
        if let Some(last) = directories.last_mut() {
            last.add(judged);
        }
        if ctx.stopped() {
            return Ok(());
        }
    }
    judge_objects(ctx, objects, kind, files).await?;
    judge_directories(ctx, objects, kind, directories, &mut frames).await?;
    judge_objects(ctx, objects, Kind::Frame, frames).await
}

/// Judges a batch of objects (files, or frames) and, confirmed, removes the orphans.
async fn judge_objects(
    ctx: &mut Ctx<'_>,
    objects: &ObjectRoot,
    kind: Kind,
    batch: Vec<Judged>,
) -> Result<(), Error> {
    if batch.is_empty() {
        return Ok(());
    }
    let subjects: Vec<Subject> = batch.iter().map(Judged::subject).collect();
    let named = judge::named(ctx.conn, kind, &subjects).await?;
    let orphans: Vec<Judged> = batch
        .into_iter()
        .zip(named)
        .filter_map(|(object, named)| (!named).then_some(object))
        .collect();
    let orphans = young_and_held(ctx, kind, orphans, Judged::subject, |o| o.modified_ns).await?;
    for object in &orphans {
        ctx.list(
            object.path.as_bytes(),
            false,
            object.size,
            object.modified_ns,
        );
    }
    if !ctx.confirm || orphans.is_empty() {
        return Ok(());
    }
    let mut tx = crate::gate::begin(ctx.conn, "").await?;
    let orphans = asked_again(&mut tx, ctx.counts, kind, orphans, Judged::subject).await?;
    let looked = orphans
        .into_iter()
        .map(|object| {
            let (key, version) = (object.key.clone(), object.version());
            (object, key, version)
        })
        .collect();
    for (object, outcome) in objects.delete_unchanged(looked).await {
        match outcome {
            LastLook::Deleted => {
                ctx.counts.gone += 1;
                ctx.counts.removed.deleted += 1;
                ctx.counts.removed.bytes += object.size;
            }
            LastLook::Changed | LastLook::Vanished => ctx.counts.count("changed", 1),
            LastLook::Failed(why) => {
                unremovable(ctx.counts, ctx.root, object.path.as_bytes(), &why);
            }
        }
    }
    Ok(tx.commit().await?)
}

/// Judges a batch of directories: those whose row is gone, listed and, confirmed, removed
/// whole; an existing session's frames gathered into `frames`, judged a batch at a time.
async fn judge_directories(
    ctx: &mut Ctx<'_>,
    objects: &ObjectRoot,
    kind: Kind,
    batch: Vec<Directory>,
    frames: &mut Vec<Judged>,
) -> Result<(), Error> {
    if batch.is_empty() {
        return Ok(());
    }
    let subjects: Vec<Subject> = batch.iter().map(Directory::subject).collect();
    let named = judge::named(ctx.conn, kind, &subjects).await?;
    let existing = if kind == Kind::SessionDir {
        let ids: Vec<Uuid> = batch.iter().map(|dir| dir.id).collect();
        judge::sessions(ctx.conn, &ids).await?
    } else {
        Vec::new()
    };
    let mut gone = Vec::new();
    for (dir, named) in batch.into_iter().zip(named) {
        if !named {
            gone.push(dir);
        } else if existing.contains(&dir.id) {
            for frame in dir.frames {
                frames.push(frame);
                if frames.len() >= BATCH {
                    judge_objects(ctx, objects, Kind::Frame, std::mem::take(frames)).await?;
                }
            }
        }
    }
    let gone = young_and_held(ctx, kind, gone, Directory::subject, |d| d.newest_ns).await?;
    for dir in &gone {
        ctx.list(
            dir.id.to_string().as_bytes(),
            true,
            dir.bytes,
            dir.newest_ns,
        );
    }
    if !ctx.confirm || gone.is_empty() {
        return Ok(());
    }
    let mut tx = crate::gate::begin(ctx.conn, "").await?;
    let gone = asked_again(&mut tx, ctx.counts, kind, gone, Directory::subject).await?;
    for dir in gone {
        let name = dir.id.to_string();
        let now = match objects.under(&name).await {
            Ok(now) => now,
            Err(why) => {
                unremovable(ctx.counts, ctx.root, name.as_bytes(), &format!("{why:?}"));
                continue;
            }
        };
        let (objects_now, bytes_now, newest_now) = now.iter().fold(
            (0u64, 0u64, i128::MIN),
            |(n, bytes, newest), (_, object)| {
                (
                    n + 1,
                    bytes + object.size,
                    newest.max(time_ns(object.last_modified)),
                )
            },
        );
        let second = |ns: i128| ns.div_euclid(1_000_000_000);
        if (objects_now, bytes_now) != (dir.objects, dir.bytes)
            || second(newest_now) != second(dir.newest_ns)
        {
            ctx.counts.count("changed", 1);
            continue;
        }
        let keys: Vec<Key> = now.into_iter().map(|(key, _)| key).collect();
        let failed = objects
            .delete(&keys)
            .await
            .into_iter()
            .filter_map(Result::err)
            .next();
        match failed {
            None => {
                ctx.counts.gone += 1;
                ctx.counts.removed.deleted += dir.objects;
                ctx.counts.removed.bytes += dir.bytes;
            }
            Some(why) => unremovable(ctx.counts, ctx.root, name.as_bytes(), &why),
        }
    }
    Ok(tx.commit().await?)
}
