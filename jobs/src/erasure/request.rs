//! A request as `sexton.erasures` keeps it (RQ-1): recorded, found again, listed and retried.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::Subject;
use crate::receipts::ReceiptKey;

crate::reasons! {
    /// Where a request stands (RQ-5).
    pub enum State {
        Received = "received",
        Running = "running",
        Waiting = "waiting",
        Verifying = "verifying",
        Completed = "completed",
        Failed = "failed",
    }
}

/// A request's row.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Request {
    pub id: Uuid,
    pub scope: Subject,
    /// Cleared once the request completes (RQ-6).
    pub scope_id: Option<Uuid>,
    pub account_id: Option<Uuid>,
    pub subject_hash: String,
    pub key_id: String,
    #[sqlx(rename = "ref")]
    #[serde(rename = "ref")]
    pub reference: String,
    pub requested_by: String,
    pub received_at: DateTime<Utc>,
    pub due_at: DateTime<Utc>,
    pub state: State,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub verified_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    pub removed: Json<serde_json::Map<String, serde_json::Value>>,
    pub kept: Json<serde_json::Map<String, serde_json::Value>>,
    pub withheld: Json<serde_json::Map<String, serde_json::Value>>,
    pub withheld_items: Json<Vec<serde_json::Value>>,
    pub passes: i32,
    pub residues: i32,
    pub last_error: Option<String>,
}

/// What `sexton erase` asks for.
#[derive(Debug, Clone)]
pub struct Erasure {
    pub subject: Subject,
    pub id: Uuid,
    /// The ticket: a data-subject request's number.
    pub reference: String,
    pub requested_by: String,
    /// When it must be done by; `[erasure] deadline_days` from now when `None`.
    pub due_at: Option<DateTime<Utc>>,
}

/// A request as `sexton erase` left it.
#[derive(Debug, Clone)]
pub enum Opened {
    /// Recorded now.
    New(Request),
    /// An open request already covers the scope: it is the one (RQ-1).
    Open(Request),
}

/// The open request whose scope covers `subject` `id`: the same scope, the account or the
/// agent it is of, or one whose members include it (a fork of a conversation being erased).
///
/// # Errors
/// A database error.
pub async fn covering(
    conn: &mut PgConnection,
    subject: Subject,
    id: Uuid,
) -> Result<Option<Request>, sqlx::Error> {
    sqlx::query_as(
        "WITH owner AS (
             SELECT c.account_id, NULL::uuid AS agent_id FROM conversations c WHERE c.id = $2
             UNION ALL SELECT g.account_id, NULL FROM agents g WHERE g.id = $2
             UNION ALL SELECT s.account_id, s.agent_id FROM sessions s WHERE s.id = $2)
         SELECT e.* FROM sexton.erasures e
         WHERE e.state <> 'completed'
           AND ((e.scope = $1 AND e.scope_id = $2)
                OR (e.scope = 'account' AND e.scope_id IN (SELECT account_id FROM owner))
                OR (e.scope = 'agent' AND e.scope_id IN (SELECT agent_id FROM owner))
                OR EXISTS (SELECT 1 FROM sexton.erasure_members m
                           WHERE m.request_id = e.id AND m.kind = $1 AND m.id = $2))
         ORDER BY e.received_at LIMIT 1",
    )
    .bind(subject)
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// Records `erasure` unless an open request covers it already (RQ-1); the subject's hash is
/// taken under `key`.
///
/// # Errors
/// A database error.
pub async fn open(
    conn: &mut PgConnection,
    erasure: &Erasure,
    key: &ReceiptKey,
    deadline: chrono::Duration,
) -> Result<Opened, sqlx::Error> {
    if let Some(open) = covering(conn, erasure.subject, erasure.id).await? {
        return Ok(Opened::Open(open));
    }
    let inserted: Option<Request> = sqlx::query_as(
        "WITH owner AS (
             SELECT $2::uuid AS account_id WHERE $1 = 'account'
             UNION ALL SELECT c.account_id FROM conversations c WHERE $1 = 'conversation' AND c.id = $2
             UNION ALL SELECT g.account_id FROM agents g WHERE $1 = 'agent' AND g.id = $2
             UNION ALL SELECT s.account_id FROM sessions s WHERE $1 = 'session' AND s.id = $2)
         INSERT INTO sexton.erasures (scope, scope_id, account_id, subject_hash, key_id, ref,
                                      requested_by, due_at)
         VALUES ($1, $2, (SELECT account_id FROM owner LIMIT 1), $3, $4, $5, $6,
                 COALESCE($7, now() + $8))
         ON CONFLICT (scope, scope_id) WHERE state <> 'completed' DO NOTHING
         RETURNING *",
    )
    .bind(erasure.subject)
    .bind(erasure.id)
    .bind(key.subject_hash(erasure.id))
    .bind(key.key_id())
    .bind(&erasure.reference)
    .bind(&erasure.requested_by)
    .bind(erasure.due_at)
    .bind(deadline)
    .fetch_optional(&mut *conn)
    .await?;
    match inserted {
        Some(request) => Ok(Opened::New(request)),
        // Recorded by another `sexton erase` since the look above.
        None => Ok(Opened::Open(
            covering(conn, erasure.subject, erasure.id)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?,
        )),
    }
}

/// One request.
///
/// # Errors
/// A database error.
pub async fn get(conn: &mut PgConnection, id: Uuid) -> Result<Option<Request>, sqlx::Error> {
    sqlx::query_as("SELECT * FROM sexton.erasures WHERE id = $1")
        .bind(id)
        .fetch_optional(conn)
        .await
}

/// The open requests (every request with `all`), earliest due first, at most `limit`.
///
/// # Errors
/// A database error.
pub async fn list(
    conn: &mut PgConnection,
    all: bool,
    limit: i64,
) -> Result<Vec<Request>, sqlx::Error> {
    sqlx::query_as(
        "SELECT * FROM sexton.erasures WHERE $1 OR state <> 'completed'
         ORDER BY state = 'completed', due_at, received_at LIMIT $2",
    )
    .bind(all)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Makes an open request's next pass due now, a failed one running again (`sexton erase
/// retry`); `None` when there is no such request or it has completed.
///
/// # Errors
/// A database error.
pub async fn retry(conn: &mut PgConnection, id: Uuid) -> Result<Option<Request>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE sexton.erasures
         SET state = CASE WHEN state IN ('failed', 'waiting') THEN 'running' ELSE state END,
             next_attempt_at = now(), last_error = NULL, updated_at = now()
         WHERE id = $1 AND state <> 'completed'
         RETURNING *",
    )
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// Makes every waiting request's next pass due now (a hold was released: RQ-4); how many.
///
/// # Errors
/// A database error.
pub async fn resume_waiting<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE sexton.erasures SET next_attempt_at = now(), updated_at = now()
         WHERE state = 'waiting'",
    )
    .execute(db)
    .await?
    .rows_affected())
}
