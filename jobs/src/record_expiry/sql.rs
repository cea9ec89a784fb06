//! The statements of every short-lived record kind, rendered from what the kind declares
//! ([`Record`]: its table, its age column, its pin) and judged by `sexton.record_expired`, the
//! one SQL function of TTL-1 … TTL-4. The rendered text is in
//! `jobs/tests/golden/record_expiry/`.

use super::Record;

/// Whether the row `t` of a kind has expired at `cutoff` (`sexton.record_expired`), its pin
/// (if the kind has one) read as `pin` says: the row's own, or `false` to ask whether it is old
/// enough whatever its pin.
fn expired<R: Record>(cutoff: &str, pin: Pin) -> String {
    let pinned = match (pin, R::PINNED) {
        (Pin::Read, Some(column)) => format!("t.{column}"),
        (Pin::Ignored, _) | (Pin::Read, None) => "false".to_owned(),
    };
    format!("sexton.record_expired(t.{}, {pinned}, {cutoff})", R::AGE)
}

/// Whether [`expired`] reads a row's pin.
#[derive(Clone, Copy)]
enum Pin {
    Read,
    Ignored,
}

/// One batch. `$1` the cutoff, `$2`/`$3` the cursor (age, id as text), `$4` the batch size.
/// It reads the next expired rows in (age, id) order, locks those no application holds
/// (`SKIP LOCKED`), re-checks their age (and pin) under the lock, asks the holds that cover
/// them (HD-3) and deletes those no hold covers; it returns the rows read, held and deleted and
/// the last row read (the next cursor).
///
/// The lock takes the batch's range of the (age, id) index again, in the statement's snapshot,
/// rather than each row by its key, and the delete takes each locked row where it lies (its
/// `ctid`, which the lock holds still): an index probe per row each, which made the batch
/// slower than a plain keyset `DELETE` (a million handoffs: 5.9 s against 4.0 s in a loop on the
/// server, 2.4 s this way). A row updated since the snapshot is re-checked by the lock against
/// the same conditions and, if it still passes, stays for the next pass, its new version not
/// being the snapshot's.
pub(super) fn batch<R: Record>() -> String {
    let (table, age, id, holds) = (R::TABLE, R::AGE, R::ID_TYPE, R::HOLDS);
    let expired = expired::<R>("$1", Pin::Read);
    format!(
        "WITH batch AS (
    SELECT t.id, t.{age} FROM {table} t
    WHERE {expired} AND (t.{age}, t.id) > ($2, $3::{id})
    ORDER BY t.{age}, t.id
    LIMIT $4),
last AS (
    SELECT b.{age}, b.id FROM batch b ORDER BY b.{age} DESC, b.id DESC LIMIT 1),
locked AS (
    SELECT t.ctid, EXISTS (SELECT 1 FROM {holds}) AS held FROM {table} t
    WHERE {expired} AND (t.{age}, t.id) > ($2, $3::{id})
      AND t.{age} <= (SELECT {age} FROM last)
      AND (t.{age}, t.id) <= ((SELECT {age} FROM last), (SELECT id FROM last))
    FOR UPDATE OF t SKIP LOCKED),
gone AS (
    DELETE FROM {table} t
    WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM locked WHERE NOT held)) RETURNING 1)
SELECT (SELECT count(*) FROM batch) AS read,
       (SELECT count(*) FROM locked WHERE held) AS held,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT {age} FROM last) AS last_at,
       (SELECT id::text FROM last) AS last_id"
    )
}

/// The oldest expired age of a row no hold covers. `$1` the cutoff, `$2` the earliest finite
/// age.
pub(super) fn oldest<R: Record>() -> String {
    let (table, age, holds) = (R::TABLE, R::AGE, R::HOLDS);
    let expired = expired::<R>("$1", Pin::Read);
    format!(
        "SELECT min(t.{age}) FROM {table} t
WHERE {expired} AND t.{age} > $2 AND NOT EXISTS (SELECT 1 FROM {holds})"
    )
}

/// Expired rows, of some accounts or all, and those of them a hold covers. `$1` the cutoff, `$2`
/// the earliest finite age, `$3` the accounts or NULL (every account).
pub(super) fn count<R: Record>() -> String {
    let (table, age, of, holds) = (R::TABLE, R::AGE, R::OF_ACCOUNTS, R::HOLDS);
    let expired = expired::<R>("$1", Pin::Read);
    format!(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM {holds})) FROM {table} t
WHERE {expired} AND t.{age} > $2 AND ($3::uuid[] IS NULL OR {of})"
    )
}

/// One record as the batches judge it (`sexton explain`): `$1` its id (as text), `$2` the
/// cutoff. Whether it has expired, and whether it is old enough whatever its pin.
pub(super) fn judge<R: Record>() -> String {
    format!(
        "SELECT {}, {} FROM {} t WHERE t.id = $1::{}",
        expired::<R>("$2", Pin::Read),
        expired::<R>("$2", Pin::Ignored),
        R::TABLE,
        R::ID_TYPE
    )
}
