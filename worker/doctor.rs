//! `sexton doctor` (OP-7): a deployment checked before its first night. One line per check, in
//! a fixed order, each finding with what to do: the database reachable and writable, the pooler
//! (ER-5), every index sexton's migrations create present and valid, the role's privileges on
//! what sexton reads, deletes and updates, each file root (a file created and removed in it, or
//! the bucket listed and its versioning read: [`objects`]), the database's clock against this
//! host's, the session's timeouts as configured, and the fleet's pools against the server's
//! `max_connections`. Exit 0 with no finding, 1 with findings, 2 when it cannot check (no
//! database to ask).

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};

use serde::Serialize;
use sexton_jobs::files::{Root, Store};
use sqlx::PgPool;

use crate::config::Settings;
use crate::db::{self, DbError};
use crate::text;

mod objects;

/// What `doctor` found, when it could look.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// It could not check at all (exit 2).
    #[error("cannot check the deployment: {0}")]
    CannotCheck(#[source] Box<DbError>),
    /// It checked, and found this many things to fix (exit 1); the lines say which.
    #[error("{0} finding(s): see the lines above")]
    Findings(usize),
    #[error("could not read the database: {0}")]
    Database(#[from] sqlx::Error),
}

/// One check's line.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked: `database`, `pooler`, `index <name>`, `privileges`, `root <name>`,
    /// `versioning <name>` (an object-store root's), `clock`, `timeouts`, `pool`.
    pub check: String,
    /// Nothing to do.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
    /// What to do, for a finding.
    pub fix: Option<String>,
}

impl Check {
    fn ok(check: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            check: check.into(),
            ok: true,
            detail: detail.into(),
            fix: None,
        }
    }

    fn finding(
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            check: check.into(),
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// The line a person reads.
    pub fn line(&self) -> String {
        let detail = text::printable(&self.detail).replace('\n', "\\n");
        match &self.fix {
            None => format!("ok       {}: {detail}", self.check),
            Some(fix) => format!("FINDING  {}: {detail}\n         fix: {fix}", self.check),
        }
    }
}

/// Tables whose rows sexton deletes (execution detail, sessions and their history, the
/// short-lived records), those it updates (markers, expired bytes, nulled references), and
/// those it only reads to decide.
const DELETES: [&str; 15] = [
    "run_tasks",
    "run_task_edges",
    "tool_results",
    "sealed_requests",
    "reasoning_traces",
    "invocation_attempts",
    "output_files",
    "sessions",
    "conversation_entries",
    "conversation_archives",
    "conversation_archive_entries",
    "handoffs",
    "dream_preloads",
    "working_records",
    "conversation_events",
];
const UPDATES: [&str; 3] = ["runs", "variants", "attachments"];
const READS: [&str; 11] = [
    "accounts",
    "conversations",
    "turns",
    "agents",
    "board_tasks",
    "session_retention_policies",
    "settlement_receipts",
    "delegations",
    "history_requests",
    "history_request_sources",
    "attachments",
];

/// Runs every check, in order.
///
/// # Errors
/// [`Error::CannotCheck`] when the database cannot be reached; a database error mid-way.
pub async fn run(settings: &Settings) -> Result<Vec<Check>, Error> {
    let mut checks = Vec::new();
    let pool = match db::connect(&settings.database, db::Access::Read).await {
        Ok(pool) => pool,
        Err(err @ DbError::TransactionPooling { .. }) => {
            checks.push(Check::finding(
                "pooler",
                err.to_string(),
                "give sexton a session-mode pool or a direct URL (ER-5); nothing else can be \
                 checked through this one",
            ));
            return Ok(checks);
        }
        Err(err) => return Err(Error::CannotCheck(Box::new(err))),
    };
    checks.push(writable(&pool).await?);
    checks.push(Check::ok(
        "pooler",
        "each connection is a session of its own (direct, or a session-mode pooler)",
    ));
    checks.extend(indexes(&pool).await?);
    checks.push(privileges(&pool).await?);
    for root in [
        Root::Outputs,
        Root::Attachments,
        Root::Sessions,
        Root::Traces,
    ] {
        checks.extend(file_root(settings, root).await);
    }
    checks.push(clock(&pool).await?);
    checks.push(timeouts(&pool, settings).await?);
    checks.push(pools(&pool, settings).await?);
    pool.close().await;
    Ok(checks)
}

