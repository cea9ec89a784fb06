//! A drain's removals from an object root (see [`ObjectRoot::remove_batch`]).

use std::sync::atomic::{AtomicBool, Ordering};

use object_store::path::Path as Key;

use super::times::SECOND;
use super::{Object, ObjectRoot, Refusal, in_order, written_before};
use crate::files::drain::{Claimed, Removed};
use crate::files::{FileCounts, Root};

impl ObjectRoot {
    /// Removes the objects of one claimed `batch` except those `referenced` (see
    /// [`drain`](super::drain)), each re-read (HEAD) just before its delete and the deletes
    /// batched; a record is forgotten once each of its objects is gone (OS-2):
    ///
    /// - A record that kept the ETag its object was judged by (attachment expiry's HEAD, or an
    ///   earlier drain's whose delete failed) deletes the object only while its ETag is still
    ///   that one. Another ETag: the object was rewritten since it was judged — new bytes,
    ///   which stay; the record is forgotten (and an attachment it marked expired is live
    ///   again, see [`conclude`](super::drain::conclude)).
    /// - Otherwise (a file whose rows were just removed, a session's directory) an object goes
    ///   when its `LastModified` proves it was written before the record ([`written_before`]);
    ///   a file whose HEAD's whole second leaves that open is judged by the store's listing,
    ///   which may give a finer time: an object whose time, as read, is later than its record
    ///   is a new one the platform put under the same key, and stays, the record forgotten
    ///   (nothing then names it; if no row comes to own it, derivative cleanup, DC-1, finds it
    ///   after its grace). The ETag the HEAD saw is kept with a record whose delete then
    ///   fails.
    ///
    /// A store that stops answering during the batch is an outage: the records its failures
    /// touched are handed back unattempted and [`Removed::unreachable`] says why.
    pub(in crate::files) async fn remove_batch(
        &self,
        root: Root,
        batch: &[Claimed],
        referenced: &[String],
        stop: &AtomicBool,
    ) -> Removed {
        let mut removed = Removed::default();
        // Failures of the store, concluded once it is known whether it still answers.
        let mut failures: Vec<(&Claimed, String)> = Vec::new();
        let mut planned: Vec<Planned<'_>> = Vec::new();
        // Files whose HEAD did not prove them older than their record.
        let mut unsure: Vec<(&Claimed, Key, Object)> = Vec::new();
        let mut looked_at = Vec::with_capacity(batch.len());
        for claimed in batch {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if referenced.contains(&claimed.path) {
                removed.forget.push(claimed.id);
                continue;
            }
            if removed.quarantined_unfinished(root, claimed) {
                continue;
            }
            looked_at.push(claimed);
        }
        // Each record's objects read (a HEAD, or a directory's listing) just before the deletes,
        // as many at once as the window lets through.
        // By index: a future borrowing each record would not be `Send` for every lifetime.
        let indexes: Vec<usize> = (0..looked_at.len()).collect();
        let found = in_order(indexes, self.at_once(), |n| {
            let claimed = looked_at[n];
            async move {
                let found = if root.holds_directories() {
                    self.under(&claimed.path).await
                } else {
                    self.head_key(&claimed.path).await
                };
                (claimed, found)
            }
        })
        .await;
        for (claimed, found) in found {
            let objects = match found {
                Ok(objects) => objects,
                Err(Refusal::Refused(why)) => {
                    removed.refused(root, claimed, &why);
                    continue;
                }
                Err(Refusal::Store(why)) => {
                    failures.push((claimed, why));
                    continue;
                }
            };
            if let Some(judged) = &claimed.etag {
                match objects.into_iter().next() {
                    None => removed.forget.push(claimed.id),
                    Some((key, object)) if object.etag.as_ref() == Some(judged) => {
                        planned.push((claimed, vec![(key, object.size)], None));
                    }
                    Some((key, object)) => {
                        tracing::warn!(
                            root = root.as_str(), key = %crate::shown::Shown(key.as_ref()),
                            judged = %crate::shown::Shown(judged),
                            etag = object.etag.as_deref().unwrap_or(""),
                            "object not deleted: rewritten since it was judged (a new ETag)"
                        );
                        removed.rewritten.push(claimed.id);
                    }
                }
                continue;
            }
            if !root.holds_directories() {
                match objects.into_iter().next() {
                    None => removed.forget.push(claimed.id),
                    Some((key, object))
                        if written_before(object.last_modified, SECOND, claimed.recorded_at) =>
                    {
                        planned.push((claimed, vec![(key, object.size)], object.etag));
                    }
                    Some((key, object)) => unsure.push((claimed, key, object)),
                }
                continue;
            }
            let unit = self.listed_unit(objects.iter().map(|(_, object)| object.last_modified));
            let (old, young): (Vec<_>, Vec<_>) = objects.into_iter().partition(|(_, object)| {
                written_before(object.last_modified, unit, claimed.recorded_at)
            });
            for (key, _) in &young {
                may_be_new(root, key);
            }
            let keys = old.into_iter().map(|(k, o)| (k, o.size)).collect();
            planned.push((claimed, keys, None));
        }
        // A HEAD's whole second left these unsure: the store's listing may tell finer. An
        // object is taken for newer than its record only where its time, as read (the
        // listing's where it gives one, else the HEAD's second), is later than the record's:
        // a store that lists milliseconds tells a rewrite in the record's own second apart; a
        // store that gives seconds alone cannot, and the object goes as it always did — kept
        // instead, a file recorded in the second it was written would stay forever, its record
        // forgotten.
        let keys: Vec<&Key> = unsure.iter().map(|(_, key, _)| key).collect();
        let listed = self.listed_times(&keys).await;
        for (claimed, key, object) in unsure {
            let at = listed.get(&key).copied().unwrap_or(object.last_modified);
            if at > claimed.recorded_at {
                may_be_new(root, &key);
                removed.forget.push(claimed.id);
            } else {
                planned.push((claimed, vec![(key, object.size)], object.etag));
            }
        }
        let keys: Vec<Key> = planned
            .iter()
            .flat_map(|(_, keys, _)| keys.iter().map(|(key, _)| key.clone()))
            .collect();
        let mut outcomes = self.delete(&keys).await.into_iter();
        for (claimed, keys, etag) in planned {
            let mut failed = None;
            for (_, size) in keys {
                match outcomes
                    .next()
                    .unwrap_or_else(|| Err("no answer".to_owned()))
                {
                    Ok(()) => removed.counts.add(FileCounts {
                        deleted: 1,
                        bytes: size,
                        errors: 0,
                    }),
                    Err(why) => failed = Some(why),
                }
            }
            match failed {
                None => removed.forget.push(claimed.id),
                Some(why) => {
                    if let Some(etag) = etag {
                        removed.judged.push((claimed.id, etag));
                    }
                    failures.push((claimed, why));
                }
            }
        }
        if !failures.is_empty()
            && let Err(why) = self.answers().await
        {
            tracing::warn!(root = root.as_str(), error = %why, records = failures.len(), "objects not deleted: the store cannot be reached");
            removed
                .outage
                .extend(failures.iter().map(|(claimed, _)| claimed.id));
            removed.unreachable = Some(why);
            return removed;
        }
        for (claimed, why) in failures {
            removed.failed_attempt(root, claimed, why);
        }
        removed
    }
}

/// A record whose objects are to be deleted: its keys with their sizes, and the ETag its one
/// object was judged by (kept with the record if the delete fails).
type Planned<'c> = (&'c Claimed, Vec<(Key, u64)>, Option<String>);

/// An object left in place because it may have been written after its record (OS-2).
fn may_be_new(root: Root, key: &Key) {
    tracing::warn!(
        root = root.as_str(), key = %crate::shown::Shown(key.as_ref()),
        "object not deleted: it may have been written after its record (a new object under the same key)"
    );
}
