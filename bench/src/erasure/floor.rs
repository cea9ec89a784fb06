//! The floor of an account's erasure (PF-8): the plain SQL a careful person would write to
//! reach sexton's end state, on one connection — every table's rows of the account deleted
//! children first, in batches of the same size as sexton's (`[erasure] batch_size`, 500), each
//! batch its own transaction, the batch's files unlinked after its commit (beside the next
//! batch's statements) — with no request, no lock order, no withholding and no verification.
//! Usage records stay, unlinked, and the account row with them, as `keep_usage_records`
//! (the default) has it.

use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use sqlx::postgres::PgConnectOptions;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::cluster::connect;
use crate::method::{Method, method};

/// Rows (or owners) per transaction: sexton's default `[erasure] batch_size`.
pub const BATCH: usize = 500;

/// The floor's name in the tables.
pub const FLOOR: &str = "children-first batches + unlink";

/// Execution detail and what hangs from a run, deleted before the runs themselves.
const UNDER_RUNS: [&str; 8] = [
    "DELETE FROM run_tasks WHERE run_id = ANY($1)",
    "DELETE FROM run_task_edges WHERE run_id = ANY($1)",
    "DELETE FROM tool_results WHERE run_id = ANY($1)",
    "DELETE FROM sealed_requests WHERE run_id = ANY($1)",
    "DELETE FROM reasoning_traces WHERE run_id = ANY($1)",
    "DELETE FROM invocation_attempts WHERE run_id = ANY($1)",
    "DELETE FROM settlement_receipts WHERE run_id = ANY($1)",
    "DELETE FROM delegations WHERE parent_run_id = ANY($1)",
];

/// What hangs from a conversation, deleted before the conversations themselves.
const UNDER_CONVERSATIONS: [&str; 7] = [
    "DELETE FROM follow_ups WHERE variant_id IN (
         SELECT v.id FROM variants v JOIN turns t ON t.id = v.turn_id
         WHERE t.conversation_id = ANY($1))",
    "DELETE FROM variants WHERE turn_id IN (SELECT id FROM turns WHERE conversation_id = ANY($1))",
    "DELETE FROM turns WHERE conversation_id = ANY($1)",
    "DELETE FROM conversation_events WHERE conversation_id = ANY($1)",
    "DELETE FROM history_request_sources WHERE history_request_id IN (
         SELECT id FROM history_requests WHERE conversation_id = ANY($1))",
    "DELETE FROM history_requests WHERE conversation_id = ANY($1)",
    "UPDATE usage_records SET conversation_id = NULL WHERE conversation_id = ANY($1)",
];

/// A session's history, deleted before the sessions themselves.
const UNDER_SESSIONS: [&str; 4] = [
    "DELETE FROM conversation_archive_entries WHERE archive_id IN (
         SELECT id FROM conversation_archives WHERE session_id = ANY($1))",
    "DELETE FROM conversation_archives WHERE session_id = ANY($1)",
    "DELETE FROM conversation_entries WHERE session_id = ANY($1)",
    "DELETE FROM handoffs WHERE from_session_id = ANY($1) OR to_session_id = ANY($1)",
];

/// The account's own rows and its agents' records, a batch per statement until none is left.
const SWEEPS: [&str; 7] = [
    "DELETE FROM fragments WHERE id IN (SELECT id FROM fragments WHERE account_id = $1 LIMIT $2)",
    "DELETE FROM handoffs WHERE id IN (SELECT id FROM handoffs WHERE account_id = $1 LIMIT $2)",
    "DELETE FROM dream_preloads WHERE id IN (
         SELECT id FROM dream_preloads WHERE account_id = $1 LIMIT $2)",
    "DELETE FROM working_records WHERE id IN (
         SELECT id FROM working_records WHERE account_id = $1 LIMIT $2)",
    "DELETE FROM brain_memories WHERE id IN (
         SELECT id FROM brain_memories WHERE account_id = $1 LIMIT $2)",
    "DELETE FROM board_tasks WHERE id IN (SELECT id FROM board_tasks WHERE account_id = $1 LIMIT $2)",
    "DELETE FROM session_retention_policies WHERE account_id = $1 AND $2 > 0",
];

