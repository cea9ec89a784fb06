//! Platform rows written with plain SQL, as the platform (and acceptance tests) would.

use std::path::Path;

use chrono::{DateTime, Duration, Utc};
use sexton_jobs::estimate::Read;
use sexton_jobs::job::Inspect;
use sqlx::PgPool;
use uuid::Uuid;

pub fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// Sets the modification time of the file or directory at `path`: how a test ages what it wrote.
pub fn set_mtime(path: &Path, at: impl Into<std::time::SystemTime>) {
    let opened = if path.is_dir() {
        std::fs::File::open(path)
    } else {
        std::fs::File::options().write(true).open(path)
    };
    opened
        .and_then(|file| file.set_times(std::fs::FileTimes::new().set_modified(at.into())))
        .unwrap_or_else(|err| panic!("setting the mtime of {}: {err}", path.display()));
}

/// The moment every test pass starts at: in the past, so that the database's now (which caps
/// every cutoff, EX-1) never binds and the tests' clock decides.
pub fn pass_start() -> DateTime<Utc> {
    at("2026-11-01T03:00:00Z")
}

pub fn days_before_pass(days: f64) -> DateTime<Utc> {
    pass_start() - Duration::seconds((days * 86_400.0) as i64)
}

pub async fn account(pool: &PgPool, days: Option<i32>) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO accounts (name, execution_details_retention_days) VALUES ('t', $1) RETURNING id",
    )
    .bind(days)
    .fetch_one(pool)
    .await
    .unwrap()
}

pub async fn conversation(pool: &PgPool, account: Uuid) -> Uuid {
    sqlx::query_scalar("INSERT INTO conversations (account_id) VALUES ($1) RETURNING id")
        .bind(account)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Locks `conversation` in the transaction of `conn` as a platform writer does (EX-6: the
/// conversation first), until that transaction ends.
pub async fn lock_conversation(conn: &mut sqlx::PgConnection, conversation: Uuid) {
    sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
        .bind(conversation)
        .execute(conn)
        .await
        .unwrap();
}

/// A run to insert; `completed_at` etc. as the case needs.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub account: Uuid,
    pub conversation: Option<Uuid>,
    pub kind: &'static str,
    pub completed_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub terminal_at: Option<DateTime<Utc>>,
    pub settled_at: Option<DateTime<Utc>>,
    pub parent: Option<Uuid>,
    /// Put the run on this turn as another (regenerated) variant instead of a new turn.
    pub turn: Option<Uuid>,
}

impl RunSpec {
    /// A completed conversation run, `days` before the pass.
    pub fn conversation(account: Uuid, conversation: Uuid, days: f64) -> Self {
        Self {
            account,
            conversation: Some(conversation),
            kind: "conversation",
            completed_at: Some(days_before_pass(days)),
            delivered_at: Some(days_before_pass(days)),
            terminal_at: None,
            settled_at: None,
            parent: None,
            turn: None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub id: Uuid,
    pub variant: Option<Uuid>,
    pub turn: Option<Uuid>,
}

/// Inserts a run with a turn and variant (for conversation runs), one row in each of the seven
/// detail tables and an output file on disk under `output_root`.
pub async fn run(pool: &PgPool, output_root: &Path, spec: RunSpec) -> Run {
    let (turn, variant) = match spec.conversation {
        Some(conversation) if spec.parent.is_none() => {
            let turn = match spec.turn {
                Some(turn) => turn,
                None => sqlx::query_scalar(
                    "INSERT INTO turns (conversation_id, position)
                     SELECT $1, count(*) FROM turns WHERE conversation_id = $1 RETURNING id",
                )
                .bind(conversation)
                .fetch_one(pool)
                .await
                .unwrap(),
            };
            let variant: Uuid = sqlx::query_scalar(
                "INSERT INTO variants (turn_id, prompt, requested_model, final_content, selected)
                 VALUES ($1, 'the question', 'atlas-large', 'the answer', true) RETURNING id",
            )
            .bind(turn)
            .fetch_one(pool)
            .await
            .unwrap();
            (Some(turn), Some(variant))
        }
        _ => (None, None),
    };
    let id: Uuid = sqlx::query_scalar(
        "INSERT INTO runs (account_id, conversation_id, variant_id, parent_run_id, kind, status,
                           requested_model, terminal_model, completed_at, delivered_at,
                           terminal_at, settled_at)
         VALUES ($1, $2, $3, $4, $5, 'completed', 'atlas-large', 'atlas-small', $6, $7, $8, $9)
         RETURNING id",
    )
    .bind(spec.account)
    .bind(spec.conversation)
    .bind(variant)
    .bind(spec.parent)
    .bind(spec.kind)
    .bind(spec.completed_at)
    .bind(spec.delivered_at)
    .bind(spec.terminal_at)
    .bind(spec.settled_at)
    .fetch_one(pool)
    .await
    .unwrap();
    let task: Uuid = sqlx::query_scalar(
        "INSERT INTO run_tasks (run_id, name, input, output) VALUES ($1, 'root', '{\"q\":1}', '{\"a\":2}') RETURNING id",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    let relative = format!("{}/{id}/out.bin", spec.account);
    for statement in [
        "INSERT INTO run_task_edges (run_id, from_task_id, to_task_id) VALUES ($1, $2, $2)",
        "INSERT INTO tool_results (run_id, task_id, tool_name, body) VALUES ($1, $2, 'search', 'results')",
    ] {
        sqlx::query(statement)
            .bind(id)
            .bind(task)
            .execute(pool)
            .await
            .unwrap();
    }
    for statement in [
        "INSERT INTO sealed_requests (run_id, provider, request, response) VALUES ($1, 'p', '{}', '{}')",
        "INSERT INTO reasoning_traces (run_id, content) VALUES ($1, 'because')",
        "INSERT INTO invocation_attempts (run_id, attempt, status) VALUES ($1, 1, 'succeeded')",
    ] {
        sqlx::query(statement).bind(id).execute(pool).await.unwrap();
    }
    sqlx::query("INSERT INTO output_files (run_id, relative_path, bytes) VALUES ($1, $2, 5)")
        .bind(id)
        .bind(&relative)
        .execute(pool)
        .await
        .unwrap();
    let path = output_root.join(&relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"bytes").unwrap();
    Run { id, variant, turn }
}

/// Rows of the run in each of the seven detail tables.
pub async fn detail_rows<'e>(db: impl sqlx::PgExecutor<'e>, run: Uuid) -> i64 {
    sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM run_tasks WHERE run_id = $1)
              + (SELECT count(*) FROM run_task_edges WHERE run_id = $1)
              + (SELECT count(*) FROM tool_results WHERE run_id = $1)
              + (SELECT count(*) FROM sealed_requests WHERE run_id = $1)
              + (SELECT count(*) FROM reasoning_traces WHERE run_id = $1)
              + (SELECT count(*) FROM invocation_attempts WHERE run_id = $1)
              + (SELECT count(*) FROM output_files WHERE run_id = $1)",
    )
    .bind(run)
    .fetch_one(db)
    .await
    .unwrap()
}

