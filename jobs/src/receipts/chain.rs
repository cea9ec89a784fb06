//! The chain (RQ-6): each receipt's `hash` is SHA-256 over the hash before it and its own body,
//! so a receipt removed, altered or moved breaks a link that [`verify`] names.
//!
//! What `verify` calls each break, walking in `seq` order from 1 and stopping at the first:
//! - **altered** at `seq`: the receipt's stored `hash` is not the hash of its `prev_hash` and
//!   its body (as jsonb holds it now);
//! - **removed** at `seq`: `seq` is missing (the first missing one, when several are), or the
//!   receipt at `seq` is intact but chained to a receipt that no longer exists — its predecessor
//!   was removed and the rest renumbered (or rewritten together with its own hash: a chain
//!   without a secret cannot tell the two apart);
//! - **reordered** at `seq`: the receipt at `seq` is intact but chained to a receipt that exists
//!   at another `seq` (or it is a first receipt, chained to [`GENESIS`], found later): receipts
//!   were moved between seqs. Two receipts swapped are named at the lower of their seqs.
//!
//! Receipts removed from the end leave no link to break: [`Verified::head`] is the last
//! receipt's seq and hash, to be recorded apart (an export kept elsewhere holds it too) and
//! compared later.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

use super::hex;

/// The `prev_hash` of the first receipt.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The class of the transaction-scoped advisory lock that serialises appenders (the hop locks
/// are 0x5e770001, the hold gate 0x5e770002).
const APPEND_LOCK_CLASS: i32 = 0x5e77_0003;

/// How many receipts `verify` reads at once: its memory is one batch, whatever the chain's length.
const BATCH: i64 = 500;

/// A receipt's hash: hex SHA-256 over `prev_hash`, a line feed, and the body's canonical text —
/// `serde_json`'s serialisation of the body as read back from jsonb, whose objects' keys are in
/// sorted order (serde_json's default map; its `preserve_order` feature stays off) and whose
/// numbers and strings are jsonb's. Anyone holding an export can recompute it.
pub fn link(prev_hash: &str, body: &Value) -> String {
    let canonical = serde_json::to_string(body).expect("a JSON value always serialises");
    let mut digest = Sha256::new();
    digest.update(prev_hash.as_bytes());
    digest.update(b"\n");
    digest.update(canonical.as_bytes());
    hex(&digest.finalize())
}

/// Appends the receipt of request `request_id`, inside the caller's open transaction (which
/// commits it with the request's completion, or rolls both back), and returns its seq. A
/// request that already has a receipt keeps it: its seq is returned and nothing is written.
/// Appenders wait for each other on a transaction-scoped advisory lock until the one before
/// commits or rolls back, so the caller should commit soon after. The caller's transaction is
/// READ COMMITTED (PostgreSQL's default): each statement here then reads what the appender
/// before it committed.
///
/// # Errors
/// [`sqlx::Error::InvalidArgument`] when `conn` is not in a transaction (the lock would end
/// with the statement); a database error.
pub async fn append(
    conn: &mut PgConnection,
    request_id: Uuid,
    body: &Value,
) -> Result<i64, sqlx::Error> {
    if !conn.is_in_transaction() {
        return Err(sqlx::Error::InvalidArgument(
            "receipts::append runs inside the caller's transaction".to_owned(),
        ));
    }
    // Its own statement: the next one's snapshot is taken once the appender before has ended.
    sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
        .bind(APPEND_LOCK_CLASS)
        .execute(&mut *conn)
        .await?;
    // The body goes through jsonb before it is hashed, as `verify` will read it.
    let (existing, last_seq, last_hash, body): (Option<i64>, Option<i64>, Option<String>, Value) =
        sqlx::query_as(
            "WITH last AS (SELECT seq, hash FROM sexton.receipts ORDER BY seq DESC LIMIT 1)
             SELECT (SELECT seq FROM sexton.receipts WHERE request_id = $1),
                    (SELECT seq FROM last), (SELECT hash FROM last), $2::jsonb",
        )
        .bind(request_id)
        .bind(body)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(seq) = existing {
        return Ok(seq);
    }
    let seq = last_seq.unwrap_or(0) + 1;
    let prev_hash = last_hash.unwrap_or_else(|| GENESIS.to_owned());
    let hash = link(&prev_hash, &body);
    sqlx::query(
        "INSERT INTO sexton.receipts (seq, request_id, body, prev_hash, hash)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(seq)
    .bind(request_id)
    .bind(&body)
    .bind(&prev_hash)
    .bind(&hash)
    .execute(&mut *conn)
    .await?;
    Ok(seq)
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// Receipts read whole, in seq order: all of them when the chain is whole, else those
    /// before the first break.
    pub receipts: u64,
    /// The first break, if any.
    pub first_bad: Option<Broken>,
    /// The last whole receipt (`None` for an empty chain, or a break at seq 1).
    pub head: Option<Head>,
}

/// Where the chain first breaks, and how (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Broken {
    pub seq: i64,
    /// "altered", "removed" or "reordered".
    pub what: &'static str,
}

