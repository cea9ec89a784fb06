//! A measured method's figures, as every part records them: its time and rates, what the
//! application writer beside it saw, its longest write transaction and, for sexton, its hops.

use serde::{Deserialize, Serialize};

use crate::compare::Side;
use crate::sampler::Longest;
use crate::writer::Writes;

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latency {
    /// p50 / p99 / max, in ms with one decimal ("—" with no samples).
    pub fn ms(&self) -> String {
        if self.samples == 0 {
            return "—".to_owned();
        }
        format!(
            "{:.1} / {:.1} / {:.1}",
            self.p50_ms, self.p99_ms, self.max_ms
        )
    }

    /// The median and p99, in whole ms: a hop's.
    pub fn median_p99(&self) -> String {
        format!("{:.0} / {:.0}", self.p50_ms, self.p99_ms)
    }

    /// The latency of `ms`, each sample's milliseconds.
    pub fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if ms.is_empty() {
                0.0
            } else {
                ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1]
            }
        };
        Self {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: ms.last().copied().unwrap_or(0.0),
            samples: ms.len(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Method {
    pub name: String,
    pub seconds: f64,
    pub owners_per_s: f64,
    pub rows_per_s: f64,
    pub writer: Latency,
    /// The writer's longest wait for its conversation and run locks.
    pub writer_longest_lock_wait_ms: f64,
    /// How many of the writer's transactions met a lock someone held (waited at all): of
    /// `writer.samples`.
    pub writer_lock_waits: usize,
    pub longest_transaction_ms: f64,
    /// What the longest transaction was running when last sampled.
    pub longest_transaction_query: String,
    /// What its backend waited on in the samples of it, most seen first (see
    /// [`crate::sampler::longest_transaction`]).
    pub longest_transaction_waits: String,
    /// sexton only: hop durations, each hop's time per candidate, peak RSS, and where the
    /// time went.
    pub hop: Option<Latency>,
    /// sexton only: from the worker's "worker started" line to its taking the nightly slot,
    /// which the bench holds back a second so that the worker's start (its queue consumers
    /// registering, its first connections) is over by then, as a running fleet's idle worker's
    /// is: not part of the timed pass.
    pub start_seconds: Option<f64>,
    /// sexton only: when its first hop of the measured job began, in seconds into the timed
    /// pass: before it, the fan-out of every kind (FL-8) and the queue handing out the hop, which
    /// no floor has.
    pub first_hop_seconds: Option<f64>,
    pub hop_us_per_candidate: Option<Latency>,
    pub peak_rss_kb: Option<u64>,
    pub share_outside_owner_transactions: Option<f64>,
    pub share_outside_hops: Option<f64>,
    /// The cluster's WAL over the method's timed span, in bytes: `pg_current_wal_lsn()` read on
    /// the bench's own connection just before and right after (for sexton, at the worker being
    /// up and at its last hop). The writer's WAL beside it is included. Measured for every
    /// sexton pass and the scales' other methods.
    pub wal_bytes: Option<i64>,
    /// Scales only: the writer's estimated share of `wal_bytes`, its idle baseline's WAL rate ×
    /// the method's seconds.
    pub wal_bytes_writer: Option<f64>,
    /// Scales only: `wal_bytes` less the writer's share, per owner pruned (session deleted).
    pub wal_bytes_per_owner: Option<f64>,
}

/// Method `name` before its figures are filled in.
pub fn method(name: &str) -> Method {
    Method {
        name: name.to_owned(),
        seconds: 0.0,
        owners_per_s: 0.0,
        rows_per_s: 0.0,
        writer: Latency::of(Vec::new()),
        writer_longest_lock_wait_ms: 0.0,
        writer_lock_waits: 0,
        longest_transaction_ms: 0.0,
        longest_transaction_query: String::new(),
        longest_transaction_waits: String::new(),
        hop: None,
        start_seconds: None,
        first_hop_seconds: None,
        hop_us_per_candidate: None,
        peak_rss_kb: None,
        share_outside_owner_transactions: None,
        share_outside_hops: None,
        wal_bytes: None,
        wal_bytes_writer: None,
        wal_bytes_per_owner: None,
    }
}

impl Method {
    /// How many of the writer's transactions beside this method met a held lock, of how many.
    pub fn waits(&self) -> String {
        format!("{} of {}", self.writer_lock_waits, self.writer.samples)
    }

    /// Its run as one side of a comparison of two builds.
    pub fn side(&self) -> Side {
        Side {
            seconds: self.seconds,
            rate: self.owners_per_s,
            peak_rss_kb: self.peak_rss_kb,
            writer_wait_ms: Some(self.writer_longest_lock_wait_ms),
        }
    }
}

/// A method's rates over `items` and `rows`, and what the writer and the sampler saw.
pub fn score(method: &mut Method, items: i64, rows: i64, writer: Writes, longest: Longest) {
    method.owners_per_s = items as f64 / method.seconds;
    method.rows_per_s = rows as f64 / method.seconds;
    method.writer = Latency::of(writer.total_ms);
    method.writer_longest_lock_wait_ms = max_ms(&writer.lock_wait_ms);
    method.writer_lock_waits = writer.lock_wait_ms.iter().filter(|ms| **ms > 0.0).count();
    method.longest_transaction_ms = longest.ms;
    method.longest_transaction_query = longest.query;
    method.longest_transaction_waits = longest.waits;
}

/// The largest of `ms`, 0 when there are none.
pub fn max_ms(ms: &[f64]) -> f64 {
    ms.iter().copied().fold(0.0, f64::max)
}

/// The runs of methods taking turns round by round, each method's by its place in a round.
pub struct Rounds<T>(Vec<Vec<T>>);

impl<T> Rounds<T> {
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// `run` of the method `at` its place in the round.
    pub fn add(&mut self, at: usize, run: T) {
        match self.0.get_mut(at) {
            Some(runs) => runs.push(run),
            None => self.0.push(vec![run]),
        }
    }

    /// Every method's run first in it.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().filter_map(|runs| runs.first())
    }

    /// Each method's median run by its `seconds`, in the methods' order.
    pub fn medians(self, seconds: impl Fn(&T) -> f64) -> Vec<T> {
        self.0
            .into_iter()
            .filter_map(|runs| median(runs, &seconds))
            .collect()
    }
}

/// The median of one method's `runs` by their `seconds` (the later of the two middle ones of
/// an even count); `None` when there are none.
pub fn median<T>(mut runs: Vec<T>, seconds: impl Fn(&T) -> f64) -> Option<T> {
    runs.sort_by(|a, b| seconds(a).total_cmp(&seconds(b)));
    let middle = runs.len() / 2;
    (middle < runs.len()).then(|| runs.swap_remove(middle))
}

/// The rounds of results written before rounds were counted.
pub fn one_round() -> u32 {
    1
}
