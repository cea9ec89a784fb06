//! Database health: between owner transactions, a hop asks whether the database
//! can take more. Two indicators are red lights — replication lag past its limit, and a vacuum
//! running on a table the job writes — and a hop that sees one stops taking owners and hands
//! over to a later hop (outcome `throttled`, never a failure). The third, a WAL budget, is a
//! pace: hops sleep between owner transactions to hold the rate of WAL the process's hops
//! write, together, at the budget.
//!
//! Readings are taken on the hop's own connection (no extra pool connection), cached for
//! `[health] cache_ms` and shared by all hops of a process.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::settings::{Check, Raw};

/// `[health]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSettings {
    /// A hop stops while any replication slot or standby is this many bytes of WAL behind;
    /// 0 turns the indicator off.
    pub max_replication_lag_bytes: u64,
    /// A hop stops while a vacuum runs on a table its job writes.
    pub pause_on_vacuum: bool,
    /// WAL bytes per second the process's hops may cause, together; 0: no limit.
    pub max_wal_bytes_per_second: u64,
    /// How long a throttled pass waits before its next hop.
    pub backoff: Duration,
    /// How long a reading is reused.
    pub cache: Duration,
}

impl HealthSettings {
    /// Every indicator off: for tools and tests that run hops without a fleet around them.
    pub const OFF: HealthSettings = HealthSettings {
        max_replication_lag_bytes: 0,
        pause_on_vacuum: false,
        max_wal_bytes_per_second: 0,
        backoff: Duration::from_secs(60),
        cache: Duration::from_secs(5),
    };
}

/// A red light, as labelled in metrics, logs and the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Indicator {
    ReplicationLag,
    Vacuum,
}

impl Indicator {
    /// Every indicator, in the order metrics list them.
    pub const ALL: [Indicator; 2] = [Indicator::ReplicationLag, Indicator::Vacuum];

    pub fn as_str(self) -> &'static str {
        match self {
            Indicator::ReplicationLag => "replication_lag",
            Indicator::Vacuum => "vacuum",
        }
    }
}

/// The last values read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Readings {
    /// The largest lag of any replication slot or standby, in bytes (0 without replication).
    pub replication_lag_bytes: i64,
    /// Tables of this database a vacuum is running on.
    pub vacuuming: Vec<String>,
}

/// A process's view of the database's health, shared by its hops.
#[derive(Debug)]
pub struct Health {
    settings: HealthSettings,
    cached: Mutex<Option<(Instant, Readings)>>,
    /// The WAL budget's account, one for every hop of the process.
    meter: Mutex<Option<Meter>>,
    /// WAL counted by the hops' paces, and the time they waited, over the process's life.
    wal_bytes: AtomicU64,
    paced_nanos: AtomicU64,
}

/// How old the last reading may be and still be paid from: working hops read the position
/// between owner transactions, which take well under a second (`owner_lock_timeout_ms`,
/// `transaction_target_ms`).
const STALE: Duration = Duration::from_secs(5);

/// The WAL position last read by any hop of the process, when, and until when the WAL counted
/// so far is paid for at the budget's rate.
#[derive(Debug, Clone, Copy)]
struct Meter {
    position: i64,
    read_at: Instant,
    paid_until: Instant,
}

impl Health {
    pub fn new(settings: HealthSettings) -> Self {
        Self {
            settings,
            cached: Mutex::new(None),
            meter: Mutex::new(None),
            wal_bytes: AtomicU64::new(0),
            paced_nanos: AtomicU64::new(0),
        }
    }

    /// Every indicator off.
    pub fn off() -> Self {
        Self::new(HealthSettings::OFF)
    }

    pub fn settings(&self) -> &HealthSettings {
        &self.settings
    }

