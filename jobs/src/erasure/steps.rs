//! What an erasure deletes (RQ-2), children first, in bounded transactions (RQ-3), never
//! relying on the platform's `ON DELETE CASCADE`: every table's rows are deleted here, each
//! after everything under it, so that the same steps leave nothing behind on a schema without
//! one foreign key — and so that a cascade never reaches a row the erasure withholds.
//!
//! An owner step locks a batch of the scope's rows first (`FOR UPDATE … SKIP LOCKED`, in id
//! order; a session before its history — EX-6), then judges and deletes them in the
//! transaction's next statement, whose snapshot holds whatever committed before the lock was
//! granted: a run or an attempt inserted under a conversation while its batch waited is seen,
//! and the conversation stays. A sweep deletes at most a batch of rows of each of its tables
//! per statement, until none is left.
//!
//! Parameters: a lock statement takes `$1` the request, `$2` the last id taken (the nil UUID
//! first) and `$3` the batch size, and returns ids in order; a take statement takes `$1` the
//! request, `$2` the locked ids (`uuid[]`), `$3` whether usage records are kept; a sweep `$1`
//! the request, `$2` the batch size, `$3` whether usage records are kept. Take and sweep append
//! the rows they deleted per table to the request's counts and return them, one `jsonb` object
//! (tables with none left out).
//!
//! Every statement reads the platform's tables through their indexes, so that an erasure costs
//! what its scope holds, not what the tables hold: rows linked to the scope by either of two
//! columns are found by one read per column, never by one scan `OR`ing them, which no index
//! serves (`rq8_…_by_index` in tests/erasure/scale.rs).

/// Every table an erasure deletes rows of: the `table` labels of its metrics.
pub const TABLES: &[&str] = &[
    "run_tasks",
    "run_task_edges",
    "tool_results",
    "sealed_requests",
    "reasoning_traces",
    "invocation_attempts",
    "output_files",
    "settlement_receipts",
    "delegations",
    "history_request_sources",
    "history_requests",
    "usage_records",
    "runs",
    "follow_ups",
    "fragments",
    "variants",
    "turns",
    "conversation_events",
    "conversations",
    "conversation_archive_entries",
    "conversation_archives",
    "conversation_entries",
    "handoffs",
    "sessions",
    "dream_preloads",
    "working_records",
    "brain_memories",
    "agents",
    "board_tasks",
    "attachments",
    "session_retention_policies",
    "accounts",
];

/// How a step takes its rows.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    /// Lock a batch of owners, then judge and delete them with everything under them.
    Owners {
        lock: &'static str,
        take: &'static str,
    },
    /// Delete at most a batch of each table's rows per statement.
    Sweep(&'static str),
}

/// One step of a pass.
#[derive(Debug, Clone, Copy)]
pub struct Delete {
    pub shape: Shape,
    /// Taken only by a pass after a verification found a residue: what it sweeps the steps
    /// before it never leave behind on their own.
    pub after_residue: bool,
}

/// A lock statement over the request's members of `kind` in `table`.
macro_rules! lock {
    ($table:literal, $kind:literal) => {
        concat!(
            "SELECT t.id FROM sexton.erasure_members m JOIN ",
            $table,
            " t ON t.id = m.id
             WHERE m.request_id = $1 AND m.kind = '",
            $kind,
            "' AND m.id > $2
             ORDER BY m.id LIMIT $3
             FOR UPDATE OF t SKIP LOCKED"
        )
    };
}

