//! The statements of session retention. Every one of them judges a session by
//! `sexton.session_verdict`, the one SQL function of SS-2 … SS-4.

use std::sync::LazyLock;

use crate::files::{self, Root};

/// The window of one kind: `$1` the account, `$2` the kind, `$3` its cutoff, `$4`/`$5` the
/// cursor (last activity, id), `$6` the room left in the hop; each session with its verdict.
pub(super) const WINDOW: &str = include_str!("window.sql");

/// The deletion statement: `$1` the sessions whose agents are locked, `$2` the account, `$3`
/// the kind, `$4` its cutoff. One row per session locked, with its verdict (NULL: deleted) and,
/// the same on every row, the rows deleted per table of [`TABLES`] and the handoffs unlinked.
/// The frame directory of each deleted session is recorded for removal after commit.
pub(super) const DELETE_SESSIONS: &str = include_str!("delete_sessions.sql");

/// [`WINDOW`], for the benchmark: how a loop that keeps the rules finds the sessions that go
/// (their verdict taken before anything is locked).
pub fn window_statement() -> &'static str {
    WINDOW
}

/// [`DELETE_SESSIONS`], for the benchmark, which times it in a plain loop to tell what the
/// rules it keeps cost from what the hops do.
pub fn delete_statement() -> &'static str {
    DELETE_SESSIONS
}

/// Each kind with the parameter of its fallback age, in the statements that read every
/// account's policy: `$1` the time it is measured at, `$2` the calendar's earliest instant.
const KINDS: [(&str, &str); 3] = [("main", "$3"), ("task", "$4"), ("subagent", "$5")];

/// The latest cutoff any enabled policy gives `kind` (parameters as [`KINDS`]'): the one its
/// shortest age gives, read at one end of the policies' index of that age, or the fallback where
/// a policy leaves it out (never a read of every policy). No session of the kind younger than it
/// is past any account's cutoff.
fn latest(kind: &str, fallback: &str) -> String {
    format!(
        "(SELECT {} FROM (SELECT LEAST(
              (SELECT min({kind}_days) FROM session_retention_policies
               WHERE enabled AND {kind}_days > 0),
              CASE WHEN EXISTS (SELECT 1 FROM session_retention_policies
                                WHERE enabled AND {kind}_days IS NULL)
                   THEN {fallback} END) AS days) shortest)",
        crate::cutoff::days_before_sql("$1", "shortest.days", "$2")
    )
}

/// Discovery (FL-8): `$1` the slot, `$2` the earliest finite age, `$3`..`$5` the fallback ages
/// (each above 0). Every session past its kind's cutoff, protected or not (what protects it is
/// looked at again by the pass), found from the sessions' side, kind by kind: those older than
/// the latest cutoff any enabled policy gives the kind — from its shortest age, read at one end
/// of the policies' index of that age, or the fallback where a policy leaves it out — in age
/// order through `sessions_retention_due`, the oldest of each account then checked against its
/// own policy. With them, the accounts whose enabled policy has an age of 0 or less (the pass
/// reports it, SS-1), and those with archive directories waiting to be removed, whatever the
/// policy. A cutoff is computed only where the age leaves one (never "out of range").
pub(super) static DUE: LazyLock<String> = LazyLock::new(|| {
    let cutoff = |days: &str| crate::cutoff::days_before_sql("$1", days, "$2");
    let oldest = KINDS
        .iter()
        .map(|(kind, fallback)| {
            format!(
                "SELECT account_id, kind, min(last_activity_at) AS oldest FROM sessions
                 WHERE kind = '{kind}' AND last_activity_at >= $2
                   AND last_activity_at < {}
                 GROUP BY account_id, kind",
                latest(kind, fallback),
            )
        })
        .collect::<Vec<_>>()
        .join("\n                 UNION ALL ");
    let own = KINDS
        .iter()
        .map(|(kind, fallback)| {
            format!(
                "WHEN '{kind}' THEN {}",
                cutoff(&format!("COALESCE(p.{kind}_days, {fallback})"))
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "SELECT o.account_id
         FROM ({oldest}) o
         WHERE EXISTS (SELECT 1 FROM session_retention_policies p
                       WHERE p.account_id = o.account_id AND p.enabled
                         AND o.oldest < CASE o.kind {own} END)
         UNION ALL
         SELECT account_id FROM session_retention_policies
         WHERE enabled AND (main_days <= 0 OR task_days <= 0 OR subagent_days <= 0)
         UNION ALL
         {}",
        files::waiting_sql(Root::Sessions)
    )
});

/// The backlog in one scan of `sessions`: the latest cutoff any enabled policy gives each kind
/// ([`latest`]), the sessions older than that (found first and apart: the planner
/// would otherwise join every session to its policy before filtering; bounded on both sides, so
/// that it reads them through `sessions_retention_due` and not every session), each joined to its
/// account's policy and checked against its own cutoff, then taken furthest past it first
/// until one would go — the verdict is asked of as few as the per-policy read asks. Parameters
/// as [`BACKLOG`]'s.
pub(super) static BACKLOG_SCAN: LazyLock<String> = LazyLock::new(|| {
    let own = KINDS
        .iter()
        .map(|(kind, fallback)| format!("WHEN '{kind}' THEN COALESCE(p.{kind}_days, {fallback})"))
        .collect::<Vec<_>>()
        .join(" ");
    let old = KINDS
        .iter()
        .map(|(kind, fallback)| {
            format!(
                "SELECT s.* FROM sessions s
                 WHERE s.kind = '{kind}' AND s.last_activity_at > $2
                   AND s.last_activity_at < {}",
                latest(kind, fallback)
            )
        })
        .collect::<Vec<_>>()
        .join("\n        UNION ALL ");
    format!(
        "
    WITH old AS MATERIALIZED ({old})
    SELECT EXTRACT(EPOCH FROM c.past)::float8
    FROM (SELECT s.id, s.account_id, s.agent_id, s.kind, s.state, s.metadata, s.last_activity_at, k.cutoff,
                 k.cutoff - s.last_activity_at AS past
          FROM old s
          JOIN session_retention_policies p ON p.account_id = s.account_id AND p.enabled
          CROSS JOIN LATERAL (SELECT {} AS cutoff) k
          WHERE s.last_activity_at < k.cutoff AND s.last_activity_at > $2
          ORDER BY past DESC OFFSET 0) c
    WHERE sexton.session_verdict(c.id, c.account_id, c.agent_id, c.kind, c.state, c.metadata,
                                 c.last_activity_at, c.cutoff) IS NULL
    ORDER BY c.past DESC LIMIT 1",
        crate::cutoff::days_before_sql("$1", &format!("CASE s.kind {own} END"), "$2"),
    )
});

/// The backlog in one statement (a query per account and kind made `status` and the gauges
/// cost 60,000 round trips at 20,000 accounts): `$1` now, `$2` the earliest finite age,
/// `$3`..`$5` the fallback ages; per enabled policy and kind with a cutoff, the oldest session
/// that would go, through `sessions_retention_window`.
pub(super) static BACKLOG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "
    SELECT max(EXTRACT(EPOCH FROM (k.cutoff - o.age)))::float8
    FROM session_retention_policies p
    CROSS JOIN LATERAL (VALUES ('main', COALESCE(p.main_days, $3)),
                               ('task', COALESCE(p.task_days, $4)),
                               ('subagent', COALESCE(p.subagent_days, $5))) AS d (kind, days)
    CROSS JOIN LATERAL (
        SELECT {} AS cutoff) k
    CROSS JOIN LATERAL (
        SELECT s.last_activity_at AS age FROM sessions s
        WHERE s.account_id = p.account_id AND s.kind = d.kind
          AND s.last_activity_at < k.cutoff AND s.last_activity_at > $2
          AND sexton.session_verdict(s.id, s.account_id, s.agent_id, s.kind, s.state, s.metadata,
                                     s.last_activity_at, k.cutoff) IS NULL
        ORDER BY s.last_activity_at, s.id LIMIT 1) o
    WHERE p.enabled AND k.cutoff IS NOT NULL",
        crate::cutoff::days_before_sql("$1", "d.days", "$2")
    )
});

