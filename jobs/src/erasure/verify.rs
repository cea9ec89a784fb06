//! What is left of a request's scope (RQ-4, RQ-5), read independently of the statements that
//! delete it: a count per table of the data contract by the scope's ids and by its account,
//! what stays withheld and why, and the files of the scope a listing of the roots still finds.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use super::Withheld;
use super::derivatives;
use crate::files::PathSettings;

/// The scope's rows left in each `(table, column)` whose column names a run, tables with none
/// left out: one index probe per run of the scope, read from the members' key in id order. A
/// join, not `IN`: a run is a member once (the key), so the count is the same without sorting
/// the scope's runs once per table.
macro_rules! detail {
    ($(($table:literal, $column:literal)),+ $(,)?) => {
        concat!(
            "SELECT t, n FROM (VALUES ",
            $("('", $table, "', (SELECT count(*) FROM sexton.erasure_members m JOIN ", $table,
              " x ON x.", $column, " = m.id WHERE m.request_id = $1 AND m.kind = 'run')), ",)+
            "(NULL, 0)) AS c (t, n) WHERE n > 0"
        )
    };
}

/// `(table, count)`: the rows of `table` whose column names an id of the scope, for each
/// `(column, kind)` given (`kind` the members' kind), counted once — one read per column, from
/// the members' key, each row found through the column's index, and their union. Never one
/// scan `OR`ing the columns: no index serves that, and every request, however small its scope,
/// would read the table whole. `$1` the request.
macro_rules! linked {
    ($table:literal: $(($column:literal, $kind:literal)),+ $(,)?) => {
        concat!(
            "('", $table, "', (SELECT count(*) FROM (",
            $("SELECT x.ctid FROM sexton.erasure_members m JOIN ", $table, " x ON x.", $column,
              " = m.id WHERE m.request_id = $1 AND m.kind = '", $kind, "' UNION ",)+
            // The union's last member, empty: each column's read above ends in `UNION`.
            "SELECT NULL::tid WHERE false) u)),\n"
        )
    };
}

/// Rows of the scope left, per table, in three statements a verification may run on two
/// connections side by side: the runs' execution detail (most of the rows, each table one
/// probe per run) in two halves, then every other table.
const REMAINING: [&str; 3] = [
    detail!(
        ("run_tasks", "run_id"),
        ("run_task_edges", "run_id"),
        ("tool_results", "run_id"),
        ("sealed_requests", "run_id"),
        ("reasoning_traces", "run_id"),
    ),
    detail!(
        ("invocation_attempts", "run_id"),
        ("output_files", "run_id"),
        ("settlement_receipts", "run_id"),
        ("delegations", "parent_run_id"),
    ),
    concat!(
        "SELECT t, n FROM (VALUES
  ('accounts', (SELECT count(*) FROM sexton.erasure_members m JOIN accounts x ON x.id = m.id
                WHERE m.request_id = $1 AND m.kind = 'account'
                  AND NOT ($2 AND x.name = $1::text))),
",
        linked!("conversations": ("id", "conversation"), ("account_id", "account")),
        linked!("turns": ("id", "turn"), ("conversation_id", "conversation")),
        linked!("variants": ("id", "variant"), ("turn_id", "turn")),
        linked!("follow_ups": ("variant_id", "variant")),
        linked!(
            "runs": ("id", "run"),
            ("conversation_id", "conversation"),
            ("account_id", "account"),
        ),
        linked!(
            "history_requests": ("id", "history_request"),
            ("run_id", "run"),
            ("conversation_id", "conversation"),
        ),
        linked!(
            "history_request_sources": ("history_request_id", "history_request"),
            ("source_run_id", "run"),
        ),
        linked!("conversation_events": ("conversation_id", "conversation")),
        linked!("agents": ("id", "agent"), ("account_id", "account")),
        linked!(
            "sessions": ("id", "session"),
            ("agent_id", "agent"),
            ("account_id", "account"),
        ),
        linked!("conversation_entries": ("session_id", "session")),
        linked!("conversation_archives": ("id", "archive"), ("session_id", "session")),
        linked!("conversation_archive_entries": ("archive_id", "archive")),
        linked!(
            "handoffs": ("agent_id", "agent"),
            ("from_session_id", "session"),
            ("to_session_id", "session"),
            ("account_id", "account"),
        ),
        linked!("dream_preloads": ("agent_id", "agent"), ("account_id", "account")),
        linked!("working_records": ("agent_id", "agent"), ("account_id", "account")),
        linked!("brain_memories": ("agent_id", "agent"), ("account_id", "account")),
        linked!("fragments": ("account_id", "account")),
        linked!("board_tasks": ("account_id", "account")),
        linked!("attachments": ("account_id", "account")),
        linked!("session_retention_policies": ("account_id", "account")),
        "  ('usage_records', (SELECT count(*) FROM (
       SELECT x.ctid FROM sexton.erasure_members m JOIN usage_records x ON x.run_id = m.id
       WHERE m.request_id = $1 AND m.kind = 'run'
       UNION SELECT x.ctid FROM sexton.erasure_members m
             JOIN usage_records x ON x.conversation_id = m.id
             WHERE m.request_id = $1 AND m.kind = 'conversation'
       UNION SELECT x.ctid FROM sexton.erasure_members m
             JOIN usage_records x ON x.account_id = m.id
             WHERE NOT $2 AND m.request_id = $1 AND m.kind = 'account') u)),
  -- sexton's own record of files to remove, emptied as they go: read whole, each record's
  -- owners looked up by the members' key.
  ('pending_file_deletions', (SELECT count(*) FROM sexton.pending_file_deletions x
                              WHERE EXISTS (SELECT 1 FROM unnest(x.run_ids) r (id)
                                            JOIN sexton.erasure_members m
                                              ON m.request_id = $1 AND m.kind = 'run'
                                             AND m.id = r.id)
                                 OR EXISTS (SELECT 1 FROM sexton.erasure_members m
                                            WHERE m.request_id = $1 AND m.kind = 'session'
                                              AND m.id = x.session_id)
                                 OR EXISTS (SELECT 1 FROM sexton.erasure_members m
                                            WHERE m.request_id = $1 AND m.kind = 'agent'
                                              AND m.id = x.agent_id)
                                 OR EXISTS (SELECT 1 FROM sexton.erasure_members m
                                            WHERE m.request_id = $1 AND m.kind = 'account'
                                              AND m.id = x.account_id)))
) AS c (t, n)
WHERE n > 0"
    ),
];

