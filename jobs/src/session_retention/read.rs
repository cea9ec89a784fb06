//! What session retention reads without deleting: the accounts a slot's fan-out starts
//! (FL-8), the backlog (OP-3), `sexton sessions prune --dry-run`'s targets, `sexton preview`
//! and `sexton explain session`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::cutoff::{EARLIEST, days_before};
use crate::estimate::Backlog;
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::job::{ACCOUNTS_NAMED, Due, Inspect, Job, Look};

use super::sql::{BACKLOG, BACKLOG_SCAN, DUE, PREVIEW};
use super::{
    Ages, Cutoffs, Error, HopSettings, PolicyRow, SessionKind, SessionReason, SessionRetention,
    TABLES,
};

/// Its discovery (FL-8): the accounts whose nightly pass for `slot` has something to do — with
/// an enabled persisted policy, a session of some kind past that kind's cutoff (protected or
/// not: what protects it is looked at again) or a kind whose age is 0 or less (the pass reports
/// it, SS-1); whatever the policy, archive directories waiting to be removed ([`DUE`]). The slot
/// bounds the cutoffs from above, as it bounds every hop's.
pub fn due(slot: DateTime<Utc>) -> Due {
    // A missing age of an enabled policy falls back to these; [`DUE`] finds the policies whose
    // age is 0 or less by their own columns, which holds only while every fallback is above 0.
    const {
        assert!(
            Ages::FALLBACK.main_days > 0
                && Ages::FALLBACK.task_days > 0
                && Ages::FALLBACK.subagent_days > 0
        );
    }
    sqlx::query(sqlx::AssertSqlSafe(DUE.as_str()))
        .bind(slot)
        .bind(EARLIEST)
        .bind(Ages::FALLBACK.main_days)
        .bind(Ages::FALLBACK.task_days)
        .bind(Ages::FALLBACK.subagent_days)
}

/// One session a pass would delete now, with the evidence it goes on (`sexton sessions prune`).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Target {
    pub session_id: Uuid,
    pub agent_id: Uuid,
    pub account_id: Uuid,
    pub kind: String,
    pub last_activity_at: DateTime<Utc>,
    pub evidence: String,
}

