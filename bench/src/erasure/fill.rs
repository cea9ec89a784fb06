//! The erasure part's data: one account to erase (its runs with execution detail, sessions with
//! history, and its files in every root) beside other accounts whose nightly pass runs at the
//! same time, all by plain SQL over `generate_series`; the file tree written afresh for each
//! method from the rows, in parallel; and the end state every method is checked by.
//!
//! Everything of the erased account is young (a day old), so that the nightly pass leaves it
//! alone: what the night does to it and what the erasure does never mix. Each other account is
//! a many-accounts night's due account (bench/src/tenants/accounts.rs): a 30-day window, an
//! enabled session policy, a young run and session, and a small backlog (old runs with detail
//! and an output file each, one held back by a pending settlement; an old main session with its
//! history and directory; an old attachment).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::sexton::ROOTS;

/// How much the erased account holds, and how many other accounts there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    pub runs: u64,
    pub sessions: u64,
    pub files: u64,
    pub others: u64,
}

impl Sizes {
    /// Conversations of the erased account: a hundred runs each.
    fn conversations(&self) -> u64 {
        self.runs.div_ceil(100).max(1)
    }

    /// Agents of the erased account: a hundred sessions each.
    fn agents(&self) -> u64 {
        self.sessions.div_ceil(100).max(1)
    }

