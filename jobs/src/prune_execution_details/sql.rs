//! The statements of execution-detail pruning. Each asks the rules of the migration
//! `20261206000018_verdicts.sql` instead of spelling them: who is an owner and since when
//! (`sexton.run_owner`, `sexton.run_age`, EX-2), what holds one back (`sexton.run_blockers`,
//! EX-5) and the verdict on a run (`sexton.run_verdict`, EX-1 with both). The statements
//! rendered from parts are in `jobs/tests/golden/prune_execution_details/`; the window is
//! `window.sql`.

use std::sync::LazyLock;

use crate::files;

use super::{DETAIL_TABLES, RetainReason};

/// The age of a run of `runs` for execution retention (EX-2): the window index's second column,
/// once `sexton.run_age` is inlined.
pub(super) const AGE: &str = "sexton.run_age(kind, completed_at, terminal_at, settled_at)";

/// A run of `runs` that is an owner (EX-2) and still holds its detail: the window index's
/// predicate, once `sexton.run_owner` is inlined.
pub(super) const UNPRUNED_OWNER: &str =
    "details_pruned_at IS NULL AND sexton.run_owner(kind, conversation_id)";

/// What holds an owner back (HD-3, EX-5), in the order reasons are reported: the rank of each
/// in `sexton.run_blockers`.
pub(super) const BLOCKERS: [RetainReason; 5] = [
    RetainReason::LegalHold,
    RetainReason::PendingWork,
    RetainReason::PendingSettlement,
    RetainReason::OutstandingDelegation,
    RetainReason::ActiveHistoryRequest,
];

/// The verdict on the run whose row is `run` (`sexton.run_verdict`: NULL when it goes, or the
/// reason it stays), with `days` its account's window, `conversation` the conversation it must
/// still belong to, `bound` the cutoff its age must be before and `reference` what the window is
/// measured back from.
fn verdict(run: &str, days: &str, conversation: &str, bound: &str, reference: &str) -> String {
    ask("v.verdict", run, days, conversation, bound, reference)
}

/// Whether the run goes: [`verdict`] is NULL, asked as a condition. Written as the sub-select's
/// own boolean, which the planner takes to hold for half the rows, where `verdict(…) IS NULL`
/// would be taken to hold for one in 200 and a read of the oldest such run would sort every
/// candidate of its account rather than walk the window index and stop at the first.
fn goes(run: &str, days: &str, conversation: &str, bound: &str, reference: &str) -> String {
    ask(
        "v.verdict IS NULL",
        run,
        days,
        conversation,
        bound,
        reference,
    )
}

/// `what` of `sexton.run_verdict` on the run whose row is `run` (see [`verdict`]).
fn ask(
    what: &str,
    run: &str,
    days: &str,
    conversation: &str,
    bound: &str,
    reference: &str,
) -> String {
    format!(
        "(SELECT {what} FROM sexton.run_verdict(
                 {run}.id, {run}.kind, {conversation}, {run}.completed_at, {run}.terminal_at,
                 {run}.settled_at, {days}, {bound}, {reference}) v)"
    )
}

/// A verdict (the column `verdict`) as the owner statement reports it ([`super::Locked`]):
/// whether the run was eligible, and which of [`BLOCKERS`] held it back — the first, the one
/// the verdict names.
fn verdict_columns() -> String {
    let blocked = BLOCKERS
        .iter()
        .map(|reason| format!("verdict IS NOT DISTINCT FROM '{}'", reason.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "verdict IS DISTINCT FROM '{}' AS eligible, ARRAY[{blocked}]::bool[] AS blocked",
        RetainReason::NotEligible.as_str()
    )
}

/// The owner transaction's statement, once the runs' conversations are locked; the runs' lock
/// is taken as `lock` says (`SKIP LOCKED`, or waiting). It locks the runs in id order (EX-6),
/// judges each under its lock (`sexton.run_verdict`: EX-1, EX-2, EX-5) and, for those that go,
/// deletes their detail, records their files in `sexton.pending_file_deletions` — each path
/// once, and only if no surviving row still references it under any spelling
/// (`sexton.path_key`) — and sets the markers on runs and on variants of the account's own
/// conversations (EX-3, EX-4, EX-9). One row per run locked. The other rows' view of
/// `output_files` is the statement's snapshot, which still holds the rows being deleted: hence
/// "not of a run pruned here". The rendered statements are in
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
    let verdict_columns = verdict_columns();
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
             WHERE NOT pruned AND verdict IS NULL),
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
         SELECT id, pruned, {verdict_columns},
                ARRAY[{deleted}]::bigint[] AS deleted
         FROM locked"
    )
}

