//! Roots in an S3-compatible object store (SPEC §10): `s3://BUCKET/PREFIX`, reached through
//! `object_store`'s S3 client. A stored relative path maps to exactly one key under the prefix
//! (OS-3: a spelling that could mean another key is refused, never normalised); a drain reads
//! each object (HEAD) just before deleting it and compares it with what was judged (OS-2),
//! deletes in batches of at most [`MAX_BATCH`] keys and keeps the record of every key whose
//! delete failed (OS-4).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt as _, RetryConfig};

mod bucket;
mod key;
mod last_look;
mod ranges;
mod removal;
mod settings;
mod times;
mod window;

pub use bucket::{BucketAnswer, parse_url};
pub use key::key_of;
pub use last_look::{LastLook, Version};
pub use settings::StorageSettings;
use times::{SECOND, unit_of};
pub use times::{time_ns, to_time, written_before};
pub use window::{Seen, Window};

/// Keys one DeleteObjects call names at the most (AWS refuses more than 1,000).
pub const MAX_BATCH: usize = 1_000;

/// Requests one object root has in flight at the most, unless `[storage] max_in_flight` says
/// otherwise (see [`Window`]). Measured on s3s-fs on loopback (a store that answers in about
/// 45 ms here), traces by age at 10 k objects: 60.2 s with 8 in flight, 22.7 s with 32, 14.9 s
/// with 64 (bench/src/traces.rs, `--max-in-flight`); a store that cannot take as many says so
/// with its throttling answers and gets fewer.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// The key, under a root, that [`ObjectRoot::answers`] asks for: nothing writes it, and were
/// something to, it would be found, which is an answer as well.
pub const PROBE: &str = ".sexton-answers";

/// A root in an object store: its bucket, the prefix its keys start with, and the client.
#[derive(Clone)]
pub struct ObjectRoot {
    bucket: String,
    /// Without a leading or trailing `/`; empty for a whole bucket.
    prefix: String,
    store: Arc<dyn ObjectStore>,
    /// The finest unit, in nanoseconds, of the times the store's listings were seen to give
    /// (see [`listed_unit`](Self::listed_unit)); a second until a finer one is seen.
    listing_unit: Arc<AtomicU32>,
    /// The S3 client itself, to presign what `object_store` has no call for (see [`bucket`]).
    signer: Option<Arc<AmazonS3>>,
    /// How many of its requests may be in flight now.
    window: Arc<Window>,
}

impl fmt::Debug for ObjectRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for ObjectRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

impl PartialEq for ObjectRoot {
    fn eq(&self, other: &Self) -> bool {
        (&self.bucket, &self.prefix) == (&other.bucket, &other.prefix)
    }
}

impl Eq for ObjectRoot {}

impl ObjectRoot {
    /// The root at `s3://bucket/prefix`, reached as `storage` says.
    ///
    /// # Errors
    /// The client cannot be built from these settings (the reason, never the secret).
    pub fn new(bucket: &str, prefix: &str, storage: &StorageSettings) -> Result<Self, String> {
        let window = Arc::new(Window::new(storage.max_in_flight));
        let retry = RetryConfig::default();
        let paced = window::Paced {
            window: window.clone(),
            retry_timeout: retry.retry_timeout,
        };
        let mut builder = AmazonS3Builder::from_env()
            .with_retry(retry)
            .with_http_connector(paced)
            .with_bucket_name(bucket)
            .with_virtual_hosted_style_request(!storage.path_style)
            .with_allow_http(storage.allow_http)
            .with_disable_bulk_delete(!storage.batch_delete);
        if let Some(endpoint) = &storage.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &storage.region {
            builder = builder.with_region(region);
        }
        if let Some(key) = &storage.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &storage.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let store = Arc::new(builder.build().map_err(|err| err.to_string())?);
        let signer = Some(store.clone());
        Ok(Self {
            signer,
            window,
            ..Self::with_store(bucket, prefix, store)
        })
    }

