//! The nightly schedule (FL-2). Every replica runs it; the slot's idempotency key makes each
//! slot one job fleet-wide. On start, the most recent slot missed within the catch-up window is
//! enqueued once; older missed slots are not backfilled.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::clock::SharedClock;
use sqlx::PgPool;

use crate::config::{ScheduleSettings, Settings};
use crate::context::JobContext;
use crate::queue::PushOutcome;
use crate::registry::Kind;
use crate::telemetry::metrics;
use crate::tick;

/// The first slot strictly after `now`.
pub fn next_slot(schedule: &ScheduleSettings, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule
        .cron
        .after(&now.with_timezone(&schedule.timezone))
        .next()
        .map(|slot| slot.with_timezone(&Utc))
}

/// The slot to catch up on at `now`: the last one due, if it is recent enough.
pub fn catch_up_slot(schedule: &ScheduleSettings, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if schedule.catch_up <= chrono::Duration::zero() {
        return None;
    }
    tick::slot_at(schedule, now).filter(|slot| now - *slot <= schedule.catch_up)
}

/// Runs the schedule until the task is dropped.
pub async fn run(pool: PgPool, settings: Arc<Settings>, clock: SharedClock) {
    if let Some(slot) = catch_up_slot(&settings.schedule, clock.now()) {
        let outcome = enqueue(&pool, &settings, slot).await;
        metrics::slot(match outcome {
            PushOutcome::Enqueued => "caught_up",
            PushOutcome::Duplicate => "duplicate",
        });
        tracing::info!(slot = %slot.to_rfc3339(), %outcome, "catch-up of the last missed slot");
    }
    loop {
        let now = clock.now();
        let Some(slot) = next_slot(&settings.schedule, now) else {
            tracing::warn!("the schedule has no further slot; scheduling stops");
            return;
        };
        tokio::time::sleep((slot - now).to_std().unwrap_or_default()).await;
        let outcome = enqueue(&pool, &settings, slot).await;
        metrics::slot(match outcome {
            PushOutcome::Enqueued => "enqueued",
            PushOutcome::Duplicate => "duplicate",
        });
    }
}

/// Enqueues a slot, retrying while the database is away: any replica may win, and the key
/// keeps it to one job.
/// The start of the period of length `period` that `now` falls in, counted from the Unix epoch.
pub fn period_start(now: DateTime<Utc>, period: chrono::Duration) -> DateTime<Utc> {
    let length = period.num_seconds().max(1);
    let start = now.timestamp().div_euclid(length) * length;
    DateTime::from_timestamp(start, 0).unwrap_or(now)
}

/// Runs a kind on its own cadence: the current period's pass on start, then one per period, each
/// once fleet-wide (its first hop is keyed by the period's start, TR-4).
pub async fn every(ctx: JobContext, kind: &'static dyn Kind, period: chrono::Duration) {
    loop {
        let slot = period_start(ctx.clock.now(), period);
        loop {
            match tick::start_period(&ctx, kind, slot).await {
                Ok(outcome) => {
                    tracing::info!(job = kind.name(), slot = %slot.to_rfc3339(), %outcome, "period");
                    break;
                }
                Err(err) => {
                    tracing::warn!(
                        job = kind.name(),
                        error = format!("{err:#}"),
                        "could not start the period; retrying"
                    );
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        }
        let wait = (slot + period - ctx.clock.now())
            .to_std()
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
    }
}

async fn enqueue(pool: &PgPool, settings: &Settings, slot: DateTime<Utc>) -> PushOutcome {
    loop {
        match tick::enqueue_slot(pool, settings, slot).await {
            Ok(outcome) => return outcome,
            Err(err) => {
                tracing::warn!(slot = %slot.to_rfc3339(), error = %err, "could not enqueue the slot; retrying");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_cron;

    fn schedule(catch_up_hours: i64) -> ScheduleSettings {
        ScheduleSettings {
            cron: parse_cron("0 3 * * *").unwrap(),
            timezone: chrono_tz::UTC,
            catch_up: chrono::Duration::hours(catch_up_hours),
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn fl2_only_the_latest_missed_slot_within_the_window_is_caught_up() {
        let s = schedule(24);
        assert_eq!(
            catch_up_slot(&s, at("2026-12-03T10:00:00Z")),
            Some(at("2026-12-03T03:00:00Z"))
        );
        assert_eq!(
            catch_up_slot(&schedule(6), at("2026-12-03T10:00:00Z")),
            None
        );
        assert_eq!(
            catch_up_slot(&schedule(0), at("2026-12-03T03:30:00Z")),
            None
        );
        assert_eq!(
            next_slot(&s, at("2026-12-03T03:00:00Z")),
            Some(at("2026-12-04T03:00:00Z"))
        );
    }
}