    /// The erased account's files per root: half outputs, a quarter session frames, 15 %
    /// attachments, the rest traces.
    pub fn split(&self) -> [(&'static str, u64); 4] {
        let outputs = (self.files / 2).min(self.runs);
        let frames = (self.files / 4).min(self.sessions);
        let attachments = self.files * 15 / 100;
        let traces = self.files.saturating_sub(outputs + frames + attachments);
        [
            ("outputs", outputs),
            ("sessions", frames),
            ("attachments", attachments),
            ("traces", traces),
        ]
    }
}

/// `days` before `now`, as an SQL timestamp.
fn at(now: DateTime<Utc>, days: i64) -> String {
    format!(
        "'{}'::timestamptz",
        (now - chrono::Duration::days(days)).to_rfc3339()
    )
}

/// Fills the migrated database on `pool`: the erased account (returned) and the other accounts,
/// then `VACUUM (FREEZE, ANALYZE)`.
pub async fn fill(pool: &PgPool, sizes: Sizes, now: DateTime<Utc>) -> anyhow::Result<Uuid> {
    let mut conn = pool.acquire().await?;
    for statement in erased(sizes, now).into_iter().chain(others(sizes, now)) {
        sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
            .execute(&mut *conn)
            .await
            .with_context(|| format!("filling: {statement}"))?;
    }
    let account: Uuid = sqlx::query_scalar("SELECT id FROM erased")
        .fetch_one(&mut *conn)
        .await?;
    drop(conn);
    sqlx::query("VACUUM (FREEZE, ANALYZE)")
        .execute(pool)
        .await?;
    Ok(account)
}

/// The statements that make the erased account and everything it holds.
fn erased(s: Sizes, now: DateTime<Utc>) -> Vec<String> {
    let (runs, sessions) = (s.runs, s.sessions);
    let (conversations, agents) = (s.conversations(), s.agents());
    let [(_, outputs), _, (_, attachments), _] = s.split();
    let day = at(now, 1);
    let output_every = runs.checked_div(outputs).unwrap_or(0);
    vec![
        "CREATE TEMP TABLE erased AS SELECT gen_random_uuid() AS id".into(),
        "INSERT INTO accounts (id, name, execution_details_retention_days)
         SELECT id, 'erased', 90 FROM erased"
            .into(),
        "INSERT INTO session_retention_policies (account_id) SELECT id FROM erased".into(),
        format!(
            "CREATE TEMP TABLE e_conv AS
             SELECT n, gen_random_uuid() AS id FROM generate_series(0, {conversations} - 1) n"
        ),
        format!(
            "INSERT INTO conversations (id, account_id, created_at)
             SELECT c.id, e.id, {day} FROM e_conv c, erased e"
        ),
        // Ten turns per conversation, a variant each, a follow-up each naming a fragment of
        // its own.
        "CREATE TEMP TABLE e_turn AS
         SELECT c.n AS conv, c.id AS conversation, k, gen_random_uuid() AS turn,
                gen_random_uuid() AS variant, gen_random_uuid() AS fragment
         FROM e_conv c CROSS JOIN generate_series(0, 9) k"
            .into(),
        "INSERT INTO turns (id, conversation_id, position) SELECT turn, conversation, k FROM e_turn"
            .into(),
        "INSERT INTO variants (id, turn_id, prompt, requested_model, final_content, selected)
         SELECT variant, turn, 'a prompt', 'model-a', 'an answer', true FROM e_turn"
            .into(),
        "INSERT INTO fragments (id, account_id, content)
         SELECT t.fragment, e.id, 'a fragment' FROM e_turn t, erased e"
            .into(),
        "INSERT INTO follow_ups (variant_id, position, body)
         SELECT variant, 0, jsonb_build_object('fragments', jsonb_build_array(
                    jsonb_build_object('fragment_id', fragment::text, 'upload_binding', null)))
         FROM e_turn"
            .into(),
        format!(
            "CREATE TEMP TABLE e_run AS
             SELECT g.n, gen_random_uuid() AS id, c.id AS conversation, t.variant
             FROM generate_series(0, {runs} - 1) g (n)
             JOIN e_conv c ON c.n = g.n % {conversations}
             JOIN e_turn t ON t.conv = c.n AND t.k = (g.n / {conversations}) % 10"
        ),
        format!(
            "INSERT INTO runs (id, account_id, conversation_id, variant_id, kind, status,
                               requested_model, terminal_model, delivered_at, completed_at,
                               terminal_at, settled_at, created_at)
             SELECT r.id, e.id, r.conversation, r.variant, 'conversation', 'completed',
                    'model-a', 'model-a', {day}, {day}, {day}, {day}, {day}
             FROM e_run r, erased e"
        ),
        "CREATE TEMP TABLE e_task AS
         SELECT id AS run, gen_random_uuid() AS root, gen_random_uuid() AS leaf FROM e_run"
            .into(),
        "INSERT INTO run_tasks (id, run_id, parent_task_id, name, input, output)
         SELECT root, run, NULL::uuid, 'root', '{\"q\": \"a question\"}'::jsonb,
                '{\"a\": \"an answer\"}'::jsonb
         FROM e_task
         UNION ALL
         SELECT leaf, run, root, 'tool', '{\"q\": \"search\"}', '{\"a\": \"results\"}' FROM e_task"
            .into(),
        "INSERT INTO run_task_edges (run_id, from_task_id, to_task_id)
         SELECT run, root, leaf FROM e_task"
            .into(),
        "INSERT INTO tool_results (run_id, task_id, tool_name, body)
         SELECT run, leaf, 'search', repeat('result ', 20) FROM e_task"
            .into(),
        "INSERT INTO sealed_requests (run_id, provider, request, response)
         SELECT id, 'provider-a', '{\"messages\": [\"a prompt\"]}', '{\"content\": \"an answer\"}'
         FROM e_run"
            .into(),
        "INSERT INTO reasoning_traces (run_id, content) SELECT id, repeat('thought ', 20) FROM e_run"
            .into(),
        format!(
            "INSERT INTO invocation_attempts (run_id, attempt, status, started_at, ended_at)
             SELECT id, 1, 'succeeded', {day}, {day} FROM e_run"
        ),
        format!(
            "INSERT INTO settlement_receipts (run_id, status, settled_at)
             SELECT id, 'settled', {day} FROM e_run"
        ),
        // A run in fifty delegates to the next one.
        "INSERT INTO delegations (parent_run_id, child_run_id, status)
         SELECT p.id, c.id, 'returned' FROM e_run p JOIN e_run c ON c.n = p.n + 1
         WHERE p.n % 50 = 0"
            .into(),
        // A sealed history request per conversation, on its first run, with two sources.
        format!(
            "CREATE TEMP TABLE e_hreq AS
             SELECT gen_random_uuid() AS id, c.id AS conversation, r.id AS run, r2.id AS other
             FROM e_conv c
             JOIN e_run r ON r.n = c.n
             LEFT JOIN e_run r2 ON r2.n = c.n + {conversations}"
        ),
        format!(
            "INSERT INTO history_requests (id, conversation_id, run_id, sealed_at)
             SELECT id, conversation, run, {day} FROM e_hreq"
        ),
        "INSERT INTO history_request_sources (history_request_id, source_run_id)
         SELECT id, run FROM e_hreq
         UNION ALL SELECT id, other FROM e_hreq WHERE other IS NOT NULL"
            .into(),
        "INSERT INTO usage_records (account_id, run_id, conversation_id, tokens, cost_micros)
         SELECT e.id, r.id, r.conversation, 1000, 20 FROM e_run r, erased e WHERE r.n % 10 = 0"
            .into(),
        "INSERT INTO conversation_events (conversation_id, run_id, kind, payload)
         SELECT conversation, id, 'delivered', '{}' FROM e_run WHERE n % 10 = 0"
            .into(),
        format!(
            "INSERT INTO output_files (run_id, relative_path, bytes)
             SELECT r.id, e.id || '/' || r.id || '/out.bin', 512
             FROM e_run r, erased e
             WHERE {output_every} > 0 AND r.n % {output_every} = 0 AND r.n / {output_every} < {outputs}"
        ),
        // Agents, a hundred sessions each, with history and archives.
        format!(
            "CREATE TEMP TABLE e_agent AS
             SELECT n, gen_random_uuid() AS id FROM generate_series(0, {agents} - 1) n"
        ),
        "INSERT INTO agents (id, account_id, name)
         SELECT a.id, e.id, 'agent ' || a.n FROM e_agent a, erased e"
            .into(),
        format!(
            "CREATE TEMP TABLE e_session AS
             SELECT g.n, gen_random_uuid() AS id, a.id AS agent
             FROM generate_series(0, {sessions} - 1) g (n) JOIN e_agent a ON a.n = g.n % {agents}"
        ),
        format!(
            "INSERT INTO sessions (id, account_id, agent_id, kind, state, last_activity_at,
                                   created_at)
             SELECT s.id, e.id, s.agent, CASE WHEN s.n < {agents} THEN 'main' ELSE 'task' END,
                    'completed', {day}, {day}
             FROM e_session s, erased e"
        ),
        "INSERT INTO conversation_entries (session_id, entry_id, seq, payload)
         SELECT s.id, 'e' || k, k, json_build_object('role', 'user', 'text', 'an entry')
         FROM e_session s CROSS JOIN generate_series(1, 10) k"
            .into(),
        "CREATE TEMP TABLE e_archive AS
         SELECT gen_random_uuid() AS id, id AS session FROM e_session"
            .into(),
        "INSERT INTO conversation_archives (id, session_id, kind, generation)
         SELECT id, session, 'compaction', 1 FROM e_archive"
            .into(),
        "INSERT INTO conversation_archive_entries (archive_id, entry_id, seq, payload)
         SELECT a.id, 'a' || k, k, json_build_object('text', 'an archived entry')
         FROM e_archive a CROSS JOIN generate_series(1, 5) k"
            .into(),
        "INSERT INTO handoffs (account_id, agent_id, from_session_id, payload)
         SELECT e.id, s.agent, s.id, '{}' FROM e_session s, erased e"
            .into(),
        "INSERT INTO dream_preloads (account_id, agent_id)
         SELECT e.id, a.id FROM e_agent a, erased e CROSS JOIN generate_series(1, 2)"
            .into(),
        "INSERT INTO working_records (account_id, agent_id, kind, pinned)
         SELECT e.id, a.id, 'record', k = 1 FROM e_agent a, erased e
         CROSS JOIN generate_series(1, 5) k"
            .into(),
        "INSERT INTO brain_memories (account_id, agent_id, revision, deleted_at)
         SELECT e.id, a.id, k, CASE WHEN k = 1 THEN now() END FROM e_agent a, erased e
         CROSS JOIN generate_series(1, 5) k"
            .into(),
        "INSERT INTO board_tasks (account_id, status)
         SELECT e.id, 'done' FROM erased e CROSS JOIN generate_series(1, 100)"
            .into(),
        format!(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             SELECT e.id, e.id || '/attachment-' || k || '.bin', 512, {day}
             FROM erased e CROSS JOIN generate_series(1, {attachments}) k"
        ),
    ]
}