    /// The root at `bucket`/`prefix` through `store` (a test wraps the client to count calls).
    pub fn with_store(bucket: &str, prefix: &str, store: Arc<dyn ObjectStore>) -> Self {
        Self {
            bucket: bucket.to_owned(),
            prefix: prefix.trim_matches('/').to_owned(),
            store,
            listing_unit: Arc::new(AtomicU32::new(SECOND)),
            signer: None,
            window: Arc::new(Window::new(DEFAULT_MAX_IN_FLIGHT)),
        }
    }

    /// Its window: how many of its requests may be in flight now, and what it has seen.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// Requests its passes keep going at once: its window's ceiling (the window itself holds
    /// back those that do not fit now).
    pub fn at_once(&self) -> usize {
        self.window.max()
    }

    /// The same root reached through `wrap` of its client (a test counts or fails its calls).
    pub fn wrapped(&self, wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>) -> Self {
        Self {
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
            store: wrap(self.store.clone()),
            listing_unit: self.listing_unit.clone(),
            signer: self.signer.clone(),
            window: self.window.clone(),
        }
    }

    /// The root's prefix as a key; `None` for a whole bucket.
    fn prefix_key(&self) -> Option<Key> {
        (!self.prefix.is_empty()).then(|| Key::from_iter(self.prefix.split('/')))
    }

    /// The key `relative` names under this root (OS-3).
    ///
    /// # Errors
    /// Why the path names no key of its own: see [`key_of`].
    pub fn key(&self, relative: &str) -> Result<Key, String> {
        key_of(&self.prefix, relative)
    }

