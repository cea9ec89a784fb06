//! The foundation: schema contract, migrations, configuration, seed data and the queue.

use chrono::{DateTime, Utc};
use sexton::queue::{self, PushOptions, PushOutcome};
use sexton::registry::{self, KINDS};
use sexton::seed::{SeedOptions, seed};
use sexton::tick::NIGHTLY;
use sexton_jobs::job::{Cadence, Scope};
use sqlx::PgPool;

use crate::common;

/// Every table and column of SPEC §1: the contract acceptance tests write and read.
const CONTRACT: &[(&str, &[&str])] = &[
    (
        "accounts",
        &[
            "id",
            "name",
            "execution_details_retention_days",
            "created_at",
        ],
    ),
    (
        "conversations",
        &[
            "id",
            "account_id",
            "forked_from_conversation_id",
            "forked_at_position",
            "usage_summary",
            "created_at",
        ],
    ),
    (
        "turns",
        &["id", "conversation_id", "position", "created_at"],
    ),
    (
        "variants",
        &[
            "id",
            "turn_id",
            "prompt",
            "requested_model",
            "final_content",
            "selected",
            "details_pruned_at",
            "runner_effects",
            "created_at",
        ],
    ),
    (
        "follow_ups",
        &["id", "variant_id", "position", "landed_at", "body"],
    ),
    ("fragments", &["id", "account_id", "content", "created_at"]),
    (
        "runs",
        &[
            "id",
            "account_id",
            "conversation_id",
            "variant_id",
            "parent_run_id",
            "kind",
            "status",
            "requested_model",
            "terminal_model",
            "delivered_at",
            "completed_at",
            "terminal_at",
            "settled_at",
            "details_pruned_at",
            "runner_effects",
            "created_at",
        ],
    ),
    (
        "run_tasks",
        &[
            "id",
            "run_id",
            "parent_task_id",
            "name",
            "status",
            "input",
            "output",
        ],
    ),
    ("run_task_edges", &["run_id", "from_task_id", "to_task_id"]),
    (
        "tool_results",
        &["id", "run_id", "task_id", "tool_name", "body"],
    ),
    (
        "sealed_requests",
        &[
            "id",
            "run_id",
            "provider",
            "request",
            "response",
            "sealed_at",
        ],
    ),
    ("reasoning_traces", &["id", "run_id", "content"]),
    (
        "invocation_attempts",
        &[
            "id",
            "run_id",
            "attempt",
            "status",
            "started_at",
            "ended_at",
        ],
    ),
    ("output_files", &["id", "run_id", "relative_path", "bytes"]),
    (
        "settlement_receipts",
        &["id", "run_id", "status", "created_at", "settled_at"],
    ),
    (
        "delegations",
        &[
            "id",
            "parent_run_id",
            "child_run_id",
            "status",
            "created_at",
        ],
    ),
    (
        "history_requests",
        &["id", "conversation_id", "run_id", "sealed_at", "created_at"],
    ),
    (
        "history_request_sources",
        &["history_request_id", "source_run_id"],
    ),
    (
        "usage_records",
        &[
            "id",
            "account_id",
            "run_id",
            "conversation_id",
            "tokens",
            "cost_micros",
            "created_at",
        ],
    ),
    (
        "conversation_events",
        &[
            "id",
            "conversation_id",
            "run_id",
            "kind",
            "payload",
            "created_at",
        ],
    ),
    (
        "agents",
        &[
            "id",
            "account_id",
            "name",
            "current_session_id",
            "main_session_id",
            "default_session_id",
        ],
    ),
    (
        "sessions",
        &[
            "id",
            "account_id",
            "agent_id",
            "kind",
            "state",
            "metadata",
            "last_activity_at",
            "created_at",
        ],
    ),
    (
        "board_tasks",
        &["id", "account_id", "status", "terminal_at"],
    ),
    (
        "session_retention_policies",
        &[
            "account_id",
            "enabled",
            "main_days",
            "task_days",
            "subagent_days",
        ],
    ),
    (
        "conversation_entries",
        &[
            "id",
            "session_id",
            "entry_id",
            "seq",
            "idempotency_key",
            "payload",
            "created_at",
        ],
    ),
    (
        "conversation_archives",
        &["id", "session_id", "kind", "generation", "created_at"],
    ),
    (
        "conversation_archive_entries",
        &["archive_id", "entry_id", "seq", "payload"],
    ),
    (
        "handoffs",
        &[
            "id",
            "account_id",
            "agent_id",
            "from_session_id",
            "to_session_id",
            "payload",
            "created_at",
        ],
    ),
    (
        "dream_preloads",
        &["id", "account_id", "agent_id", "payload", "created_at"],
    ),
    (
        "working_records",
        &[
            "id",
            "account_id",
            "agent_id",
            "kind",
            "pinned",
            "body",
            "updated_at",
        ],
    ),
    (
        "brain_memories",
        &[
            "id",
            "account_id",
            "agent_id",
            "revision",
            "body",
            "deleted_at",
        ],
    ),
    (
        "attachments",
        &[
            "id",
            "account_id",
            "relative_path",
            "bytes",
            "created_at",
            "bytes_expired_at",
        ],
    ),
];

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

