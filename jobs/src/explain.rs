//! "Why is this still here?": a job's verdict on one row or file, with every reason
//! that applies and its rule id, computed by the same code as the job's own decision.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

/// What the next pass would do with it, or what a pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The next pass removes it.
    Eligible,
    /// The next pass leaves it, for the reasons given.
    Retained,
    /// A pass removed it already.
    Removed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Eligible => "eligible",
            Verdict::Retained => "retained",
            Verdict::Removed => "removed",
        }
    }
}

/// One reason, with the rule it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// The rule id, e.g. `EX-5`.
    pub rule: &'static str,
    /// The stable label (a metric's `reason`, where there is one).
    pub code: String,
    /// For people: the rows, times and values it rests on.
    pub detail: String,
}

impl Reason {
    pub fn new(rule: &'static str, code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            rule,
            code: code.into(),
            detail: detail.into(),
        }
    }
}

/// The reason code of a thing a hold keeps (HD-3), in every job's retained reasons.
pub const LEGAL_HOLD: &str = "legal_hold";

/// Every active hold that keeps a thing (HD-5), oldest first, each a reason naming its case,
/// why, who placed it and when: `holds` is one of the covering functions of the holds migration
/// (`sexton.run_holds($1::uuid)`, …) with `ids` bound, as text, to its parameters in order.
///
/// # Errors
/// A database error — the hold table unreadable included: a hold is never assumed away.
pub async fn holds(
    conn: &mut PgConnection,
    holds: &str,
    ids: &[&str],
) -> Result<Vec<Reason>, sqlx::Error> {
    let sql = format!(
        "SELECT 'hold ' || h.id || ' on ' || h.scope || ' ' || h.scope_id || ': case '
                || h.case_ref || ', ' || h.reason || ', placed by ' || h.placed_by || ' at '
                || to_char(h.placed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
         FROM {holds} h ORDER BY h.placed_at, h.id"
    );
    let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(*id);
    }
    Ok(query
        .fetch_all(conn)
        .await?
        .into_iter()
        .map(|detail| Reason::new("HD-3", LEGAL_HOLD, detail))
        .collect())
}

/// A job's answer about one subject. The JSON shape is documented in the README.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// The job that owns it.
    pub job: &'static str,
    /// What it is (`run`, `session`, `trace`, …) and its id or path.
    pub subject: &'static str,
    pub id: String,
    pub account_id: Option<Uuid>,
    /// The policy in force and where it comes from.
    pub policy: String,
    /// What its age is measured from, and that moment.
    pub measured_from: Option<String>,
    pub age_at: Option<DateTime<Utc>>,
    /// Where a pass starting now would draw the line.
    pub cutoff: Option<DateTime<Utc>>,
    pub verdict: Verdict,
    /// Every reason that applies (for `eligible`, the one that makes it go).
    pub reasons: Vec<Reason>,
    /// When it was removed, and by which pass, where that is known.
    pub removed_at: Option<DateTime<Utc>>,
    pub removed_by: Option<String>,
}

fn time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} {}: {}", self.subject, self.id, self.verdict.as_str())?;
        writeln!(f, "  job:      {}", self.job)?;
        if let Some(account) = self.account_id {
            writeln!(f, "  account:  {account}")?;
        }
        writeln!(f, "  policy:   {}", self.policy)?;
        if let Some(from) = &self.measured_from {
            writeln!(f, "  age:      {from} {}", time(self.age_at))?;
        }
        writeln!(f, "  cutoff:   {} (a pass starting now)", time(self.cutoff))?;
        if self.verdict == Verdict::Removed {
            writeln!(
                f,
                "  removed:  {} by {}",
                time(self.removed_at),
                self.removed_by.as_deref().unwrap_or("a pass")
            )?;
        }
        for reason in &self.reasons {
            writeln!(f, "  {} {}: {}", reason.rule, reason.code, reason.detail)?;
        }
        Ok(())
    }
}