/// The floor on `db`, its files under `files`: erases account `account`.
pub async fn run_floor(
    base: &PgConnectOptions,
    db: &str,
    files: &Path,
    account: Uuid,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-raw").await?;
    let mut unlinks = Unlinks::default();
    let ids = |table: &str| format!("SELECT id FROM {table} WHERE account_id = $1 ORDER BY id");
    let runs: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(ids("runs")))
        .bind(account)
        .fetch_all(&pool)
        .await?;
    for batch in runs.chunks(BATCH) {
        let mut tx = pool.begin().await?;
        all(&mut tx, &UNDER_RUNS, batch).await?;
        let outputs: Vec<String> = sqlx::query_scalar(
            "DELETE FROM output_files WHERE run_id = ANY($1) RETURNING relative_path",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        all(
            &mut tx,
            &[
                "DELETE FROM history_request_sources WHERE source_run_id = ANY($1)
                    OR history_request_id IN (SELECT id FROM history_requests WHERE run_id = ANY($1))",
                "DELETE FROM history_requests WHERE run_id = ANY($1)",
                "UPDATE usage_records SET run_id = NULL, conversation_id = NULL WHERE run_id = ANY($1)",
                "DELETE FROM runs WHERE id = ANY($1)",
            ],
            batch,
        )
        .await?;
        tx.commit().await?;
        unlinks
            .after(files.join("outputs"), outputs, Unlink::File)
            .await?;
    }
    let conversations: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(ids("conversations")))
        .bind(account)
        .fetch_all(&pool)
        .await?;
    for batch in conversations.chunks(BATCH) {
        let mut tx = pool.begin().await?;
        all(&mut tx, &UNDER_CONVERSATIONS, batch).await?;
        all(
            &mut tx,
            &["DELETE FROM conversations WHERE id = ANY($1)"],
            batch,
        )
        .await?;
        tx.commit().await?;
    }
    let sessions: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(ids("sessions")))
        .bind(account)
        .fetch_all(&pool)
        .await?;
    for batch in sessions.chunks(BATCH) {
        let mut tx = pool.begin().await?;
        all(&mut tx, &UNDER_SESSIONS, batch).await?;
        all(&mut tx, &["DELETE FROM sessions WHERE id = ANY($1)"], batch).await?;
        tx.commit().await?;
        let dirs = batch.iter().map(Uuid::to_string).collect();
        unlinks
            .after(files.join("sessions"), dirs, Unlink::Directory)
            .await?;
    }
    for sweep in SWEEPS {
        sweep_all(&pool, sweep, account).await?;
    }
    let agents: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(ids("agents")))
        .bind(account)
        .fetch_all(&pool)
        .await?;
    for batch in agents.chunks(BATCH) {
        let mut tx = pool.begin().await?;
        all(&mut tx, &["DELETE FROM agents WHERE id = ANY($1)"], batch).await?;
        tx.commit().await?;
        let dirs = batch.iter().map(Uuid::to_string).collect();
        unlinks
            .after(files.join("traces"), dirs, Unlink::Directory)
            .await?;
    }
    loop {
        let attachments: Vec<String> = sqlx::query_scalar(
            "DELETE FROM attachments WHERE id IN (
                 SELECT id FROM attachments WHERE account_id = $1 LIMIT $2)
             RETURNING relative_path",
        )
        .bind(account)
        .bind(BATCH as i64)
        .fetch_all(&pool)
        .await?;
        if attachments.is_empty() {
            break;
        }
        unlinks
            .after(files.join("attachments"), attachments, Unlink::File)
            .await?;
    }
    // The account row stays as its usage records' anchor.
    sqlx::query("UPDATE accounts SET name = 'erased' WHERE id = $1")
        .bind(account)
        .execute(&pool)
        .await?;
    unlinks.finish().await?;
    pool.close().await;
    let mut m = method(FLOOR);
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// Runs each of `statements` with `$1` the batch's ids, in one transaction.
async fn all(
    tx: &mut Transaction<'_, Postgres>,
    statements: &[&str],
    batch: &[Uuid],
) -> sqlx::Result<()> {
    for statement in statements {
        sqlx::query(sqlx::AssertSqlSafe(*statement))
            .bind(batch)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Runs `sweep` (`$1` the account, `$2` the batch size) until it deletes nothing.
async fn sweep_all(pool: &PgPool, sweep: &str, account: Uuid) -> sqlx::Result<()> {
    while sqlx::query(sqlx::AssertSqlSafe(sweep))
        .bind(account)
        .bind(BATCH as i64)
        .execute(pool)
        .await?
        .rows_affected()
        > 0
    {}
    Ok(())
}

/// What an unlink removes.
#[derive(Clone, Copy)]
enum Unlink {
    File,
    Directory,
}

/// One batch's unlinks at a time, beside the next batch's statements.
#[derive(Default)]
struct Unlinks {
    running: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Unlinks {
    /// Waits for the previous batch's unlinks, then starts removing `names` under `root`.
    async fn after(
        &mut self,
        root: std::path::PathBuf,
        names: Vec<String>,
        what: Unlink,
    ) -> anyhow::Result<()> {
        self.finish().await?;
        self.running = Some(tokio::task::spawn_blocking(move || {
            for name in names {
                let path = root.join(&name);
                let done = match what {
                    Unlink::File => std::fs::remove_file(&path),
                    Unlink::Directory => std::fs::remove_dir_all(&path),
                };
                match done {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(e).with_context(|| format!("removing {}", path.display()));
                    }
                    _ => {}
                }
            }
            Ok(())
        }));
        Ok(())
    }

    /// Waits for the last batch's unlinks.
    async fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(running) = self.running.take() {
            running.await??;
        }
        Ok(())
    }
}
