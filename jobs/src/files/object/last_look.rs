//! OS-2's last look, in one place for every pass that deletes what it judged from a listing
//! (the trace cleaner, the orphan scan): each object read again (HEAD) just before its delete
//! and compared with what was judged, the unchanged ones deleted in batches (OS-4), as many
//! HEADs in flight as the root's window lets through, each taken as it comes.

use futures::StreamExt as _;
use object_store::ObjectMeta;
use object_store::path::Path as Key;

use super::ObjectRoot;
use super::times::time_ns;

/// An object as it was judged: its size, its `LastModified` and its ETag, where the store gave
/// one (some stores list none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub size: u64,
    /// `LastModified`, in nanoseconds since the epoch.
    pub modified_ns: i128,
    pub etag: Option<String>,
}

impl Version {
    /// What the store says of an object, as a version.
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            size: meta.size,
            modified_ns: time_ns(meta.last_modified),
            etag: meta.e_tag.clone(),
        }
    }

    /// Whether the store's answer now is this version: the same size, `LastModified` to the
    /// second (a listing may give milliseconds, a HEAD gives seconds) and, where both answers
    /// carry one, the same ETag.
    pub fn same(&self, now: &ObjectMeta) -> bool {
        let now = Self::of(now);
        let second = |ns: i128| ns.div_euclid(1_000_000_000);
        now.size == self.size
            && second(now.modified_ns) == second(self.modified_ns)
            && match (&self.etag, &now.etag) {
                (Some(judged), Some(now)) => judged == now,
                _ => true,
            }
    }
}

/// What became of an object at its last look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastLook {
    /// Unchanged, and deleted (or already gone when its delete came: OS-4).
    Deleted,
    /// Changed since it was judged: kept, for the next pass to judge again.
    Changed,
    /// Gone before its last look.
    Vanished,
    /// Not read again, or its delete failed: the store's answer, for people.
    Failed(String),
}

impl ObjectRoot {
    /// Each of `objects` (an item of the caller's, its key, the version judged) read again just
    /// before its delete; those unchanged deleted in calls of at most
    /// [`MAX_BATCH`](super::MAX_BATCH) keys. Each item with its outcome, in no particular order.
    pub async fn delete_unchanged<T>(&self, objects: Vec<(T, Key, Version)>) -> Vec<(T, LastLook)> {
        let looked: Vec<_> = futures::stream::iter(objects)
            .map(|(item, key, judged)| async move {
                let now = self.meta(&key).await;
                (item, key, judged, now)
            })
            .buffer_unordered(self.at_once())
            .collect()
            .await;
        let mut outcomes = Vec::with_capacity(looked.len());
        let mut going = Vec::new();
        for (item, key, judged, now) in looked {
            match now {
                Ok(Some(now)) if judged.same(&now) => going.push((item, key)),
                Ok(Some(_)) => outcomes.push((item, LastLook::Changed)),
                Ok(None) => outcomes.push((item, LastLook::Vanished)),
                Err(why) => outcomes.push((item, LastLook::Failed(why))),
            }
        }
        let keys: Vec<Key> = going.iter().map(|(_, key)| key.clone()).collect();
        let deleted = self.delete(&keys).await;
        outcomes.extend(going.into_iter().zip(deleted).map(|((item, _), outcome)| {
            let outcome = match outcome {
                Ok(()) => LastLook::Deleted,
                Err(why) => LastLook::Failed(why),
            };
            (item, outcome)
        }));
        outcomes
    }
}