/// Old runs per other account, one of them held back by a pending settlement.
const OLD_RUNS: i64 = 3;

/// The statements that make the other accounts: every one a due account of the many-accounts
/// night.
fn others(s: Sizes, now: DateTime<Utc>) -> Vec<String> {
    let (young, old, stale) = (at(now, 3), at(now, 60), at(now, 100));
    let accounts = s.others;
    vec![
        format!(
            "CREATE TEMP TABLE tenant AS
             SELECT n, gen_random_uuid() AS id, gen_random_uuid() AS conversation,
                    gen_random_uuid() AS agent
             FROM generate_series(1, {accounts}) n"
        ),
        "INSERT INTO accounts (id, name, execution_details_retention_days)
         SELECT id, 'tenant ' || n, 30 FROM tenant"
            .into(),
        "INSERT INTO conversations (id, account_id) SELECT conversation, id FROM tenant".into(),
        "INSERT INTO agents (id, account_id) SELECT agent, id FROM tenant".into(),
        "INSERT INTO session_retention_policies (account_id, enabled) SELECT id, true FROM tenant"
            .into(),
        format!(
            "INSERT INTO runs (account_id, conversation_id, status, completed_at)
             SELECT id, conversation, 'completed', {young} FROM tenant"
        ),
        format!(
            "INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
             SELECT id, agent, 'main', 'idle', {young} FROM tenant"
        ),
        format!(
            "CREATE TEMP TABLE old_run AS
             SELECT gen_random_uuid() AS run, t.id AS account, t.conversation, k = 1 AS held
             FROM tenant t CROSS JOIN generate_series(1, {OLD_RUNS}) k"
        ),
        format!(
            "INSERT INTO runs (id, account_id, conversation_id, status, completed_at)
             SELECT run, account, conversation, 'completed', {old} FROM old_run"
        ),
        "INSERT INTO run_tasks (run_id, name) SELECT run, 'root' FROM old_run".into(),
        "INSERT INTO tool_results (run_id, tool_name, body)
         SELECT run, 'search', 'results' FROM old_run"
            .into(),
        "INSERT INTO output_files (run_id, relative_path, bytes)
         SELECT run, account || '/' || run || '/out.bin', 5 FROM old_run"
            .into(),
        "INSERT INTO settlement_receipts (run_id, status)
         SELECT run, 'pending' FROM old_run WHERE held"
            .into(),
        format!(
            "INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
             SELECT id, agent, 'main', 'completed', {stale} FROM tenant"
        ),
        format!(
            "INSERT INTO conversation_entries (session_id, entry_id)
             SELECT id, 'e1' FROM sessions WHERE last_activity_at = {stale}"
        ),
        format!(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             SELECT id, id || '/a.bin', 5, {old} FROM tenant"
        ),
    ]
}