/// The window of a hop: `$1` the account, `$2` the bound, `$3`/`$4` the cursor (age, run),
/// `$5` the window size. Candidates in (age, id) order through the window index.
pub(super) const WINDOW: &str = include_str!("window.sql");

/// [`prune_locked`] for owners taken together: a run that is not free at once is left out.
pub(super) static PRUNE_LOCKED: LazyLock<String> = LazyLock::new(|| prune_locked("SKIP LOCKED"));

/// [`prune_locked`] for an owner taken alone: its run's lock is waited for.
pub(super) static PRUNE_WAITING: LazyLock<String> = LazyLock::new(|| prune_locked(""));

/// What the owner statement reads of a run `r` of the account `a` under its lock: its id, its
/// variant, whether it is pruned already, and its verdict (EX-1, EX-2, EX-5), with the
/// conversation it must still belong to written as `conversation`; $3 is the bound and $4 what
/// the current setting is measured back from.
pub(super) fn recheck_columns(conversation: &str) -> String {
    let verdict = verdict(
        "r",
        "a.execution_details_retention_days",
        &format!("CASE WHEN r.conversation_id = {conversation} THEN r.conversation_id END"),
        "$3",
        "$4",
    );
    format!(
        "r.id, r.variant_id, r.details_pruned_at IS NOT NULL AS pruned,
                    {verdict} AS verdict"
    )
}

/// The backlog: `$1` now, `$2` the earliest finite age. Per account, the oldest owner that
/// would go through the window index.
pub(super) static BACKLOG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT max(EXTRACT(EPOCH FROM (c.cutoff - o.age)))::float8
         FROM (SELECT id, execution_details_retention_days AS days,
                      $1 - make_interval(days => execution_details_retention_days) AS cutoff
               FROM accounts
               WHERE execution_details_retention_days > 0
                 AND make_interval(days => execution_details_retention_days) < $1 - $2) c
         CROSS JOIN LATERAL (
             SELECT {AGE} AS age FROM runs r
             WHERE r.account_id = c.id AND {UNPRUNED_OWNER} AND {AGE} < c.cutoff
               AND {AGE} > $2 AND {}
             ORDER BY {AGE}, r.id LIMIT 1) o",
        goes("r", "c.days", "r.conversation_id", "c.cutoff", "$1")
    )
});

/// The latest cutoff of any account, `$1` the time it is measured at and `$2` the calendar's
/// earliest instant: the one its shortest window gives, read at one end of
/// `accounts_execution_details_retention_days` (never a read of every account). No owner younger
/// than it is past any account's cutoff.
static LATEST: LazyLock<String> = LazyLock::new(|| {
    let days = "execution_details_retention_days";
    format!(
        "(SELECT {} FROM accounts WHERE {days} > 0)",
        crate::cutoff::days_before_sql("$1", &format!("min({days})"), "$2")
    )
});

/// The backlog in one scan of `runs`: owners older than the latest cutoff of any account, each
/// joined to its account through the primary key (a probe per owner: the planner would rather
/// read every account to hash them) and checked against that account's cutoff,
/// then taken furthest past it first until one would go — the verdict is asked of as few as
/// the per-account read asks, each joined back to its run and account by key, so that the sort
/// carries no more than it did before the verdict was a function. Parameters as [`BACKLOG`]'s.
pub(super) static BACKLOG_SCAN: LazyLock<String> = LazyLock::new(|| {
    let cutoff = crate::cutoff::days_before_sql("$1", "a.execution_details_retention_days", "$2");
    format!(
        "SELECT EXTRACT(EPOCH FROM c.past)::float8
         FROM (SELECT r.id, k.cutoff - {AGE} AS past
               FROM runs r
               CROSS JOIN LATERAL (SELECT {cutoff} AS cutoff FROM accounts a
                                   WHERE a.id = r.account_id OFFSET 0) k
               WHERE {UNPRUNED_OWNER}
                 AND {AGE} < {latest}
                 AND {AGE} < k.cutoff AND {AGE} > $2
               ORDER BY past DESC OFFSET 0) c
         JOIN runs r ON r.id = c.id
         JOIN accounts a ON a.id = r.account_id
         WHERE {}
         ORDER BY c.past DESC LIMIT 1",
        goes(
            "r",
            "a.execution_details_retention_days",
            "r.conversation_id",
            &cutoff,
            "$1"
        ),
        latest = LATEST.as_str(),
    )
});

