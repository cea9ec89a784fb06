//! The step a pass takes only after a verification found a residue: rows whose parent is gone.

use super::{Delete, Shape};

/// A CTE `$cte` deleting at most a batch (`$2`) of `$table`'s rows whose `$column` names an id
/// of the CTE `$kind` (the scope's ids whose row is gone), found again by `$key`.
macro_rules! orphans {
    ($cte:ident, $table:ident, $key:ident, $column:ident, $kind:ident) => {
        concat!(
            "\n         ",
            stringify!($cte),
            " AS (DELETE FROM ",
            stringify!($table),
            " WHERE ",
            stringify!($key),
            " IN (SELECT x.",
            stringify!($key),
            " FROM ",
            stringify!($table),
            " x WHERE x.",
            stringify!($column),
            " IN (SELECT id FROM ",
            stringify!($kind),
            ") LIMIT $2) RETURNING 1),"
        )
    };
}

/// Rows that name an id of the scope whose row is already gone: what a schema without foreign
/// keys lets a writer leave behind (a tool result inserted beside its run's deletion), or what
/// the verification found (RQ-5). Their parents are gone, so no lock order applies; each table
/// at most a batch per statement. (Runs of a conversation that is gone are found by the next
/// pass's plan and go with the runs' step.) A table linked to the scope by two columns is read
/// once per column, each through its index, at most a batch each.
pub(super) const ORPHANS: Delete = Delete {
    after_residue: true,
    shape: Shape::Sweep(concat!(
        "WITH m AS (SELECT kind, id FROM sexton.erasure_members WHERE request_id = $1),
         run AS (SELECT id FROM m WHERE kind = 'run'
                   AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = m.id)),
         conv AS (SELECT id FROM m WHERE kind = 'conversation'
                    AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = m.id)),
         turn AS (SELECT id FROM m WHERE kind = 'turn'
                    AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = m.id)),
         variant AS (SELECT id FROM m WHERE kind = 'variant'
                       AND NOT EXISTS (SELECT 1 FROM variants v WHERE v.id = m.id)),
         sess AS (SELECT id FROM m WHERE kind = 'session'
                    AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = m.id)),
         archive AS (SELECT id FROM m WHERE kind = 'archive'
                       AND NOT EXISTS (SELECT 1 FROM conversation_archives a WHERE a.id = m.id)),
         hreq AS (SELECT id FROM m WHERE kind = 'history_request'
                    AND NOT EXISTS (SELECT 1 FROM history_requests q WHERE q.id = m.id)),
         ",
        orphans!(tasks, run_tasks, id, run_id, run),
        orphans!(edges, run_task_edges, ctid, run_id, run),
        orphans!(tools, tool_results, id, run_id, run),
        orphans!(sealed, sealed_requests, id, run_id, run),
        orphans!(reasoning, reasoning_traces, id, run_id, run),
        orphans!(attempts, invocation_attempts, id, run_id, run),
        "
         outputs AS (DELETE FROM output_files WHERE id IN (
                         SELECT x.id FROM output_files x WHERE x.run_id IN (SELECT id FROM run)
                         LIMIT $2)
                     RETURNING run_id, relative_path),
         pending AS (INSERT INTO sexton.pending_file_deletions
                         (root, account_id, relative_path, run_ids)
                     SELECT DISTINCT 'outputs',
                            COALESCE((SELECT e.account_id FROM sexton.erasures e WHERE e.id = $1),
                                     '00000000-0000-0000-0000-000000000000'),
                            o.relative_path, ARRAY[o.run_id]
                     FROM outputs o),
         ",
        orphans!(settled, settlement_receipts, id, run_id, run),
        orphans!(delegated, delegations, id, parent_run_id, run),
        "
         sources AS (DELETE FROM history_request_sources WHERE ctid IN (
                         (SELECT x.ctid FROM history_request_sources x
                          WHERE x.source_run_id IN (SELECT id FROM run) LIMIT $2)
                         UNION ALL
                         (SELECT x.ctid FROM history_request_sources x
                          WHERE x.history_request_id IN (SELECT id FROM hreq) LIMIT $2))
                     RETURNING 1),
         histories AS (DELETE FROM history_requests WHERE id IN (
                           (SELECT x.id FROM history_requests x
                            WHERE x.run_id IN (SELECT id FROM run) LIMIT $2)
                           UNION ALL
                           (SELECT x.id FROM history_requests x
                            WHERE x.conversation_id IN (SELECT id FROM conv) LIMIT $2))
                       RETURNING 1),
         linked_usage AS (
             (SELECT x.id FROM usage_records x WHERE x.run_id IN (SELECT id FROM run) LIMIT $2)
             UNION ALL
             (SELECT x.id FROM usage_records x
              WHERE x.conversation_id IN (SELECT id FROM conv) LIMIT $2)),
         unbilled AS (UPDATE usage_records SET run_id = NULL, conversation_id = NULL
                      WHERE $3 AND id IN (SELECT id FROM linked_usage)
                      RETURNING 1),
         billed AS (DELETE FROM usage_records WHERE NOT $3 AND id IN (SELECT id FROM linked_usage)
                    RETURNING 1),
         ",
        orphans!(turns_gone, turns, id, conversation_id, conv),
        orphans!(variants_gone, variants, id, turn_id, turn),
        orphans!(follow, follow_ups, id, variant_id, variant),
        orphans!(events, conversation_events, id, conversation_id, conv),
        orphans!(entries, conversation_entries, id, session_id, sess),
        orphans!(archives, conversation_archives, id, session_id, sess),
        orphans!(
            archive_entries,
            conversation_archive_entries,
            ctid,
            archive_id,
            archive
        ),
        "
         handed AS (DELETE FROM handoffs WHERE id IN (
                        SELECT h.id FROM handoffs h
                        WHERE h.id IN (SELECT x.id FROM handoffs x
                                       WHERE x.from_session_id IN (SELECT id FROM sess)
                                       UNION ALL
                                       SELECT x.id FROM handoffs x
                                       WHERE x.to_session_id IN (SELECT id FROM sess))
                          AND NOT EXISTS (SELECT 1 FROM sexton.handoff_holds(
                                              h.account_id, h.agent_id, h.from_session_id,
                                              h.to_session_id))
                        LIMIT $2)
                    RETURNING 1)
         ",
        counts!(
            ("run_tasks", "tasks"),
            ("run_task_edges", "edges"),
            ("tool_results", "tools"),
            ("sealed_requests", "sealed"),
            ("reasoning_traces", "reasoning"),
            ("invocation_attempts", "attempts"),
            ("output_files", "outputs"),
            ("settlement_receipts", "settled"),
            ("delegations", "delegated"),
            ("history_request_sources", "sources"),
            ("history_requests", "histories"),
            ("usage_records", "billed"),
            ("usage_records_unlinked", "unbilled"),
            ("turns", "turns_gone"),
            ("variants", "variants_gone"),
            ("follow_ups", "follow"),
            ("conversation_events", "events"),
            ("conversation_entries", "entries"),
            ("conversation_archives", "archives"),
            ("conversation_archive_entries", "archive_entries"),
            ("handoffs", "handed"),
        )
    )),
};
