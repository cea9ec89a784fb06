//! The accounts of a many-accounts night and what the rules leave of them: every account with a
//! 30-day window, an enabled session policy, a young run and a young session; the due ones with
//! a small backlog each (old runs with detail and output files, one held back by EX-5, an old
//! main session with its history and directory, an expired attachment), all by plain SQL over
//! `generate_series`; and the end state a night is checked against.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::disk;

/// Old runs per due account, one of them held back.
const OLD_RUNS: i64 = 3;

/// The accounts and their rows (plain SQL over `generate_series`), aged from `now` (the night's
/// slot is at most a day earlier), then the due accounts' files.
pub async fn fill(
    pool: &PgPool,
    roots: &Path,
    now: DateTime<Utc>,
    accounts: u64,
    due: u64,
) -> anyhow::Result<()> {
    let statements = every_account(now, accounts, due)
        .into_iter()
        .chain(backlog(now));
    let mut conn = pool.acquire().await?;
    for statement in statements {
        sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
            .execute(&mut *conn)
            .await
            .with_context(|| format!("filling: {statement}"))?;
    }
    drop(conn);
    sqlx::query("VACUUM (FREEZE, ANALYZE)")
        .execute(pool)
        .await?;
    write_files(pool, roots, now).await
}

/// `days` before `now`, as an SQL timestamp.
fn at(now: DateTime<Utc>, days: i64) -> String {
    format!(
        "'{}'::timestamptz",
        (now - chrono::Duration::days(days)).to_rfc3339()
    )
}

/// The statements that make the `accounts` accounts (the first `due` of them due) in a
/// temporary table `tenant`, and what every one holds: a 30-day window, an enabled session
/// policy, a conversation with a young run and an agent with a young session.
fn every_account(now: DateTime<Utc>, accounts: u64, due: u64) -> Vec<String> {
    let young = at(now, 3);
    vec![
        format!(
            "CREATE TEMP TABLE tenant AS
             SELECT n, gen_random_uuid() AS id, gen_random_uuid() AS conversation,
                    gen_random_uuid() AS agent, n <= {due} AS due
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
            "INSERT INTO sessions (account_id, agent_id, kind, last_activity_at)
             SELECT id, agent, 'main', {young} FROM tenant"
        ),
    ]
}

/// The statements that give each due account of `tenant` its backlog: the old runs with
/// detail and an output file each, one held back by a pending settlement; an old main session
/// with its history row; an old attachment.
fn backlog(now: DateTime<Utc>) -> Vec<String> {
    let (old, stale) = (at(now, 60), at(now, 100));
    vec![
        format!(
            "CREATE TEMP TABLE old_run AS
             SELECT gen_random_uuid() AS run, t.id AS account, t.conversation, k = 1 AS held
             FROM tenant t CROSS JOIN generate_series(1, {OLD_RUNS}) k WHERE t.due"
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
             SELECT id, agent, 'main', 'completed', {stale} FROM tenant WHERE due"
        ),
        format!(
            "INSERT INTO conversation_entries (session_id, entry_id)
             SELECT id, 'e1' FROM sessions WHERE last_activity_at = {stale}"
        ),
        format!(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             SELECT id, id || '/a.bin', 5, {old} FROM tenant WHERE due"
        ),
    ]
}

/// The due accounts' files under `roots`, each 60 days old: every old run's output, every old
/// session's directory (a frame in it) and every attachment's file; then syncs.
async fn write_files(pool: &PgPool, roots: &Path, now: DateTime<Utc>) -> anyhow::Result<()> {
    let outputs: Vec<String> = sqlx::query_scalar("SELECT relative_path FROM output_files")
        .fetch_all(pool)
        .await?;
    let sessions: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM sessions WHERE state = 'completed'")
            .fetch_all(pool)
            .await?;
    let attachments: Vec<String> = sqlx::query_scalar("SELECT relative_path FROM attachments")
        .fetch_all(pool)
        .await?;
    let old_mtime = std::time::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(
            (now - chrono::Duration::days(60)).timestamp(),
        )?);
    for (root, relative) in outputs
        .iter()
        .map(|p| ("outputs", p.clone()))
        .chain(
            sessions
                .iter()
                .map(|s| ("sessions", format!("{s}/frame.json"))),
        )
        .chain(attachments.iter().map(|p| ("attachments", p.clone())))
    {
        let path = roots.join(root).join(relative);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        let file = std::fs::File::create(&path)?;
        file.set_modified(old_mtime)?;
    }
    disk::sync();
    Ok(())
}

/// The end state the rules give: the two free old runs of each due account pruned and their
/// files gone, the held one and every young run untouched; each old session and its directory
/// gone, every young one kept; each old attachment expired and its file gone.
pub async fn check(
    pool: &PgPool,
    roots: &Path,
    now: DateTime<Utc>,
    due: u64,
) -> anyhow::Result<()> {
    let due = i64::try_from(due)?;
    let (pruned, unpruned_old, old_sessions, young_sessions, expired, pending): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs WHERE details_pruned_at IS NOT NULL),
                (SELECT count(*) FROM runs r WHERE details_pruned_at IS NULL AND completed_at < $1
                   AND EXISTS (SELECT 1 FROM output_files f WHERE f.run_id = r.id)),
                (SELECT count(*) FROM sessions WHERE state = 'completed'),
                (SELECT count(*) FROM sessions WHERE state = 'idle'),
                (SELECT count(*) FROM attachments WHERE bytes_expired_at IS NOT NULL),
                (SELECT count(*) FROM sexton.pending_file_deletions)",
    )
    .bind(now - chrono::Duration::days(30))
    .fetch_one(pool)
    .await?;
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(pool)
        .await?;
    let files = |root: &str| disk::files_left(&roots.join(root));
    let (outputs, session_files, attachment_files) =
        (files("outputs")?, files("sessions")?, files("attachments")?);
    let expected = (
        (OLD_RUNS - 1) * due,
        due,
        0,
        accounts,
        due,
        0,
        u64::try_from(due)?,
        0,
        0,
    );
    let found = (
        pruned,
        unpruned_old,
        old_sessions,
        young_sessions,
        expired,
        pending,
        outputs,
        session_files,
        attachment_files,
    );
    if found != expected {
        bail!(
            "the night did not end as the rules say: (pruned runs, held old runs, old sessions, \
             young sessions, expired attachments, pending deletions, output files, session \
             files, attachment files) = {found:?}, expected {expected:?}"
        );
    }
    Ok(())
}