/// Discovery (FL-8): `$1` the slot, `$2` the earliest finite age. Every owner past the cutoff,
/// whatever holds it back (what holds it is looked at again by the pass), found from the
/// owners' side: those older than the latest cutoff of any account — the one its shortest
/// window gives, read at one end of `accounts_execution_details_retention_days` — in age order
/// through `runs_execution_details_due`, the oldest of each account then checked against that
/// account's own cutoff. With them, the accounts whose window is 0 or less and those with
/// output files waiting to be removed. A cutoff is computed only where the window leaves one
/// (a CASE: never "timestamp out of range").
pub(super) static DUE: LazyLock<String> = LazyLock::new(|| {
    let days = "execution_details_retention_days";
    format!(
        "SELECT o.account_id
         FROM (SELECT account_id, min({AGE}) AS oldest FROM runs
               WHERE {UNPRUNED_OWNER} AND {AGE} >= $2
                 AND {AGE} < {latest}
               GROUP BY account_id) o
         WHERE o.oldest < (SELECT {cutoff} FROM accounts a WHERE a.id = o.account_id)
         UNION ALL
         SELECT id FROM accounts WHERE {days} <= 0
         UNION ALL
         {waiting}",
        latest = LATEST.as_str(),
        cutoff = crate::cutoff::days_before_sql("$1", &format!("a.{days}"), "$2"),
        waiting = files::waiting_sql(files::Root::Outputs),
    )
});

/// The preview of some accounts: `$1` their ids (every account when NULL), `$2` now, `$3` the
/// earliest finite age. Per account, owners past the cutoff by verdict (read account by account
/// through the window index: the planner would rather read every run to hash them), then the
/// detail rows and bytes of those that would go.
pub(super) static PREVIEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH judged AS (
             SELECT r.account_id, r.id, {} AS verdict
             FROM {accounts} a
             CROSS JOIN LATERAL (SELECT {} AS cutoff) k
             CROSS JOIN LATERAL (SELECT * FROM runs
                                 WHERE account_id = a.id AND {UNPRUNED_OWNER} AND {AGE} < k.cutoff
                                 OFFSET 0) r),
         eligible AS (SELECT account_id, id FROM judged WHERE verdict IS NULL)
         SELECT account_id, COALESCE(verdict, 'eligible'), count(*) FROM judged
         GROUP BY account_id, verdict
         {rows}
         UNION ALL SELECT e.account_id, 'bytes', COALESCE(sum(f.bytes), 0)::bigint
                   FROM output_files f JOIN eligible e ON f.run_id = e.id GROUP BY e.account_id",
        verdict(
            "r",
            "a.execution_details_retention_days",
            "r.conversation_id",
            "k.cutoff",
            "$2"
        ),
        crate::cutoff::days_before_sql("$2", "a.execution_details_retention_days", "$3"),
        accounts = crate::job::ACCOUNTS_NAMED,
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
/// statement's columns, without a lock.
pub(super) static EXPLAIN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH judged AS (
             SELECT {}
             FROM runs r JOIN accounts a ON a.id = r.account_id
             WHERE r.id = $1 AND r.account_id = $2)
         SELECT id, pruned, {}, ARRAY[]::bigint[] AS deleted
         FROM judged",
        recheck_columns("r.conversation_id"),
        verdict_columns()
    )
});

/// Everything that holds the run `$1` back (`sexton.run_blockers`, EX-5), each with the row
/// behind it for people, first reason first.
pub(super) const BLOCKERS_OF: &str =
    "SELECT reason, detail FROM sexton.run_blockers($1) ORDER BY rank";
