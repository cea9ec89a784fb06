//! Two accounts with something in every table of the data contract and every file root, and
//! the oracle the erasure tests judge by: a snapshot of every row of every table, so that a test
//! asserts what went is exactly the scope's and everything else is as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use sexton_jobs::files::PathSettings;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec};

/// Every table of the data contract (§1).
pub use sexton::demo::TABLES;

/// Every row of every table, as JSON text.
pub type Snapshot = BTreeMap<&'static str, BTreeSet<String>>;

pub async fn snapshot(pool: &PgPool) -> Snapshot {
    let mut snapshot = Snapshot::new();
    for table in TABLES {
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT to_jsonb(t)::text FROM {table} t"
        )))
        .fetch_all(pool)
        .await
        .unwrap();
        snapshot.insert(table, rows.into_iter().collect());
    }
    snapshot
}

/// Whether a row (JSON text) names one of `ids` in any of its columns.
fn names(row: &str, ids: &BTreeSet<Uuid>) -> bool {
    let value: Value = serde_json::from_str(row).unwrap();
    value.as_object().unwrap().values().any(|v| {
        v.as_str()
            .and_then(|s| Uuid::parse_str(s).ok())
            .is_some_and(|id| ids.contains(&id))
    })
}

/// `ids` and, transitively, the id of every row that names one of them (a fork names its
/// conversation, a delegated child its parent run, a turn its conversation).
fn closure(snapshot: &Snapshot, ids: &BTreeSet<Uuid>) -> BTreeSet<Uuid> {
    let mut ids = ids.clone();
    loop {
        let mut grown = false;
        for row in snapshot.values().flatten() {
            let value: Value = serde_json::from_str(row).unwrap();
            if let Some(id) = value["id"].as_str().and_then(|s| Uuid::parse_str(s).ok())
                && !ids.contains(&id)
                && names(row, &ids)
            {
                ids.insert(id);
                grown = true;
            }
        }
        if !grown {
            return ids;
        }
    }
}

/// Asserts the erasure of the scope whose ids are `scope` took every row naming one of them
/// and nothing else: a row not naming one is unchanged, except the usage records whose links
/// to the scope's content were cleared (`kept`), which are checked by the caller.
pub fn assert_exactly(before: &Snapshot, after: &Snapshot, scope: &BTreeSet<Uuid>, kept: &[&str]) {
    let scope = &closure(before, scope);
    for table in TABLES {
        let (was, is) = (&before[table], &after[table]);
        for row in was.difference(is) {
            if kept.contains(table) {
                continue;
            }
            assert!(
                names(row, scope),
                "{table}: a row outside the scope was removed or changed: {row}"
            );
        }
        for row in is.difference(was) {
            assert!(
                kept.contains(table),
                "{table}: a row appeared or changed: {row}"
            );
        }
        for row in is {
            if !kept.contains(table) {
                assert!(
                    !names(row, scope),
                    "{table}: a row of the scope is left: {row}"
                );
            }
        }
    }
}

/// Every foreign key of the platform's tables, dropped: the platform owns its schema, and may
/// carry none of the reference schema's cascades.
pub async fn drop_foreign_keys(pool: &PgPool) {
    let keys: Vec<(String, String)> = sqlx::query_as(
        "SELECT conrelid::regclass::text, conname FROM pg_constraint
         WHERE contype = 'f' AND connamespace = 'public'::regnamespace",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        keys.len() > 20,
        "the reference schema's foreign keys: {keys:?}"
    );
    for (table, key) in keys {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} DROP CONSTRAINT \"{key}\""
        )))
        .execute(pool)
        .await
        .unwrap();
    }
}

/// Rows whose parent the reference schema's foreign keys name is gone, per (table, column).
pub async fn orphans(pool: &PgPool) -> Vec<(String, i64)> {
    let mut found = Vec::new();
    for (table, column, parent) in [
        ("conversations", "account_id", "accounts"),
        ("turns", "conversation_id", "conversations"),
        ("variants", "turn_id", "turns"),
        ("follow_ups", "variant_id", "variants"),
        ("fragments", "account_id", "accounts"),
        ("runs", "account_id", "accounts"),
        ("runs", "conversation_id", "conversations"),
        ("run_tasks", "run_id", "runs"),
        ("run_task_edges", "run_id", "runs"),
        ("tool_results", "run_id", "runs"),
        ("sealed_requests", "run_id", "runs"),
        ("reasoning_traces", "run_id", "runs"),
        ("invocation_attempts", "run_id", "runs"),
        ("output_files", "run_id", "runs"),
        ("settlement_receipts", "run_id", "runs"),
        ("delegations", "parent_run_id", "runs"),
        ("history_requests", "run_id", "runs"),
        ("history_requests", "conversation_id", "conversations"),
        (
            "history_request_sources",
            "history_request_id",
            "history_requests",
        ),
        ("history_request_sources", "source_run_id", "runs"),
        ("usage_records", "account_id", "accounts"),
        ("conversation_events", "conversation_id", "conversations"),
        ("agents", "account_id", "accounts"),
        ("sessions", "agent_id", "agents"),
        ("sessions", "account_id", "accounts"),
        ("conversation_entries", "session_id", "sessions"),
        ("conversation_archives", "session_id", "sessions"),
        (
            "conversation_archive_entries",
            "archive_id",
            "conversation_archives",
        ),
        ("handoffs", "agent_id", "agents"),
        ("dream_preloads", "agent_id", "agents"),
        ("working_records", "agent_id", "agents"),
        ("brain_memories", "agent_id", "agents"),
        ("attachments", "account_id", "accounts"),
        ("board_tasks", "account_id", "accounts"),
    ] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} t WHERE t.{column} IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM {parent} p WHERE p.id = t.{column})"
        )))
        .fetch_one(pool)
        .await
        .unwrap();
        if n > 0 {
            found.push((format!("{table}.{column}"), n));
        }
    }
    found
}