/// Every session that `ages` would delete now, for every account or one, oldest first. The
/// persisted policies are not consulted: these are the CLI's targets (SS-1).
///
/// # Errors
/// [`Error::Database`] on a database error.
pub async fn targets(
    conn: &mut PgConnection,
    ages: Ages,
    now: DateTime<Utc>,
    account: Option<Uuid>,
) -> Result<Vec<Target>, Error> {
    let cutoffs = ages.cutoffs(now);
    Ok(sqlx::query_as(
        "SELECT s.id AS session_id, s.agent_id, s.account_id, s.kind, s.last_activity_at,
                CASE s.kind
                    WHEN 'main' THEN 'main session: age alone'
                    WHEN 'task' THEN 'board task ' || b.id || ' ' || b.status || ' at '
                                     || to_char(b.terminal_at AT TIME ZONE 'UTC',
                                                'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
                    ELSE 'completed at ' || to_char(
                        COALESCE(sexton.jsonb_timestamptz(s.metadata -> 'completed_at'),
                                 sexton.jsonb_timestamptz(s.metadata -> 'completion' -> 'completed_at'))
                        AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
                END AS evidence
         FROM sessions s
         CROSS JOIN LATERAL (SELECT CASE s.kind WHEN 'main' THEN $2::timestamptz
                                                WHEN 'task' THEN $3::timestamptz
                                                WHEN 'subagent' THEN $4::timestamptz END AS cutoff) c
         LEFT JOIN board_tasks b
                ON s.kind = 'task'
               AND b.id = COALESCE(sexton.jsonb_uuid(s.metadata -> 'board_task_id'),
                                   sexton.jsonb_uuid(s.metadata -> 'board_task' -> 'id'))
         WHERE ($1::uuid IS NULL OR s.account_id = $1)
           AND s.last_activity_at < c.cutoff AND s.last_activity_at > $5
           AND sexton.session_verdict(s.id, s.account_id, s.agent_id, s.kind, s.state, s.metadata,
                                      s.last_activity_at, c.cutoff) IS NULL
         ORDER BY s.last_activity_at, s.id",
    )
    .bind(account)
    .bind(cutoffs.main)
    .bind(cutoffs.task)
    .bind(cutoffs.subagent)
    .bind(EARLIEST)
    .fetch_all(&mut *conn)
    .await?)
}

/// What a nightly pass would do for one account now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub account_id: Uuid,
    pub account_name: String,
    /// `None` when the account has no policy or it is disabled: nothing goes.
    pub ages: Option<Ages>,
    pub cutoffs: Option<Cutoffs>,
    /// Sessions that would go, per kind.
    pub eligible: BTreeMap<&'static str, i64>,
    /// Old enough but kept, by reason.
    pub retained: BTreeMap<String, i64>,
    /// History rows that would go with them, per table.
    pub rows: BTreeMap<&'static str, i64>,
}

impl Inspect for SessionRetention {
    const SUBJECTS: &'static [&'static str] = &["session"];

    type Preview = Preview;

    /// How far past its cutoff the oldest session still to go is, over every account whose policy
    /// is enabled, in seconds (0 when none waits). Read per policy and kind through
    /// `sessions_retention_window`, or in one scan of `sessions` when there are fewer than about
    /// ten per policy ([`crate::estimate`]): both give the same figure.
    fn backlog() -> Option<Backlog> {
        Some(Backlog {
            over: ("sessions", "session_retention_policies"),
            probes: &BACKLOG,
            scan: &BACKLOG_SCAN,
            extra: &[
                Ages::FALLBACK.main_days,
                Ages::FALLBACK.task_days,
                Ages::FALLBACK.subagent_days,
            ],
        })
    }

    /// Previews `accounts` (every account when `None`), in name order: one statement for the
    /// accounts and their policies and one for all their sessions, whatever their number.
    async fn preview(
        look: Look<'_, HopSettings>,
        accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let Look { conn, now, .. } = look;
        #[derive(sqlx::FromRow)]
        struct Row {
            id: Uuid,
            name: String,
            #[sqlx(flatten)]
            policy: PolicyRow,
        }
        let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT a.id, a.name, p.enabled, p.main_days, p.task_days, p.subagent_days
             FROM {ACCOUNTS_NAMED} a LEFT JOIN session_retention_policies p ON p.account_id = a.id
             ORDER BY a.name, a.id"
        )))
        .bind(accounts)
        .fetch_all(&mut *conn)
        .await?;
        let mut previews: Vec<Preview> = rows
            .into_iter()
            .map(|row| Preview::before_counting(row.id, row.name, row.policy.ages(), now))
            .collect();
        let counts: Vec<(Uuid, String, String, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(&**PREVIEW))
                .bind(accounts)
                .bind(now)
                .bind(EARLIEST)
                .bind(Ages::FALLBACK.main_days)
                .bind(Ages::FALLBACK.task_days)
                .bind(Ages::FALLBACK.subagent_days)
                .fetch_all(&mut *conn)
                .await?;
        let at: BTreeMap<Uuid, usize> = previews
            .iter()
            .enumerate()
            .map(|(i, p)| (p.account_id, i))
            .collect();
        for (account, class, key, n) in counts {
            let Some(preview) = at.get(&account).map(|i| &mut previews[*i]) else {
                continue;
            };
            match class.as_str() {
                "eligible" => {
                    if let Some(kind) = SessionKind::ALL.iter().find(|k| k.as_str() == key) {
                        preview.eligible.insert(kind.as_str(), n);
                    }
                }
                "retained" => {
                    preview.retained.insert(key, n);
                }
                _ => {
                    if let Some(table) = TABLES.iter().find(|t| **t == key) {
                        preview.rows.insert(table, n);
                    }
                }
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
            Ok(session) => explain_session(look.conn, look.now, session).await,
            Err(_) => Ok(None),
        }
    }

    fn tally(p: &Preview) -> Vec<(String, i64)> {
        let mut tally: Vec<(String, i64)> = SessionKind::ALL
            .iter()
            .map(|k| {
                let n = p.eligible.get(k.as_str()).copied().unwrap_or(0);
                (format!("sessions eligible {}", k.as_str()), n)
            })
            .collect();
        tally.extend(
            p.retained
                .iter()
                .map(|(r, n)| (format!("retained {r}"), *n)),
        );
        tally.extend(p.rows.iter().map(|(t, n)| (format!("rows {t}"), *n)));
        tally
    }
}