    /// The last readings, if any were taken (for gauges).
    pub fn last(&self) -> Option<Readings> {
        self.cached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, r)| r.clone())
    }

    /// WAL bytes the hops' paces counted while working, and the time they waited, so far.
    pub fn wal_accounted(&self) -> (u64, Duration) {
        (
            self.wal_bytes.load(Ordering::Relaxed),
            Duration::from_nanos(self.paced_nanos.load(Ordering::Relaxed)),
        )
    }

    /// Whether a hop of a job writing `tables` should stop now, and why.
    ///
    /// # Errors
    /// A database error reading the indicators.
    pub async fn red(
        &self,
        conn: &mut PgConnection,
        tables: &[&str],
    ) -> Result<Option<Indicator>, sqlx::Error> {
        let s = &self.settings;
        if s.max_replication_lag_bytes == 0 && !s.pause_on_vacuum {
            return Ok(None);
        }
        let fresh = self
            .cached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(at, _)| at.elapsed() < s.cache)
            .map(|(_, r)| r.clone());
        let readings = match fresh {
            Some(readings) => readings,
            None => {
                let readings = read(conn).await?;
                *self.cached.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), readings.clone()));
                readings
            }
        };
        let lag_limit = i64::try_from(s.max_replication_lag_bytes).unwrap_or(i64::MAX);
        if s.max_replication_lag_bytes > 0 && readings.replication_lag_bytes > lag_limit {
            return Ok(Some(Indicator::ReplicationLag));
        }
        if s.pause_on_vacuum
            && readings
                .vacuuming
                .iter()
                .any(|t| tables.contains(&t.as_str()))
        {
            return Ok(Some(Indicator::Vacuum));
        }
        Ok(None)
    }

    /// A WAL pace for one hop; `None` without a budget.
    pub fn pace(&self) -> Option<WalPace<'_>> {
        (self.settings.max_wal_bytes_per_second > 0).then_some(WalPace {
            health: self,
            budget: self.settings.max_wal_bytes_per_second,
        })
    }

    /// Counts the WAL written since any hop last read the position (each byte once, however
    /// many hops run) and returns until when it is paid for at `budget` bytes per second. The
    /// bytes are paid from the previous reading on — the time they took to write counts — and
    /// never before what was counted earlier. A meter idle for over [`STALE`] — its last
    /// reading that old and paid for — starts afresh, free: no hop was working meanwhile (a
    /// night, a backoff), and what others wrote then is not the hops' to pay.
    fn count(&self, position: i64, budget: u64, now: Instant) -> Instant {
        let mut meter = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        // Busy until read and paid for: a hop sleeping off a large transaction keeps it busy.
        let last = meter.filter(|last| {
            now.saturating_duration_since(last.read_at.max(last.paid_until)) <= STALE
        });
        let Some(last) = last else {
            *meter = Some(Meter {
                position,
                read_at: now,
                paid_until: now,
            });
            return now;
        };
        let delta = u64::try_from(position - last.position).unwrap_or(0);
        self.wal_bytes.fetch_add(delta, Ordering::Relaxed);
        let paid_until = last.paid_until.max(last.read_at)
            + Duration::from_secs_f64(delta as f64 / budget as f64);
        *meter = Some(Meter {
            position: position.max(last.position),
            read_at: now,
            paid_until,
        });
        paid_until
    }
}

/// Holds the WAL the process writes to its budget, across all its hops: between owner
/// transactions a hop reads the WAL position, and the bytes written since the last reading of
/// any hop are paid for at the budget's rate, one after another — the hop waits until its
/// share is paid. The position is the cluster's, so WAL others write meanwhile counts too: the
/// pace errs on the gentle side.
#[derive(Debug)]
pub struct WalPace<'a> {
    health: &'a Health,
    budget: u64,
}

impl WalPace<'_> {
    /// Counts, then waits as the budget requires; returns early when `stop` is raised.
    ///
    /// # Errors
    /// A database error reading the WAL position.
    pub async fn wait(
        &mut self,
        conn: &mut PgConnection,
        stop: &AtomicBool,
    ) -> Result<(), sqlx::Error> {
        let position = wal_position(conn).await?;
        let until = self.health.count(position, self.budget, Instant::now());
        let mut wait = until.saturating_duration_since(Instant::now());
        while !wait.is_zero() && !stop.load(Ordering::Relaxed) {
            let step = wait.min(Duration::from_millis(200));
            tokio::time::sleep(step).await;
            self.health
                .paced_nanos
                .fetch_add(step.as_nanos() as u64, Ordering::Relaxed);
            wait = wait.saturating_sub(step);
        }
        Ok(())
    }
}

/// The cluster's WAL insert position, in bytes.
///
/// # Errors
/// A database error.
pub async fn wal_position<'c>(db: impl sqlx::PgExecutor<'c>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint")
        .fetch_one(db)
        .await
}

