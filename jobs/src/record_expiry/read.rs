//! What a record kind reads without deleting: the backlog (OP-3), `sexton preview` and
//! `sexton explain`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::cutoff::{EARLIEST, days_before};
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::job::{Inspect, Look};

use super::{Error, Expire, ExpirySettings, Record, sql};

impl<R: Record> Inspect for Expire<R> {
    const SUBJECTS: &'static [&'static str] = &[R::SUBJECT];

    type Preview = Preview;

    /// How far past its cutoff the oldest expired row is, in seconds (0 when none is).
    async fn backlog_seconds(
        pool: &PgPool,
        settings: &ExpirySettings,
        now: DateTime<Utc>,
    ) -> Result<Option<f64>, Error> {
        let Some(cutoff) = enabled_cutoff::<R>(settings, now) else {
            return Ok(Some(0.0));
        };
        let oldest: Option<DateTime<Utc>> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql::oldest::<R>()))
                .bind(cutoff)
                .bind(EARLIEST)
                .fetch_one(pool)
                .await?;
        Ok(Some(
            oldest.map_or(0.0, |oldest| (cutoff - oldest).as_seconds_f64()),
        ))
    }

    fn parse_id(_subject: &str, id: &str) -> Result<(), String> {
        // Conversation events are numbered, every other kind has UUIDs.
        let ok = if R::FIRST_ID.starts_with('-') {
            id.parse::<i64>().is_ok()
        } else {
            Uuid::parse_str(id).is_ok()
        };
        ok.then_some(()).ok_or_else(|| {
            if R::FIRST_ID.starts_with('-') {
                format!("expected a whole number, got {id:?}")
            } else {
                format!("expected a UUID, got {id:?}")
            }
        })
    }

    async fn explain(
        look: Look<'_, ExpirySettings>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        if Self::parse_id(R::SUBJECT, id).is_err() {
            return Ok(None);
        }
        explain_record::<R>(look.conn, look.settings, look.now, id).await
    }

    async fn preview(
        look: Look<'_, ExpirySettings>,
        accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let Look {
            conn,
            settings,
            now,
            ..
        } = look;
        let days = R::days(settings);
        let cutoff = enabled_cutoff::<R>(settings, now);
        let (past, held): (i64, i64) = match cutoff {
            Some(cutoff) => {
                sqlx::query_as(sqlx::AssertSqlSafe(sql::count::<R>()))
                    .bind(cutoff)
                    .bind(EARLIEST)
                    .bind(accounts)
                    .fetch_one(&mut *conn)
                    .await?
            }
            None => (0, 0),
        };
        Ok(vec![Preview {
            table: R::TABLE,
            rule: R::RULE,
            days,
            cutoff,
            account_id: match accounts {
                Some([account]) => Some(*account),
                _ => None,
            },
            expired: past - held,
            held,
        }])
    }
}

/// The cutoff at `now`, or `None` when the kind is disabled or nothing can be old enough.
pub(super) fn enabled_cutoff<R: Record>(
    settings: &ExpirySettings,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    match R::days(settings) {
        0 => None,
        days => days_before(now, days),
    }
}

/// What a pass of one record kind would delete now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub table: &'static str,
    pub rule: &'static str,
    /// The configured age; 0 means the kind is disabled.
    pub days: i32,
    pub cutoff: Option<DateTime<Utc>>,
    pub account_id: Option<Uuid>,
    /// Rows past the cutoff (of the account, if one was asked for) that a pass would delete.
    pub expired: i64,
    /// Rows past the cutoff that a hold keeps (HD-3).
    pub held: i64,
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scope = self
            .account_id
            .map_or_else(|| "all accounts".to_owned(), |a| format!("account {a}"));
        match (self.days, self.cutoff) {
            (0, _) => write!(f, "{} ({}): disabled, nothing goes", self.table, self.rule),
            (_, None) => write!(
                f,
                "{} ({}): {} days reaches past the calendar, nothing goes",
                self.table, self.rule, self.days
            ),
            (days, Some(cutoff)) => {
                write!(
                    f,
                    "{} ({}), {scope}: {} rows older than {days} days (before {}) expire",
                    self.table,
                    self.rule,
                    self.expired,
                    cutoff.format("%Y-%m-%dT%H:%M:%SZ")
                )?;
                if self.held > 0 {
                    write!(f, "; {} more are kept by a hold (legal_hold)", self.held)?;
                }
                Ok(())
            }
        }
    }
}

/// The job's verdict on one record: whether it has expired as the batches judge it
/// (`sexton.record_expired`: a finite age before the cutoff, not pinned) and whether a hold
/// keeps it.
pub(super) async fn explain_record<R: Record>(
    conn: &mut PgConnection,
    settings: &ExpirySettings,
    now: DateTime<Utc>,
    id: &str,
) -> Result<Option<Explanation>, Error> {
    let row: Option<(Uuid, DateTime<Utc>, bool)> = sqlx::query_as(R::ROW)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((account, age, pinned)) = row else {
        return Ok(None);
    };
    let days = R::days(settings);
    let cutoff = enabled_cutoff::<R>(settings, now);
    let mut explanation = Explanation {
        job: R::JOB,
        subject: R::SUBJECT,
        id: id.to_owned(),
        account_id: Some(account),
        policy: match days {
            0 => format!("{} = 0: this kind never expires", R::SETTING),
            days => format!("{} = {days}", R::SETTING),
        },
        measured_from: Some(R::AGE.to_owned()),
        age_at: Some(age),
        cutoff,
        verdict: ExplainVerdict::Retained,
        reasons: Vec::new(),
        removed_at: None,
        removed_by: None,
    };
    // Whatever else applies, every hold that keeps it is named (HD-5).
    let holds = format!(
        "(SELECT h.* FROM {} t, {} h WHERE t.id = $1::{})",
        R::TABLE,
        R::HOLDS,
        R::ID_TYPE
    );
    let held = crate::explain::holds(conn, &holds, &[id]).await?;
    let is_held = !held.is_empty();
    explanation.reasons.extend(held);
    if pinned {
        explanation.reasons.push(ExplainReason::new(
            "TTL-3",
            "pinned",
            "pinned records and cards never expire",
        ));
    }
    let Some(cutoff) = cutoff else {
        explanation.reasons.push(ExplainReason::new(
            "TTL-5",
            "disabled",
            "expiry of this kind is off (or its age reaches back past the calendar)",
        ));
        return Ok(Some(explanation));
    };
    let judged: Option<(bool, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(sql::judge::<R>()))
        .bind(id)
        .bind(cutoff)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((expired, old_enough)) = judged else {
        return Ok(None);
    };
    if !old_enough {
        explanation.reasons.push(ExplainReason::new(
            R::RULE,
            "not_expired",
            "younger than its age",
        ));
    }
    if expired && !is_held {
        explanation.verdict = ExplainVerdict::Eligible;
        explanation.reasons.push(ExplainReason::new(
            R::RULE,
            "expired",
            "older than its age: the next pass deletes it (unless an application holds it)",
        ));
    }
    Ok(Some(explanation))
}
