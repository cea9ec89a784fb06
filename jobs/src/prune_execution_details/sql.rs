//! The statements of execution-detail pruning, rendered once from the parts every rule shares:
//! the age of a run (EX-2), what holds an owner back (EX-5), the re-check under lock. The
//! rendered text is in `jobs/tests/golden/prune_execution_details/`.

use std::sync::LazyLock;

use crate::files;

use super::{DETAIL_TABLES, RetainReason};

/// The age of a run for execution retention, as the window index spells it (EX-2).
pub(super) const AGE: &str = "(CASE WHEN kind = 'conversation' THEN completed_at \
                    WHEN settled_at IS NOT NULL THEN terminal_at END)";

/// A run that is an owner (EX-2) and still holds its detail: the window index's predicate.
pub(super) const UNPRUNED_OWNER: &str = "details_pruned_at IS NULL AND conversation_id IS NOT NULL \
                              AND kind IN ('conversation', 'direct_reply')";

/// What holds an owner back (HD-3, EX-5), in the order reasons are reported.
pub(super) const BLOCKERS: [RetainReason; 5] = [
    RetainReason::LegalHold,
    RetainReason::PendingWork,
    RetainReason::PendingSettlement,
    RetainReason::OutstandingDelegation,
    RetainReason::ActiveHistoryRequest,
];

/// The condition under which `reason` holds back the run whose id is the SQL expression `run`
/// (EX-5); `None` for the reasons found otherwise.
pub(super) fn blocks(reason: RetainReason, run: &str) -> Option<String> {
    Some(match reason {
        RetainReason::LegalHold => format!("EXISTS (SELECT 1 FROM sexton.run_holds({run}))"),
        RetainReason::PendingWork => format!(
            "EXISTS (SELECT 1 FROM invocation_attempts \
                     WHERE run_id = {run} AND status IN ('pending', 'running'))"
        ),
        RetainReason::PendingSettlement => format!(
            "EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = {run} AND status = 'pending')"
        ),
        RetainReason::OutstandingDelegation => format!(
            "EXISTS (SELECT 1 FROM delegations \
                     WHERE parent_run_id = {run} AND status = 'outstanding')"
        ),
        RetainReason::ActiveHistoryRequest => format!(
            "EXISTS (SELECT 1 FROM history_request_sources s \
                     JOIN history_requests h ON h.id = s.history_request_id \
                     WHERE s.source_run_id = {run} AND h.sealed_at IS NULL)"
        ),
        RetainReason::NotEligible | RetainReason::Busy | RetainReason::InvalidWindow => {
            return None;
        }
    })
}

/// The blockers' conditions on the run id expression `run`, each rendered by `render`.
pub(super) fn blockers(
    run: &str,
    render: impl Fn(RetainReason, String) -> String,
    separator: &str,
) -> String {
    BLOCKERS
        .iter()
        .filter_map(|reason| blocks(*reason, run).map(|sql| render(*reason, sql)))
        .collect::<Vec<_>>()
        .join(separator)
}