#[sqlx::test]
async fn seed_fills_every_table_and_writes_real_files(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let now: DateTime<Utc> = "2026-12-01T03:00:00Z".parse().unwrap();
    let options = SeedOptions {
        scale: 1,
        seed: 7,
        now,
        show_progress: false,
        checked: false,
    };
    let report = seed(&pool, &settings.paths, &options).await.unwrap();
    assert!(
        report.runs > 2000,
        "scale 1 is a few thousand runs, got {}",
        report.runs
    );

    for table in sexton::demo::TABLES {
        let count: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&pool)
                .await
                .unwrap();
        assert!(count > 0, "{table} is empty after seeding");
    }
    // Every edge case the jobs must meet is present.
    let cases: &[(&str, &str)] = &[
        (
            "retention 30",
            "SELECT count(*) FROM accounts WHERE execution_details_retention_days = 30",
        ),
        (
            "retention NULL",
            "SELECT count(*) FROM accounts WHERE execution_details_retention_days IS NULL",
        ),
        (
            "pending attempt",
            "SELECT count(*) FROM invocation_attempts WHERE status IN ('pending','running')",
        ),
        (
            "pending receipt",
            "SELECT count(*) FROM settlement_receipts WHERE status = 'pending'",
        ),
        (
            "outstanding delegation",
            "SELECT count(*) FROM delegations WHERE status = 'outstanding'",
        ),
        (
            "active history request",
            "SELECT count(*) FROM history_requests WHERE sealed_at IS NULL",
        ),
        (
            "inherited fork source",
            "SELECT count(*) FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id JOIN runs r ON r.id = s.source_run_id WHERE r.conversation_id <> h.conversation_id",
        ),
        (
            "fork",
            "SELECT count(*) FROM conversations WHERE forked_from_conversation_id IS NOT NULL",
        ),
        (
            "regenerated variant",
            "SELECT count(*) FROM (SELECT turn_id FROM variants GROUP BY turn_id HAVING count(*) > 1) t",
        ),
        (
            "delegated child",
            "SELECT count(*) FROM runs WHERE parent_run_id IS NOT NULL",
        ),
        (
            "late completion",
            "SELECT count(*) FROM runs WHERE completed_at - delivered_at > interval '30 days'",
        ),
        (
            "unsettled direct reply",
            "SELECT count(*) FROM runs WHERE kind = 'direct_reply' AND terminal_at IS NOT NULL AND settled_at IS NULL",
        ),
        (
            "standalone",
            "SELECT count(*) FROM runs WHERE kind = 'standalone'",
        ),
        (
            "inference",
            "SELECT count(*) FROM runs WHERE kind = 'inference'",
        ),
        (
            "nested board task",
            "SELECT count(*) FROM sessions WHERE metadata ? 'board_task' AND jsonb_typeof(metadata->'board_task') = 'object'",
        ),
        (
            "flattened board task",
            "SELECT count(*) FROM sessions WHERE metadata ? 'board_task_id'",
        ),
        (
            "malformed metadata",
            "SELECT count(*) FROM sessions WHERE jsonb_typeof(metadata->'completion') = 'string'",
        ),
        (
            "pinned record",
            "SELECT count(*) FROM working_records WHERE pinned",
        ),
        (
            "protected state",
            "SELECT count(*) FROM sessions WHERE state IN ('running','finalizing')",
        ),
    ];
    for (case, sql) in cases {
        let n: i64 = sqlx::query_scalar(*sql).fetch_one(&pool).await.unwrap();
        assert!(n > 0, "no seeded {case}");
    }

    // Rows point at real files.
    let outputs: Vec<(String, i64)> =
        sqlx::query_as("SELECT relative_path, bytes FROM output_files")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (path, bytes) in &outputs {
        let meta = std::fs::metadata(settings.paths.output_root.join(path)).unwrap();
        assert_eq!(meta.len() as i64, *bytes, "{path}");
    }
    let attachments: Vec<String> = sqlx::query_scalar("SELECT relative_path FROM attachments")
        .fetch_all(&pool)
        .await
        .unwrap();
    for path in &attachments {
        assert!(
            settings.paths.attachments_root.join(path).is_file(),
            "{path}"
        );
    }
    let frames: Vec<(uuid::Uuid, uuid::Uuid, String)> =
        sqlx::query_as("SELECT session_id, id, kind FROM conversation_archives")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (session, archive, kind) in &frames {
        let frame = settings
            .paths
            .sessions_root
            .join(session.to_string())
            .join("archive")
            .join(format!("{kind}-{archive}.frame"));
        assert!(frame.is_file(), "{}", frame.display());
    }
    let traces: Vec<_> = walk(&settings.paths.traces_root);
    assert!(
        traces.iter().any(|p| p.is_symlink()),
        "a trace symlink escaping the root"
    );
    assert!(
        traces
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == "bad.trace.jsonl"))
    );
    // TR-3: every trace but the deliberately bad ones carries a valid signature; the bad
    // ones are the control that the check rejects something.
    let (bad, signed): (Vec<_>, Vec<_>) = traces
        .iter()
        .filter(|p| !p.is_symlink())
        .partition(|p| p.file_name().is_some_and(|n| n == "bad.trace.jsonl"));
    assert!(!signed.is_empty(), "valid trace files");
    for path in &signed {
        assert!(
            has_trace_signature(path),
            "{} has no valid signature",
            path.display()
        );
    }
    for path in &bad {
        assert!(
            !has_trace_signature(path),
            "{} is accepted as signed",
            path.display()
        );
    }
}

