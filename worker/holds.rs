//! Holds (SPEC §9, HD-1): what a person froze, whatever a window says — placed on one account,
//! conversation, agent, session or run, released once, never deleted (`sexton holds place`,
//! `release`, `list`). `status` and the `sexton_holds_active` gauge read the active ones. What
//! a hold covers is the migration's (`sexton.hold_on` and the functions beside it), which the
//! jobs ask.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::text;

/// Inserts a hold on a scope that exists, the hold gate closed (HD-3).
const PLACE: &str = include_str!("holds_place.sql");

/// What a hold names: one row of the platform's table of that name (plural).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Account,
    Conversation,
    Agent,
    Session,
    Run,
}

impl Scope {
    /// As `sexton.holds.scope` stores it, and as the command line's flag reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Account => "account",
            Scope::Conversation => "conversation",
            Scope::Agent => "agent",
            Scope::Session => "session",
            Scope::Run => "run",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for Scope {
    type Error = String;

    fn try_from(scope: String) -> Result<Self, Self::Error> {
        [
            Scope::Account,
            Scope::Conversation,
            Scope::Agent,
            Scope::Session,
            Scope::Run,
        ]
        .into_iter()
        .find(|s| s.as_str() == scope)
        .ok_or_else(|| format!("sexton.holds.scope: unknown scope {scope:?}"))
    }
}

/// A hold as it was placed: what `status` lists of an active one.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Placed {
    pub id: Uuid,
    #[sqlx(try_from = "String")]
    pub scope: Scope,
    pub scope_id: Uuid,
    pub case_ref: String,
    pub reason: String,
    pub placed_by: String,
    pub placed_at: DateTime<Utc>,
}

/// A hold as `sexton.holds` records it: as placed, and who released it when (both `null`
/// while it is active).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Hold {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub placed: Placed,
    pub released_by: Option<String>,
    pub released_at: Option<DateTime<Utc>>,
}

/// A hold that cannot be placed or released as asked (exit 2), or a database that could not be
/// read or written (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--{scope} {id}: no such {scope} (a hold is placed on one that exists)")]
    NoScope { scope: Scope, id: Uuid },
    #[error("no hold {0}")]
    NoHold(Uuid),
    #[error(
        "hold {id} was already released by {who} at {when}; a hold is released once",
        who = text::one_line(.by),
        when = time(*.at)
    )]
    Released {
        id: Uuid,
        by: String,
        at: DateTime<Utc>,
    },
    #[error(
        "the hold was not placed: the deletions in flight did not end within {} s; nothing \
         changed, try again",
        GATE_WAIT.as_secs()
    )]
    Gate,
    #[error("could not read or write sexton.holds (run `sexton migrate` first?)")]
    Database(#[from] sqlx::Error),
}

impl Error {
    /// Whether the command was asked for something that cannot be (bad usage, exit 2).
    pub fn is_usage(&self) -> bool {
        !matches!(self, Error::Database(_) | Error::Gate)
    }
}

/// Every column of a hold, in the order `RETURNING` and `SELECT` give them.
const COLUMNS: &str =
    "id, scope, scope_id, case_ref, reason, placed_by, placed_at, released_by, released_at";

/// Places a hold on `scope` `scope_id`, which must exist; a scope already held may be held
/// again (HD-1). It returns once the hold is in force (HD-3): the hold gate closed, every
/// deletion begun before it has ended (and committed before the hold's `placed_at`), and every
/// one begun after it finds the hold.
///
/// # Errors
/// [`Error::NoScope`] when no such row exists; [`Error::Gate`] when the deletions in flight
/// did not end within [`GATE_WAIT`]; a database error.
pub async fn place(
    pool: &PgPool,
    scope: Scope,
    scope_id: Uuid,
    case_ref: &str,
    reason: &str,
    by: &str,
) -> Result<Hold, Error> {
    let mut tx = pool.begin().await?;
    let wait = GATE_WAIT.as_millis();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET LOCAL lock_timeout = {wait}; SET LOCAL statement_timeout = {wait}"
    )))
    .execute(&mut *tx)
    .await?;
    let closed = sqlx::query("SELECT sexton.close_for_hold()")
        .execute(&mut *tx)
        .await;
    match closed {
        Err(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("55P03" | "57014")) =>
        {
            return Err(Error::Gate);
        }
        closed => closed?,
    };
    let hold = sqlx::query_as(PLACE)
        .bind(scope.as_str())
        .bind(scope_id)
        .bind(case_ref)
        .bind(reason)
        .bind(by)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(Error::NoScope {
            scope,
            id: scope_id,
        })?;
    tx.commit().await?;
    analyze(pool).await;
    Ok(hold)
}