/// A receipt's place in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Head {
    pub seq: i64,
    pub hash: String,
}

/// Walks the whole chain in seq order, a batch at a time, up to its first break. Run it in one
/// REPEATABLE READ transaction to read one snapshot (appenders may add receipts meanwhile;
/// they only add at the end).
///
/// # Errors
/// A database error.
pub async fn verify(conn: &mut PgConnection) -> Result<Verified, sqlx::Error> {
    let mut walk = Walk::default();
    loop {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT seq, body, prev_hash, hash FROM sexton.receipts
             WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(walk.expect_seq - 1)
        .bind(BATCH)
        .fetch_all(&mut *conn)
        .await?;
        let done = rows.len() < BATCH as usize;
        for row in &rows {
            let broken = match walk.step(row) {
                Step::Whole => continue,
                Step::Broken(broken) => broken,
                Step::Unlinked => {
                    let elsewhere: Option<i64> = sqlx::query_scalar(
                        "SELECT seq FROM sexton.receipts WHERE hash = $1 AND seq <> $2 LIMIT 1",
                    )
                    .bind(&row.prev_hash)
                    .bind(row.seq)
                    .fetch_optional(&mut *conn)
                    .await?;
                    unlinked(row, elsewhere.is_some())
                }
            };
            return Ok(walk.verified(Some(broken)));
        }
        if done {
            return Ok(walk.verified(None));
        }
    }
}

/// One receipt as `verify` reads it.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    seq: i64,
    body: Value,
    prev_hash: String,
    hash: String,
}

/// The walk so far: how many receipts were whole, and what the next must be.
#[derive(Debug)]
struct Walk {
    receipts: u64,
    expect_seq: i64,
    prev_hash: String,
}

impl Default for Walk {
    fn default() -> Self {
        Self {
            receipts: 0,
            expect_seq: 1,
            prev_hash: GENESIS.to_owned(),
        }
    }
}

/// One receipt judged.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Whole,
    Broken(Broken),
    /// Intact, but not chained to the receipt before it: removed or reordered, by whether its
    /// predecessor exists elsewhere ([`unlinked`]).
    Unlinked,
}

impl Walk {
    fn step(&mut self, row: &Row) -> Step {
        if row.seq > self.expect_seq {
            return Step::Broken(Broken {
                seq: self.expect_seq,
                what: "removed",
            });
        }
        if row.seq < self.expect_seq {
            // Only a seq below 1 comes before the first expected one.
            return Step::Broken(Broken {
                seq: row.seq,
                what: "reordered",
            });
        }
        if link(&row.prev_hash, &row.body) != row.hash {
            return Step::Broken(Broken {
                seq: row.seq,
                what: "altered",
            });
        }
        if row.prev_hash != self.prev_hash {
            return Step::Unlinked;
        }
        self.receipts += 1;
        self.expect_seq += 1;
        self.prev_hash.clone_from(&row.hash);
        Step::Whole
    }

    fn verified(self, first_bad: Option<Broken>) -> Verified {
        Verified {
            receipts: self.receipts,
            first_bad,
            head: (self.receipts > 0).then(|| Head {
                seq: self.expect_seq - 1,
                hash: self.prev_hash,
            }),
        }
    }
}