/// The preview of some accounts' sessions under their enabled policies: `$1` the accounts
/// (every account when NULL), `$2` now, `$3` the earliest finite age, `$4`..`$6` the fallback
/// ages. Per account, sessions past their kind's cutoff by verdict, then the history rows of
/// those that would go.
pub(super) static PREVIEW: LazyLock<String> = LazyLock::new(|| {
    let days = "CASE s.kind WHEN 'main' THEN COALESCE(p.main_days, $4) \
                WHEN 'task' THEN COALESCE(p.task_days, $5) \
                ELSE COALESCE(p.subagent_days, $6) END";
    format!(
        "WITH judged AS (
             SELECT s.account_id, s.id, s.kind,
                    sexton.session_verdict(s.id, s.account_id, s.agent_id, s.kind, s.state, s.metadata,
                                           s.last_activity_at, c.cutoff) AS verdict
             FROM session_retention_policies p
             JOIN sessions s ON s.account_id = p.account_id
             CROSS JOIN LATERAL (SELECT {} AS cutoff) c
             WHERE p.enabled AND ($1::uuid[] IS NULL OR p.account_id = ANY($1))
               AND s.last_activity_at < c.cutoff AND s.last_activity_at > $3),
         doomed AS (SELECT account_id, id FROM judged WHERE verdict IS NULL)
         SELECT account_id, 'eligible', kind, count(*) FROM judged WHERE verdict IS NULL
                GROUP BY account_id, kind
         UNION ALL SELECT account_id, 'retained', verdict, count(*) FROM judged
                   WHERE verdict IS NOT NULL GROUP BY account_id, verdict
         UNION ALL SELECT d.account_id, 'rows', 'conversation_entries', count(*)
                   FROM conversation_entries e JOIN doomed d ON d.id = e.session_id
                   GROUP BY d.account_id
         UNION ALL SELECT d.account_id, 'rows', 'conversation_archives', count(*)
                   FROM conversation_archives a JOIN doomed d ON d.id = a.session_id
                   GROUP BY d.account_id
         UNION ALL SELECT d.account_id, 'rows', 'conversation_archive_entries', count(*)
                   FROM conversation_archive_entries e
                   JOIN conversation_archives a ON a.id = e.archive_id
                   JOIN doomed d ON d.id = a.session_id
                   GROUP BY d.account_id
         UNION ALL SELECT account_id, 'rows', 'sessions', count(*) FROM doomed GROUP BY account_id",
        crate::cutoff::days_before_sql("$2", days, "$3")
    )
});
