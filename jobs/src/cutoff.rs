//! Cutoffs (EX-1): a window measured back from a moment, never before the calendar
//! PostgreSQL can hold, and never past the database's now.

use chrono::{DateTime, Utc};

use crate::payload::Payload;
use crate::report::HopOutcome;

/// The earliest moment PostgreSQL represents (4714-11-24 BC): the cursor of a pass's first hop,
/// before every finite age. Infinite ages are never candidates (EX-2).
pub const EARLIEST: DateTime<Utc> = match DateTime::from_timestamp(-210_866_803_200, 0) {
    Some(at) => at,
    None => DateTime::UNIX_EPOCH,
};

/// Whether a window of `days` read from the platform's tables means anything: the platform owns
/// its schema and need not carry the reference CHECK, and a window of 0 or less never means
/// "everything is old" (EX-1, SS-1).
pub fn valid_window(days: i32) -> bool {
    days > 0
}

/// The cutoff `days` before `reference`, or `None` when nothing is old enough (EX-1, SS-1): the
/// window is not [`valid_window`], or it reaches back past the calendar (EARLIEST).
pub fn days_before(reference: DateTime<Utc>, days: i32) -> Option<DateTime<Utc>> {
    if !valid_window(days) {
        return None;
    }
    chrono::TimeDelta::try_days(days.into())
        .and_then(|window| reference.checked_sub_signed(window))
        .filter(|cutoff| *cutoff > EARLIEST)
}

/// [`days_before`] in SQL, for set-based statements: the cutoff `days` (an SQL expression)
/// before `reference`, NULL where [`days_before`] gives `None` — the window is not a valid one,
/// or it reaches back to `earliest` (the parameter bound to [`EARLIEST`]). A CASE, so that
/// nothing is ever computed out of range.
pub fn days_before_sql(reference: &str, days: &str, earliest: &str) -> String {
    format!(
        "(CASE WHEN {days} > 0 AND make_interval(days => {days}) < {reference} - {earliest} \
         THEN {reference} - make_interval(days => {days}) END)"
    )
}

/// What a pass measures its windows back from: its start, or the database's now if that is
/// earlier, so that a slot, a payload or a clock in the future prunes nothing early (EX-1).
pub fn reference(pass_started_at: DateTime<Utc>, database_now: DateTime<Utc>) -> DateTime<Utc> {
    pass_started_at.min(database_now)
}

/// A kind's cutoff: what its pass prunes up to.
pub trait Cutoff: Payload {
    /// The stricter of two cutoffs: nothing younger than either is pruned.
    #[must_use]
    fn stricter(&self, other: &Self) -> Self;
}

impl Cutoff for DateTime<Utc> {
    fn stricter(&self, other: &Self) -> Self {
        *self.min(other)
    }
}

/// A kind whose pass carries no cutoff (it measures what it keeps on its own, as the trace
/// cleaner's quota does).
impl Cutoff for () {
    fn stricter(&self, _other: &Self) -> Self {}
}

/// What a kind's policy says of its pass when a hop runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy<T> {
    /// Prune up to this cutoff (before the carry rule).
    Cutoff(T),
    /// The pass ends here, nothing removed: the policy turns the kind off
    /// ([`HopOutcome::Disabled`]), the account is gone ([`HopOutcome::AccountGone`]), or nothing
    /// is old enough ([`HopOutcome::Finished`]).
    Ends(HopOutcome),
}

impl<T> Policy<T> {
    /// Prune up to `cutoff`, or, `None` (a window past the calendar), nothing is old enough.
    pub fn up_to(cutoff: Option<T>) -> Self {
        cutoff.map_or(Policy::Ends(HopOutcome::Finished), Policy::Cutoff)
    }

    /// Prune up to `cutoff` while the kind is `enabled`; the pass ends, disabled, once it is
    /// not.
    pub fn while_enabled(enabled: bool, cutoff: T) -> Self {
        if enabled {
            Policy::Cutoff(cutoff)
        } else {
            Policy::Ends(HopOutcome::Disabled)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ex1_a_window_past_the_calendar_has_no_cutoff() {
        let now: DateTime<Utc> = "2026-12-01T03:00:00Z".parse().unwrap();
        assert_eq!(
            days_before(now, 30),
            Some("2026-11-01T03:00:00Z".parse().unwrap())
        );
        assert_eq!(days_before(now, 3_000_000), None);
        assert_eq!(days_before(now, i32::MAX), None);
        assert_eq!(
            reference(now, now - chrono::Duration::days(1)),
            now - chrono::Duration::days(1)
        );
    }

    #[test]
    fn ex1_ss1_a_window_of_zero_or_less_has_no_cutoff() {
        let now: DateTime<Utc> = "2026-12-01T03:00:00Z".parse().unwrap();
        for days in [0, -1, -5, i32::MIN] {
            assert_eq!(days_before(now, days), None, "{days} days");
        }
        assert_eq!(
            days_before(now, 1),
            Some("2026-11-30T03:00:00Z".parse().unwrap())
        );
    }
}
