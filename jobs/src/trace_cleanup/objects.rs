//! A traces root in an object store (OS-2): the walk is a listing of the root's prefix, in key
//! ranges side by side, each trace's signature read with a ranged GET of at most
//! [`FIRST_LINE_LIMIT`] bytes (with no quota, only those of traces old enough to go), its size standing for allocated bytes and its `LastModified` for
//! its mtime; each planned object is read again (HEAD) just before the batched delete, and one
//! whose ETag, size or time changed is re-evaluated by the next run, never deleted blind. The
//! GETs and the HEADs go as many at once as the root's window lets through (see
//! [`crate::files::object::Window`]), the listing and its GETs read ahead of the cleaner while
//! it deletes a batch.

use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use object_store::ObjectMeta;
use tokio::sync::mpsc;

use crate::files::object::{LastLook, ObjectRoot, Version, read_ahead};
use crate::shown::Shown;

use super::plan::Removal;
use super::walk::{Candidate, Entry, Listing, Seen, Step, line_of, signature, time_ns};
use super::{BATCH, Error, FIRST_LINE_LIMIT, Planned};

/// Entries of the walk read ahead of the cleaner: four of its batches.
const READ_AHEAD: usize = 4 * BATCH;

/// The walk of an object root: every object under its prefix, once.
pub(in crate::trace_cleanup) struct Objects {
    root: Arc<ObjectRoot>,
    entries: mpsc::Receiver<Result<Option<Entry>, Error>>,
    done: bool,
}

impl Objects {
    /// The walk of `root`, the objects last modified at or after `unread_from` handed out
    /// unread ([`Entry::Young`]).
    pub(super) fn new(root: Arc<ObjectRoot>, unread_from: Option<i128>) -> Self {
        let reader = root.clone();
        // The root listed in key ranges side by side, and as many signatures read at once as
        // the root's window lets through, each taken as it comes: a GET waiting on a throttled
        // answer's backoff holds up no other (the walk's order decides nothing: the quota's
        // boundary is sorted, its ties are any of them).
        let at_once = root.at_once();
        let entries = root
            .list_unordered()
            .map_err({
                let root = root.to_string();
                move |err| Error::Store {
                    root: root.clone(),
                    why: err.to_string(),
                }
            })
            .map_ok(move |meta| {
                let root = reader.clone();
                async move { Ok(classify(&root, meta, unread_from).await) }
            })
            .try_buffer_unordered(at_once)
            .boxed();
        // Read ahead on a task of its own: the signatures keep coming while a batch is
        // planned, read again and deleted.
        let entries = read_ahead(entries, READ_AHEAD);
        Self {
            root,
            entries,
            done: false,
        }
    }

    /// The next trace or kept object; once every object is listed, one last
    /// [`Step::DirDone`] for what is still pending.
    ///
    /// # Errors
    /// [`Error::Store`] when the listing fails.
    pub(super) async fn next_step(&mut self) -> Result<Option<Step>, Error> {
        if self.done {
            return Ok(None);
        }
        loop {
            let dir = Listing::Object(self.root.clone());
            match self.entries.recv().await.transpose()? {
                None => {
                    self.done = true;
                    return Ok(Some(Step::DirDone(dir)));
                }
                Some(None) => {}
                Some(Some(entry)) => return Ok(Some(Step::Entry(dir, entry))),
            }
        }
    }
}

/// What the cleaner makes of one listed object: `None` for an object not named
/// `*.trace.jsonl`; kept as `outside_root` when its key is no path of the root's own (OS-3);
/// unread when last modified at or after `unread_from`.
async fn classify(root: &ObjectRoot, meta: ObjectMeta, unread_from: Option<i128>) -> Option<Entry> {
    let key = meta.location.as_ref();
    if !key.ends_with(".trace.jsonl") {
        return None;
    }
    let Some(relative) = root.relative(&meta.location) else {
        return Some(Entry::Kept("outside_root", key.as_bytes().to_vec()));
    };
    if unread_from.is_some_and(|from| time_ns(meta.last_modified) >= from) {
        return Some(Entry::Young(meta.size));
    }
    let first = root
        .first_bytes(&meta.location, meta.size, FIRST_LINE_LIMIT as u64)
        .await;
    let Ok(first) = first else {
        return Some(Entry::Kept("unreadable", relative.into_bytes()));
    };
    Some(match signature(&line_of(first)) {
        Some((agent_id, session_id)) => Entry::Candidate(Candidate {
            path: relative.into_bytes(),
            blocks_bytes: meta.size,
            seen: seen_object(&meta),
            agent_id,
            session_id,
        }),
        None => Entry::Kept("bad_signature", relative.into_bytes()),
    })
}

fn seen_object(meta: &ObjectMeta) -> Seen {
    Seen {
        ino: 0,
        size: i64::try_from(meta.size).unwrap_or(i64::MAX),
        mtime_ns: time_ns(meta.last_modified),
        etag: meta.e_tag.clone(),
    }
}

impl Removal<'_> {
    /// Deletes the planned objects of `batch` (already checked against the holds and live
    /// sessions): each read again just before, those that changed or vanished kept, the rest
    /// deleted in one batch; a key whose delete failed is counted and kept for the next run.
    pub(super) async fn delete_objects(&mut self, root: &ObjectRoot, batch: Vec<Planned>) {
        let mut looked = Vec::with_capacity(batch.len());
        for file in batch {
            match root.key(&file.path) {
                Ok(key) => {
                    let version = Version {
                        size: u64::try_from(file.seen.size).unwrap_or(0),
                        modified_ns: file.seen.mtime_ns,
                        etag: file.seen.etag.clone(),
                    };
                    looked.push((file, key, version));
                }
                Err(why) => self.not_deleted(&file, &why),
            }
        }
        for (file, outcome) in root.delete_unchanged(looked).await {
            match outcome {
                LastLook::Deleted => {
                    self.report.deleted += 1;
                    self.report.deleted_bytes += u64::try_from(file.seen.size).unwrap_or(0);
                }
                LastLook::Changed => self.report.keep("changed"),
                LastLook::Vanished => self.report.keep("vanished"),
                LastLook::Failed(why) => self.not_deleted(&file, &why),
            }
        }
    }

    fn not_deleted(&mut self, file: &Planned, why: &str) {
        tracing::warn!(path = %Shown(&file.path), error = %why, "trace not deleted");
        self.report.keep("error");
    }
}