/// Reads the indicators: the largest lag of any replication slot (WAL it holds back) or
/// standby (WAL it has not replayed), and the tables of this database being vacuumed.
async fn read(conn: &mut PgConnection) -> Result<Readings, sqlx::Error> {
    let (lag, vacuuming): (Option<i64>, Vec<String>) = sqlx::query_as(
        "SELECT
            (SELECT max(lag)::bigint FROM (
                 SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) AS lag
                 FROM pg_replication_slots WHERE restart_lsn IS NOT NULL
                 UNION ALL
                 SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)
                 FROM pg_stat_replication WHERE replay_lsn IS NOT NULL) l
             WHERE NOT pg_is_in_recovery()),
            ARRAY(SELECT c.relname::text FROM pg_stat_progress_vacuum v
                  JOIN pg_class c ON c.oid = v.relid
                  WHERE v.datid = (SELECT oid FROM pg_database WHERE datname = current_database()))",
    )
    .fetch_one(conn)
    .await?;
    Ok(Readings {
        replication_lag_bytes: lag.unwrap_or(0),
        vacuuming,
    })
}

/// The `[health]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    max_replication_lag_bytes: Raw<i64>,
    pause_on_vacuum: Raw<bool>,
    max_wal_bytes_per_second: Raw<i64>,
    backoff_ms: Raw<i64>,
    cache_ms: Raw<i64>,
}

/// Reads `[health]`.
pub fn settings(section: &serde_json::Value, c: &mut Check<'_>) -> Option<HealthSettings> {
    let s: RawSettings = c.section("health", section)?;
    let lag = c.int(
        "health.max_replication_lag_bytes",
        &s.max_replication_lag_bytes,
        0..=i64::MAX,
        "a number of bytes, 0 (off) or more",
    );
    let pause_on_vacuum = match &s.pause_on_vacuum {
        Raw::Typed(b) => Some(*b),
        Raw::Other(v) => {
            c.fail("health.pause_on_vacuum", "true or false", v);
            None
        }
    };
    let wal = c.int(
        "health.max_wal_bytes_per_second",
        &s.max_wal_bytes_per_second,
        0..=i64::MAX,
        "a number of bytes per second, 0 (no limit) or more",
    );
    let backoff = c.millis("health.backoff_ms", &s.backoff_ms);
    let cache = c.millis("health.cache_ms", &s.cache_ms);
    Some(HealthSettings {
        max_replication_lag_bytes: lag?,
        pause_on_vacuum: pause_on_vacuum?,
        max_wal_bytes_per_second: wal?,
        backoff: backoff?,
        cache: cache?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paced(budget: u64) -> Health {
        Health::new(HealthSettings {
            max_wal_bytes_per_second: budget,
            ..HealthSettings::OFF
        })
    }

    #[test]
    fn wal_counted_by_any_hop_is_paid_once_from_the_previous_reading() {
        let health = paced(1000);
        let t0 = Instant::now();
        assert_eq!(health.count(0, 1000, t0), t0, "the first reading is free");
        // Two hops read 500 and then 2500 bytes more: each byte is paid once, in turn.
        let half = t0 + Duration::from_millis(100);
        assert_eq!(
            health.count(500, 1000, half),
            t0 + Duration::from_millis(500)
        );
        let later = t0 + Duration::from_millis(200);
        assert_eq!(health.count(3000, 1000, later), t0 + Duration::from_secs(3));
        assert_eq!(health.wal_accounted().0, 3000);
    }

    #[test]
    fn an_idle_meter_starts_afresh_but_one_still_paying_does_not() {
        let health = paced(1000);
        let t0 = Instant::now();
        health.count(0, 1000, t0);
        // 10 kB in one transaction: paid 10 s later; the hop sleeps it off and reads again,
        // 10.1 s after the last reading — the meter was busy all along, so this is charged.
        let paid = health.count(10_000, 1000, t0 + Duration::from_millis(50));
        assert_eq!(paid, t0 + Duration::from_secs(10));
        let after_sleep = t0 + Duration::from_millis(10_100);
        assert_eq!(
            health.count(11_000, 1000, after_sleep),
            t0 + Duration::from_secs(11)
        );
        // A night later, whatever the cluster wrote meanwhile is not the hops' to pay.
        let night = t0 + Duration::from_secs(8 * 3600);
        assert_eq!(health.count(50_000_000_000, 1000, night), night);
        assert_eq!(health.wal_accounted().0, 11_000);
    }
}
