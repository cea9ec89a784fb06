//! The verification (RQ-5) read on its own: what it finds left of a scope, table by table.

use std::collections::BTreeMap;

use sexton_jobs::erasure::{Subject, plan, verify};
use sexton_jobs::files::PathSettings;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{request, two_tenants, world::drop_foreign_keys};
use crate::common;

/// What the verification finds left of request `id` after its steps, usage records kept.
async fn left_after(
    conn: &mut PgConnection,
    beside: Option<&mut PgConnection>,
    paths: &PathSettings,
    id: Uuid,
) -> verify::Left {
    verify::left(conn, beside, paths, id, true, verify::Reading::After)
        .await
        .unwrap()
}

#[sqlx::test]
async fn rq5_the_verification_finds_every_row_of_execution_detail_left_under_the_scopes_runs(
    pool: PgPool,
) {
    const DETAIL: [(&str, &str); 9] = [
        ("run_tasks", "run_id"),
        ("run_task_edges", "run_id"),
        ("tool_results", "run_id"),
        ("sealed_requests", "run_id"),
        ("reasoning_traces", "run_id"),
        ("invocation_attempts", "run_id"),
        ("output_files", "run_id"),
        ("settlement_receipts", "run_id"),
        ("delegations", "parent_run_id"),
    ];
    let dir = common::backend::tempdir();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    drop_foreign_keys(&pool).await;
    let asked = request(&pool, Subject::Account, one.account).await;
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(plan::members(Subject::Account, false)))
        .bind(asked.id)
        .bind(one.account)
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut planted = BTreeMap::new();
    for (table, column) in DETAIL {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} x JOIN runs r ON r.id = x.{column}
             WHERE r.account_id = $1"
        )))
        .bind(one.account)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        if n > 0 {
            planted.insert(table.to_owned(), n);
        }
    }
    assert!(planted.len() >= 6, "the world holds detail: {planted:?}");
    // The runs go by hand and their detail stays behind, as on a schema without a cascade.
    sqlx::query("DELETE FROM runs WHERE account_id = $1")
        .bind(one.account)
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut beside = pool.acquire().await.unwrap();
    for two in [false, true] {
        let left = left_after(&mut conn, two.then_some(&mut *beside), &paths, asked.id).await;
        let detail: BTreeMap<String, i64> = left
            .rows
            .into_iter()
            .filter(|(table, _)| DETAIL.iter().any(|(t, _)| t == table))
            .collect();
        assert_eq!(detail, planted, "read on two connections: {two}");
    }
}

/// A conversation and its forks.
const FORKS: &str = "WITH RECURSIVE c (id) AS (
    SELECT $1::uuid
    UNION SELECT x.id FROM conversations x JOIN c ON x.forked_from_conversation_id = c.id)
SELECT count(*) FROM conversations WHERE id IN (SELECT id FROM c)";

/// Tables, each with the statement that counts the scope's rows in it (`$1` the scope's id).
type Counts = &'static [(&'static str, &'static str)];

#[sqlx::test]
async fn rq5_the_verification_finds_each_scope_by_its_own_ids(pool: PgPool) {
    let dir = common::backend::tempdir();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    // Planned, nothing deleted: the verification finds the scope's own rows through the members
    // of their own kind — a session, a conversation (with its forks) or an agent (with its
    // sessions) erased on its own has no account among its members to be found by.
    let scopes: [(Subject, Uuid, Counts); 3] = [
        (
            Subject::Session,
            one.session,
            &[("sessions", "SELECT count(*) FROM sessions WHERE id = $1")],
        ),
        (
            Subject::Conversation,
            one.conversation,
            &[("conversations", FORKS)],
        ),
        (
            Subject::Agent,
            one.agent,
            &[
                ("agents", "SELECT count(*) FROM agents WHERE id = $1"),
                (
                    "sessions",
                    "SELECT count(*) FROM sessions WHERE agent_id = $1",
                ),
            ],
        ),
    ];
    for (subject, id, checks) in scopes {
        let asked = request(&pool, subject, id).await;
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(plan::members(subject, false)))
            .bind(asked.id)
            .bind(id)
            .execute(&mut *conn)
            .await
            .unwrap();
        let left = left_after(&mut conn, None, &paths, asked.id).await;
        for (table, expected) in checks {
            let expected: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(*expected))
                .bind(id)
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert!(expected >= 1);
            let found = left.rows.get(*table);
            assert_eq!(
                found,
                Some(&expected),
                "{subject:?} {table}: {:?}",
                left.rows
            );
        }
        sqlx::query("UPDATE sexton.erasures SET state = 'failed' WHERE id = $1")
            .bind(asked.id)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
}