/// Prints `checks` (a line each, or JSON) and says how it ended.
///
/// # Errors
/// [`Error::Findings`] when any check found something.
pub fn report(checks: &[Check], json: bool) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    if json {
        let _ = writeln!(out, "{}", serde_json::json!({ "checks": checks }));
    } else {
        for check in checks {
            let _ = writeln!(out, "{}", check.line());
        }
    }
    match checks.iter().filter(|c| !c.ok).count() {
        0 => Ok(()),
        n => Err(Error::Findings(n)),
    }
}

async fn writable(pool: &PgPool) -> Result<Check, sqlx::Error> {
    let (recovery, read_only, version): (bool, String, String) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only'),
                current_setting('server_version')",
    )
    .fetch_one(pool)
    .await?;
    Ok(if recovery {
        Check::finding(
            "database",
            "the server is a standby (in recovery): it takes no writes",
            "point DATABASE_URL at the primary (ER-6)",
        )
    } else if read_only == "on" {
        Check::finding(
            "database",
            "default_transaction_read_only is on for this role or database: nothing can be removed",
            "ALTER ROLE … SET default_transaction_read_only = off (or on the database), or give \
             sexton a role that writes (ER-6)",
        )
    } else {
        Check::ok(
            "database",
            format!("reachable and writable (PostgreSQL {version})"),
        )
    })
}

/// The indexes sexton's migrations leave behind: every `CREATE INDEX` not dropped by a later
/// `DROP INDEX`, in migration order.
pub fn expected_indexes() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for migration in db::MIGRATOR.iter() {
        let sql = migration.sql.as_str();
        for statement in sql.split(';') {
            let words: Vec<String> = statement
                .lines()
                .filter(|line| !line.trim_start().starts_with("--"))
                .flat_map(str::split_whitespace)
                .map(str::to_owned)
                .collect();
            let upper: Vec<String> = words.iter().map(|w| w.to_uppercase()).collect();
            let name_after = |at: usize| {
                upper[at..]
                    .iter()
                    .position(|w| !matches!(w.as_str(), "IF" | "NOT" | "EXISTS" | "CONCURRENTLY"))
                    .map(|i| words[at + i].trim_matches('"').to_owned())
            };
            let starts = |prefix: &[&str]| {
                upper.len() > prefix.len() && upper.iter().zip(prefix).all(|(w, p)| w == p)
            };
            if starts(&["CREATE", "INDEX"]) || starts(&["CREATE", "UNIQUE", "INDEX"]) {
                let at = upper.iter().position(|w| w == "INDEX").unwrap_or(0) + 1;
                if let Some(name) = name_after(at)
                    && name.to_uppercase() != "ON"
                    && !names.contains(&name)
                {
                    names.push(name);
                }
            } else if starts(&["DROP", "INDEX"])
                && let Some(name) = name_after(2)
            {
                let name = name.rsplit('.').next().unwrap_or(&name).to_owned();
                names.retain(|n| *n != name);
            }
        }
    }
    names
}

