//! How a failed queue consumer is restarted (ER-2): after a pause that doubles with each failure
//! in a row, logged once per interval for the whole worker.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a failed queue consumer waits before its restart, and when that is logged.
#[derive(Debug, Default)]
pub struct RestartPacer {
    consumers: HashMap<String, Failing>,
    /// Failures of any consumer not yet logged, and when the last log line was written: one
    /// line per interval for the whole worker, however many queues it consumes.
    unlogged: u32,
    logged: Option<Instant>,
}

#[derive(Debug)]
struct Failing {
    /// Failures in a row (reset after a quiet minute).
    streak: u32,
    last: Instant,
}

impl RestartPacer {
    /// The first pause after a failure; doubled on every failure in a row, up to the longest.
    const FIRST: Duration = Duration::from_millis(250);
    /// Kept well under the shutdown grace: a pause holds off SIGTERM handling until it ends.
    const LONGEST: Duration = Duration::from_secs(5);
    /// A consumer quiet this long starts a new streak.
    const QUIET: Duration = Duration::from_secs(60);
    /// Failures are logged once per this interval, with a count of them all.
    const LOG_EVERY: Duration = Duration::from_secs(10);

    /// Records a failure of the worker `name` and returns the pause before its restart. A
    /// restarted worker's name carries `.r<n>`; its failures count for the consumer it restarts.
    pub fn failed(&mut self, name: &str, error: &str) -> Duration {
        let consumer = match name.rsplit_once(".r") {
            Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
            _ => name,
        };
        let now = Instant::now();
        let failing = self
            .consumers
            .entry(consumer.to_owned())
            .or_insert(Failing {
                streak: 0,
                last: now,
            });
        if now.duration_since(failing.last) > Self::QUIET {
            failing.streak = 0;
        }
        failing.streak += 1;
        failing.last = now;
        let (streak, pause) = (
            failing.streak,
            (Self::FIRST * 2u32.saturating_pow(failing.streak.min(16) - 1)).min(Self::LONGEST),
        );
        self.unlogged += 1;
        if self
            .logged
            .is_none_or(|at| now.duration_since(at) >= Self::LOG_EVERY)
        {
            tracing::warn!(
                event = crate::event::CONSUMER_RESTARTING,
                worker = consumer,
                failures = self.unlogged,
                in_a_row = streak,
                pause_ms = pause.as_millis() as u64,
                error,
                "queue worker failed; restarting it after a pause"
            );
            self.unlogged = 0;
            self.logged = Some(now);
        }
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn er2_restarts_of_one_consumer_pause_longer_each_time_up_to_the_longest() {
        let mut pacer = RestartPacer::default();
        let pauses: Vec<u128> = ["w.nightly", "w.nightly.r1", "w.nightly.r2", "w.nightly.r3"]
            .iter()
            .chain(["w.nightly.r4"; 6].iter())
            .map(|name| pacer.failed(name, "permission denied").as_millis())
            .collect();
        assert_eq!(
            pauses,
            [250, 500, 1000, 2000, 4000, 5000, 5000, 5000, 5000, 5000]
        );
        assert_eq!(
            pacer.failed("w.prune_execution_details", "x").as_millis(),
            250
        );
    }
}
