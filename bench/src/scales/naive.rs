//! The naive delete: one statement per detail table over every owner.

use std::time::Instant;

use sexton_jobs::prune_execution_details::DETAIL_TABLES;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::cluster::{connect, wal_position};
use crate::method::{Method, method};

/// The naive delete: one statement per table over every owner. Its WAL is read on `admin`.
pub async fn run_naive(
    admin: &PgPool,
    base: &PgConnectOptions,
    db: &str,
) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-naive").await?;
    for table in DETAIL_TABLES {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE run_id IN (SELECT id FROM bench_owners)"
        )))
        .execute(&pool)
        .await?;
    }
    pool.close().await;
    let mut m = method("naive");
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}