/// The owners of the scope left with why each stays: one row per owner, its first reason and
/// hold. `$1` the request; `$2` whether the steps have yet to run (a dry run), when only the
/// owners that would stay for a reason of their own are listed. After the steps, an owner left
/// with no reason was locked when its batch came (busy).
const WITHHELD: &str = "
WITH m AS (SELECT kind, id FROM sexton.erasure_members WHERE request_id = $1),
owners (what, id, reason, hold) AS (
  SELECT 'run', r.id, w.reason, w.hold FROM runs r
  LEFT JOIN LATERAL (SELECT * FROM sexton.erasure_run_withheld(r.id, r.status) LIMIT 1) w ON true
  WHERE r.id IN (SELECT id FROM m WHERE kind = 'run')
  UNION ALL
  SELECT 'conversation', c.id, w.reason, w.hold FROM conversations c
  LEFT JOIN LATERAL (SELECT * FROM sexton.erasure_conversation_withheld(c.id, c.account_id)
                     LIMIT 1) w ON true
  WHERE c.id IN (SELECT id FROM m WHERE kind = 'conversation')
  UNION ALL
  SELECT 'session', s.id, w.reason, w.hold FROM sessions s
  LEFT JOIN LATERAL (SELECT * FROM sexton.erasure_session_withheld(
                         $1, s.id, s.account_id, s.agent_id, s.state) LIMIT 1) w ON true
  WHERE s.id IN (SELECT id FROM m WHERE kind = 'session')
  UNION ALL
  SELECT 'agent', g.id, w.reason, w.hold FROM agents g
  LEFT JOIN LATERAL (SELECT * FROM sexton.erasure_agent_withheld(g.id, g.account_id) LIMIT 1) w
      ON true
  WHERE g.id IN (SELECT id FROM m WHERE kind = 'agent')
  UNION ALL
  SELECT 'account', a.id, 'legal_hold', h.id FROM accounts a
  JOIN LATERAL (SELECT * FROM sexton.account_holds(a.id) LIMIT 1) h ON true
  WHERE a.id IN (SELECT id FROM m WHERE kind = 'account'))
SELECT o.what, o.id, COALESCE(o.reason, 'busy') AS reason, o.hold, h.case_ref
FROM owners o LEFT JOIN sexton.holds h ON h.id = o.hold
-- Before the steps every owner is still there: one without a reason would go, and a parent
-- waits for its children only if one of them is withheld, which that child's row says.
WHERE NOT $2 OR (o.reason IS NOT NULL AND o.reason <> 'withheld_child')
ORDER BY o.what, o.id";

/// The verification's statements, with their parameters' types: what is left, and why the
/// owners left stay.
pub(super) const STATEMENTS: [(&str, &str); 4] = [
    (REMAINING[0], "uuid"),
    (REMAINING[1], "uuid"),
    (REMAINING[2], "uuid, boolean"),
    (WITHHELD, "uuid, boolean"),
];