    /// Whether the store answers for this root and lets it be listed: the first page of its
    /// listing (`check-config`, `doctor`).
    ///
    /// # Errors
    /// The store's answer, for people.
    pub async fn reach(&self) -> Result<(), String> {
        let prefix = self.prefix_key();
        match self.store.list(prefix.as_ref()).next().await {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(err)) => Err(err.to_string()),
        }
    }

    /// Whether the store answers for this root, at the price of one HEAD: of [`PROBE`], a key
    /// under the root nothing writes; found or not, the store answered. A drain asks it before
    /// each batch it claims, and after a batch whose requests failed (an outage is not a failed
    /// removal, OS-2). Not a listing: a store may answer a listing's first page by walking the
    /// whole bucket (s3s-fs took 0.4–0.8 s a page at 10 k objects, asked before each 500
    /// removals: half of an attachment pass), and S3 bills a LIST as a dozen HEADs.
    ///
    /// # Errors
    /// The store's answer, for people.
    pub async fn answers(&self) -> Result<(), String> {
        let key = self.key(PROBE)?;
        match self.store.head(&key).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.to_string()),
        }
    }

    /// The object at `relative`: its last modification and size; `None` when there is none.
    ///
    /// # Errors
    /// The path names no key (OS-3), or the store failed.
    pub async fn head(&self, relative: &str) -> Result<Option<Object>, Refusal> {
        let key = self.key(relative).map_err(Refusal::Refused)?;
        match self.store.head(&key).await {
            Ok(meta) => Ok(Some(Object {
                last_modified: meta.last_modified,
                size: meta.size,
                etag: meta.e_tag,
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(Refusal::Store(err.to_string())),
        }
    }

    /// The object at `relative`, with its key, as a directory's one object.
    async fn head_key(&self, relative: &str) -> Result<Vec<(Key, Object)>, Refusal> {
        let key = self.key(relative).map_err(Refusal::Refused)?;
        Ok(self
            .head(relative)
            .await?
            .map(|object| (key, object))
            .into_iter()
            .collect())
    }

    /// The times the store's listing gives the objects at `keys`: some stores list a finer time
    /// than a HEAD's whole second. One listing per directory, from just before its first key
    /// to its last; a key the listing does not give (gone, or the listing failed) is missing.
    async fn listed_times(&self, keys: &[&Key]) -> HashMap<Key, DateTime<Utc>> {
        let mut directories: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for key in keys {
            let text = key.as_ref();
            let parent = text.rsplit_once('/').map_or("", |(parent, _)| parent);
            directories.entry(parent).or_default().push(text);
        }
        // The directories listed at once, each listing's pages one after another; owned
        // names, as above.
        let directories: Vec<(String, Vec<String>)> = directories
            .into_iter()
            .map(|(parent, wanted)| {
                (
                    parent.to_owned(),
                    wanted.into_iter().map(str::to_owned).collect(),
                )
            })
            .collect();
        futures::stream::iter(directories)
            .map(|(parent, wanted)| self.listed_in(parent, wanted))
            .buffer_unordered(self.at_once())
            .flat_map(futures::stream::iter)
            .collect()
            .await
    }

    /// The listed times of `wanted` (keys of the directory `parent`), from one listing.
    async fn listed_in(
        &self,
        parent: String,
        mut wanted: Vec<String>,
    ) -> Vec<(Key, DateTime<Utc>)> {
        wanted.sort_unstable();
        let (first, last) = (wanted[0].as_str(), wanted[wanted.len() - 1].as_str());
        let parent = Key::parse(&parent).ok().filter(|_| !parent.is_empty());
        // The listing starts after the first key without its last character: the keys are
        // among the first it gives, unless many others sort in between.
        let offset = first
            .char_indices()
            .last()
            .and_then(|(at, _)| Key::parse(&first[..at]).ok())
            .or_else(|| parent.clone())
            .unwrap_or_default();
        let mut times = Vec::new();
        let mut listing = self.store.list_with_offset(parent.as_ref(), &offset);
        while let Some(Ok(meta)) = listing.next().await {
            let location = meta.location.as_ref();
            if location > last {
                break;
            }
            if wanted
                .binary_search_by(|key| key.as_str().cmp(location))
                .is_ok()
            {
                times.push((meta.location, meta.last_modified));
            }
        }
        times
    }

    /// The unit of times a listing of this store gives, `times` among them: the finest seen in
    /// any of its listings so far. A time's digits show at most how fine a store's times are
    /// (`.123` a millisecond, `.120` perhaps a hundredth), and a store gives all its listed
    /// times in one unit: a listed `.000` from a store seen to list milliseconds is a whole
    /// millisecond, not a second. A HEAD's time is always a whole second, whatever the store.
    fn listed_unit(&self, times: impl Iterator<Item = DateTime<Utc>>) -> u32 {
        let finest = times.map(unit_of).min().unwrap_or(SECOND);
        self.listing_unit
            .fetch_min(finest, Ordering::Relaxed)
            .min(finest)
    }

    /// Every object under `relative/` (a session's or an agent's directory), as the store lists
    /// them (a stream, as [`list_all`](Self::list_all)).
    ///
    /// # Errors
    /// The path names no key (OS-3).
    pub fn list_under(
        &self,
        relative: &str,
    ) -> Result<BoxStream<'static, object_store::Result<ObjectMeta>>, String> {
        Ok(self.store.list(Some(&self.key(relative)?)))
    }

    /// Every object under `relative/` (a session's directory, SS-6), with its size and time.
    pub(crate) async fn under(&self, relative: &str) -> Result<Vec<(Key, Object)>, Refusal> {
        self.list_under(relative)
            .map_err(Refusal::Refused)?
            .map_ok(|meta| {
                let object = Object {
                    last_modified: meta.last_modified,
                    size: meta.size,
                    etag: meta.e_tag,
                };
                (meta.location, object)
            })
            .try_collect()
            .await
            .map_err(|err| Refusal::Store(err.to_string()))
    }

    /// Every object under the root, as the store lists them (a stream: a root of millions of
    /// objects is never held in memory).
    pub fn list_all(&self) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let prefix = self.prefix_key();
        self.store.list(prefix.as_ref())
    }

    /// Every object under the root, listed in ranges side by side and taken as they come, in
    /// no particular order (see [`ranges`]): for a pass whose order decides nothing.
    pub fn list_unordered(&self) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let prefix = self.prefix_key();
        ranges::list_ranges(&self.store, prefix.as_ref())
    }

    /// `key` relative to the root, if it names one of the root's objects by exactly that path
    /// (OS-3: a key whose spelling [`key_of`] would refuse, or map elsewhere, is `None`).
    pub fn relative(&self, key: &Key) -> Option<String> {
        let relative = if self.prefix.is_empty() {
            key.as_ref()
        } else {
            key.as_ref()
                .strip_prefix(self.prefix.as_str())?
                .strip_prefix('/')?
        };
        (self.key(relative).ok()? == *key).then(|| relative.to_owned())
    }

    /// The first `limit` bytes of the object at `key` (a ranged GET; all of it when shorter).
    ///
    /// # Errors
    /// The store's answer, for people.
    pub async fn first_bytes(&self, key: &Key, size: u64, limit: u64) -> Result<Vec<u8>, String> {
        if size == 0 {
            return Ok(Vec::new());
        }
        self.store
            .get_range(key, 0..size.min(limit))
            .await
            .map(|bytes| bytes.to_vec())
            .map_err(|err| err.to_string())
    }

    /// What the store says of the object at `key` now; `None` when there is none.
    ///
    /// # Errors
    /// The store's answer, for people.
    pub async fn meta(&self, key: &Key) -> Result<Option<ObjectMeta>, String> {
        match self.store.head(key).await {
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    }

    /// Deletes `keys` in calls of at most [`MAX_BATCH`] keys each; each key's outcome, in
    /// order (a key already gone is deleted). A key whose delete failed — one of a call that
    /// failed as a whole (its answer lost: the store may have removed any of its keys), or one
    /// the store answered for with an error — is read again (HEAD) at once: found gone, it was
    /// removed and counts so (OS-4); still there, or not readable, its failure stands and its
    /// record is retried.
    ///
    /// `object_store` 0.14 has no conditional delete (no `If-Match` on DeleteObject, no ETag per
    /// key in DeleteObjects): what is deleted is what a HEAD just before saw (OS-2), and an
    /// object rewritten between that HEAD and the delete is the one window left.
    pub async fn delete(&self, keys: &[Key]) -> Vec<Result<(), String>> {
        // The calls in flight at once, their answers taken in order.
        // Owned chunks: a future borrowing each would not be `Send` for every lifetime.
        let chunks: Vec<Vec<Key>> = keys.chunks(MAX_BATCH).map(<[Key]>::to_vec).collect();
        let answers = in_order(chunks, self.at_once(), |chunk| self.delete_batch(chunk)).await;
        let mut outcomes: Vec<Result<(), String>> = answers.into_iter().flatten().collect();
        let failed: Vec<(usize, Key)> = (0..keys.len())
            .filter(|n| outcomes[*n].is_err())
            .map(|n| (n, keys[n].clone()))
            .collect();
        let gone: Vec<(usize, bool)> = futures::stream::iter(failed)
            .map(|(n, key)| async move { (n, matches!(self.meta(&key).await, Ok(None))) })
            .buffer_unordered(self.at_once())
            .collect()
            .await;
        for (n, gone) in gone {
            if gone {
                outcomes[n] = Ok(());
            }
        }
        outcomes
    }

    /// One DeleteObjects call (single deletes where the store has none) of at most
    /// [`MAX_BATCH`] `keys`: each key's outcome, in order. A call that failed as a whole fails
    /// each of its keys.
    async fn delete_batch(&self, keys: Vec<Key>) -> Vec<Result<(), String>> {
        let count = keys.len();
        let stream = futures::stream::iter(keys).map(Ok).boxed();
        let results: Vec<_> = self.store.delete_stream(stream).collect().await;
        if results.len() == count {
            return results
                .into_iter()
                .map(|result| match result {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(err) => Err(err.to_string()),
                })
                .collect();
        }
        let why = results.into_iter().find_map(Result::err).map_or_else(
            || "the store answered for fewer keys".to_owned(),
            |e| e.to_string(),
        );
        vec![Err(why); count]
    }
}

