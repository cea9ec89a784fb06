//! The floors for short-lived records: a raw keyset loop of batched deletes, and the same
//! taking the lock sexton's batch takes.

use std::time::Instant;

use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use super::kinds::{Expiring, Id};
use crate::cluster::connect;
use crate::method::{Method, method};

/// The floor for short-lived records: the next `batch` expired ids in (created_at, id) order,
/// then `DELETE … WHERE id = ANY($1)`, each batch its own transaction; no lock, no re-check.
/// With `lock` (the floor with the lock sexton's batch takes, timed alone: HD-3 re-checks the
/// holds behind it and a held row is skipped as `busy`), the batch's rows are read
/// `FOR UPDATE SKIP LOCKED` first, so that a row the application holds is left.
pub async fn run_raw(
    base: &PgConnectOptions,
    db: &str,
    kind: &Expiring,
    batch: u32,
    lock: bool,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-raw").await?;
    match kind.id {
        Id::Uuid => raw_batches::<Uuid>(&pool, kind, batch, lock).await?,
        Id::BigInt => raw_batches::<i64>(&pool, kind, batch, lock).await?,
    }
    pool.close().await;
    let mut m = method(if lock { RAW_LOCKED } else { "raw" });
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// The raw floor with the lock and skip of rows an application holds.
pub const RAW_LOCKED: &str = "raw+lock";

async fn raw_batches<T>(
    pool: &PgPool,
    kind: &Expiring,
    batch: u32,
    lock: bool,
) -> anyhow::Result<()>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    Vec<T>: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let next = format!(
        "SELECT id FROM {} WHERE created_at < $1 ORDER BY created_at, id LIMIT $2{}",
        kind.table,
        if lock { " FOR UPDATE SKIP LOCKED" } else { "" }
    );
    let delete = format!("DELETE FROM {} WHERE id = ANY($1)", kind.table);
    loop {
        let mut tx = pool.begin().await?;
        let ids: Vec<T> = sqlx::query_scalar(sqlx::AssertSqlSafe(next.clone()))
            .bind(kind.cutoff())
            .bind(i64::from(batch))
            .fetch_all(&mut *tx)
            .await?;
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(delete.clone()))
            .bind(ids)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
}