/// One file of the tree: its path under the run's files, its modification time and its first
/// line (a trace's signature; empty for other files).
#[derive(Debug, Clone)]
pub struct File {
    pub path: PathBuf,
    pub mtime: DateTime<Utc>,
    pub body: String,
}

/// The files the rows of the template on `pool` lead to, and the erased account's traces:
/// every output file, attachment and session frame (the other accounts' old ones 60 days old,
/// the erased account's a day old), and the erased account's traces, each naming one of its
/// agent's sessions.
pub async fn files(pool: &PgPool, sizes: Sizes, now: DateTime<Utc>) -> anyhow::Result<Vec<File>> {
    let [_, (_, frames), _, (_, traces)] = sizes.split();
    let erased: Uuid = sqlx::query_scalar("SELECT id FROM accounts WHERE name = 'erased'")
        .fetch_one(pool)
        .await?;
    let mut files = Vec::new();
    let (old, young) = (
        now - chrono::Duration::days(60),
        now - chrono::Duration::days(1),
    );
    let mut add = |root: &str, relative: String, mtime, body: String| {
        files.push(File {
            path: Path::new(root).join(relative),
            mtime,
            body,
        });
    };
    let outputs: Vec<(String, bool)> = sqlx::query_as(
        "SELECT o.relative_path, r.account_id = $1 FROM output_files o JOIN runs r ON r.id = o.run_id",
    )
    .bind(erased)
    .fetch_all(pool)
    .await?;
    let attachments: Vec<(String, bool)> =
        sqlx::query_as("SELECT relative_path, account_id = $1 FROM attachments")
            .bind(erased)
            .fetch_all(pool)
            .await?;
    for (root, rows) in [("outputs", outputs), ("attachments", attachments)] {
        for (path, mine) in rows {
            add(root, path, if mine { young } else { old }, String::new());
        }
    }
    let old_sessions: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM sessions WHERE state = 'completed' AND account_id <> $1",
    )
    .bind(erased)
    .fetch_all(pool)
    .await?;
    for session in old_sessions {
        add(
            "sessions",
            format!("{session}/frame.json"),
            old,
            String::new(),
        );
    }
    let mine: Vec<(Uuid, Uuid)> =
        sqlx::query_as("SELECT id, agent_id FROM sessions WHERE account_id = $1 ORDER BY id")
            .bind(erased)
            .fetch_all(pool)
            .await?;
    for (session, _) in mine.iter().take(usize::try_from(frames)?) {
        add(
            "sessions",
            format!("{session}/archive/compaction-{session}.frame"),
            young,
            String::new(),
        );
    }
    if !mine.is_empty() {
        for n in 0..usize::try_from(traces)? {
            let (session, agent) = mine[n % mine.len()];
            let signature = serde_json::json!({
                "format": "run-trace/1",
                "agent_id": agent,
                "session_id": session,
            });
            add(
                "traces",
                format!("{agent}/run-{n}.trace.jsonl"),
                young,
                signature.to_string(),
            );
        }
    }
    Ok(files)
}