/// The end of a statement whose CTEs are listed before it: the counts of those CTEs, as
/// `(table, CTE)` pairs, `{table: n}` for those above 0 — appended to request `$1`'s counts
/// (`sexton.erasure_removed`) by the statement itself, a round trip fewer per transaction, and
/// returned.
macro_rules! counts {
    ($(($table:literal, $cte:literal)),* $(,)?) => {
        concat!(
            ", counted AS (
                 SELECT COALESCE(jsonb_object_agg(t, n) FILTER (WHERE n > 0), '{}') AS removed
                 FROM (VALUES ",
            $("('", $table, "', (SELECT count(*) FROM ", $cte, ")),",)*
            "(NULL, 0)) AS c (t, n)),
             appended AS (INSERT INTO sexton.erasure_removed (request_id, removed)
                          SELECT $1, removed FROM counted WHERE removed <> '{}')
             SELECT removed FROM counted"
        )
    };
}

mod orphans;

use orphans::ORPHANS;

/// Runs, each with its execution detail, output files (recorded for the drain, each path once
/// and only if no other row still names it under any spelling: EX-3), settlements, delegations,
/// history requests and usage links. A run in flight or held stays (`erasure_run_withheld`).
const RUNS: Delete = Delete {
    after_residue: false,
    shape: Shape::Owners {
        lock: lock!("runs", "run"),
        take: concat!(
            "WITH judged AS (
                 SELECT r.id FROM runs r
                 WHERE r.id = ANY($2)
                   AND NOT EXISTS (SELECT 1 FROM sexton.erasure_run_withheld(r.id, r.status))),
             doomed AS (SELECT COALESCE(array_agg(id), '{}') AS ids FROM judged),
             tasks AS (DELETE FROM run_tasks WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[])
                       RETURNING 1),
             edges AS (DELETE FROM run_task_edges WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[])
                       RETURNING 1),
             tools AS (DELETE FROM tool_results WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[])
                       RETURNING 1),
             sealed AS (DELETE FROM sealed_requests WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[])
                        RETURNING 1),
             reasoning AS (DELETE FROM reasoning_traces
                           WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             attempts AS (DELETE FROM invocation_attempts
                          WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             outputs AS (DELETE FROM output_files WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[])
                         RETURNING run_id, relative_path),
             settled AS (DELETE FROM settlement_receipts
                         WHERE run_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             delegated AS (DELETE FROM delegations
                           WHERE parent_run_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             own_requests AS (SELECT q.id FROM history_requests q
                              WHERE q.run_id = ANY((SELECT ids FROM doomed)::uuid[])),
             read_sources AS (DELETE FROM history_request_sources s
                              WHERE s.source_run_id = ANY((SELECT ids FROM doomed)::uuid[])
                              RETURNING 1),
             own_sources AS (DELETE FROM history_request_sources s
                             WHERE s.history_request_id IN (SELECT id FROM own_requests)
                               AND s.source_run_id <> ALL((SELECT ids FROM doomed)::uuid[])
                             RETURNING 1),
             sources AS (SELECT 1 FROM read_sources UNION ALL SELECT 1 FROM own_sources),
             histories AS (DELETE FROM history_requests WHERE id IN (SELECT id FROM own_requests)
                           RETURNING 1),
             unbilled AS (UPDATE usage_records SET run_id = NULL, conversation_id = NULL
                          WHERE $3 AND run_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             billed AS (DELETE FROM usage_records
                        WHERE NOT $3 AND run_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             gone AS (DELETE FROM runs WHERE id = ANY((SELECT ids FROM doomed)::uuid[])
                      RETURNING id, account_id, conversation_id),
             pending AS (
                 INSERT INTO sexton.pending_file_deletions
                     (root, account_id, relative_path, run_ids, conversation_ids)
                 SELECT 'outputs', g.account_id, o.relative_path, array_agg(DISTINCT g.id),
                        COALESCE(array_agg(DISTINCT g.conversation_id)
                                     FILTER (WHERE g.conversation_id IS NOT NULL), '{}')
                 FROM outputs o JOIN gone g ON g.id = o.run_id
                 WHERE NOT EXISTS (
                     SELECT 1 FROM output_files x
                     WHERE sexton.path_key(x.relative_path) = sexton.path_key(o.relative_path)
                       AND x.run_id <> ALL((SELECT ids FROM doomed)::uuid[]))
                 GROUP BY g.account_id, o.relative_path)
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
                ("runs", "gone"),
            )
        ),
    },
};

/// Conversations (a fork is one of the scope's), once no run of theirs is left: their turns,
/// variants, follow-ups, the fragments only those follow-ups reference, their events and
/// history requests, and their usage links.
const CONVERSATIONS: Delete = Delete {
    after_residue: false,
    shape: Shape::Owners {
        lock: lock!("conversations", "conversation"),
        take: concat!(
            "WITH judged AS (
                 SELECT c.id FROM conversations c
                 WHERE c.id = ANY($2)
                   AND NOT EXISTS (SELECT 1
                                   FROM sexton.erasure_conversation_withheld(c.id, c.account_id))),
             doomed AS (SELECT COALESCE(array_agg(id), '{}') AS ids FROM judged),
             turn_ids AS (SELECT t.id FROM turns t
                          WHERE t.conversation_id = ANY((SELECT ids FROM doomed)::uuid[])),
             variant_ids AS (SELECT v.id FROM variants v
                             WHERE v.turn_id IN (SELECT id FROM turn_ids)),
             follow AS (DELETE FROM follow_ups f WHERE f.variant_id IN (SELECT id FROM variant_ids)
                        RETURNING f.id, f.body),
             named AS (SELECT DISTINCT sexton.jsonb_uuid(e -> 'fragment_id') AS id
                       FROM follow,
                            jsonb_array_elements(CASE jsonb_typeof(follow.body -> 'fragments')
                                                     WHEN 'array' THEN follow.body -> 'fragments'
                                                     ELSE '[]' END) e),
             fragments_gone AS (
                 DELETE FROM fragments g
                 WHERE g.id IN (SELECT id FROM named WHERE id IS NOT NULL)
                   AND NOT EXISTS (
                       SELECT 1 FROM follow_ups o
                       WHERE o.body @> jsonb_build_object(
                                 'fragments',
                                 jsonb_build_array(jsonb_build_object('fragment_id', g.id::text)))
                         AND o.id NOT IN (SELECT id FROM follow))
                 RETURNING 1),
             variants_gone AS (DELETE FROM variants WHERE id IN (SELECT id FROM variant_ids)
                               RETURNING 1),
             turns_gone AS (DELETE FROM turns WHERE id IN (SELECT id FROM turn_ids) RETURNING 1),
             events AS (DELETE FROM conversation_events
                        WHERE conversation_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             requests AS (SELECT q.id FROM history_requests q
                          WHERE q.conversation_id = ANY((SELECT ids FROM doomed)::uuid[])),
             sources AS (DELETE FROM history_request_sources
                         WHERE history_request_id IN (SELECT id FROM requests) RETURNING 1),
             histories AS (DELETE FROM history_requests WHERE id IN (SELECT id FROM requests)
                           RETURNING 1),
             unbilled AS (UPDATE usage_records SET conversation_id = NULL
                          WHERE $3 AND conversation_id = ANY((SELECT ids FROM doomed)::uuid[])
                          RETURNING 1),
             billed AS (DELETE FROM usage_records
                        WHERE NOT $3 AND conversation_id = ANY((SELECT ids FROM doomed)::uuid[])
                        RETURNING 1),
             gone AS (DELETE FROM conversations WHERE id = ANY((SELECT ids FROM doomed)::uuid[])
                      RETURNING 1)
             ",
            counts!(
                ("follow_ups", "follow"),
                ("fragments", "fragments_gone"),
                ("variants", "variants_gone"),
                ("turns", "turns_gone"),
                ("conversation_events", "events"),
                ("history_request_sources", "sources"),
                ("history_requests", "histories"),
                ("usage_records", "billed"),
                ("conversations", "gone"),
            )
        ),
    },
};

/// Sessions, each with its history, archives and the handoffs naming it (unless a hold on the
/// other session keeps a handoff); its directory recorded for the drain (frames included).
const SESSIONS: Delete = Delete {
    after_residue: false,
    shape: Shape::Owners {
        lock: lock!("sessions", "session"),
        take: concat!(
            "WITH judged AS (
                 SELECT s.id FROM sessions s
                 WHERE s.id = ANY($2)
                   AND NOT EXISTS (SELECT 1 FROM sexton.erasure_session_withheld(
                                       $1, s.id, s.account_id, s.agent_id, s.state))),
             doomed AS (SELECT COALESCE(array_agg(id), '{}') AS ids FROM judged),
             archive_entries AS (
                 DELETE FROM conversation_archive_entries
                 WHERE archive_id IN (SELECT id FROM conversation_archives
                                      WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[]))
                 RETURNING 1),
             archives AS (DELETE FROM conversation_archives
                          WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             entries AS (DELETE FROM conversation_entries
                         WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1),
             handed AS (
                 DELETE FROM handoffs h
                 WHERE (h.from_session_id = ANY((SELECT ids FROM doomed)::uuid[])
                        OR h.to_session_id = ANY((SELECT ids FROM doomed)::uuid[]))
                   AND NOT EXISTS (SELECT 1 FROM sexton.handoff_holds(
                                       h.account_id, h.agent_id, h.from_session_id,
                                       h.to_session_id))
                 RETURNING 1),
             gone AS (DELETE FROM sessions WHERE id = ANY((SELECT ids FROM doomed)::uuid[])
                      RETURNING id, account_id, agent_id),
             directories AS (
                 INSERT INTO sexton.pending_file_deletions
                     (root, account_id, relative_path, agent_id, session_id)
                 SELECT 'sessions', account_id, id::text, agent_id, id FROM gone)
             ",
            counts!(
                ("conversation_archive_entries", "archive_entries"),
                ("conversation_archives", "archives"),
                ("conversation_entries", "entries"),
                ("handoffs", "handed"),
                ("sessions", "gone"),
            )
        ),
    },
};