#[sqlx::test]
async fn seed_is_deterministic_for_a_seed(pool: PgPool) {
    let options = |seed| SeedOptions {
        scale: 1,
        seed,
        now: "2026-12-01T03:00:00Z".parse().unwrap(),
        show_progress: false,
        checked: false,
    };
    let first = seeded_fingerprint(&pool, "a", &options(42)).await;
    let second = seeded_fingerprint(&pool, "b", &options(42)).await;
    assert_same_fingerprint(&first, &second);
    // The control: the fingerprint sees a different seed, in the rows and in the files.
    let other = seeded_fingerprint(&pool, "c", &options(43)).await;
    assert_ne!(
        first.tables, other.tables,
        "seed 43 wrote the rows of seed 42"
    );
    assert_ne!(
        first.files, other.files,
        "seed 43 wrote the files of seed 42"
    );
}

/// The seed writes batches side by side with foreign-key checks and triggers off when its role
/// may (a superuser here): the rows and files are those of a seed that checks every row, one
/// batch at a time. Scale 3 is three batches, so lanes do overlap.
#[sqlx::test]
async fn seed_in_lanes_writes_what_a_checked_seed_writes(pool: PgPool) {
    let options = |checked| SeedOptions {
        scale: 3,
        seed: 7,
        now: "2026-12-01T03:00:00Z".parse().unwrap(),
        show_progress: false,
        checked,
    };
    let superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(superuser, "the lanes need a role that may skip the checks");
    let lanes = seeded_fingerprint(&pool, "lanes", &options(false)).await;
    let checked = seeded_fingerprint(&pool, "checked", &options(true)).await;
    assert_same_fingerprint(&lanes, &checked);
    assert!(
        lanes.tables.len() > 20 && !lanes.files.is_empty(),
        "every table and the files are fingerprinted: {} tables, {} files",
        lanes.tables.len(),
        lanes.files.len()
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_symlink() || path.is_file() {
                out.push(path);
            } else if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

#[tokio::test]
async fn op2_three_invalid_values_exit_2_naming_all_three() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "[database]\nmax_connections = 0\n[schedule]\ntimezone = \"Mars/Olympus\"\n[queue]\nmax_attempts = \"many\"\n",
    )
    .unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_sexton"))
        .arg("check-config")
        .arg("--config")
        .arg(&file)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for setting in [
        "database.max_connections",
        "schedule.timezone",
        "queue.max_attempts",
    ] {
        assert!(stderr.contains(setting), "{setting} not named in: {stderr}");
    }
    assert!(
        stderr.contains("\"many\""),
        "the bad value is shown: {stderr}"
    );
}

