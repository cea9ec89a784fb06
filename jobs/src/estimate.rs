//! Which way a set-based statement over every account reads: through each account's window
//! index (a probe per account, whatever its history holds), or in one scan of the candidates'
//! table joined to their accounts (a row per candidate, whatever the account count). The planner
//! cannot choose between the two — a per-account `LIMIT 1` is not a join it rewrites — so the
//! statistics it keeps choose instead: a million quiet accounts read by probes cost seconds,
//! ten accounts with a hundred million runs read by a scan cost minutes.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::cutoff::EARLIEST;

/// Candidates per account below which one scan of the table is the cheaper read: a probe of a
/// window index costs about as much as reading ten rows of a sequential scan.
const SCAN_BELOW_ROWS_PER_ACCOUNT: f32 = 10.0;

/// How a statement over every account reads its candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Through the window index, account by account.
    Probes,
    /// In one scan of the candidates' table.
    Scan,
}

impl Read {
    /// The statement of this read: `probes` or `scan`.
    pub fn pick<'s>(self, probes: &'s str, scan: &'s str) -> &'s str {
        match self {
            Read::Probes => probes,
            Read::Scan => scan,
        }
    }
}

/// A kind's backlog (OP-3) as one statement written both ways: `$1` the time it is measured at,
/// `$2` the calendar's earliest instant, then `extra`; its one value is how far past its cutoff
/// the oldest candidate is, in seconds.
pub struct Backlog {
    /// The candidates' table and the table of what they belong to, which choose the read.
    pub over: (&'static str, &'static str),
    pub probes: &'static str,
    pub scan: &'static str,
    pub extra: &'static [i32],
}

impl Backlog {
    /// The backlog, read the cheaper way ([`cheaper_read`]).
    ///
    /// # Errors
    /// A database error.
    pub async fn seconds(&self, pool: &PgPool, now: DateTime<Utc>) -> Result<f64, sqlx::Error> {
        let (table, accounts) = self.over;
        let read = cheaper_read(pool, table, accounts).await?;
        self.read(pool, now, read).await
    }

    /// The backlog read one way or the other (both are tested to agree): no row (a scan that
    /// found nothing) or NULL (a per-account read that found nothing) is 0, and it is never
    /// below 0.
    ///
    /// # Errors
    /// A database error.
    pub async fn read(
        &self,
        pool: &PgPool,
        now: DateTime<Utc>,
        read: Read,
    ) -> Result<f64, sqlx::Error> {
        let sql = read.pick(self.probes, self.scan);
        let mut query = sqlx::query_scalar::<_, Option<f64>>(sqlx::AssertSqlSafe(sql))
            .bind(now)
            .bind(EARLIEST);
        for value in self.extra {
            query = query.bind(value);
        }
        let seconds = query.fetch_optional(pool).await?.flatten();
        Ok(seconds.unwrap_or(0.0).max(0.0))
    }
}

/// [`Read::Scan`] when one scan of `table` costs less than a probe per row of `accounts` (both
/// relations as `pg_class` names them), by the planner's row estimates; [`Read::Probes`] when
/// either has never been analysed, so that a fresh database reads by probes.
///
/// # Errors
/// A database error.
pub async fn cheaper_read(pool: &PgPool, table: &str, accounts: &str) -> Result<Read, sqlx::Error> {
    let (rows, accounts): (f32, f32) = sqlx::query_as(
        "SELECT COALESCE((SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)), -1),
                COALESCE((SELECT reltuples FROM pg_class WHERE oid = to_regclass($2)), -1)",
    )
    .bind(table)
    .bind(accounts)
    .fetch_one(pool)
    .await?;
    let scan = rows >= 0.0 && accounts > 0.0 && rows < accounts * SCAN_BELOW_ROWS_PER_ACCOUNT;
    Ok(if scan { Read::Scan } else { Read::Probes })
}