impl Preview {
    /// An account's line before its sessions are counted: its ages and cutoffs, and its kinds
    /// with an age that is not one, counted once each as the pass counts them (SS-1).
    fn before_counting(
        account_id: Uuid,
        account_name: String,
        ages: Option<Ages>,
        now: DateTime<Utc>,
    ) -> Self {
        let mut retained = BTreeMap::new();
        if let Some(invalid) = ages.map(|ages| ages.invalid().count() as i64)
            && invalid > 0
        {
            retained.insert(SessionReason::InvalidPolicy.as_str().to_owned(), invalid);
        }
        Self {
            account_id,
            account_name,
            ages,
            cutoffs: ages.map(|ages| ages.cutoffs(now)),
            eligible: BTreeMap::new(),
            retained,
            rows: TABLES.iter().map(|t| (*t, 0)).collect(),
        }
    }
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(ages) = self.ages else {
            return write!(
                f,
                "account {} ({}): no enabled session retention policy, nothing goes",
                self.account_name, self.account_id
            );
        };
        write!(
            f,
            "account {} ({}), main {} / task {} / subagent {} days: {} sessions eligible",
            self.account_name,
            self.account_id,
            ages.main_days,
            ages.task_days,
            ages.subagent_days,
            self.eligible.values().sum::<i64>()
        )?;
        for (kind, n) in &self.eligible {
            write!(f, "\n  eligible {kind:<24} {n:>10}")?;
        }
        for (reason, n) in &self.retained {
            write!(f, "\n  retained {reason:<24} {n:>10}")?;
        }
        for (table, n) in &self.rows {
            write!(f, "\n  rows     {table:<28} {n:>10}")?;
        }
        Ok(())
    }
}

/// The job's verdict on one session, from the SQL functions the job itself judges
/// by: `sexton.session_verdict` decides, `session_protection` and `session_evidence` give every
/// reason that applies.
pub(super) async fn explain_session(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    session: Uuid,
) -> Result<Option<Explanation>, Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        account_id: Uuid,
        kind: String,
        last_activity_at: DateTime<Utc>,
        #[sqlx(flatten)]
        policy: PolicyRow,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT s.account_id, s.kind, s.last_activity_at,
                p.enabled, p.main_days, p.task_days, p.subagent_days
         FROM sessions s LEFT JOIN session_retention_policies p ON p.account_id = s.account_id
         WHERE s.id = $1",
    )
    .bind(session)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(Row {
        account_id: account,
        kind,
        last_activity_at: last_activity,
        policy,
    }) = row
    else {
        return Ok(None);
    };
    let kind_of = SessionKind::ALL
        .iter()
        .copied()
        .find(|k| k.as_str() == kind);
    let ages = policy.ages();
    let cutoff = ages
        .zip(kind_of)
        .and_then(|(ages, kind)| days_before(now, ages.days(kind)));
    let mut explanation = Explanation {
        job: SessionRetention::NAME,
        subject: "session",
        id: session.to_string(),
        account_id: Some(account),
        policy: match (policy.enabled, ages) {
            (None, _) => "no session_retention_policies row: nothing goes (SS-1)".into(),
            (Some(_), None) => "the account's policy is disabled: nothing goes (SS-1)".into(),
            (_, Some(a)) => format!(
                "enabled: main {} / task {} / subagent {} days (the account's policy, missing \
                 ages falling back to 60 / 30 / 7)",
                a.main_days, a.task_days, a.subagent_days
            ),
        },
        measured_from: Some(format!("last_activity_at of a {kind} session")),
        age_at: Some(last_activity),
        cutoff,
        verdict: ExplainVerdict::Retained,
        reasons: Vec::new(),
        removed_at: None,
        removed_by: None,
    };
    // Whatever else applies, every hold that keeps it is named (HD-5).
    explanation.reasons.extend(holds(conn, session).await?);
    if ages.is_none() {
        explanation.reasons.push(ExplainReason::new(
            "SS-1",
            "no_policy",
            "no enabled session retention policy for the account",
        ));
        return Ok(Some(explanation));
    }
    let invalid = ages
        .zip(kind_of)
        .map(|(ages, kind)| ages.days(kind))
        .filter(|days| !crate::cutoff::valid_window(*days));
    judge(conn, &mut explanation, session, &kind, invalid).await?;
    Ok(Some(explanation))
}