/// One account's content: a conversation with a fork, runs with a delegated child, follow-ups
/// and fragments; an agent with two sessions (one with history, archives, frames and traces),
/// records and memories; attachments; usage records.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub account: Uuid,
    pub conversation: Uuid,
    pub other_conversation: Uuid,
    pub runs: Vec<Uuid>,
    pub child_run: Uuid,
    pub other_run: Uuid,
    /// Referenced only by the conversation's follow-up.
    pub own_fragment: Uuid,
    /// Referenced by the conversation's and the other conversation's follow-ups.
    pub shared_fragment: Uuid,
    pub agent: Uuid,
    pub session: Uuid,
    pub other_session: Uuid,
    /// Files, relative to their roots: (root, path).
    pub session_trace: PathBuf,
    pub other_trace: PathBuf,
    pub attachment_file: PathBuf,
}

impl Tenant {
    /// What a conversation erasure is asked for: the conversation, and the fragment only it
    /// references (every row naming one of them, transitively, goes too).
    pub fn conversation_scope(&self) -> BTreeSet<Uuid> {
        [self.conversation, self.own_fragment].into_iter().collect()
    }

    /// What a session erasure is asked for.
    pub fn session_scope(&self) -> BTreeSet<Uuid> {
        [self.session].into_iter().collect()
    }
}

async fn exec(pool: &PgPool, sql: &str, ids: &[Uuid]) {
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
    for id in ids {
        query = query.bind(*id);
    }
    query.execute(pool).await.unwrap();
}

async fn id(pool: &PgPool, sql: &str, ids: &[Uuid]) -> Uuid {
    let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()));
    for id in ids {
        query = query.bind(*id);
    }
    query.fetch_one(pool).await.unwrap()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Builds one tenant under `paths`.