/// The owner transaction's statement, once the runs' conversations are locked; the runs' lock
/// is taken as `lock` says (`SKIP LOCKED`, or waiting). It locks the runs in id order (EX-6),
/// re-checks each under its lock (EX-1, EX-2, EX-5) and, for those still to go, deletes their
/// detail, records their files in `sexton.pending_file_deletions` — each path once, and only
/// if no surviving row still references it under any spelling (`sexton.path_key`) — and sets the markers on runs and on variants of
/// the account's own conversations (EX-3, EX-4, EX-9). One row per run locked. The other rows'
/// view of `output_files` is the statement's snapshot, which still holds the rows being
/// deleted: hence "not of a run pruned here". The rendered statements are in
/// `jobs/tests/golden/prune_execution_details/`.
///
/// | param | what |
/// |---|---|
/// | `$1` | the runs (`uuid[]`) |
/// | `$2` | the conversation each must still belong to (`uuid[]`, same order) |
/// | `$3` | the bound: the stricter of the carried and the current cutoff |
/// | `$4` | what the current setting is measured back from |
/// | `$5` | the account |
/// | `$6` | now, for the markers |
/// | `$7` | the runner effects of a pruned run |
pub(super) fn prune_locked(lock: &str) -> String {
    let recheck = recheck_columns("c.conversation_id");
    let names: Vec<&str> = BLOCKERS.iter().map(|reason| reason.as_str()).collect();
    let any_blocker = names.join(" OR ");
    let blocked = names.join(", ");
    // Each table's deleted rows are the CTE `<table>_gone`; `output_files_gone` keeps the paths and their runs.
    let deletes = DETAIL_TABLES
        .iter()
        .map(|table| {
            let returning = if *table == "output_files" {
                "relative_path, run_id"
            } else {
                "1"
            };
            format!(
                "{table}_gone AS (DELETE FROM {table} \
                 WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING {returning})"
            )
        })
        .collect::<Vec<_>>()
        .join(",\n         ");
    let deleted = DETAIL_TABLES
        .iter()
        .map(|table| format!("(SELECT count(*) FROM {table}_gone)"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH locked AS (
             SELECT {recheck}
             FROM unnest($1::uuid[], $2::uuid[]) AS c (run_id, conversation_id)
             JOIN runs r ON r.id = c.run_id
             JOIN accounts a ON a.id = r.account_id
             WHERE r.account_id = $5
             ORDER BY r.id
             FOR UPDATE OF r {lock}),
         prune AS (
             SELECT array_agg(id) AS runs, array_agg(variant_id) AS variants FROM locked
             WHERE NOT pruned AND eligible AND NOT ({any_blocker})),
         {deletes},
         pending AS (INSERT INTO sexton.pending_file_deletions
                         (root, account_id, relative_path, run_ids, conversation_ids)
                     SELECT 'outputs', $5, g.relative_path, array_agg(DISTINCT g.run_id),
                            array_agg(DISTINCT r.conversation_id)
                     FROM output_files_gone g JOIN runs r ON r.id = g.run_id
                     WHERE NOT EXISTS (
                         SELECT 1 FROM output_files o
                         WHERE sexton.path_key(o.relative_path) = sexton.path_key(g.relative_path)
                           AND o.run_id <> ALL((SELECT runs FROM prune)::uuid[]))
                     GROUP BY g.relative_path),
         run AS (UPDATE runs SET details_pruned_at = $6, runner_effects = $7
                 WHERE id = ANY((SELECT runs FROM prune)::uuid[])),
         variant AS (UPDATE variants v SET details_pruned_at = $6, runner_effects = $7
                     FROM turns t JOIN conversations cv ON cv.id = t.conversation_id
                     WHERE v.id = ANY((SELECT variants FROM prune)::uuid[])
                       AND t.id = v.turn_id AND cv.account_id = $5)
         SELECT id, pruned, eligible, ARRAY[{blocked}]::bool[] AS blocked,
                ARRAY[{deleted}]::bigint[] AS deleted
         FROM locked"
    )
}

/// The window of a hop: `$1` the account, `$2` the bound, `$3`/`$4` the cursor (age, run),
/// `$5` the window size. Candidates in (age, id) order through the window index.
pub(super) static WINDOW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id, conversation_id, {AGE} AS age FROM runs
         WHERE account_id = $1
           AND {UNPRUNED_OWNER}
           AND {AGE} < $2
           AND ({AGE}, id) > ($3, $4)
         ORDER BY {AGE}, id
         LIMIT $5"
    )
});

/// [`prune_locked`] for owners taken together: a run that is not free at once is left out.
pub(super) static PRUNE_LOCKED: LazyLock<String> = LazyLock::new(|| prune_locked("SKIP LOCKED"));

/// [`prune_locked`] for an owner taken alone: its run's lock is waited for.
pub(super) static PRUNE_WAITING: LazyLock<String> = LazyLock::new(|| prune_locked(""));

/// The re-check of EX-1, EX-2 and EX-5 under lock, for `runs r JOIN accounts a`, with the
/// conversation the run must still belong to written as `conversation`; $3 is the bound and $4
/// what the current setting is measured back from. The window is compared as an interval, so
/// that a window longer than the calendar is "not old enough", never an overflow (EX-1).
pub(super) fn recheck_columns(conversation: &str) -> String {
    format!(
        "r.id, r.variant_id,
         r.details_pruned_at IS NOT NULL AS pruned,
         COALESCE(r.conversation_id = {conversation}
                  AND r.kind IN ('conversation', 'direct_reply')
                  AND {AGE} < $3
                  AND a.execution_details_retention_days > 0
                  AND CASE WHEN isfinite({AGE})
                           THEN $4 - {AGE} > make_interval(days => a.execution_details_retention_days)
                      END,
                  false) AS eligible,
         {}",
        blockers(
            "r.id",
            |reason, sql| format!("{sql} AS {}", reason.as_str()),
            ",\n"
        )
    )
}

/// The backlog: `$1` now, `$2` the earliest finite age. Per account, the oldest eligible
/// owner through the window index.
pub(super) static BACKLOG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT max(EXTRACT(EPOCH FROM (c.cutoff - o.age)))::float8
         FROM (SELECT id, $1 - make_interval(days => execution_details_retention_days) AS cutoff
               FROM accounts
               WHERE execution_details_retention_days > 0
                 AND make_interval(days => execution_details_retention_days) < $1 - $2) c
         CROSS JOIN LATERAL (
             SELECT {AGE} AS age FROM runs r
             WHERE r.account_id = c.id AND {UNPRUNED_OWNER} AND {AGE} < c.cutoff
               AND {AGE} > $2 AND {}
             ORDER BY {AGE}, r.id LIMIT 1) o",
        blockers("r.id", |_, sql| format!("NOT {sql}"), " AND ")
    )
});