/// An agent's own records — handoffs, dream preloads, working records pinned or not, brain
/// memories of every revision — unless a hold on the agent or its account keeps them; whether
/// or not the agent's row is still there.
const AGENT_RECORDS: Delete = Delete {
    after_residue: false,
    shape: Shape::Sweep(concat!(
        "WITH agent AS (
             SELECT m.id FROM sexton.erasure_members m
             WHERE m.request_id = $1 AND m.kind = 'agent'
               AND NOT EXISTS (SELECT 1 FROM sexton.holds_of(
                                   (SELECT e.account_id FROM sexton.erasures e WHERE e.id = $1),
                                   NULL, m.id, NULL, NULL))),
         handed AS (DELETE FROM handoffs WHERE id IN (
                        SELECT h.id FROM handoffs h WHERE h.agent_id IN (SELECT id FROM agent)
                          AND NOT EXISTS (SELECT 1 FROM sexton.handoff_holds(
                                              h.account_id, h.agent_id, h.from_session_id,
                                              h.to_session_id))
                        LIMIT $2)
                    RETURNING 1),
         preloads AS (DELETE FROM dream_preloads WHERE id IN (
                          SELECT d.id FROM dream_preloads d
                          WHERE d.agent_id IN (SELECT id FROM agent) LIMIT $2)
                      RETURNING 1),
         records AS (DELETE FROM working_records WHERE id IN (
                         SELECT w.id FROM working_records w
                         WHERE w.agent_id IN (SELECT id FROM agent) LIMIT $2)
                     RETURNING 1),
         memories AS (DELETE FROM brain_memories WHERE id IN (
                          SELECT b.id FROM brain_memories b
                          WHERE b.agent_id IN (SELECT id FROM agent) LIMIT $2)
                      RETURNING 1)
         ",
        counts!(
            ("handoffs", "handed"),
            ("dream_preloads", "preloads"),
            ("working_records", "records"),
            ("brain_memories", "memories"),
        )
    )),
};

