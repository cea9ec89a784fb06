//! What execution-detail pruning reads without deleting: the backlog (OP-3), the accounts a
//! slot's fan-out starts (FL-8), `sexton preview` and `sexton explain run`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::cutoff::{EARLIEST, days_before};
use crate::estimate::Backlog;
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::job::{ACCOUNTS_NAMED, Due, Inspect, Job, Look};

use super::sql::{AGE, BACKLOG, BACKLOG_SCAN, BLOCKERS_OF, DUE, EXPLAIN, PREVIEW};
use super::{
    DETAIL_TABLES, Error, HopSettings, Locked, PruneExecutionDetails, RetainReason, Verdict,
};

/// Its discovery (FL-8): the accounts whose pass for `slot` has something to do — an owner past
/// the cutoff the account's current window gives (held back or not: what holds it is looked at
/// again), a window of 0 or less (the pass reports it, EX-1), or output files waiting to be
/// removed ([`DUE`]). The slot bounds the cutoff from above, as it bounds every hop's: a slot
/// ahead of the database's now names more accounts, never fewer.
pub fn due(slot: DateTime<Utc>) -> Due {
    sqlx::query(sqlx::AssertSqlSafe(DUE.as_str()))
        .bind(slot)
        .bind(EARLIEST)
}

/// What a pass would do for one account now, deleting nothing (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub account_id: Uuid,
    pub account_name: String,
    pub retention_days: Option<i32>,
    pub cutoff: Option<DateTime<Utc>>,
    pub eligible_owners: i64,
    pub retained: BTreeMap<RetainReason, i64>,
    /// Detail rows that would go, per table.
    pub rows: BTreeMap<&'static str, i64>,
    pub bytes: i64,
}

impl Inspect for PruneExecutionDetails {
    const SUBJECTS: &'static [&'static str] = &["run"];

    type Preview = Preview;

    /// How far past its cutoff the oldest eligible owner of any account is, in seconds (0 when
    /// nothing eligible waits): the backlog an operator watches grow or shrink (OP-3). An account
    /// whose window reaches back past the calendar has nothing old enough, and infinite ages are
    /// never candidates: neither can break the gauge (EX-1, EX-2). Read per account through the
    /// window index, or in one scan of `runs` when there are fewer than about ten runs per account
    /// ([`crate::estimate`]): both give the same figure.
    fn backlog() -> Option<Backlog> {
        Some(Backlog {
            over: ("runs", "accounts"),
            probes: &BACKLOG,
            scan: &BACKLOG_SCAN,
            extra: &[],
        })
    }

    /// Previews `accounts` (every account when `None`), in name order: one statement for the
    /// accounts and one for all their owners, whatever their number.
    async fn preview(
        look: Look<'_, HopSettings>,
        accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let Look { conn, now, .. } = look;
        let rows: Vec<(Uuid, String, Option<i32>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, name, execution_details_retention_days FROM {ACCOUNTS_NAMED} a
             ORDER BY name, id"
        )))
        .bind(accounts)
        .fetch_all(&mut *conn)
        .await?;
        let mut previews: Vec<Preview> = rows
            .into_iter()
            .map(|(account_id, account_name, days)| {
                let mut preview = Preview {
                    account_id,
                    account_name,
                    retention_days: days,
                    cutoff: days.and_then(|days| days_before(now, days)),
                    eligible_owners: 0,
                    retained: BTreeMap::new(),
                    rows: DETAIL_TABLES.iter().map(|t| (*t, 0)).collect(),
                    bytes: 0,
                };
                if days.is_some_and(|days| !crate::cutoff::valid_window(days)) {
                    // As the pass counts it: once for the account (EX-1).
                    preview.retained.insert(RetainReason::InvalidWindow, 1);
                }
                preview
            })
            .collect();
        let counts: Vec<(Uuid, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(&**PREVIEW))
            .bind(accounts)
            .bind(now)
            .bind(EARLIEST)
            .fetch_all(&mut *conn)
            .await?;
        let at: BTreeMap<Uuid, usize> = previews
            .iter()
            .enumerate()
            .map(|(i, p)| (p.account_id, i))
            .collect();
        for (account, key, n) in counts {
            let Some(preview) = at.get(&account).map(|i| &mut previews[*i]) else {
                continue;
            };
            if key == "eligible" {
                preview.eligible_owners = n;
            } else if key == "bytes" {
                preview.bytes = n;
            } else if let Some(reason) = RetainReason::ALL.iter().find(|r| r.as_str() == key) {
                preview.retained.insert(*reason, n);
            } else if let Some(table) = DETAIL_TABLES.iter().find(|t| **t == key) {
                preview.rows.insert(table, n);
            }
        }
        Ok(previews)
    }

    async fn explain(
        look: Look<'_, HopSettings>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        match Uuid::parse_str(id) {
            Ok(run) => explain_run(look.conn, look.now, run).await,
            Err(_) => Ok(None),
        }
    }

    fn tally(p: &Preview) -> Vec<(String, i64)> {
        let mut tally = vec![("owners eligible".to_owned(), p.eligible_owners)];
        tally.extend(
            p.retained
                .iter()
                .map(|(r, n)| (format!("retained {}", r.as_str()), *n)),
        );
        tally.extend(p.rows.iter().map(|(t, n)| (format!("rows {t}"), *n)));
        tally.push(("bytes of output files".to_owned(), p.bytes));
        tally
    }
}