/// When what is left is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Before any step ran (`sexton erase --dry-run`): what would go, and what would stay.
    Before,
    /// After a pass's steps: what they left.
    After,
}

/// An owner that stays, as `sexton erase status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Item {
    pub what: String,
    pub id: Uuid,
    pub reason: Withheld,
    pub hold: Option<Uuid>,
    pub case_ref: Option<String>,
}

/// What is left of a request's scope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Left {
    /// Rows per table (kept-by-law rows not counted).
    pub rows: BTreeMap<String, i64>,
    /// Owners that stay, by reason.
    pub withheld: BTreeMap<Withheld, u64>,
    /// The first of them, for people.
    pub items: Vec<Item>,
    /// Files of the scope the roots still hold, per root.
    pub files: BTreeMap<String, u64>,
}

/// Items named in a request's status at most.
pub const ITEMS_SHOWN: usize = 20;

impl Left {
    pub fn nothing(&self) -> bool {
        self.rows.is_empty() && self.files.is_empty()
    }
}

/// Reads what is left of request `request` (an independent read: RQ-5), at `reading`: the
/// tables on `conn` and, with `beside`, half of them on that connection at the same time, and
/// the roots' listings beside both.
///
/// # Errors
/// A database error, or a root that cannot be listed (for people).
pub async fn left(
    conn: &mut PgConnection,
    beside: Option<&mut PgConnection>,
    paths: &PathSettings,
    request: Uuid,
    keep_usage: bool,
    reading: Reading,
) -> Result<Left, String> {
    let db = |err: sqlx::Error| err.to_string();
    let members: Vec<(String, Uuid)> = sqlx::query_as(
        "SELECT kind, id FROM sexton.erasure_members
         WHERE request_id = $1 AND kind IN ('agent', 'session') ORDER BY kind, id",
    )
    .bind(request)
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let remaining = |statement| {
        sqlx::query_as::<_, (String, i64)>(statement)
            .bind(request)
            .bind(keep_usage)
    };
    let withheld = || {
        sqlx::query_as::<_, Item>(WITHHELD)
            .bind(request)
            .bind(reading == Reading::Before)
    };
    let [first, second, rest] = REMAINING;
    let tables = async {
        let mut rows = Vec::new();
        let owners = match beside {
            Some(beside) => {
                let (one, other) = tokio::join!(remaining(first).fetch_all(&mut *conn), async {
                    let mut rows = remaining(second).fetch_all(&mut *beside).await?;
                    rows.extend(remaining(rest).fetch_all(&mut *beside).await?);
                    Ok::<_, sqlx::Error>((rows, withheld().fetch_all(&mut *beside).await?))
                });
                let (other, owners) = other?;
                rows.extend(one?);
                rows.extend(other);
                owners
            }
            None => {
                for statement in REMAINING {
                    rows.extend(remaining(statement).fetch_all(&mut *conn).await?);
                }
                withheld().fetch_all(&mut *conn).await?
            }
        };
        Ok::<_, sqlx::Error>((rows, owners))
    };
    let (tables, files) = tokio::join!(tables, files_left(paths, &members));
    let (rows, owners) = tables.map_err(db)?;
    let mut left = Left {
        rows: rows.into_iter().collect(),
        files: files?,
        ..Left::default()
    };
    for item in owners {
        *left.withheld.entry(item.reason).or_default() += 1;
        if left.items.len() < ITEMS_SHOWN {
            left.items.push(item);
        }
    }
    Ok(left)
}

/// Files of the scope the roots still hold, per root: the directories of its sessions, and the
/// traces of its agents or — a session erased on its own — those whose signature names it,
/// wherever they are. `members` are the scope's agents and sessions.
async fn files_left(
    paths: &PathSettings,
    members: &[(String, Uuid)],
) -> Result<BTreeMap<String, u64>, String> {
    let mut files = BTreeMap::new();
    let agents = members.iter().any(|(kind, _)| kind == "agent");
    let sessions: Vec<Uuid> = members
        .iter()
        .filter(|(kind, _)| kind == "session")
        .map(|(_, id)| *id)
        .collect();
    if !agents && !sessions.is_empty() {
        let traces = derivatives::traces(paths, None, false, &sessions).await?;
        if !traces.is_empty() {
            *files.entry("traces".to_owned()).or_default() += traces.len() as u64;
        }
    }
    for (kind, id) in members {
        if kind == "session" && derivatives::session_directory(paths, *id).await? {
            *files.entry("sessions".to_owned()).or_default() += 1;
        }
        if kind == "agent" {
            let traces = derivatives::traces(paths, Some(*id), true, &[]).await?;
            if !traces.is_empty() {
                *files.entry("traces".to_owned()).or_default() += traces.len() as u64;
            }
        }
    }
    Ok(files)
}
