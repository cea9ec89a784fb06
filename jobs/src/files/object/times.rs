//! What an object's `LastModified` proves of when it was written (OS-2).

use chrono::{DateTime, Utc};

/// A second, in nanoseconds.
pub(super) const SECOND: u32 = 1_000_000_000;

/// The coarsest unit `time` can be a whole number of (a second, a tenth, …, a nanosecond): at
/// most how fine the store that gave it keeps its times.
pub(super) fn unit_of(time: DateTime<Utc>) -> u32 {
    let nanos = time.timestamp_subsec_nanos();
    let mut unit = SECOND;
    while !nanos.is_multiple_of(unit) {
        unit /= 10;
    }
    unit
}

/// A time in nanoseconds since the epoch (an mtime, a `LastModified`), as the passes compare
/// them.
pub fn time_ns(at: DateTime<Utc>) -> i128 {
    i128::from(at.timestamp()) * 1_000_000_000 + i128::from(at.timestamp_subsec_nanos())
}

/// [`time_ns`]'s time again (the epoch for one out of chrono's range).
pub fn to_time(ns: i128) -> DateTime<Utc> {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let nanos = ns.rem_euclid(1_000_000_000) as u32;
    DateTime::from_timestamp(secs, nanos).unwrap_or(DateTime::UNIX_EPOCH)
}

/// Whether an object the store says was last modified at `modified`, a time it gives in whole
/// `unit`s of nanoseconds (truncated, as stores do: a HEAD's whole second; some stores' listings
/// give milliseconds), was written before `recorded` (OS-2): it was written at most one unit
/// after `modified`. A time in a whole second is never taken for finer than the unit it came
/// in, so an object of its record's own second may always be the newer. A finer time (a
/// listing's milliseconds, s3s-fs; `.120` reads as a hundredth until a finer one is seen) is
/// taken as it reads: listed before the record's instant is before it. Only an object written
/// within that unit after its record could be misjudged so, where a file written just before
/// its record (a crash between commit and unlink, a test that writes and records at once)
/// would otherwise be kept forever, its record forgotten.
pub fn written_before(modified: DateTime<Utc>, unit: u32, recorded: DateTime<Utc>) -> bool {
    if unit < SECOND {
        modified < recorded
    } else {
        modified + chrono::Duration::nanoseconds(i64::from(unit.min(SECOND))) <= recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os2_a_time_proves_an_object_older_only_by_the_unit_it_is_given_in() {
        let at = |text: &str| text.parse::<DateTime<Utc>>().unwrap();
        let recorded = at("2026-12-01T03:00:07.300Z");
        // A HEAD's whole second: the record's own second proves nothing, the one before does.
        assert!(!written_before(
            at("2026-12-01T03:00:07Z"),
            SECOND,
            recorded
        ));
        assert!(written_before(at("2026-12-01T03:00:06Z"), SECOND, recorded));
        // A listing's milliseconds: before the record by a unit, or not.
        let ms = 1_000_000;
        assert!(written_before(at("2026-12-01T03:00:07.123Z"), ms, recorded));
        assert!(written_before(at("2026-12-01T03:00:07.299Z"), ms, recorded));
        // Within the record's own millisecond, listed before its instant: before it.
        assert!(written_before(
            at("2026-12-01T03:00:07.300Z"),
            ms,
            at("2026-12-01T03:00:07.300400Z")
        ));
        assert!(!written_before(
            at("2026-12-01T03:00:07.300Z"),
            ms,
            recorded
        ));
        assert!(!written_before(
            at("2026-12-01T03:00:07.800Z"),
            ms,
            recorded
        ));
        assert!(written_before(at("2026-12-01T03:00:07Z"), ms, recorded));
        assert!(!written_before(at("2026-12-01T03:00:08Z"), ms, recorded));
        // What a time's digits say of its unit.
        assert_eq!(unit_of(at("2026-12-01T03:00:07Z")), SECOND);
        assert_eq!(unit_of(at("2026-12-01T03:00:07.200Z")), 100_000_000);
        assert_eq!(unit_of(at("2026-12-01T03:00:07.123Z")), ms);
        assert!(written_before(
            at("2026-12-01T03:00:07.200Z"),
            100_000_000,
            recorded
        ));
    }
}
