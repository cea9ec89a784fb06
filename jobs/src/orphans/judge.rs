//! What the database says of a batch of entries (DC-1, DC-2): which a row (or a pending
//! deletion) names, and which a hold keeps. Each question is one statement for the whole batch,
//! through the indexes (the path keys, the primary keys, `holds_active`); the same statements
//! judge an entry and ask again just before it is unlinked.

use std::collections::HashSet;

use sqlx::PgConnection;
use uuid::Uuid;

use crate::files::Root;

/// What kind of entry is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A file under the outputs root.
    Output,
    /// A file under the attachments root.
    Attachment,
    /// `<sessions_root>/<session>/`.
    SessionDir,
    /// `<sessions_root>/<session>/archive/<kind>-<archive>.frame`.
    Frame,
    /// `<traces_root>/<agent>/`.
    TraceDir,
}

/// One entry as the database is asked about it.
#[derive(Debug, Clone, Default)]
pub(super) struct Subject {
    /// Its path relative to the root, when it is UTF-8 (no row can name another).
    pub text: Option<String>,
    /// The id its name is: the session, the agent, the archive.
    pub id: Option<Uuid>,
    /// The ids whose holds keep it: the UUIDs its path names (a file), its session (a frame),
    /// its own (a directory).
    pub ids: Vec<Uuid>,
}

/// The UUIDs a path names: every segment that starts with one in its hyphenated form
/// (`<account>/<run>/out.bin`, `<account>/<attachment>.bin`).
pub(super) fn ids_in(path: &[u8]) -> Vec<Uuid> {
    path.split(|b| *b == b'/')
        .filter_map(|segment| uuid_named(segment.get(..36)?))
        .collect()
}

/// The UUID `name` is, in its hyphenated form only (how the platform names its directories).
pub(super) fn uuid_named(name: &[u8]) -> Option<Uuid> {
    if name.len() != 36 {
        return None;
    }
    Uuid::try_parse_ascii(name).ok()
}

/// Which of `subjects` a row names, or a pending deletion covers (in their order).
///
/// # Errors
/// A database error.
pub(super) async fn named(
    conn: &mut PgConnection,
    kind: Kind,
    subjects: &[Subject],
) -> Result<Vec<bool>, sqlx::Error> {
    match kind {
        Kind::Output | Kind::Attachment => {
            let root = if kind == Kind::Output {
                Root::Outputs
            } else {
                Root::Attachments
            };
            let texts: Vec<String> = subjects.iter().filter_map(|s| s.text.clone()).collect();
            let referenced = root
                .referenced_sql()
                .expect("the outputs and attachments roots have rows naming their files");
            let named: HashSet<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "{referenced} UNION {PENDING}"
            )))
            .bind(&texts)
            .bind(root.as_str())
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
            Ok(subjects
                .iter()
                .map(|s| s.text.as_ref().is_some_and(|text| named.contains(text)))
                .collect())
        }
        Kind::SessionDir => {
            by_id(
                conn,
                subjects,
                "SELECT u FROM unnest($1::uuid[]) u
                 WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.id = u)
                    OR EXISTS (SELECT 1 FROM sexton.pending_file_deletions d
                               WHERE d.root = 'sessions'
                                 AND sexton.path_key(d.relative_path) = u::text)",
            )
            .await
        }
        Kind::Frame => {
            by_id(
                conn,
                subjects,
                "SELECT u FROM unnest($1::uuid[]) u
                 WHERE EXISTS (SELECT 1 FROM conversation_archives a WHERE a.id = u)",
            )
            .await
        }
        Kind::TraceDir => {
            by_id(
                conn,
                subjects,
                "SELECT u FROM unnest($1::uuid[]) u WHERE EXISTS (SELECT 1 FROM agents g WHERE g.id = u)",
            )
            .await
        }
    }
}

/// The sessions of `ids` that exist: those whose frames are looked at.
///
/// # Errors
/// A database error.
pub(super) async fn sessions(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT s.id FROM sessions s WHERE s.id = ANY($1)")
        .bind(ids)
        .fetch_all(conn)
        .await
}

/// The paths of `$1` a pending deletion of root `$2` covers (under any spelling), asked in the
/// same statement as the rows that name them.
const PENDING: &str = "SELECT p FROM unnest($1::text[]) p
     WHERE EXISTS (SELECT 1 FROM sexton.pending_file_deletions d
                   WHERE d.root = $2 AND sexton.path_key(d.relative_path) = sexton.path_key(p))";

/// Which of `subjects` (by their `id`) `sql` returns, `$1` being their ids.
async fn by_id(
    conn: &mut PgConnection,
    subjects: &[Subject],
    sql: &'static str,
) -> Result<Vec<bool>, sqlx::Error> {
    let ids: Vec<Uuid> = subjects.iter().filter_map(|s| s.id).collect();
    let found: HashSet<Uuid> = sqlx::query_scalar(sql)
        .bind(&ids)
        .fetch_all(conn)
        .await?
        .into_iter()
        .collect();
    Ok(subjects
        .iter()
        .map(|s| s.id.is_some_and(|id| found.contains(&id)))
        .collect())
}

/// Which of `subjects` a hold keeps (HD-2, HD-3), in their order: a hold on an id its path
/// names or on what a surviving row ties that id to (`sexton.id_holds`); a session directory
/// whose row is gone under every account or agent hold, a trace directory whose agent is gone
/// under every account hold (`sexton.trace_holds`), as no row says whose they were.
///
/// # Errors
/// A database error: nothing is removed when the holds cannot be read.
pub(super) async fn held(
    conn: &mut PgConnection,
    kind: Kind,
    subjects: &[Subject],
) -> Result<Vec<bool>, sqlx::Error> {
    let (ns, ids): (Vec<i32>, Vec<Uuid>) = subjects
        .iter()
        .enumerate()
        .flat_map(|(n, s)| s.ids.iter().map(move |id| (n as i32, *id)))
        .unzip();
    let covered = match kind {
        Kind::Output | Kind::Attachment | Kind::Frame => {
            "EXISTS (SELECT 1 FROM sexton.id_holds(u.id))"
        }
        Kind::SessionDir => {
            "EXISTS (SELECT 1 FROM sexton.id_holds(u.id))
             OR EXISTS (SELECT 1 FROM sexton.holds h
                        WHERE h.released_at IS NULL AND h.scope IN ('account', 'agent'))"
        }
        Kind::TraceDir => "EXISTS (SELECT 1 FROM sexton.trace_holds(u.id, NULL))",
    };
    let held: HashSet<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT DISTINCT u.n FROM unnest($1::int[], $2::uuid[]) AS u (n, id) WHERE {covered}"
    )))
    .bind(&ns)
    .bind(&ids)
    .fetch_all(conn)
    .await?
    .into_iter()
    .collect();
    Ok((0..subjects.len())
        .map(|n| held.contains(&(n as i32)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dc2_a_path_names_the_uuids_its_segments_start_with() {
        let account = Uuid::new_v4();
        let run = Uuid::new_v4();
        let path = format!("{account}/{run}.bin/x/{}", "not-a-uuid");
        assert_eq!(ids_in(path.as_bytes()), vec![account, run]);
        assert_eq!(ids_in(b"a/\xff\xfe/b"), Vec::<Uuid>::new());
        assert_eq!(uuid_named(account.simple().to_string().as_bytes()), None);
    }
}
