//! The database's clock, read on this host. Cutoffs already measure back from the database's
//! `now()` (EX-1); this clock puts everything else a replica times — the nightly slot it pushes
//! (FL-2), the markers it stamps, `preview` and `status` — on the same clock, so that one
//! replica whose host clock runs 40 days ahead neither stalls the fleet nor says so only by
//! silence.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use sexton_jobs::clock::Clock;
use sqlx::PgPool;

/// How often a worker measures how far its host's clock is from the database's.
const INTERVAL: Duration = Duration::from_secs(60);

/// A difference beyond which the host's clock is reported as wrong (NTP keeps hosts well
/// within it; a round trip is far below it).
const TOLERANCE: TimeDelta = TimeDelta::seconds(5);

/// The host's clock, corrected by how far it was from the database's at the last
/// [`measure`](Self::measure) — only when that is more than [`TOLERANCE`], so that replicas
/// whose clocks are in sync read the very same host clock, with no measurement noise between
/// them: the database's clock without a round trip per reading.
#[derive(Debug, Default)]
pub struct DatabaseClock {
    /// How far the host's clock is ahead of the database's, in milliseconds (negative: behind).
    ahead_ms: AtomicI64,
}

impl Clock for DatabaseClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() - TimeDelta::milliseconds(self.ahead_ms.load(Ordering::Relaxed))
    }
}

impl DatabaseClock {
    /// Measures how far the host's clock is ahead of the database's (the middle of the round
    /// trip against `clock_timestamp()`) and corrects by it from now on.
    ///
    /// # Errors
    /// A database error; the last correction stays.
    pub async fn measure(&self, pool: &PgPool) -> Result<TimeDelta, sqlx::Error> {
        let before = Utc::now();
        let database: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(pool)
            .await?;
        let after = Utc::now();
        let ahead = before + (after - before) / 2 - database;
        let correction = if ahead.abs() > TOLERANCE {
            ahead.num_milliseconds()
        } else {
            0
        };
        self.ahead_ms.store(correction, Ordering::Relaxed);
        Ok(ahead)
    }

    /// Measures now and then every minute, for as long as the task lives; says so, every
    /// time, while the host's clock is off by more than [`TOLERANCE`].
    pub async fn keep(self: Arc<Self>, pool: PgPool) {
        loop {
            match self.measure(&pool).await {
                Ok(ahead) => report(ahead),
                Err(err) => {
                    tracing::warn!(error = %err, "could not read the database's clock; keeping the last correction")
                }
            }
            tokio::time::sleep(INTERVAL).await;
        }
    }
}

/// Warns when the host's clock is off.
pub fn report(ahead: TimeDelta) {
    if ahead.abs() > TOLERANCE {
        tracing::warn!(
            ahead_seconds = ahead.num_milliseconds() as f64 / 1000.0,
            "this host's clock is {} the database's by {}; sexton schedules, stamps and \
             pushes by the database's clock (fix the host's time sync)",
            if ahead > TimeDelta::zero() {
                "ahead of"
            } else {
                "behind"
            },
            human(ahead.abs())
        );
    }
}

/// The database's clock now, in one round trip: for the one-shot commands.
///
/// # Errors
/// A database error.
pub async fn database_now(pool: &PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    let clock = DatabaseClock::default();
    report(clock.measure(pool).await?);
    Ok(clock.now())
}

fn human(delta: TimeDelta) -> String {
    let seconds = delta.num_seconds();
    match seconds {
        s if s >= 86_400 => format!("{:.1} days", s as f64 / 86_400.0),
        s if s >= 3_600 => format!("{:.1} hours", s as f64 / 3_600.0),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fl2_the_correction_is_applied_to_every_reading() {
        let clock = DatabaseClock::default();
        clock.ahead_ms.store(40 * 86_400 * 1000, Ordering::Relaxed);
        let behind = Utc::now() - clock.now();
        assert!((behind - TimeDelta::days(40)).abs() < TimeDelta::seconds(1));
        assert_eq!(human(TimeDelta::days(40)), "40.0 days");
    }
}