/// Agents, once nothing of theirs is left and no hold covers them.
const AGENTS: Delete = Delete {
    after_residue: false,
    shape: Shape::Owners {
        lock: lock!("agents", "agent"),
        take: concat!(
            "WITH gone AS (
                 DELETE FROM agents a
                 WHERE a.id = ANY($2)
                   AND NOT EXISTS (SELECT 1 FROM sexton.erasure_agent_withheld(a.id, a.account_id))
                   AND NOT EXISTS (SELECT 1 FROM handoffs h WHERE h.agent_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM dream_preloads d WHERE d.agent_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM working_records w WHERE w.agent_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM brain_memories b WHERE b.agent_id = a.id)
                 RETURNING 1)
             ",
            counts!(("agents", "gone"))
        ),
    },
};

/// An account's own rows (an account erasure): fragments, board tasks, attachments (their
/// bytes recorded for the drain), its session retention policy, and — unless kept by law —
/// its usage records; nothing while a hold covers the account.
const ACCOUNT_RECORDS: Delete = Delete {
    after_residue: false,
    shape: Shape::Sweep(concat!(
        "WITH account AS (
             SELECT m.id FROM sexton.erasure_members m
             WHERE m.request_id = $1 AND m.kind = 'account'
               AND NOT EXISTS (SELECT 1 FROM sexton.account_holds(m.id))),
         fragments_gone AS (DELETE FROM fragments WHERE id IN (
                                SELECT f.id FROM fragments f
                                WHERE f.account_id IN (SELECT id FROM account) LIMIT $2)
                            RETURNING 1),
         tasks AS (DELETE FROM board_tasks WHERE id IN (
                       SELECT b.id FROM board_tasks b
                       WHERE b.account_id IN (SELECT id FROM account) LIMIT $2)
                   RETURNING 1),
         attached AS (DELETE FROM attachments WHERE id IN (
                          SELECT a.id FROM attachments a
                          WHERE a.account_id IN (SELECT id FROM account) LIMIT $2)
                      RETURNING account_id, relative_path, bytes_expired_at),
         bytes AS (INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
                   SELECT DISTINCT 'attachments', account_id, relative_path FROM attached
                   WHERE sexton.attachment_live(bytes_expired_at)),
         policies AS (DELETE FROM session_retention_policies
                      WHERE account_id IN (SELECT id FROM account) RETURNING 1),
         billed AS (DELETE FROM usage_records WHERE NOT $3 AND id IN (
                        SELECT u.id FROM usage_records u
                        WHERE u.account_id IN (SELECT id FROM account) LIMIT $2)
                    RETURNING 1)
         ",
        counts!(
            ("fragments", "fragments_gone"),
            ("board_tasks", "tasks"),
            ("attachments", "attached"),
            ("session_retention_policies", "policies"),
            ("usage_records", "billed"),
        )
    )),
};

