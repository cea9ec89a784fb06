//! The throw-away cluster every part runs on: its databases, created (from a template) and
//! dropped, connections to them, and its WAL position.

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Two connections to `db`, named `application` in pg_stat_activity (which the sampler reads).
pub async fn connect(
    base: &PgConnectOptions,
    db: &str,
    application: &str,
) -> anyhow::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .connect_with(base.clone().database(db).application_name(application))
        .await?)
}

/// `db` created afresh (dropped first if it exists), as a copy of `template` if one is given.
pub async fn recreate(admin: &PgPool, db: &str, template: Option<&str>) -> anyhow::Result<()> {
    drop_db(admin, db).await?;
    let sql = match template {
        // FILE_COPY: a checkpoint and a file copy, not the whole template through the WAL.
        Some(t) => format!("CREATE DATABASE {db} TEMPLATE {t} STRATEGY FILE_COPY"),
        None => format!("CREATE DATABASE {db}"),
    };
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(admin).await?;
    Ok(())
}

/// Drops `db` if it exists, closing any connections to it.
pub async fn drop_db(admin: &PgPool, db: &str) -> anyhow::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(admin)
    .await?;
    Ok(())
}

/// The cluster's WAL position in bytes (`pg_current_wal_lsn()`), read on the bench's own
/// connection.
pub async fn wal_position(admin: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            .fetch_one(admin)
            .await?,
    )
}