/// Writes `files` under `root` afresh (the roots emptied first), on a few threads, each file's
/// body its first line and a kilobyte after it, its modification time set; then syncs.
pub async fn write_tree(root: &Path, files: &[File]) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(root);
    for (_, dir) in ROOTS {
        std::fs::create_dir_all(root.join(dir))?;
    }
    let chunks: Vec<Vec<File>> = files
        .chunks(files.len().div_ceil(4).max(1))
        .map(<[File]>::to_vec)
        .collect();
    let mut writers = Vec::new();
    for chunk in chunks {
        let root = root.to_owned();
        writers.push(tokio::task::spawn_blocking(
            move || -> anyhow::Result<()> {
                let filler = "x".repeat(1024);
                for file in chunk {
                    let path = root.join(&file.path);
                    std::fs::create_dir_all(path.parent().context("a parent")?)?;
                    std::fs::write(&path, format!("{}\n{filler}\n", file.body))?;
                    let mtime = std::time::UNIX_EPOCH
                        + Duration::from_secs(u64::try_from(file.mtime.timestamp())?);
                    std::fs::File::options()
                        .write(true)
                        .open(&path)?
                        .set_modified(mtime)?;
                }
                Ok(())
            },
        ));
    }
    for writer in writers {
        writer.await??;
    }
    crate::disk::sync();
    Ok(())
}

/// The files left under `root`, by path relative to it.
pub fn files_left(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(entry.path());
            } else {
                let path = entry.path();
                left.push(path.strip_prefix(root)?.to_string_lossy().into_owned());
            }
        }
    }
    left.sort();
    Ok(left)
}

/// What a database holds, table by table of the platform's (`public`) schema: rows and a digest
/// of their text. The accounts' `name` is left out: an erasure that keeps usage records keeps
/// the account row as their anchor, named after the request (RQ-2), which a floor has not.
pub type Digest = BTreeMap<String, (i64, String)>;

/// The digest of the database on `pool`.
pub async fn digest(pool: &PgPool) -> anyhow::Result<Digest> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    let mut digest = Digest::new();
    for table in tables {
        let row = if table == "accounts" {
            "(t.id, t.execution_details_retention_days, t.created_at)::text"
        } else {
            "t::text"
        };
        let (n, md5): (i64, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*), md5(string_agg({row}, ',' ORDER BY {row})) FROM {table} t"
        )))
        .fetch_one(pool)
        .await?;
        digest.insert(table, (n, md5.unwrap_or_default()));
    }
    Ok(digest)
}

/// What is left of the erased account `account` on `pool`, table by table (rows that still
/// name it or one of its runs, conversations, sessions or agents, by their ids as the template
/// had them): only its account row and its usage records, unlinked, may stay.
pub async fn left_of(pool: &PgPool, account: Uuid) -> anyhow::Result<()> {
    let left: Vec<(String, i64)> = sqlx::query_as(
        "SELECT t, n FROM (VALUES
            ('runs', (SELECT count(*) FROM runs WHERE account_id = $1)),
            ('run_tasks', (SELECT count(*) FROM run_tasks x
                           WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = x.run_id))),
            ('conversations', (SELECT count(*) FROM conversations WHERE account_id = $1)),
            ('turns', (SELECT count(*) FROM turns x WHERE NOT EXISTS
                           (SELECT 1 FROM conversations c WHERE c.id = x.conversation_id))),
            ('fragments', (SELECT count(*) FROM fragments WHERE account_id = $1)),
            ('sessions', (SELECT count(*) FROM sessions WHERE account_id = $1)),
            ('conversation_entries', (SELECT count(*) FROM conversation_entries x WHERE NOT EXISTS
                           (SELECT 1 FROM sessions s WHERE s.id = x.session_id))),
            ('agents', (SELECT count(*) FROM agents WHERE account_id = $1)),
            ('handoffs', (SELECT count(*) FROM handoffs WHERE account_id = $1)),
            ('brain_memories', (SELECT count(*) FROM brain_memories WHERE account_id = $1)),
            ('attachments', (SELECT count(*) FROM attachments WHERE account_id = $1)),
            ('board_tasks', (SELECT count(*) FROM board_tasks WHERE account_id = $1)),
            ('linked usage_records', (SELECT count(*) FROM usage_records WHERE account_id = $1
                                      AND (run_id IS NOT NULL OR conversation_id IS NOT NULL)))
         ) AS c (t, n) WHERE n > 0",
    )
    .bind(account)
    .fetch_all(pool)
    .await?;
    if !left.is_empty() {
        bail!("the erased account still has rows: {left:?}");
    }
    Ok(())
}
