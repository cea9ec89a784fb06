//! The statements of every short-lived record kind, rendered from what the kind declares
//! ([`Record`]): one place for each rule of TTL-1 … TTL-4. The rendered text is in
//! `jobs/tests/golden/record_expiry/`.

use super::Record;

/// `NOT <pin> AND ` on `alias`'s row for a kind with a pin, else nothing.
fn unpinned<R: Record>(alias: &str) -> String {
    R::PINNED.map_or_else(String::new, |pin| format!("NOT {alias}{pin} AND "))
}

/// One batch. `$1` the cutoff, `$2`/`$3` the cursor (age, id as text), `$4` the batch size.
/// It reads the next expired rows in (age, id) order, locks those no application holds
/// (`SKIP LOCKED`), re-checks their age (and pin) under the lock, asks the holds that cover
/// them (HD-3) and deletes those no hold covers; it returns the rows read, held and deleted and
/// the last row read (the next cursor).
pub(super) fn batch<R: Record>() -> String {
    let (table, age, id, holds) = (R::TABLE, R::AGE, R::ID_TYPE, R::HOLDS);
    let (live, locked_live) = (unpinned::<R>(""), unpinned::<R>("t."));
    format!(
        "WITH batch AS (
    SELECT id, {age} FROM {table}
    WHERE {live}{age} < $1 AND ({age}, id) > ($2, $3::{id})
    ORDER BY {age}, id
    LIMIT $4),
locked AS (
    SELECT t.id, EXISTS (SELECT 1 FROM {holds}) AS held FROM {table} t JOIN batch b ON b.id = t.id
    WHERE {locked_live}t.{age} < $1
    FOR UPDATE OF t SKIP LOCKED),
gone AS (
    DELETE FROM {table} t USING locked
    WHERE t.id = locked.id AND NOT locked.held RETURNING 1),
last AS (
    SELECT b.{age}, b.id::text AS id FROM batch b ORDER BY b.{age} DESC, b.id DESC LIMIT 1)
SELECT (SELECT count(*) FROM batch) AS read,
       (SELECT count(*) FROM locked WHERE held) AS held,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT {age} FROM last) AS last_at,
       (SELECT id FROM last) AS last_id"
    )
}

/// The oldest expired age of a row no hold covers. `$1` the cutoff, `$2` the earliest finite
/// age.
pub(super) fn oldest<R: Record>() -> String {
    let (table, age, live, holds) = (R::TABLE, R::AGE, unpinned::<R>("t."), R::HOLDS);
    format!(
        "SELECT min(t.{age}) FROM {table} t
WHERE {live}t.{age} < $1 AND t.{age} > $2 AND NOT EXISTS (SELECT 1 FROM {holds})"
    )
}

/// Expired rows, of some accounts or all, and those of them a hold covers. `$1` the cutoff, `$2`
/// the earliest finite age, `$3` the accounts or NULL (every account).
pub(super) fn count<R: Record>() -> String {
    let (table, age, live, of, holds) = (
        R::TABLE,
        R::AGE,
        unpinned::<R>("t."),
        R::OF_ACCOUNTS,
        R::HOLDS,
    );
    format!(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM {holds})) FROM {table} t
WHERE {live}t.{age} < $1 AND t.{age} > $2 AND ($3::uuid[] IS NULL OR {of})"
    )
}