/// The backlog in one scan of `runs`: owners older than the latest cutoff of any account, each
/// joined to its account through the primary key and checked against that account's cutoff,
/// then taken furthest past it first until one is not held back — what holds an owner back is
/// asked of as few as the per-account read asks. Parameters as [`BACKLOG`]'s.
pub(super) static BACKLOG_SCAN: LazyLock<String> = LazyLock::new(|| {
    let cutoff = crate::cutoff::days_before_sql("$1", "a.execution_details_retention_days", "$2");
    format!(
        "SELECT EXTRACT(EPOCH FROM c.past)::float8
         FROM (SELECT r.id, {cutoff} - {AGE} AS past
               FROM runs r JOIN accounts a ON a.id = r.account_id
               WHERE {UNPRUNED_OWNER}
                 AND {AGE} < (SELECT max({cutoff}) FROM accounts a)
                 AND {AGE} < {cutoff} AND {AGE} > $2
               ORDER BY past DESC OFFSET 0) c
         WHERE {}
         ORDER BY c.past DESC LIMIT 1",
        blockers("c.id", |_, sql| format!("NOT {sql}"), " AND ")
    )
});

/// Discovery: `$1`/`$2` the range, `$3` the slot, `$4` the earliest finite age. The cutoff is
/// computed only where the window leaves one (a CASE: never "timestamp out of range").
pub(super) static DUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT a.id FROM accounts a
         WHERE ($1::uuid IS NULL OR a.id > $1) AND a.id <= $2
           AND (a.execution_details_retention_days <= 0
                OR EXISTS (
                    SELECT 1 FROM runs r
                    WHERE r.account_id = a.id AND {UNPRUNED_OWNER} AND {AGE} >= $4
                      AND {AGE} < {})
                OR {})
         ORDER BY a.id",
        crate::cutoff::days_before_sql("$3", "a.execution_details_retention_days", "$4"),
        files::waiting_sql(files::Root::Outputs, "a.id")
    )
});

/// The preview of some accounts: `$1` their ids (every account when NULL), `$2` now, `$3` the
/// earliest finite age. Per account, owners by verdict, then the detail rows and bytes of the
/// eligible ones.
pub(super) static PREVIEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH candidates AS (
             SELECT r.account_id, r.id, isfinite({AGE}) AS finite
             FROM accounts a JOIN runs r ON r.account_id = a.id
             WHERE ($1::uuid[] IS NULL OR a.id = ANY($1)) AND {UNPRUNED_OWNER} AND {AGE} < {}),
         classified AS (
             SELECT c.account_id, c.id,
                    CASE WHEN NOT c.finite THEN 'not_eligible' {} ELSE 'eligible' END AS class
             FROM candidates c),
         eligible AS (SELECT account_id, id FROM classified WHERE class = 'eligible')
         SELECT account_id, class, count(*) FROM classified GROUP BY account_id, class
         {rows}
         UNION ALL SELECT e.account_id, 'bytes', COALESCE(sum(f.bytes), 0)::bigint
                   FROM output_files f JOIN eligible e ON f.run_id = e.id GROUP BY e.account_id",
        crate::cutoff::days_before_sql("$2", "a.execution_details_retention_days", "$3"),
        blockers("c.id", |reason, sql| format!("WHEN {sql} THEN '{}'", reason.as_str()), " "),
        rows = DETAIL_TABLES
            .iter()
            .map(|table| format!(
                "UNION ALL SELECT e.account_id, '{table}', count(*) FROM {table} t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id"
            ))
            .collect::<Vec<_>>()
            .join("\n         "),
    )
});

/// One run as the job's own re-check judges it (`sexton explain`): `$1` the run,
/// `$2` its account, `$3` the cutoff, `$4` what it is measured back from — the owner
/// statement's `locked` columns, without a lock.
pub(super) static EXPLAIN: LazyLock<String> = LazyLock::new(|| {
    let recheck = recheck_columns("r.conversation_id");
    let blocked = BLOCKERS
        .iter()
        .map(|reason| reason.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH judged AS (
             SELECT {recheck}
             FROM runs r JOIN accounts a ON a.id = r.account_id
             WHERE r.id = $1 AND r.account_id = $2)
         SELECT id, pruned, eligible, ARRAY[{blocked}]::bool[] AS blocked,
                ARRAY[]::bigint[] AS deleted
         FROM judged"
    )
});
