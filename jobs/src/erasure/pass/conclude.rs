//! The end of a request's pass (RQ-4 … RQ-6): what is left decides whether it waits, runs again
//! or completes with its receipt.

use serde_json::{Map, Value};
use sqlx::types::Json;
use sqlx::{Connection as _, PgConnection};

use super::{InHand, MAX_RESIDUES, Requests};
use crate::erasure::Withheld;
use crate::erasure::verify::{self, Left};
use crate::files::DrainError;
use crate::job::Report;
use crate::owner_loop::Error;
use crate::receipts;

impl Requests<'_> {
    /// What is left decides: withheld items make the request wait (RQ-3, RQ-4); a residue sends
    /// it back to work (RQ-5); nothing left completes it, with its receipt (RQ-6).
    pub(super) async fn conclude(
        &mut self,
        conn: &mut PgConnection,
        request: &InHand,
        report: &mut Report<Withheld>,
    ) -> Result<(), Error> {
        sqlx::query(
            "UPDATE sexton.erasures SET state = 'verifying', updated_at = now() WHERE id = $1",
        )
        .bind(request.id)
        .execute(&mut *conn)
        .await?;
        let (paths, keep_usage_records) = (self.env.paths, self.settings.keep_usage_records);
        // Read on both connections unless another kind's pass is under way (PF-8).
        let beside = if self.give_way.now(conn).await? {
            None
        } else {
            Some(self.second_lane().await?)
        };
        let left = match verify::left(
            conn,
            beside,
            paths,
            request.id,
            keep_usage_records,
            verify::Reading::After,
        )
        .await
        {
            Ok(left) => left,
            Err(why) => {
                return Err(DrainError::Store {
                    root: "erasure".to_owned(),
                    why,
                }
                .into());
            }
        };
        for (reason, n) in &left.withheld {
            report.retain(*reason, *n);
        }
        if !left.withheld.is_empty() {
            return Ok(self.wait(conn, request, &left).await?);
        }
        if !left.nothing() {
            return Ok(self.residue(conn, request, &left).await?);
        }
        Ok(self.complete(conn, request).await?)
    }

    async fn wait(
        &self,
        conn: &mut PgConnection,
        request: &InHand,
        left: &Left,
    ) -> Result<(), sqlx::Error> {
        let withheld: Map<String, Value> = left
            .withheld
            .iter()
            .map(|(reason, n)| (reason.as_str().to_owned(), (*n).into()))
            .collect();
        sqlx::query(
            "UPDATE sexton.erasures
             SET state = 'waiting', next_attempt_at = now() + $2, withheld = $3,
                 withheld_items = $4,
                 updated_at = now()
             WHERE id = $1",
        )
        .bind(request.id)
        .bind(self.settings.retry)
        .bind(Json(&withheld))
        .bind(Json(&left.items))
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn residue(
        &mut self,
        conn: &mut PgConnection,
        request: &InHand,
        left: &Left,
    ) -> Result<(), sqlx::Error> {
        let what = serde_json::json!({"rows": left.rows, "files": left.files});
        tracing::warn!(request = %request.id, left = %what, "erasure verification found a residue; the request runs again");
        let failed: bool = sqlx::query_scalar(
            "UPDATE sexton.erasures
             SET residues = residues + 1,
                 state = CASE WHEN residues + 1 >= $2 THEN 'failed' ELSE 'running' END,
                 last_error = CASE WHEN residues + 1 >= $2
                                   THEN 'verification found what the steps cannot remove: ' || $3
                              END,
                 updated_at = now()
             WHERE id = $1
             RETURNING state = 'failed'",
        )
        .bind(request.id)
        .bind(MAX_RESIDUES)
        .bind(what.to_string())
        .fetch_one(conn)
        .await?;
        self.failed += u64::from(failed);
        Ok(())
    }

    /// Completes the request: verified, its receipt chained, its subject's ids cleared.
    async fn complete(&self, conn: &mut PgConnection, request: &InHand) -> Result<(), sqlx::Error> {
        let mut tx = conn.begin().await?;
        let body: Value = sqlx::query_scalar(
            "WITH usage AS (
                 SELECT count(*) AS n FROM usage_records u
                 WHERE $2 AND u.account_id = (SELECT e.account_id FROM sexton.erasures e
                                              WHERE e.id = $1 AND e.scope = 'account')),
             done AS (
                 UPDATE sexton.erasures e
                 SET state = 'completed', verified_at = now(), completed_at = now(),
                     kept = CASE WHEN (SELECT n FROM usage) > 0
                                 THEN jsonb_build_object('usage_records', (SELECT n FROM usage),
                                                         'accounts', 1)
                                 ELSE '{}' END,
                     scope_id = NULL, account_id = NULL, withheld = '{}', withheld_items = '[]',
                     next_attempt_at = NULL, updated_at = now()
                 WHERE e.id = $1
                 RETURNING e.*)
             SELECT jsonb_build_object(
                 'request_id', id, 'ref', ref, 'scope', scope, 'requested_by', requested_by,
                 'received_at', received_at, 'due_at', due_at, 'completed_at', completed_at,
                 'verified_at', verified_at, 'subject_hash', subject_hash, 'key_id', key_id,
                 'removed', removed, 'kept', kept, 'withheld', withheld, 'passes', passes,
                 'residues', residues)
             FROM done",
        )
        .bind(request.id)
        .bind(self.settings.keep_usage_records)
        .fetch_one(&mut *tx)
        .await?;
        receipts::append(&mut tx, request.id, &body).await?;
        sqlx::query("DELETE FROM sexton.erasure_members WHERE request_id = $1")
            .bind(request.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}
