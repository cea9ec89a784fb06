//! The step a pass takes only after a verification found a residue: rows whose parent is gone.

use super::{Delete, Shape};

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
         tasks AS (DELETE FROM run_tasks WHERE id IN (
                       SELECT x.id FROM run_tasks x WHERE x.run_id IN (SELECT id FROM run) LIMIT $2)
                   RETURNING 1),
         edges AS (DELETE FROM run_task_edges WHERE ctid IN (
                       SELECT x.ctid FROM run_task_edges x
                       WHERE x.run_id IN (SELECT id FROM run) LIMIT $2)
                   RETURNING 1),
         tools AS (DELETE FROM tool_results WHERE id IN (
                       SELECT x.id FROM tool_results x WHERE x.run_id IN (SELECT id FROM run)
                       LIMIT $2)
                   RETURNING 1),
         sealed AS (DELETE FROM sealed_requests WHERE id IN (
                        SELECT x.id FROM sealed_requests x WHERE x.run_id IN (SELECT id FROM run)
                        LIMIT $2)
                    RETURNING 1),
         reasoning AS (DELETE FROM reasoning_traces WHERE id IN (
                           SELECT x.id FROM reasoning_traces x
                           WHERE x.run_id IN (SELECT id FROM run) LIMIT $2)
                       RETURNING 1),
         attempts AS (DELETE FROM invocation_attempts WHERE id IN (
                          SELECT x.id FROM invocation_attempts x
                          WHERE x.run_id IN (SELECT id FROM run) LIMIT $2)
                      RETURNING 1),
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
         settled AS (DELETE FROM settlement_receipts WHERE id IN (
                         SELECT x.id FROM settlement_receipts x
                         WHERE x.run_id IN (SELECT id FROM run) LIMIT $2)
                     RETURNING 1),
         delegated AS (DELETE FROM delegations WHERE id IN (
                           SELECT x.id FROM delegations x
                           WHERE x.parent_run_id IN (SELECT id FROM run) LIMIT $2)
                       RETURNING 1),
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
         turns_gone AS (DELETE FROM turns WHERE id IN (
                            SELECT x.id FROM turns x WHERE x.conversation_id IN (SELECT id FROM conv)
                            LIMIT $2)
                        RETURNING 1),
         variants_gone AS (DELETE FROM variants WHERE id IN (
                               SELECT x.id FROM variants x WHERE x.turn_id IN (SELECT id FROM turn)
                               LIMIT $2)
                           RETURNING 1),
         follow AS (DELETE FROM follow_ups WHERE id IN (
                        SELECT x.id FROM follow_ups x WHERE x.variant_id IN (SELECT id FROM variant)
                        LIMIT $2)
                    RETURNING 1),
         events AS (DELETE FROM conversation_events WHERE id IN (
                        SELECT x.id FROM conversation_events x
                        WHERE x.conversation_id IN (SELECT id FROM conv) LIMIT $2)
                    RETURNING 1),
         entries AS (DELETE FROM conversation_entries WHERE id IN (
                         SELECT x.id FROM conversation_entries x
                         WHERE x.session_id IN (SELECT id FROM sess) LIMIT $2)
                     RETURNING 1),
         archives AS (DELETE FROM conversation_archives WHERE id IN (
                          SELECT x.id FROM conversation_archives x
                          WHERE x.session_id IN (SELECT id FROM sess) LIMIT $2)
                      RETURNING 1),
         archive_entries AS (DELETE FROM conversation_archive_entries WHERE ctid IN (
                                 SELECT x.ctid FROM conversation_archive_entries x
                                 WHERE x.archive_id IN (SELECT id FROM archive) LIMIT $2)
                             RETURNING 1),
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
