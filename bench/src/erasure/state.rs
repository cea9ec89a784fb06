//! The two methods' end states, and what differs between them: the same rows left in every
//! table and the same files left, or the comparison is void.

use std::path::Path;

use anyhow::bail;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use super::fill::{self, Digest};
use crate::cluster::connect;

/// A method's end state: the platform's tables and the files left, after checking that nothing
/// of the erased account is left but what the law keeps.
pub(super) async fn end_state(
    base: &PgConnectOptions,
    db: &str,
    files: &Path,
    account: Uuid,
) -> anyhow::Result<(Digest, Vec<String>)> {
    let pool = connect(base, db, "bench").await?;
    fill::left_of(&pool, account).await?;
    let digest = fill::digest(&pool).await?;
    pool.close().await;
    let left = fill::files_left(files)?;
    let account = account.to_string();
    if let Some(file) = left.iter().find(|f| f.contains(&account)) {
        bail!("{db}: a file of the erased account is left: {file}");
    }
    Ok((digest, left))
}

/// What differs between two end states, in a few words.
pub(super) fn differences(a: &(Digest, Vec<String>), b: &(Digest, Vec<String>)) -> String {
    let mut out: Vec<String> =
        a.0.iter()
            .filter(|(table, v)| b.0.get(*table) != Some(v))
            .map(|(table, (n, _))| {
                let m = b.0.get(table).map_or(-1, |(m, _)| *m);
                format!("{table}: {n} rows against {m}")
            })
            .collect();
    if a.1 != b.1 {
        out.push(format!("files: {} against {}", a.1.len(), b.1.len()));
    }
    out.join("; ")
}