/// The account row itself, once nothing of it is left: deleted, or — when usage records are
/// kept by law — kept as their anchor, its name the request's id (RQ-2).
const ACCOUNT: Delete = Delete {
    after_residue: false,
    shape: Shape::Owners {
        lock: lock!("accounts", "account"),
        take: concat!(
            "WITH judged AS (
                 SELECT a.id, EXISTS (SELECT 1 FROM usage_records u WHERE u.account_id = a.id)
                                  AS billed
                 FROM accounts a
                 WHERE a.id = ANY($2)
                   AND NOT EXISTS (SELECT 1 FROM sexton.account_holds(a.id))
                   AND NOT EXISTS (SELECT 1 FROM conversations x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM agents x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM fragments x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM board_tasks x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM attachments x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM handoffs x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM dream_preloads x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM working_records x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM brain_memories x WHERE x.account_id = a.id)
                   AND NOT EXISTS (SELECT 1 FROM session_retention_policies x
                                   WHERE x.account_id = a.id)),
             anchored AS (UPDATE accounts a SET name = $1::text
                          WHERE a.id IN (SELECT id FROM judged WHERE billed)),
             gone AS (DELETE FROM accounts WHERE id IN (SELECT id FROM judged WHERE NOT billed)
                      RETURNING 1)
             ",
            counts!(("accounts", "gone"))
        ),
    },
};

/// The steps of a pass, in order: children before what they hang from.
pub const STEPS: &[Delete] = &[
    RUNS,
    CONVERSATIONS,
    SESSIONS,
    AGENT_RECORDS,
    AGENTS,
    ACCOUNT_RECORDS,
    ACCOUNT,
    ORPHANS,
];