#[tokio::test]
async fn op2_environment_overrides_are_validated_too() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_sexton"))
        .arg("check-config")
        .env("SEXTON_DATABASE__LOCK_TIMEOUT_MS", "-5")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("database.lock_timeout_ms"));
}

#[sqlx::test]
async fn fl1_a_job_on_each_queue_runs_and_the_worker_exits_when_idle(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    for (queue, payload) in sample_payloads() {
        let outcome = queue::push(
            &pool,
            queue,
            &settings.queue,
            &payload,
            PushOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(outcome, PushOutcome::Enqueued);
    }
    common::run_until_idle(&pool, dir.path()).await;
    for (queue, _) in sample_payloads() {
        // The nightly slot fans out one more first hop to every global kind (the database has
        // no accounts, so none to a per-account kind); two hops of one global kind that meet
        // each other's scope lock leave one more, deferred, job (FL-3).
        let fanned_out = registry::by_queue(queue).is_some_and(|k| {
            k.scope() == Scope::Global && k.cadence(&settings) == Cadence::Nightly
        });
        let (done, other): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'Done'), count(*) FILTER (WHERE status <> 'Done')
             FROM apalis.jobs WHERE job_type = $1",
        )
        .bind(queue)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(
            done > i64::from(fanned_out),
            "the job on {queue} ran ({done} done)"
        );
        assert_eq!(other, 0, "every job on {queue} is done");
    }
    let counts = queue::counts(&pool).await.unwrap();
    assert_eq!((counts.pending, counts.running, counts.failed), (0, 0, 0));
}

#[sqlx::test]
async fn fl1_a_malformed_payload_fails_its_job_and_the_worker_lives_on(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let bad = serde_json::json!({"version": 99, "slot": "2026-12-01T03:00:00Z"});
    queue::push(
        &pool,
        NIGHTLY,
        &settings.queue,
        &bad,
        PushOptions::default(),
    )
    .await
    .unwrap();
    let good = nightly_payload();
    queue::push(
        &pool,
        NIGHTLY,
        &settings.queue,
        &good,
        PushOptions::default(),
    )
    .await
    .unwrap();
    common::run_until_idle(&pool, dir.path()).await;
    let (status, result): (String, String) = sqlx::query_as(
        "SELECT status, last_result::text FROM apalis.jobs WHERE convert_from(job, 'UTF8')::jsonb ->> 'version' = '99'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        status, "Killed",
        "a bad payload is failed for good, not retried"
    );
    assert!(
        result.contains("unsupported payload version 99"),
        "{result}"
    );
    let done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE job_type = 'sexton.nightly' AND status = 'Done'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(done, 1, "the good job beside it ran");
}

fn nightly_payload() -> serde_json::Value {
    serde_json::json!({"version": 1, "slot": "2026-12-01T03:00:00Z"})
}

/// One job for every queue a worker serves: a nightly slot, and a first hop of every kind.
fn sample_payloads() -> Vec<(&'static str, serde_json::Value)> {
    let slot = "2026-12-01T03:00:00Z".parse().unwrap();
    std::iter::once((NIGHTLY, nightly_payload()))
        .chain(KINDS.iter().map(|kind| {
            let payload = kind.first_payload(Some(uuid::Uuid::new_v4()), slot);
            (kind.queue(), payload)
        }))
        .collect()
}

/// Whether a trace file's first line is the signature of TR-3: a JSON object with
/// `"format":"run-trace/1"` and string `agent_id` and `session_id`.
fn has_trace_signature(path: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let first = text.lines().next().unwrap_or_default();
    let Ok(serde_json::Value::Object(signature)) = serde_json::from_str(first) else {
        return false;
    };
    signature.get("format").and_then(|f| f.as_str()) == Some("run-trace/1")
        && signature.get("agent_id").is_some_and(|a| a.is_string())
        && signature.get("session_id").is_some_and(|s| s.is_string())
}

/// Everything one seed run wrote: a hash of each table's rows (all columns, in a stable
/// order) and the facts of each file under the file roots, with a digest over both.
#[derive(Debug, PartialEq, Eq)]
struct SeedFingerprint {
    /// Table name → md5 of its rows.
    tables: std::collections::BTreeMap<String, String>,
    /// Path relative to the roots' parent → length, mtime and content md5 (or a link's target).
    files: std::collections::BTreeMap<String, String>,
    digest: String,
}