pub async fn tenant(pool: &PgPool, paths: &PathSettings) -> Tenant {
    let account = fixture::account(pool, Some(90)).await;
    let conversation = fixture::conversation(pool, account).await;
    let other_conversation = fixture::conversation(pool, account).await;
    let fork = id(
        pool,
        "INSERT INTO conversations (account_id, forked_from_conversation_id, forked_at_position)
         VALUES ($1, $2, 1) RETURNING id",
        &[account, conversation],
    )
    .await;
    let mut runs = Vec::new();
    let mut variants = Vec::new();
    for conv in [conversation, conversation, fork] {
        let run = fixture::run(
            pool,
            &paths.output_root,
            RunSpec::conversation(account, conv, 5.0),
        )
        .await;
        runs.push(run.id);
        variants.extend(run.variant);
    }
    let child_run = fixture::run(
        pool,
        &paths.output_root,
        RunSpec {
            parent: Some(runs[0]),
            ..RunSpec::conversation(account, conversation, 5.0)
        },
    )
    .await
    .id;
    exec(
        pool,
        "INSERT INTO delegations (parent_run_id, child_run_id) VALUES ($1, $2)",
        &[runs[0], child_run],
    )
    .await;
    let other = fixture::run(
        pool,
        &paths.output_root,
        RunSpec::conversation(account, other_conversation, 5.0),
    )
    .await;
    let other_run = other.id;
    for run in [runs[0], other_run] {
        exec(
            pool,
            "INSERT INTO settlement_receipts (run_id) VALUES ($1)",
            &[run],
        )
        .await;
        exec(
            pool,
            "INSERT INTO usage_records (account_id, run_id, conversation_id, tokens)
             SELECT account_id, id, conversation_id, 7 FROM runs WHERE id = $1",
            &[run],
        )
        .await;
    }
    let request = id(
        pool,
        "INSERT INTO history_requests (conversation_id, run_id) VALUES ($1, $2) RETURNING id",
        &[conversation, runs[1]],
    )
    .await;
    exec(
        pool,
        "INSERT INTO history_request_sources (history_request_id, source_run_id) VALUES ($1, $2)",
        &[request, runs[0]],
    )
    .await;
    let own_fragment = id(
        pool,
        "INSERT INTO fragments (account_id, content) VALUES ($1, 'own') RETURNING id",
        &[account],
    )
    .await;
    let shared_fragment = id(
        pool,
        "INSERT INTO fragments (account_id, content) VALUES ($1, 'shared') RETURNING id",
        &[account],
    )
    .await;
    let body = |fragments: &[Uuid]| {
        serde_json::json!({"fragments": fragments.iter()
            .map(|f| serde_json::json!({"fragment_id": f.to_string(), "upload_binding": null}))
            .collect::<Vec<_>>()})
    };
    for (variant, fragments) in [
        (variants[0], vec![own_fragment, shared_fragment]),
        (other.variant.unwrap(), vec![shared_fragment]),
    ] {
        sqlx::query("INSERT INTO follow_ups (variant_id, body) VALUES ($1, $2)")
            .bind(variant)
            .bind(body(&fragments))
            .execute(pool)
            .await
            .unwrap();
    }
    for conv in [conversation, other_conversation] {
        exec(
            pool,
            "INSERT INTO conversation_events (conversation_id, kind) VALUES ($1, 'delta')",
            &[conv],
        )
        .await;
    }
    let agent = fixture::agent(pool, account).await;
    let session = fixture::session(pool, account, agent, "task", 3, None).await;
    let other_session =
        fixture::session(pool, account, agent, "main", 3, Some("main_session_id")).await;
    for s in [session, other_session] {
        exec(
            pool,
            "INSERT INTO conversation_entries (session_id, entry_id) VALUES ($1, 'e1')",
            &[s],
        )
        .await;
        write(
            &paths
                .sessions_root
                .join(s.to_string())
                .join("history.jsonl"),
            b"{}",
        );
    }
    let archive = id(
        pool,
        "INSERT INTO conversation_archives (session_id) VALUES ($1) RETURNING id",
        &[session],
    )
    .await;
    exec(
        pool,
        "INSERT INTO conversation_archive_entries (archive_id, entry_id) VALUES ($1, 'a1')",
        &[archive],
    )
    .await;
    write(
        &paths
            .sessions_root
            .join(session.to_string())
            .join(format!("archive/compaction-{archive}.frame")),
        b"frame",
    );
    exec(
        pool,
        "INSERT INTO handoffs (account_id, agent_id, from_session_id, to_session_id)
         VALUES ($1, $2, $3, NULL)",
        &[account, agent, session],
    )
    .await;
    for sql in [
        "INSERT INTO dream_preloads (account_id, agent_id) VALUES ($1, $2)",
        "INSERT INTO working_records (account_id, agent_id, pinned) VALUES ($1, $2, true)",
        "INSERT INTO brain_memories (account_id, agent_id, revision, deleted_at) VALUES ($1, $2, 1, now())",
        "INSERT INTO brain_memories (account_id, agent_id, revision) VALUES ($1, $2, 2)",
    ] {
        exec(pool, sql, &[account, agent]).await;
    }
    let trace = |s: Uuid| {
        format!(
            "{{\"format\":\"run-trace/1\",\"agent_id\":\"{agent}\",\"session_id\":\"{s}\"}}\n{{}}\n"
        )
    };
    let session_trace = PathBuf::from(format!("{agent}/{session}.trace.jsonl"));
    let other_trace = PathBuf::from(format!("{agent}/{other_session}.trace.jsonl"));
    write(
        &paths.traces_root.join(&session_trace),
        trace(session).as_bytes(),
    );
    write(
        &paths.traces_root.join(&other_trace),
        trace(other_session).as_bytes(),
    );
    exec(
        pool,
        "INSERT INTO board_tasks (account_id, status) VALUES ($1, 'done')",
        &[account],
    )
    .await;
    exec(
        pool,
        "INSERT INTO session_retention_policies (account_id, enabled) VALUES ($1, false)",
        &[account],
    )
    .await;
    let attachment_file = PathBuf::from(format!("{account}/a.bin"));
    write(&paths.attachments_root.join(&attachment_file), b"attached");
    sqlx::query("INSERT INTO attachments (account_id, relative_path, bytes) VALUES ($1, $2, 8)")
        .bind(account)
        .bind(attachment_file.to_str().unwrap())
        .execute(pool)
        .await
        .unwrap();
    Tenant {
        account,
        conversation,
        other_conversation,
        runs,
        child_run,
        other_run,
        own_fragment,
        shared_fragment,
        agent,
        session,
        other_session,
        session_trace,
        other_trace,
        attachment_file,
    }
}