/// The job's verdict on one run.
pub(super) async fn explain_run(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    run: Uuid,
) -> Result<Option<Explanation>, Error> {
    let row: Option<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.account_id, a.execution_details_retention_days, r.kind,
                sexton.run_owner(r.kind, r.conversation_id), r.details_pruned_at, {AGE},
                CASE WHEN r.kind = 'conversation' THEN 'completed_at'
                     ELSE 'terminal_at (settled)' END
         FROM runs r JOIN accounts a ON a.id = r.account_id WHERE r.id = $1"
    )))
    .bind(run)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((account, days, kind, owner, pruned_at, age, measured_from)) = row else {
        return Ok(None);
    };
    let cutoff = days.and_then(|days| days_before(now, days));
    let mut explanation = Explanation {
        job: PruneExecutionDetails::NAME,
        subject: "run",
        id: run.to_string(),
        account_id: Some(account),
        policy: days.map_or_else(
            || {
                "execution_details_retention_days is NULL: retention disabled for the account"
                    .into()
            },
            |d| format!("execution_details_retention_days = {d} (the account's row)"),
        ),
        measured_from,
        age_at: age,
        cutoff,
        verdict: ExplainVerdict::Retained,
        reasons: Vec::new(),
        removed_at: None,
        removed_by: None,
    };
    if let Some(at) = pruned_at {
        removed(conn, &mut explanation, account, at).await?;
        return Ok(Some(explanation));
    }
    // Whatever else applies, every hold that keeps it is named (HD-5).
    let id = run.to_string();
    let holds = crate::explain::holds(conn, "sexton.run_holds($1::uuid)", &[&id]).await?;
    explanation.reasons.extend(holds);
    // Every precondition that fails is a reason; any of them keeps the run.
    if cutoff.is_none() {
        explanation.reasons.push(no_cutoff(days));
    }
    if !owner {
        explanation.measured_from = None;
        explanation.reasons.push(ExplainReason::new(
            "EX-2",
            "not_an_owner",
            format!("a {kind} run without a conversation owns no execution detail to prune"),
        ));
    } else if age.is_none() {
        explanation.reasons.push(ExplainReason::new(
            "EX-2",
            "no_age",
            "not completed yet (or, for a direct reply, not settled)",
        ));
    }
    let Some(cutoff) = cutoff.filter(|_| owner && age.is_some()) else {
        return Ok(Some(explanation));
    };
    let found = judge(conn, &mut explanation, run, account, cutoff, now).await?;
    Ok(found.then_some(explanation))
}

/// A run as `explain` reads it: its account, the account's window, its kind, whether it is an
/// owner (EX-2), when its detail was pruned, its age and what that is measured from.
type RunRow = (
    Uuid,
    Option<i32>,
    String,
    bool,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<String>,
);

