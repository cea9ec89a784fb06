//! The schema (SPEC §1): migrations apply twice and the catalog holds the contract; the contract's
//! defaults let a test's row name only ids and keys.

use sqlx::PgPool;

use crate::common;
use crate::common::contract::CONTRACT;

#[sqlx::test]
async fn migrate_twice_and_the_catalog_matches_the_contract(pool: PgPool) {
    common::migrate(&pool).await;
    common::migrate(&pool).await;
    for (table, columns) in CONTRACT {
        let present: Vec<String> = sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = 'public' AND table_name = $1",
        )
        .bind(table)
        .fetch_all(&pool)
        .await
        .unwrap();
        for column in *columns {
            assert!(
                present.iter().any(|c| c == column),
                "{table}.{column} is missing"
            );
        }
    }
    let payload_type: String = sqlx::query_scalar(
        "SELECT data_type FROM information_schema.columns
         WHERE table_name = 'conversation_entries' AND column_name = 'payload'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        payload_type, "json",
        "original payloads are json, not jsonb"
    );
}

#[sqlx::test]
async fn contract_defaults_let_a_row_name_only_ids_and_keys(pool: PgPool) {
    // The contract's promise to tests: ids, foreign keys and the columns of the case suffice.
    let account: uuid::Uuid =
        sqlx::query_scalar("INSERT INTO accounts DEFAULT VALUES RETURNING id")
            .fetch_one(&pool)
            .await
            .unwrap();
    let days: Option<i32> =
        sqlx::query_scalar("SELECT execution_details_retention_days FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(days, Some(90), "EX-1: the default window is 90 days");
    let conversation: uuid::Uuid =
        sqlx::query_scalar("INSERT INTO conversations (account_id) VALUES ($1) RETURNING id")
            .bind(account)
            .fetch_one(&pool)
            .await
            .unwrap();
    let summary: serde_json::Value =
        sqlx::query_scalar("SELECT usage_summary FROM conversations WHERE id = $1")
            .bind(conversation)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(summary, serde_json::json!({"tokens": 0, "cost_micros": 0}));
    let run: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO runs (account_id, conversation_id) VALUES ($1, $2) RETURNING id",
    )
    .bind(account)
    .bind(conversation)
    .fetch_one(&pool)
    .await
    .unwrap();
    for statement in [
        "INSERT INTO run_tasks (run_id) VALUES ($1)",
        "INSERT INTO tool_results (run_id) VALUES ($1)",
        "INSERT INTO sealed_requests (run_id) VALUES ($1)",
        "INSERT INTO reasoning_traces (run_id) VALUES ($1)",
        "INSERT INTO invocation_attempts (run_id) VALUES ($1)",
        "INSERT INTO settlement_receipts (run_id) VALUES ($1)",
        "INSERT INTO delegations (parent_run_id) VALUES ($1)",
    ] {
        sqlx::query(statement)
            .bind(run)
            .execute(&pool)
            .await
            .unwrap();
    }
    let refused =
        sqlx::query("UPDATE accounts SET execution_details_retention_days = 0 WHERE id = $1")
            .bind(account)
            .execute(&pool)
            .await;
    assert!(
        refused.is_err(),
        "EX-1: a retention of 0 days is refused by the schema"
    );
}