/// `work` on each of `items`, up to `at_once` at a time, the results in `items`' order. Taken as
/// they come, not in order (`buffer_unordered`): an item waiting on a throttled request's
/// backoff holds up no other, where an ordered buffer would keep every place behind it.
pub(crate) async fn in_order<T, R, F, Fut>(items: Vec<T>, at_once: usize, work: F) -> Vec<R>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = R>,
{
    let mut done: Vec<(usize, R)> = futures::stream::iter(items.into_iter().enumerate())
        .map(|(n, item)| {
            let answer = work(item);
            async move { (n, answer.await) }
        })
        .buffer_unordered(at_once)
        .collect()
        .await;
    done.sort_unstable_by_key(|(n, _)| *n);
    done.into_iter().map(|(_, result)| result).collect()
}

/// An object's time, size and ETag, as the store reports them (OS-2: `LastModified` is its
/// mtime).
#[derive(Debug, Clone)]
pub struct Object {
    pub last_modified: DateTime<Utc>,
    pub size: u64,
    /// `None` from a store that gives none.
    pub etag: Option<String>,
}

/// Why an object could not be looked at.
#[derive(Debug)]
pub enum Refusal {
    /// The path names no key of its own (OS-3).
    Refused(String),
    /// The store failed.
    Store(String),
}

