//! A root's keys listed in ranges side by side: one listing of a large prefix is a chain of
//! pages, each asked for only once the one before it has answered, so a store that answers a
//! page in tens of milliseconds (or, like s3s-fs, walks its whole bucket for each page) keeps a
//! lone listing waiting on one request at a time. Split at the first character of the key
//! below the root, the ranges are listed at once, each a chain of its own, the way AWS advises
//! for listing a large bucket fast. Every key falls in exactly one range, so none is forgotten
//! or listed twice (OS-4): range `n` is the keys after split `n - 1` (the first range: from the
//! start) up to and including split `n` (the last range: to the end).
//!
//! Each object is taken from the first range, in key order, that has one at hand
//! ([`FirstAtHand`]): a range asks for its next page once its last one is read, so the ranges
//! ask at different times. Taken in turns, the ranges ran out of their pages together and asked
//! for the next sixteen at once: a store that walks its whole bucket for each page (s3s-fs) then
//! walked it sixteen times side by side and answered little else for tens of seconds, again and
//! again (behind a store that throttles, at 100 k objects, 0.84 of its rate). A page's body is
//! read as soon as it is answered (window.rs), however long its range waits its turn.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use object_store::path::Path as Key;
use object_store::{ObjectMeta, ObjectStore};

/// Where the ranges meet: after each hex digit but the last, the characters the UUID-named
/// directories of every root sexton writes begin with, so that sixteen ranges share out such a
/// root evenly. A key of any other spelling is still listed, in the range its first character
/// sorts into.
const SPLITS: [&str; 15] = [
    "1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f",
];

/// Every object under `prefix` (the whole store when `None`), the ranges listed side by side,
/// each object taken from the first range that has one at hand: in no order a caller may count
/// on. Each range holds one page at a time, so memory stays a page per range whatever the root's
/// size.
pub(super) fn list_ranges(
    store: &Arc<dyn ObjectStore>,
    prefix: Option<&Key>,
) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
    let at = |split: &str| match prefix {
        Some(prefix) => Key::from_iter(prefix.parts().chain([split.into()])),
        None => Key::from(split),
    };
    let bounds: Vec<Key> = SPLITS.iter().map(|split| at(split)).collect();
    let lowers = std::iter::once(None).chain(bounds.iter().cloned().map(Some));
    let uppers = bounds
        .iter()
        .cloned()
        .map(Some)
        .chain(std::iter::once(None));
    let ranges = lowers.zip(uppers).map(|(lower, upper)| {
        let listing = match &lower {
            None => store.list(prefix),
            Some(lower) => store.list_with_offset(prefix, lower),
        };
        within(listing, lower, upper)
    });
    FirstAtHand(ranges.collect()).boxed()
}

/// One range's listing: the keys after `lower` up to and including `upper`, ending at the first
/// past it. The ranges count on the store to list in key order (UTF-8 bytes, as S3 does) and to
/// start after `lower`; a listing that does not (a store that ignores `start-after`, or lists in
/// no order, as S3 Express directory buckets do) fails, naming the keys, rather than judge a key
/// twice or end a range early and forget the rest of it.
fn within(
    listing: BoxStream<'static, object_store::Result<ObjectMeta>>,
    lower: Option<Key>,
    upper: Option<Key>,
) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
    let mut last = lower;
    listing
        .and_then(move |meta| {
            let after = last.replace(meta.location.clone());
            let checked = match after {
                Some(after) if meta.location.as_ref() <= after.as_ref() => {
                    Err(object_store::Error::Generic {
                        store: "S3",
                        source: format!(
                            "the store listed {} after {after}: its listing is not in key order \
                             (or ignores start-after), and sexton judges no root from such a \
                             listing",
                            meta.location
                        )
                        .into(),
                    })
                }
                _ => Ok(meta),
            };
            futures::future::ready(checked)
        })
        .try_take_while(move |meta| {
            let within = upper
                .as_ref()
                .is_none_or(|upper| meta.location.as_ref() <= upper.as_ref());
            futures::future::ready(Ok(within))
        })
        .boxed()
}