/// How long `holds place` waits for the deletions in flight to end (each is bounded by the
/// statement timeout; a drain's removals by its batch).
pub const GATE_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Refreshes the hold table's statistics, which every owner's probe plans on (a table never
/// analyzed looks empty, and is then read whole per owner). Autovacuum does the same within its
/// nap; this makes the next hop's plan right at once. Best effort: the hold is in either way.
async fn analyze(pool: &PgPool) {
    if let Err(err) = sqlx::query("ANALYZE sexton.holds").execute(pool).await {
        tracing::warn!(error = %err, "could not analyze sexton.holds");
    }
}

/// Releases the active hold `id` now, by `by`; the row stays (HD-1).
///
/// # Errors
/// [`Error::NoHold`] for an unknown id, [`Error::Released`] for a hold released before; a
/// database error.
pub async fn release(pool: &PgPool, id: Uuid, by: &str) -> Result<Hold, Error> {
    let released = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE sexton.holds SET released_by = $2, released_at = now()
         WHERE id = $1 AND released_at IS NULL RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(by)
    .fetch_optional(pool)
    .await?;
    if let Some(hold) = released {
        analyze(pool).await;
        return Ok(hold);
    }
    let hold: Option<Hold> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM sexton.holds WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Err(match hold {
        Some(Hold {
            released_by: Some(by),
            released_at: Some(at),
            ..
        }) => Error::Released { id, by, at },
        // Released between the two statements is released all the same; none is gone.
        _ => Error::NoHold(id),
    })
}

/// The holds, newest first: the active ones, or `all` of them (released ones too).
///
/// # Errors
/// A database error.
pub async fn list(pool: &PgPool, all: bool) -> Result<Vec<Hold>, Error> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM sexton.holds WHERE $1 OR released_at IS NULL
         ORDER BY placed_at DESC, id DESC"
    )))
    .bind(all)
    .fetch_all(pool)
    .await?)
}

/// The newest `limit` active holds, newest first, as placed (`sexton status` shows a few; the
/// rest are `holds list`'s).
///
/// # Errors
/// A database error.
pub async fn active(pool: &PgPool, limit: i64) -> Result<Vec<Placed>, Error> {
    let holds: Vec<Hold> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM sexton.holds WHERE released_at IS NULL
         ORDER BY placed_at DESC, id DESC LIMIT $1"
    )))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(holds.into_iter().map(|hold| hold.placed).collect())
}

/// How many holds are active (the `sexton_holds_active` gauge).
///
/// # Errors
/// A database error.
pub async fn active_count(pool: &PgPool) -> Result<i64, Error> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM sexton.holds WHERE released_at IS NULL")
            .fetch_one(pool)
            .await?,
    )
}

