//! The floors that reach derivative cleanup's end state on the outputs root (PF-6's method for
//! DC-4): every file the walk or the listing finds, asked about a thousand at a time in one
//! anti-join against `output_files` through the path-key index sexton's migrations build, and
//! what no row names unlinked (deleted a thousand keys a call, on the object store). No grace, no
//! hold, no second look: what sexton does beyond them is its cost.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use futures::StreamExt as _;
use sexton_jobs::files::object::ObjectRoot;
use sqlx::PgPool;

/// Paths asked about together.
const BATCH: usize = 1_000;

/// What no `output_files` row names, of `$1`.
const UNNAMED: &str = "SELECT p FROM unnest($1::text[]) p
     WHERE NOT EXISTS (SELECT 1 FROM output_files o
                       WHERE sexton.path_key(o.relative_path) = sexton.path_key(p))";

/// Walks `root` (no symlink followed), asks about its files a thousand at a time and unlinks
/// what no row names. Returns the method's description.
pub async fn walk_anti_join(pool: &PgPool, root: &Path) -> anyhow::Result<String> {
    let mut dirs = vec![PathBuf::new()];
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(root.join(&dir))? {
            let entry = entry?;
            let path = dir.join(entry.file_name());
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                batch.push(
                    path.into_os_string()
                        .into_string()
                        .ok()
                        .context("a UTF-8 path")?,
                );
                if batch.len() == BATCH {
                    unlink_unnamed(pool, root, &mut batch).await?;
                }
            }
        }
    }
    unlink_unnamed(pool, root, &mut batch).await?;
    Ok("walk the root; per 1,000 files one anti-join against output_files; unlink".to_owned())
}

async fn unlink_unnamed(pool: &PgPool, root: &Path, batch: &mut Vec<String>) -> anyhow::Result<()> {
    let unnamed: Vec<String> = sqlx::query_scalar(UNNAMED)
        .bind(&*batch)
        .fetch_all(pool)
        .await?;
    for path in unnamed {
        std::fs::remove_file(root.join(path))?;
    }
    batch.clear();
    Ok(())
}

/// Lists `root`'s prefix, asks about its keys a thousand at a time and deletes what no row names,
/// a thousand keys a call. Returns the method's description.
pub async fn list_anti_join(pool: &PgPool, root: &ObjectRoot) -> anyhow::Result<String> {
    let mut listing = root.list_all();
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        if let Some(relative) = root.relative(&meta.location) {
            batch.push(relative);
        }
        if batch.len() == BATCH {
            delete_unnamed(pool, root, &mut batch).await?;
        }
    }
    delete_unnamed(pool, root, &mut batch).await?;
    Ok(
        "LIST the prefix; per 1,000 keys one anti-join against output_files; DeleteObjects"
            .to_owned(),
    )
}

async fn delete_unnamed(
    pool: &PgPool,
    root: &ObjectRoot,
    batch: &mut Vec<String>,
) -> anyhow::Result<()> {
    let unnamed: Vec<String> = sqlx::query_scalar(UNNAMED)
        .bind(&*batch)
        .fetch_all(pool)
        .await?;
    let keys = unnamed
        .iter()
        .map(|path| root.key(path).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for outcome in root.delete(&keys).await {
        outcome.map_err(anyhow::Error::msg)?;
    }
    batch.clear();
    Ok(())
}
