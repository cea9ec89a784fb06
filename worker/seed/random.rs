//! The one source of randomness: a ChaCha8 stream seeded from `--seed`, and `--now`, which
//! every age is measured back from.
//!
//! The same seed and now give the same data only because every draw goes through here in a
//! fixed order. Changing the order of draws, their number, or the integer type of a range (an
//! `i32` and an `i64` range draw differently) changes every row after it: the full-table hash
//! test (`seed_is_deterministic_for_a_seed`) shows it.

use chrono::{DateTime, Duration, Utc};
use rand::distr::uniform::{SampleRange, SampleUniform};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use uuid::Uuid;

/// Models a variant asks for.
pub(super) const MODELS: &[&str] = &["atlas-large", "atlas-small", "quill-2", "quill-2-mini"];
/// Tools whose results a run keeps.
pub(super) const TOOLS: &[&str] = &["search", "read_file", "write_file", "run_shell", "browse"];
/// The vocabulary of every generated text.
const WORDS: &[&str] = &[
    "the", "agent", "reads", "a", "file", "and", "writes", "summary", "of", "results", "with",
    "tool", "calls", "over", "history", "model", "answer", "question", "plan", "step",
];

/// The seeded stream and the moment ages are measured back from.
pub(super) struct Random {
    rng: ChaCha8Rng,
    now: DateTime<Utc>,
}

impl Random {
    pub(super) fn new(seed: u64, now: DateTime<Utc>) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now,
        }
    }

    /// A random (version 4) id.
    pub(super) fn id(&mut self) -> Uuid {
        uuid::Builder::from_random_bytes(self.rng.random()).into_uuid()
    }

    /// True with probability `p`.
    pub(super) fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// A number in `range`; its type is part of the stream (see the module's note).
    pub(super) fn range<T, R>(&mut self, range: R) -> T
    where
        T: SampleUniform,
        R: SampleRange<T>,
    {
        self.rng.random_range(range)
    }

    /// One of `items`, which must not be empty.
    pub(super) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        *items.choose(&mut self.rng).expect("non-empty")
    }

    /// `n` words of the vocabulary, separated by spaces.
    pub(super) fn words(&mut self, n: usize) -> String {
        let mut s = String::with_capacity(n * 6);
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(self.pick(WORDS));
        }
        s
    }

    /// A moment up to `max_days` before now, to the second.
    pub(super) fn days_ago(&mut self, max_days: i64) -> DateTime<Utc> {
        self.now - Duration::seconds(self.rng.random_range(0..max_days * 86_400))
    }
}