/// Seeds a fresh database and fresh file roots with `options`, and fingerprints the result.
/// `suffix` names the database, beside the test's own; it is dropped afterwards.
async fn seeded_fingerprint(pool: &PgPool, suffix: &str, options: &SeedOptions) -> SeedFingerprint {
    let current: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    // Database names are at most 63 bytes; the test's own name already fills them.
    let name = format!(
        "{}_{suffix}",
        &current[..current.len().min(62 - suffix.len())]
    );
    let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
    sqlx::query(sqlx::AssertSqlSafe(drop.clone()))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(pool)
        .await
        .unwrap();
    let fresh = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(pool.connect_options().as_ref().clone().database(&name))
        .await
        .unwrap();
    common::migrate(&fresh).await;

    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    seed(&fresh, &settings.paths, options).await.unwrap();
    let tables = table_hashes(&fresh).await;
    let files = file_facts(&fresh, dir.path()).await;
    fresh.close().await;
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(pool)
        .await
        .unwrap();

    let manifest: String = tables
        .iter()
        .chain(&files)
        .map(|(key, value)| format!("{key}\t{value}\n"))
        .collect();
    let digest: String = sqlx::query_scalar("SELECT md5($1)")
        .bind(manifest)
        .fetch_one(pool)
        .await
        .unwrap();
    SeedFingerprint {
        tables,
        files,
        digest,
    }
}

/// md5 of every row of every table in `public` (the platform's tables: all the seed writes),
/// all columns, rows ordered by their text. Each table of the contract must hold rows, so that
/// the hash is not over empty tables.
async fn table_hashes(pool: &PgPool) -> std::collections::BTreeMap<String, String> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'
           AND table_name <> '_sqlx_migrations'
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut hashes = std::collections::BTreeMap::new();
    for name in names {
        // The names come from the catalog, never from input.
        let (rows, hash): (i64, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text)) FROM \"{name}\" t"
        )))
        .fetch_one(pool)
        .await
        .unwrap();
        hashes.insert(name, format!("{rows} {}", hash.unwrap_or_default()));
    }
    for (table, _) in CONTRACT {
        let entry = hashes.get(*table).map_or("absent", String::as_str);
        assert!(
            !entry.starts_with("0 ") && entry != "absent",
            "{table} is empty after seeding ({entry})"
        );
    }
    hashes
}

/// Length, mtime (ns since the epoch) and content md5 of every regular file under `base`, and
/// the target (relative to `base`) of every symlink, keyed by path relative to `base`.
async fn file_facts(
    pool: &PgPool,
    base: &std::path::Path,
) -> std::collections::BTreeMap<String, String> {
    let mut facts = std::collections::BTreeMap::new();
    let mut contents = Vec::new();
    let mut stack = vec![base.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(base).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                let target = target.strip_prefix(base).unwrap_or(&target);
                facts.insert(relative, format!("-> {}", target.display()));
            } else if meta.is_dir() {
                stack.push(path);
            } else {
                let mtime = meta
                    .modified()
                    .unwrap()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                contents.push((relative, meta.len(), mtime, std::fs::read(&path).unwrap()));
            }
        }
    }
    assert!(!contents.is_empty(), "the seed wrote no files");
    let md5s: Vec<String> = sqlx::query_scalar(
        "SELECT md5(c) FROM unnest($1::bytea[]) WITH ORDINALITY AS u (c, i) ORDER BY i",
    )
    .bind(contents.iter().map(|c| c.3.clone()).collect::<Vec<_>>())
    .fetch_all(pool)
    .await
    .unwrap();
    for ((relative, len, mtime, _), md5) in contents.into_iter().zip(md5s) {
        facts.insert(relative, format!("{len} {mtime} {md5}"));
    }
    facts
}

/// Equal fingerprints, or a failure naming the first tables and files that differ.
fn assert_same_fingerprint(a: &SeedFingerprint, b: &SeedFingerprint) {
    let differ = |x: &std::collections::BTreeMap<String, String>,
                  y: &std::collections::BTreeMap<String, String>| {
        x.keys()
            .chain(y.keys())
            .filter(|k| x.get(*k) != y.get(*k))
            .take(10)
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert!(
        a == b,
        "the same --seed and --now wrote different data: tables {:?}, files {:?}",
        differ(&a.tables, &b.tables),
        differ(&a.files, &b.files)
    );
}