/// Streams merged, each item taken from the first of them, in their order, that has one at hand.
/// Every stream is asked until one answers, so each keeps its request in flight.
struct FirstAtHand<T>(Vec<BoxStream<'static, T>>);

impl<T> Stream for FirstAtHand<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut n = 0;
        while n < self.0.len() {
            match self.0[n].poll_next_unpin(cx) {
                Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
                Poll::Ready(None) => drop(self.0.remove(n)),
                Poll::Pending => n += 1,
            }
        }
        if self.0.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt as _, PutPayload};

    /// Keys at and around every split, and of spellings no range is named after, under `under`.
    fn keys(under: &str) -> Vec<Key> {
        let names = [
            "0",
            "0/x",
            "0zz/y",
            "1",
            "1/x",
            "10/y",
            "1~",
            "9/z",
            "a",
            "a/b/c",
            "af/x",
            "f",
            "f/x",
            "ff/x",
            "g",
            "z/x",
            "A/x",
            "-/x",
            ".x",
            "_y",
            "~",
            "\u{e9}t\u{e9}/x",
        ];
        let splits = SPLITS.iter().map(|split| format!("{split}/in"));
        names
            .into_iter()
            .map(str::to_owned)
            .chain(splits)
            .map(|name| Key::from(format!("{under}{name}")))
            .collect()
    }

    async fn listed(store: &Arc<dyn ObjectStore>, prefix: Option<&Key>) -> Vec<String> {
        let mut listed: Vec<String> = list_ranges(store, prefix)
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .unwrap();
        listed.sort();
        listed
    }

    #[tokio::test]
    async fn os4_pf7_each_item_comes_from_the_first_range_with_one_at_hand() {
        let ranges = vec![
            futures::stream::iter([1, 2]).boxed(),
            futures::stream::iter([3, 4]).boxed(),
        ];
        let merged: Vec<i32> = FirstAtHand(ranges).collect().await;
        assert_eq!(
            merged,
            [1, 2, 3, 4],
            "the first range read out before the next"
        );
        // A range waiting on its next page holds up none after it.
        let waiting = futures::stream::pending().boxed();
        let ranges = vec![waiting, futures::stream::iter([3, 4]).boxed()];
        let merged: Vec<i32> = FirstAtHand(ranges).take(2).collect().await;
        assert_eq!(merged, [3, 4]);
    }

    #[tokio::test]
    async fn os4_a_listing_out_of_key_order_or_from_before_its_range_fails() {
        let meta = |key: &str| ObjectMeta {
            location: Key::from(key),
            last_modified: chrono::DateTime::UNIX_EPOCH,
            size: 1,
            e_tag: None,
            version: None,
        };
        let range = |keys: &[&str], lower: &str, upper: &str| {
            let metas: Vec<_> = keys.iter().map(|key| Ok(meta(key))).collect();
            let listing = futures::stream::iter(metas).boxed();
            within(listing, Some(Key::from(lower)), Some(Key::from(upper)))
                .map_ok(|meta| meta.location.to_string())
                .try_collect::<Vec<_>>()
        };
        assert_eq!(
            range(&["r/1a", "r/1b", "r/2", "r/3"], "r/1", "r/2")
                .await
                .unwrap(),
            ["r/1a", "r/1b", "r/2"],
            "in order: up to and including the upper bound"
        );
        // A store that ignores start-after lists the range before this one's lower bound too.
        let error = range(&["r/0", "r/1a"], "r/1", "r/2").await.unwrap_err();
        assert!(
            error.to_string().contains("listed r/0 after r/1"),
            "{error}"
        );
        // A store that lists in no order would end the range at the first key past it.
        let error = range(&["r/1b", "r/1a", "r/3"], "r/1", "r/2")
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("listed r/1a after r/1b"),
            "{error}"
        );
        let error = range(&["r/1b", "r/1b"], "r/1", "r/2").await.unwrap_err();
        assert!(error.to_string().contains("not in key order"), "{error}");
    }

    #[tokio::test]
    async fn os4_every_key_is_listed_once_whichever_range_it_falls_in() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (mut top, mut under_root, elsewhere) = (keys(""), keys("root/"), keys("rooted/"));
        for key in top.iter().chain(&under_root).chain(&elsewhere) {
            let payload = PutPayload::from_static(b"x");
            store.put(key, payload).await.unwrap();
        }
        under_root.sort();
        let shown = |keys: &[Key]| keys.iter().map(Key::to_string).collect::<Vec<_>>();
        assert_eq!(
            listed(&store, Some(&Key::from("root"))).await,
            shown(&under_root),
            "the ranges of a prefix give each of its keys once, and none of another prefix"
        );
        top.extend(under_root.into_iter().chain(elsewhere));
        top.sort();
        assert_eq!(
            listed(&store, None).await,
            shown(&top),
            "the whole store, each key once"
        );
    }
}