/// An intact receipt not chained to the one before it: reordered when the receipt it is
/// chained to exists at another seq (`elsewhere`), or when it is a first receipt out of place;
/// else removed (the receipt it was chained to is gone).
fn unlinked(row: &Row, elsewhere: bool) -> Broken {
    let what = if elsewhere || row.prev_hash == GENESIS {
        "reordered"
    } else {
        "removed"
    };
    Broken { seq: row.seq, what }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A whole chain of `n` receipts, seqs from 1.
    fn chain(n: i64) -> Vec<Row> {
        let mut prev = GENESIS.to_owned();
        (1..=n)
            .map(|seq| {
                let body = json!({"request_id": seq, "rows": {"runs": seq * 10}});
                let hash = link(&prev, &body);
                Row {
                    seq,
                    body,
                    prev_hash: std::mem::replace(&mut prev, hash.clone()),
                    hash,
                }
            })
            .collect()
    }

    /// The walk over `rows`, as `verify` does it, `elsewhere` answering whether a hash is that
    /// of a receipt at another seq.
    fn walk(rows: &[Row]) -> Verified {
        let mut walk = Walk::default();
        for row in rows {
            let broken = match walk.step(row) {
                Step::Whole => continue,
                Step::Broken(broken) => broken,
                Step::Unlinked => {
                    let elsewhere = rows
                        .iter()
                        .any(|r| r.hash == row.prev_hash && r.seq != row.seq);
                    unlinked(row, elsewhere)
                }
            };
            return walk.verified(Some(broken));
        }
        walk.verified(None)
    }

    fn broken(seq: i64, what: &'static str) -> Option<Broken> {
        Some(Broken { seq, what })
    }

    #[test]
    fn rq6_a_link_is_sha256_over_the_previous_hash_and_the_sorted_body() {
        // Computed apart from this code (Python's hashlib), over `{"a":1,"b":[true,null,"x"]}`.
        let body = json!({"b": [true, null, "x"], "a": 1});
        assert_eq!(
            link(GENESIS, &body),
            "dbd176a6ac2f9486b58e057d95b0bd2bd263061b2bc581dc0823e0649f65ef49"
        );
        // Control: another previous hash or body gives another link.
        assert_ne!(link(&"1".repeat(64), &body), link(GENESIS, &body));
        assert_ne!(
            link(GENESIS, &json!({"a": 2, "b": []})),
            link(GENESIS, &body)
        );
    }

    #[test]
    fn rq6_a_whole_chain_walks_to_its_head() {
        let rows = chain(5);
        let verified = walk(&rows);
        assert_eq!(verified.receipts, 5);
        assert_eq!(verified.first_bad, None);
        assert_eq!(verified.head.unwrap().hash, rows[4].hash);
        // Control: an empty chain is whole, with no head.
        assert_eq!(walk(&[]).first_bad, None);
        assert_eq!(walk(&[]).head, None);
    }

    #[test]
    fn rq6_an_altered_body_is_named_at_its_seq() {
        let mut rows = chain(5);
        rows[2].body["rows"]["runs"] = json!(0);
        let verified = walk(&rows);
        assert_eq!(verified.first_bad, broken(3, "altered"));
        assert_eq!((verified.receipts, verified.head.unwrap().seq), (2, 2));
    }

    #[test]
    fn rq6_a_removed_receipt_is_named_by_its_seq_renumbered_or_not() {
        let mut rows = chain(5);
        rows.remove(2);
        assert_eq!(walk(&rows).first_bad, broken(3, "removed"));
        for row in &mut rows[2..] {
            row.seq -= 1;
        }
        assert_eq!(walk(&rows).first_bad, broken(3, "removed"));
        // The first receipt, too.
        let mut rows = chain(3);
        rows.remove(0);
        assert_eq!(walk(&rows).first_bad, broken(1, "removed"));
        for row in &mut rows {
            row.seq -= 1;
        }
        assert_eq!(walk(&rows).first_bad, broken(1, "removed"));
    }

    #[test]
    fn rq6_two_swapped_receipts_are_named_reordered_at_the_lower_seq() {
        for (a, b) in [(1, 3), (2, 4), (3, 4), (0, 4)] {
            let mut rows = chain(5);
            let (seq_a, seq_b) = (rows[a].seq, rows[b].seq);
            rows[a].seq = seq_b;
            rows[b].seq = seq_a;
            rows.sort_by_key(|r| r.seq);
            assert_eq!(
                walk(&rows).first_bad,
                broken(seq_a, "reordered"),
                "{seq_a} <-> {seq_b}"
            );
        }
    }
}
