//! Seed data (OP-1 `sexton seed`): every table filled and real files written, the same data for
//! the same seed whether written in lanes or checked row by row, and never over a database that
//! holds accounts unless forced.

use chrono::{DateTime, Utc};
use sexton::seed::{SeedOptions, seed};
use sqlx::PgPool;

use crate::common;
use crate::common::contract::CONTRACT;
use crate::common::fixture;

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

#[sqlx::test]
async fn op1_seed_refuses_a_database_that_holds_accounts(pool: PgPool) {
    common::migrate(&pool).await;
    fixture::account(&pool, Some(30)).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let output = common::sexton(&url, dir.path())
        .args(["seed", "--scale", "1", "--json"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--force"));
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(accounts, 1, "nothing was written");
    // The control: --force seeds all the same.
    let forced = common::sexton(&url, dir.path())
        .args(["seed", "--scale", "1", "--json", "--force"])
        .output()
        .await
        .unwrap();
    assert!(forced.status.success(), "{forced:?}");
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(accounts > 1, "seeded beside the existing account");
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
