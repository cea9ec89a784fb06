//! The schedule's arithmetic (FL-2): which slot a moment belongs to, the next slot, the slot to
//! catch up on after downtime, and the period a kind on a cadence of its own is in. Pure
//! functions of the settings and a moment; enqueuing what falls due is `tick`'s.

use chrono::{DateTime, SubsecRound, Utc};

use crate::config::ScheduleSettings;

/// The moments a slot can be asked for at: the years a cron schedule names (1970 to 2100); a
/// moment outside them has no slot of its own (the schedule would answer with its last slot in
/// 2100, or none).
pub fn slot_range() -> (DateTime<Utc>, DateTime<Utc>) {
    let earliest = DateTime::from_timestamp(0, 0).unwrap_or_default();
    let latest = "2100-12-31T23:59:59Z".parse().unwrap_or(earliest);
    (earliest, latest)
}

/// `at` if a slot can be asked for at it ([`slot_range`]).
///
/// # Errors
/// A message naming the accepted range.
pub fn in_slot_range(at: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let (earliest, latest) = slot_range();
    if (earliest..=latest).contains(&at) {
        Ok(at)
    } else {
        Err(format!(
            "expected a moment from {} to {} (the years a schedule names), got {}",
            earliest.to_rfc3339(),
            latest.to_rfc3339(),
            at.to_rfc3339()
        ))
    }
}

/// The last slot of the schedule at or before `at`.
pub fn slot_at(schedule: &ScheduleSettings, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let local =
        (at.trunc_subsecs(0) + chrono::Duration::seconds(1)).with_timezone(&schedule.timezone);
    schedule
        .cron
        .after(&local)
        .next_back()
        .map(|slot| slot.with_timezone(&Utc))
}

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
    slot_at(schedule, now).filter(|slot| now - *slot <= schedule.catch_up)
}

/// The start of the period of length `period` that `now` falls in, counted from the Unix epoch.
pub fn period_start(now: DateTime<Utc>, period: chrono::Duration) -> DateTime<Utc> {
    let length = period.num_seconds().max(1);
    let start = now.timestamp().div_euclid(length) * length;
    DateTime::from_timestamp(start, 0).unwrap_or(now)
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

    #[test]
    fn fl2_slot_is_the_last_due_at_or_before() {
        let schedule = ScheduleSettings {
            cron: parse_cron("0 3 * * *").unwrap(),
            timezone: chrono_tz::UTC,
            catch_up: chrono::Duration::hours(24),
        };
        assert_eq!(
            slot_at(&schedule, at("2026-12-01T03:00:00Z")),
            Some(at("2026-12-01T03:00:00Z"))
        );
        assert_eq!(
            slot_at(&schedule, at("2026-12-01T02:59:59Z")),
            Some(at("2026-11-30T03:00:00Z"))
        );
        assert_eq!(
            slot_at(&schedule, at("2026-12-01T17:30:00.5Z")),
            Some(at("2026-12-01T03:00:00Z"))
        );
    }

    #[test]
    fn fl2_slot_follows_the_configured_time_zone() {
        let schedule = ScheduleSettings {
            cron: parse_cron("0 3 * * *").unwrap(),
            timezone: chrono_tz::Europe::Berlin,
            catch_up: chrono::Duration::hours(24),
        };
        assert_eq!(
            slot_at(&schedule, at("2026-12-01T12:00:00Z")),
            Some(at("2026-12-01T02:00:00Z"))
        );
    }
}