async fn indexes(pool: &PgPool) -> Result<Vec<Check>, sqlx::Error> {
    let found: Vec<(String, bool)> = sqlx::query_as(
        "SELECT c.relname::text, i.indisvalid FROM pg_index i
         JOIN pg_class c ON c.oid = i.indexrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY (current_schemas(false)) OR n.nspname = 'sexton'",
    )
    .fetch_all(pool)
    .await?;
    let expected = expected_indexes();
    let mut checks = Vec::new();
    for name in &expected {
        match found.iter().find(|(n, _)| n == name) {
            None => checks.push(Check::finding(
                format!("index {name}"),
                "missing: every pass that needs it reads its table whole",
                "run `sexton migrate` (on a large table first CREATE INDEX CONCURRENTLY as the \
                 migration spells it: README, \"Migrating a large database\")",
            )),
            Some((_, false)) => checks.push(Check::finding(
                format!("index {name}"),
                "INVALID (a CREATE INDEX CONCURRENTLY that failed): the planner cannot use it",
                format!("REINDEX INDEX CONCURRENTLY {name}; (or DROP INDEX CONCURRENTLY {name}; then `sexton migrate`)"),
            )),
            Some((_, true)) => {}
        }
    }
    if checks.is_empty() {
        checks.push(Check::ok(
            "indexes",
            format!(
                "all {} of sexton's indexes present and valid",
                expected.len()
            ),
        ));
    }
    Ok(checks)
}

async fn privileges(pool: &PgPool) -> Result<Check, sqlx::Error> {
    let mut wanted: Vec<(String, &str)> = Vec::new();
    wanted.extend(DELETES.iter().map(|t| ((*t).to_owned(), "DELETE")));
    wanted.extend(UPDATES.iter().map(|t| ((*t).to_owned(), "UPDATE")));
    wanted.extend(
        DELETES
            .iter()
            .chain(&UPDATES)
            .chain(&READS)
            .map(|t| ((*t).to_owned(), "SELECT")),
    );
    let sexton_tables: Vec<String> = sqlx::query_scalar(
        "SELECT format('sexton.%I', relname) FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'sexton' AND c.relkind IN ('r', 'p') ORDER BY relname",
    )
    .fetch_all(pool)
    .await?;
    for table in &sexton_tables {
        for privilege in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
            wanted.push((table.clone(), privilege));
        }
    }
    let (tables, privileges): (Vec<String>, Vec<&str>) = wanted.into_iter().unzip();
    let missing: Vec<String> = sqlx::query_scalar(
        "SELECT CASE WHEN to_regclass(w.t) IS NULL THEN w.t || ' (no such table)'
                     ELSE w.p || ' ON ' || w.t END
         FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS w (t, p, n)
         WHERE to_regclass(w.t) IS NULL OR NOT has_table_privilege(w.t, w.p)
         UNION ALL
         SELECT 'USAGE ON SCHEMA sexton' WHERE NOT has_schema_privilege('sexton', 'USAGE')",
    )
    .bind(&tables)
    .bind(&privileges)
    .fetch_all(pool)
    .await?;
    Ok(if missing.is_empty() {
        Check::ok(
            "privileges",
            "the role may read, delete and update every table sexton works on",
        )
    } else {
        let role: String = sqlx::query_scalar("SELECT current_user::text")
            .fetch_one(pool)
            .await?;
        Check::finding(
            "privileges",
            format!("role {role} lacks {}", missing.join(", ")),
            format!("GRANT what is listed to {role} (a hop that needs it fails for good, 42501)"),
        )
    })
}

/// A file created and removed in a local root; for an object-store one, the bucket listed and
/// its versioning read.
async fn file_root(settings: &Settings, root: Root) -> Vec<Check> {
    match settings.paths.store(root) {
        Store::Object(objects) => objects::root(root.as_str(), &objects).await,
        Store::Local(path) => {
            let check = format!("root {}", root.as_str());
            let probe = path.join(format!(".sexton-doctor-{}", std::process::id()));
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&probe)
                .and_then(|_| std::fs::remove_file(&probe));
            vec![match made {
                Ok(()) => Check::ok(
                    check,
                    format!("{}: a file created and removed", path.display()),
                ),
                Err(err) => Check::finding(
                    check,
                    format!("{}: cannot create and remove a file: {err}", path.display()),
                    format!(
                        "give the worker's user (uid {}) write and search permission on the \
                         directory and on every directory below it",
                        std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
                    ),
                ),
            }]
        }
    }
}