/// Every hold that keeps `session` (HD-5).
async fn holds(conn: &mut PgConnection, session: Uuid) -> Result<Vec<ExplainReason>, sqlx::Error> {
    let holds =
        "(SELECT h.* FROM sessions s, sexton.session_holds(s.account_id, s.agent_id, s.id) h
                  WHERE s.id = $1::uuid)";
    crate::explain::holds(conn, holds, &[&session.to_string()]).await
}

/// The job's own verdict on a session under an enabled policy, and every reason for it, into
/// `explanation` (which holds its cutoff and last activity); `invalid` is its kind's age when
/// that is not an age (SS-1).
async fn judge(
    conn: &mut PgConnection,
    explanation: &mut Explanation,
    session: Uuid,
    kind: &str,
    invalid: Option<i32>,
) -> Result<(), Error> {
    let (cutoff, last_activity) = (explanation.cutoff, explanation.age_at);
    let (verdict, protection, evidence): (Option<String>, Option<String>, Option<String>) =
        sqlx::query_as(
            "SELECT sexton.session_verdict(s.id, s.account_id, s.agent_id, s.kind, s.state, s.metadata,
                                           s.last_activity_at, $2),
                    sexton.session_protection(s.id, s.state),
                    sexton.session_evidence(s.kind, s.metadata, s.account_id)
             FROM sessions s WHERE s.id = $1",
        )
        .bind(session)
        .bind(cutoff)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(days) = invalid {
        explanation.reasons.push(ExplainReason::new(
            "SS-1",
            SessionReason::InvalidPolicy.as_str(),
            format!(
                "the policy's age for a {kind} session is {days} days, which is not an age \
                 (it must be more than 0): none of its kind is old"
            ),
        ));
    } else if !cutoff
        .zip(last_activity)
        .is_some_and(|(c, at)| at < c && at > EARLIEST)
    {
        explanation.reasons.push(ExplainReason::new(
            "SS-2",
            "not_eligible",
            "its last activity is not before the cutoff",
        ));
    }
    if let Some(protection) = protection {
        let code = if protection.starts_with("its state") {
            "protected_state"
        } else {
            "protected_pointer"
        };
        explanation.reasons.push(ExplainReason::new(
            "SS-3",
            code,
            format!("protected: {protection}"),
        ));
    }
    if let Some(evidence) = evidence {
        explanation.reasons.push(ExplainReason::new(
            "SS-4",
            evidence.clone(),
            format!("its metadata does not prove it finished ({evidence})"),
        ));
    }
    // The verdict is the job's own.
    if verdict.is_none() {
        explanation.verdict = ExplainVerdict::Eligible;
        explanation.reasons.push(ExplainReason::new(
            "SS-2",
            "expired",
            "idle longer than its kind's age, unprotected, with its evidence: the next pass \
             deletes it with its history",
        ));
    }
    Ok(())
}
