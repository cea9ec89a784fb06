//! Reading receipts back (RQ-6): every one, as JSON lines for an auditor (`export`), and a
//! subject's, by its hash recomputed under the key (`find`).

use chrono::{DateTime, Utc};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::ReceiptKey;

/// How many receipts `export` reads at once.
const BATCH: i64 = 500;

/// A receipt as stored, and as `export` prints it: one JSON object a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Receipt {
    pub seq: i64,
    pub request_id: Uuid,
    /// The receipt itself, as the erasure job wrote it (the subject only as `subject_hash`).
    pub body: Value,
    pub prev_hash: String,
    pub hash: String,
    pub written_at: DateTime<Utc>,
}

/// Every column of a receipt, in [`Receipt`]'s order.
const COLUMNS: &str = "seq, request_id, body, prev_hash, hash, written_at";

/// The receipts in seq order, those written at or after `since` (all without it), a batch at a
/// time: memory holds one batch, whatever the number of receipts. Each batch is its own
/// statement: run it in one REPEATABLE READ transaction to read one snapshot.
///
/// # Errors
/// Each batch: a database error.
pub fn export(
    conn: &mut PgConnection,
    since: Option<DateTime<Utc>>,
) -> impl Stream<Item = Result<Vec<Receipt>, sqlx::Error>> + Send + '_ {
    futures::stream::try_unfold((conn, 0_i64), move |(conn, after)| async move {
        let batch: Vec<Receipt> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM sexton.receipts
             WHERE seq > $1 AND ($2::timestamptz IS NULL OR written_at >= $2)
             ORDER BY seq LIMIT $3"
        )))
        .bind(after)
        .bind(since)
        .bind(BATCH)
        .fetch_all(&mut *conn)
        .await?;
        let last = batch.last().map(|receipt| receipt.seq);
        Ok(last.map(|last| (batch, (conn, last))))
    })
}

/// A subject's receipts, and what the key cannot tell of the others.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Found {
    /// The key's [`ReceiptKey::key_id`]: the era of receipts it can check.
    pub key_id: String,
    /// The receipts whose `subject_hash` is the subject's under this key, in seq order.
    pub receipts: Vec<Receipt>,
    /// The receipts written under other keys, by key id (the subject may be among them: this
    /// key cannot tell), in key id order, receipts without a key id last.
    pub other_keys: Vec<OtherKey>,
}

impl Found {
    /// How many receipts this key cannot check.
    pub fn unchecked(&self) -> u64 {
        self.other_keys.iter().map(|other| other.receipts).sum()
    }
}

/// Receipts written under a key other than the one asking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherKey {
    /// The `key_id` they store; `None` when they store none.
    pub key_id: Option<String>,
    pub receipts: u64,
}

/// The receipts of subject `id` (an account, conversation, agent or session id): those whose
/// `subject_hash` is its HMAC under `key`, found through the `receipts_subject_hash` index; and
/// how many were written under other keys, which `key` cannot check.
///
/// # Errors
/// A database error.
pub async fn find(
    conn: &mut PgConnection,
    key: &ReceiptKey,
    id: Uuid,
) -> Result<Found, sqlx::Error> {
    let receipts = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM sexton.receipts WHERE body->>'subject_hash' = $1 ORDER BY seq"
    )))
    .bind(key.subject_hash(id))
    .fetch_all(&mut *conn)
    .await?;
    let key_id = key.key_id();
    let others: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT body->>'key_id', count(*) FROM sexton.receipts
         WHERE (body->>'key_id') IS DISTINCT FROM $1
         GROUP BY 1 ORDER BY 1 NULLS LAST",
    )
    .bind(&key_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Found {
        key_id,
        receipts,
        other_keys: others
            .into_iter()
            .map(|(key_id, receipts)| OtherKey {
                key_id,
                receipts: u64::try_from(receipts).unwrap_or(0),
            })
            .collect(),
    })
}
