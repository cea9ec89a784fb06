//! The plain loops attachment bytes are held to: a stat-and-unlink loop over the live rows, the
//! same in the order a crash cannot break (`plain+record`), and on the object store a listing
//! and a DeleteObjects call per thousand rows.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use sexton_jobs::files::object::ObjectRoot;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::cluster::connect;
use crate::method::{Method, method};

/// Rows the plain loop reads, checks and marks together.
const PLAIN_BATCH: i64 = 1000;

/// The plain loop, a file last modified before `cutoff` expired: the next thousand live rows
/// in id order, a stat of each file (not following a symlink), the old ones unlinked, then
/// their rows marked in one statement. With `record`, the order a crash cannot break instead
/// (what sexton's durable file record costs, ER-3): the old rows marked and their files
/// recorded in one statement and committed, the files unlinked, then their records deleted.
pub async fn plain(
    base: &PgConnectOptions,
    db: &str,
    root: &Path,
    cutoff: DateTime<Utc>,
    record: bool,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-plain").await?;
    let cutoff = cutoff.timestamp();
    let mut after = Uuid::nil();
    loop {
        let batch = live_rows(&pool, after).await?;
        let Some((last, _)) = batch.last() else {
            break;
        };
        after = *last;
        let mut expired = Vec::new();
        for (id, path) in &batch {
            let path = root.join(path);
            if let Ok(meta) = std::fs::symlink_metadata(&path)
                && meta.is_file()
                && meta.mtime() < cutoff
            {
                if !record {
                    std::fs::remove_file(&path)?;
                }
                expired.push(*id);
            }
        }
        if !record {
            mark(&pool, &expired).await?;
            continue;
        }
        let recorded: Vec<(i64, String)> = sqlx::query_as(
            "WITH marked AS (
                 UPDATE attachments SET bytes_expired_at = now() WHERE id = ANY($1)
                 RETURNING account_id, relative_path)
             INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
             SELECT 'attachments', account_id, relative_path FROM marked
             RETURNING id, relative_path",
        )
        .bind(&expired)
        .fetch_all(&pool)
        .await?;
        for (_, path) in &recorded {
            std::fs::remove_file(root.join(path))?;
        }
        let ids: Vec<i64> = recorded.iter().map(|(id, _)| *id).collect();
        sqlx::query("DELETE FROM sexton.pending_file_deletions WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&pool)
            .await?;
    }
    pool.close().await;
    let mut m = method(if record { "plain+record" } else { "plain" });
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// The plain loops' next thousand live rows after `after`, in id order.
async fn live_rows(pool: &PgPool, after: Uuid) -> anyhow::Result<Vec<(Uuid, String)>> {
    Ok(sqlx::query_as(
        "SELECT id, relative_path FROM attachments
         WHERE bytes_expired_at IS NULL AND id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(PLAIN_BATCH)
    .fetch_all(pool)
    .await?)
}

/// The plain loops' marking of `expired` rows, in one statement.
async fn mark(pool: &PgPool, expired: &[Uuid]) -> anyhow::Result<()> {
    sqlx::query("UPDATE attachments SET bytes_expired_at = now() WHERE id = ANY($1)")
        .bind(expired)
        .execute(pool)
        .await?;
    Ok(())
}

/// The plain loop on the object store, an object last modified before `cutoff` expired: one
/// listing of the root for every object's `LastModified`, then the next thousand live rows in
/// id order, the old ones' objects deleted in one DeleteObjects call, their rows marked in one
/// statement.
pub async fn plain_objects(
    base: &PgConnectOptions,
    db: &str,
    root: Arc<ObjectRoot>,
    cutoff: DateTime<Utc>,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-plain").await?;
    let mut modified = HashMap::new();
    let mut listing = root.list_all();
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        if let Some(relative) = root.relative(&meta.location) {
            modified.insert(relative, meta.last_modified);
        }
    }
    let mut after = Uuid::nil();
    loop {
        let batch = live_rows(&pool, after).await?;
        let Some((last, _)) = batch.last() else {
            break;
        };
        after = *last;
        let (mut expired, mut keys) = (Vec::new(), Vec::new());
        for (id, path) in &batch {
            if modified.get(path).is_some_and(|at| *at < cutoff) {
                keys.push(root.key(path).map_err(anyhow::Error::msg)?);
                expired.push(*id);
            }
        }
        for outcome in root.delete(&keys).await {
            outcome.map_err(anyhow::Error::msg)?;
        }
        mark(&pool, &expired).await?;
    }
    pool.close().await;
    let mut m = method("plain s3");
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}
