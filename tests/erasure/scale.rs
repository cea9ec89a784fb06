//! An erasure costs what its scope holds, not what the platform's tables hold (RQ-8).

use sexton_jobs::erasure;
use sqlx::PgPool;
use sqlx::types::Json;

/// The platform's tables a plan reads whole: its `Seq Scan` nodes outside sexton's schema.
fn whole_reads(node: &serde_json::Value, found: &mut Vec<String>) {
    if node["Node Type"] == "Seq Scan" && node["Schema"] != "sexton" {
        found.push(node["Relation Name"].as_str().unwrap_or("?").to_owned());
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        whole_reads(child, found);
    }
}

#[sqlx::test]
async fn rq8_every_statement_of_an_erasure_reads_the_platforms_tables_by_index(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    // A scan is then chosen only where no index can serve the statement, whatever the tables
    // hold; the plan is the generic one every transaction of a pass runs.
    sqlx::raw_sql("SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let statements = erasure::statements();
    assert!(statements.len() >= 20, "{} statements", statements.len());
    let mut scans = Vec::new();
    for (i, (sql, types)) in statements.iter().enumerate() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "PREPARE statement_{i} ({types}) AS {sql}"
        )))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}: {sql}"));
        let nulls = vec!["NULL"; types.split(',').count()].join(", ");
        let Json(plan): Json<serde_json::Value> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE statement_{i} ({nulls})"
        )))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        let mut found = Vec::new();
        whole_reads(&plan[0]["Plan"], &mut found);
        if !found.is_empty() {
            let head: String = sql.split_whitespace().take(8).collect::<Vec<_>>().join(" ");
            scans.push(format!("{found:?} in `{head} …`"));
        }
    }
    assert!(
        scans.is_empty(),
        "statements that read a table whole:\n{}",
        scans.join("\n")
    );
}