/// The run's rows in each detail table, in the order of [`DETAIL_TABLES`].
pub async fn detail_counts(pool: &PgPool, run: Uuid) -> [i64; 7] {
    let mut counts = [0; 7];
    for (count, table) in counts.iter_mut().zip(DETAIL_TABLES) {
        *count = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE run_id = $1"
        )))
        .bind(run)
        .fetch_one(pool)
        .await
        .unwrap();
    }
    counts
}

/// The detail tables, as this oracle lists them (on purpose apart from the job's own list).
pub const DETAIL_TABLES: [&str; 7] = [
    "run_tasks",
    "run_task_edges",
    "tool_results",
    "sealed_requests",
    "reasoning_traces",
    "invocation_attempts",
    "output_files",
];

/// The fixture's detail with a second invocation attempt added by the case.
pub const WITH_SECOND_ATTEMPT: [i64; 7] = [1, 1, 1, 1, 1, 2, 1];

/// Whether the run still has exactly the detail the fixture wrote: one row in each table.
pub async fn has_detail(pool: &PgPool, run: Uuid) -> bool {
    detail_counts(pool, run).await == [1; 7]
}

pub async fn is_pruned(pool: &PgPool, run: Uuid) -> bool {
    let pruned: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT details_pruned_at FROM runs WHERE id = $1")
            .bind(run)
            .fetch_one(pool)
            .await
            .unwrap();
    pruned.is_some()
}

pub async fn is_pruned_any(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM runs WHERE details_pruned_at IS NOT NULL)")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// An agent of `account`.
pub async fn agent(pool: &PgPool, account: Uuid) -> Uuid {
    sqlx::query_scalar("INSERT INTO agents (account_id, name) VALUES ($1, 'agent') RETURNING id")
        .bind(account)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// An idle `kind` session of `agent`, last active `idle_days` before the database's now, that the
/// agent points at with `pointer` (`current_session_id`, `main_session_id`, …) if one is given.
pub async fn session(
    pool: &PgPool,
    account: Uuid,
    agent: Uuid,
    kind: &str,
    idle_days: i32,
    pointer: Option<&str>,
) -> Uuid {
    let session: Uuid = sqlx::query_scalar(
        "INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
         VALUES ($1, $2, $3, 'idle', now() - make_interval(days => $4)) RETURNING id",
    )
    .bind(account)
    .bind(agent)
    .bind(kind)
    .bind(idle_days)
    .fetch_one(pool)
    .await
    .unwrap();
    if let Some(pointer) = pointer {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE agents SET {pointer} = $1 WHERE id = $2"
        )))
        .bind(session)
        .bind(agent)
        .execute(pool)
        .await
        .unwrap();
    }
    session
}

/// The execution-details backlog at `now`, read both ways — account by account through the
/// window index and in one scan of `runs` — which must agree (OP-3).
pub async fn execution_backlog(pool: &PgPool, now: DateTime<Utc>) -> f64 {
    use sexton_jobs::prune_execution_details::PruneExecutionDetails;
    let backlog = PruneExecutionDetails::backlog().unwrap();
    let probes = backlog.read(pool, now, Read::Probes).await.unwrap();
    let scan = backlog.read(pool, now, Read::Scan).await.unwrap();
    assert_eq!(probes, scan, "the backlog read per account and in one scan");
    probes
}

/// The session backlog at `now`, read both ways, which must agree (OP-3).
pub async fn session_backlog(pool: &PgPool, now: DateTime<Utc>) -> f64 {
    use sexton_jobs::session_retention::SessionRetention;
    let backlog = SessionRetention::backlog().unwrap();
    let probes = backlog.read(pool, now, Read::Probes).await.unwrap();
    let scan = backlog.read(pool, now, Read::Scan).await.unwrap();
    assert_eq!(
        probes, scan,
        "the backlog read per policy and kind and in one scan"
    );
    probes
}