/// A run pruned at `at`: by which pass, and what that did (EX-3).
async fn removed(
    conn: &mut PgConnection,
    explanation: &mut Explanation,
    account: Uuid,
    at: DateTime<Utc>,
) -> Result<(), Error> {
    explanation.verdict = ExplainVerdict::Removed;
    explanation.removed_at = Some(at);
    explanation.removed_by = sqlx::query_scalar(
        "SELECT 'the pass of slot ' || to_char(slot AT TIME ZONE 'UTC',
                                               'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
         FROM sexton.passes
         WHERE job = $1 AND scope = $2 AND started_at <= $3
         ORDER BY slot DESC LIMIT 1",
    )
    .bind(PruneExecutionDetails::NAME)
    .bind(account)
    .bind(at)
    .fetch_optional(&mut *conn)
    .await?;
    explanation.reasons.push(ExplainReason::new(
        "EX-3",
        "pruned",
        "its execution detail was deleted and its markers set; its text stays",
    ));
    Ok(())
}

/// Why an account's window of `days` gives no cutoff (EX-1).
fn no_cutoff(days: Option<i32>) -> ExplainReason {
    let (code, detail) = match days {
        None => (
            "disabled",
            "the account's execution_details_retention_days is NULL".into(),
        ),
        Some(d) if !crate::cutoff::valid_window(d) => (
            RetainReason::InvalidWindow.as_str(),
            format!(
                "a window of {d} days is not a window (it must be more than 0): nothing of \
                 the account is old"
            ),
        ),
        Some(d) => (
            "disabled",
            format!("a window of {d} days reaches back past the calendar"),
        ),
    };
    ExplainReason::new("EX-1", code, detail)
}

/// The job's own verdict on an owner with an age and a cutoff, from the same columns its owner
/// statement reads (EX-1, EX-5), into `explanation`; `false` when the run is gone meanwhile.
async fn judge(
    conn: &mut PgConnection,
    explanation: &mut Explanation,
    run: Uuid,
    account: Uuid,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, Error> {
    let judged: Option<Locked> = sqlx::query_as(sqlx::AssertSqlSafe(&**EXPLAIN))
        .bind(run)
        .bind(account)
        .bind(cutoff)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(judged) = judged else {
        return Ok(false);
    };
    if !judged.eligible {
        explanation.reasons.push(ExplainReason::new(
            "EX-1",
            RetainReason::NotEligible.as_str(),
            "not old enough: its age is not before the cutoff (or is infinite, EX-2)".to_owned(),
        ));
    }
    // Everything that holds it back, each reason once with the rows behind it; its holds are
    // named already.
    let blockers: Vec<(String, String)> = sqlx::query_as(BLOCKERS_OF)
        .bind(run)
        .fetch_all(&mut *conn)
        .await?;
    for rows in blockers.chunk_by(|a, b| a.0 == b.0) {
        let reason = &rows[0].0;
        if reason != RetainReason::LegalHold.as_str() {
            let detail = rows
                .iter()
                .map(|(_, detail)| detail.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            explanation
                .reasons
                .push(ExplainReason::new("EX-5", reason.clone(), detail));
        }
    }
    if let Verdict::Prune = judged.verdict() {
        explanation.verdict = ExplainVerdict::Eligible;
        explanation.reasons.push(ExplainReason::new(
            "EX-1",
            "expired",
            "older than the window and held back by nothing: the next pass prunes it",
        ));
    }
    Ok(true)
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (Some(days), Some(cutoff)) = (self.retention_days, self.cutoff) else {
            let why = match self.retention_days {
                None => "retention disabled".to_owned(),
                Some(days) if !crate::cutoff::valid_window(days) => format!(
                    "{days} days is not a window (it must be more than 0): nothing is old \
                     ({})",
                    RetainReason::InvalidWindow.as_str()
                ),
                Some(days) => {
                    format!("{days} days reach back past the calendar: nothing is old enough")
                }
            };
            return write!(
                f,
                "account {} ({}): {why}",
                self.account_name, self.account_id
            );
        };
        write!(
            f,
            "account {} ({}), {} days, cutoff {}: {} owners eligible, {} bytes of output files",
            self.account_name,
            self.account_id,
            days,
            cutoff.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.eligible_owners,
            self.bytes
        )?;
        for (reason, n) in &self.retained {
            write!(f, "\n  retained {:<24} {n:>10}", reason.as_str())?;
        }
        for (table, n) in &self.rows {
            write!(f, "\n  rows     {table:<24} {n:>10}")?;
        }
        Ok(())
    }
}