/// How far the database's clock may be from this host's before it is worth saying.
const CLOCK_SKEW: f64 = 5.0;

async fn clock(pool: &PgPool) -> Result<Check, sqlx::Error> {
    let before = chrono::Utc::now();
    let database: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await?;
    let after = chrono::Utc::now();
    let host = before + (after - before) / 2;
    let skew = (database - host).num_milliseconds() as f64 / 1000.0;
    Ok(if skew.abs() > CLOCK_SKEW {
        Check::finding(
            "clock",
            format!("the database's clock is {skew:+.1} s from this host's"),
            "run NTP on both: sexton takes now from the database (EX-1), but logs, slots and \
             alerts read this host's",
        )
    } else {
        Check::ok("clock", format!("{skew:+.1} s from this host's"))
    })
}

/// The session's timeouts as the server applied them: a pooler or a role setting that
/// overrides them is a setting silently not applied.
async fn timeouts(pool: &PgPool, settings: &Settings) -> Result<Check, sqlx::Error> {
    let (statement, lock): (f64, f64) = sqlx::query_as(
        "SELECT (extract(epoch FROM current_setting('statement_timeout')::interval) * 1000)::float8,
                (extract(epoch FROM current_setting('lock_timeout')::interval) * 1000)::float8",
    )
    .fetch_one(pool)
    .await?;
    let want = (
        settings.database.statement_timeout.as_millis() as f64,
        settings.database.lock_timeout.as_millis() as f64,
    );
    Ok(if (statement, lock) == want {
        Check::ok(
            "timeouts",
            format!("statement_timeout {statement} ms and lock_timeout {lock} ms, as configured"),
        )
    } else {
        Check::finding(
            "timeouts",
            format!(
                "the session runs with statement_timeout {statement} ms and lock_timeout \
                 {lock} ms; configured {} and {} ms",
                want.0, want.1
            ),
            "something between sexton and the server resets them (a pooler's \
             server_reset_query or ignore_startup_parameters, a role setting): sexton's waits are \
             bounded only by what the session applies (FL-6)",
        )
    })
}

/// The fleet's pools against the connections the server has for them.
async fn pools(pool: &PgPool, settings: &Settings) -> Result<Check, sqlx::Error> {
    let (max, reserved, others): (i64, i64, i64) = sqlx::query_as(
        "SELECT current_setting('max_connections')::bigint,
                current_setting('superuser_reserved_connections')::bigint,
                (SELECT count(*) FROM pg_stat_activity
                 WHERE backend_type = 'client backend'
                   AND application_name NOT LIKE 'sexton%' AND pid <> pg_backend_pid())",
    )
    .fetch_one(pool)
    .await?;
    let replicas = i64::from(settings.fleet.replicas);
    let per = i64::from(settings.database.max_connections);
    let needed = replicas * per;
    let room = max - reserved - others;
    Ok(if needed > room {
        Check::finding(
            "pool",
            format!(
                "{replicas} replicas × {per} connections = {needed}, but the server has {room} \
                 ({max} max_connections − {reserved} reserved − {others} in use by others)"
            ),
            "raise max_connections on the server, or lower database.max_connections or \
             fleet.replicas (a pool that cannot fill waits, then fails hops with \"pool timed out\")",
        )
    } else {
        Check::ok(
            "pool",
            format!(
                "{replicas} replicas × {per} connections = {needed} of the server's {room} free"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op7_the_indexes_expected_are_those_the_migrations_leave() {
        let names = expected_indexes();
        for kept in [
            "output_files_path_key",
            "holds_active",
            "output_files_loose",
        ] {
            assert!(names.iter().any(|n| n == kept), "{kept} in {names:?}");
        }
        // Created by an early migration, dropped by a later one.
        assert!(
            !names.iter().any(|n| n == "output_files_relative_path"),
            "{names:?}"
        );
    }
}
