//! Which way a set-based statement over every account reads: through each account's window
//! index (a probe per account, whatever its history holds), or in one scan of the candidates'
//! table joined to their accounts (a row per candidate, whatever the account count). The planner
//! cannot choose between the two — a per-account `LIMIT 1` is not a join it rewrites — so the
//! statistics it keeps choose instead: a million quiet accounts read by probes cost seconds,
//! ten accounts with a hundred million runs read by a scan cost minutes.

use sqlx::PgPool;

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

/// A backlog in seconds, from the one value of its statement: no row (a scan that found
/// nothing) or NULL (a per-account read that found nothing) is 0, and it is never below 0.
///
/// # Errors
/// A database error.
pub async fn backlog_seconds(
    pool: &sqlx::PgPool,
    query: sqlx::query::QueryScalar<'_, sqlx::Postgres, Option<f64>, sqlx::postgres::PgArguments>,
) -> Result<f64, sqlx::Error> {
    let seconds = query.fetch_optional(pool).await?.flatten();
    Ok(seconds.unwrap_or(0.0).max(0.0))
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