/// The scopes whose holds cover `scope_id` of `scope` beside its own (HD-2): a session's agent
/// and account, a run's conversation and account, a conversation's or an agent's account, as
/// the platform's rows tie them now.
const COVERING: &str = "
    WITH covering (scope, scope_id) AS (
        SELECT $2::text, $1::uuid
        UNION ALL SELECT 'agent', agent_id FROM sessions WHERE $2 = 'session' AND id = $1
        UNION ALL SELECT 'account', account_id FROM sessions WHERE $2 = 'session' AND id = $1
        UNION ALL SELECT 'conversation', conversation_id FROM runs
            WHERE $2 = 'run' AND id = $1 AND conversation_id IS NOT NULL
        UNION ALL SELECT 'account', account_id FROM runs WHERE $2 = 'run' AND id = $1
        UNION ALL SELECT 'account', account_id FROM conversations
            WHERE $2 = 'conversation' AND id = $1
        UNION ALL SELECT 'account', account_id FROM agents WHERE $2 = 'agent' AND id = $1
    )
    SELECT h.scope, h.scope_id, count(*)
    FROM sexton.holds h JOIN covering c ON c.scope = h.scope AND c.scope_id = h.scope_id
    WHERE h.released_at IS NULL AND h.id <> $3
    GROUP BY h.scope, h.scope_id
    ORDER BY array_position(ARRAY['session', 'run', 'agent', 'conversation', 'account'], h.scope)";

/// What `holds release` says of a hold it released: the hold, and whether what it held is
/// free now — only once no active hold covers it any more, its own scope's or one covering it
/// through its agent, conversation or account (HD-1, HD-2) — naming the holds that still do.
///
/// # Errors
/// A database error.
pub async fn released(pool: &PgPool, hold: &Hold) -> Result<String, Error> {
    let p = &hold.placed;
    let covering: Vec<(String, Uuid, i64)> = sqlx::query_as(COVERING)
        .bind(p.scope_id)
        .bind(p.scope.as_str())
        .bind(p.id)
        .fetch_all(pool)
        .await?;
    let scope = format!("{} {}", p.scope, p.scope_id);
    let plural = |n: i64| if n == 1 { "hold" } else { "holds" };
    let still = match covering.iter().map(|(_, _, n)| n).sum::<i64>() {
        0 => format!("{scope} is held by no other hold"),
        total => {
            let by: Vec<String> = covering
                .iter()
                .map(|(held, id, n)| {
                    if *held == p.scope.as_str() && *id == p.scope_id {
                        format!("{n} on the {held} itself")
                    } else {
                        format!("{n} on its {held} {id}")
                    }
                })
                .collect();
            format!(
                "{scope} is still held by {total} other {}: {} (sexton holds list)",
                plural(total),
                by.join(", ")
            )
        }
    };
    Ok(format!(
        "released hold {} on {scope} (case {}) by {} at {}\n{still}\n",
        p.id,
        cell(&p.case_ref),
        hold.released_by.as_deref().map_or_else(String::new, cell),
        hold.released_at.map_or_else(String::new, time),
    ))
}

/// A moment as the tables show it, to the second.
pub fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `holds` as a table for people, one line each, every column (the reason last, as long as
/// it is).
pub fn table(holds: &[Hold]) -> String {
    let rows: Vec<[String; 9]> = holds
        .iter()
        .map(|h| {
            let p = &h.placed;
            [
                p.id.to_string(),
                p.scope.to_string(),
                p.scope_id.to_string(),
                cell(&p.case_ref),
                cell(&p.placed_by),
                time(p.placed_at),
                h.released_by
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), cell),
                h.released_at.map_or_else(|| "-".to_owned(), time),
                cell(&p.reason),
            ]
        })
        .collect();
    let header = [
        "id",
        "scope",
        "scope id",
        "case",
        "placed by",
        "placed at",
        "released by",
        "released at",
        "reason",
    ]
    .map(str::to_owned);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// Text from the database on one line of a table: shown, never obeyed, line breaks included.
fn cell(stored: &str) -> String {
    text::one_line(stored)
}

/// One active hold as `status` lists it.
pub fn line(hold: &Placed) -> String {
    format!(
        "{} on {} {}: case {}, placed by {} at {}: {}",
        hold.id,
        hold.scope,
        hold.scope_id,
        cell(&hold.case_ref),
        cell(&hold.placed_by),
        time(hold.placed_at),
        cell(&hold.reason)
    )
}