/// `stream` read on a task of its own, up to `ahead` items before its reader takes them, so
/// that a pass's next requests (a listing's pages, the reads it leads to) go on while the pass
/// works through a batch. The task ends at the stream's end or first error, or once the reader
/// is dropped.
pub fn read_ahead<T, E>(
    mut stream: BoxStream<'static, Result<T, E>>,
    ahead: usize,
) -> tokio::sync::mpsc::Receiver<Result<T, E>>
where
    T: Send + 'static,
    E: Send + 'static,
{
    let (read, taken) = tokio::sync::mpsc::channel(ahead.max(1));
    tokio::spawn(async move {
        while let Some(item) = stream.next().await {
            let failed = item.is_err();
            if read.send(item).await.is_err() || failed {
                break;
            }
        }
    });
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os1_the_secret_is_never_in_debug_output() {
        let settings = StorageSettings {
            secret_access_key: Some("hunter2-secret".to_owned()),
            ..StorageSettings::default()
        };
        assert!(!format!("{settings:?}").contains("hunter2"));
    }

    /// PF-7: a pass's listing and reads go on while the pass works on a batch — `ahead` items
    /// are read before the reader takes one; then the stream waits for it, and its error ends
    /// the reading.
    #[tokio::test]
    async fn pf7_a_listing_is_read_ahead_of_its_reader_up_to_its_bound() {
        let (produced, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let items = futures::stream::iter(0..10)
            .map(move |n| {
                produced.send(n).unwrap();
                if n == 7 {
                    Err("the store failed")
                } else {
                    Ok(n)
                }
            })
            .boxed();

        let mut taken = read_ahead(items, 4);

        // Four sit in the channel and a fifth waits to be sent, with nothing taken yet.
        for n in 0..5 {
            assert_eq!(seen.recv().await, Some(n));
        }
        let mut got = Vec::new();
        while let Some(item) = taken.recv().await {
            got.push(item);
        }
        assert_eq!(
            got,
            [
                Ok(0),
                Ok(1),
                Ok(2),
                Ok(3),
                Ok(4),
                Ok(5),
                Ok(6),
                Err("the store failed")
            ]
        );
        let mut rest = Vec::new();
        while let Some(n) = seen.recv().await {
            rest.push(n);
        }
        assert_eq!(rest, [5, 6, 7], "nothing is read after the error");
    }
}
