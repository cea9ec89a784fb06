//! What the erasure kind reads without deleting: `sexton preview` (the open requests) and
//! `sexton explain` of an account, a conversation or an agent (RQ-7).

use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use super::{Erase, ErasureSettings};
use crate::explain::{Explanation, Reason, Verdict};
use crate::job::{Inspect, Job as _, Look};
use crate::owner_loop::Error;

/// The open requests by state, and the earliest due date.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Preview {
    pub received: i64,
    pub running: i64,
    pub waiting: i64,
    pub verifying: i64,
    pub failed: i64,
    pub earliest_due: Option<chrono::DateTime<chrono::Utc>>,
}

impl fmt::Display for Preview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "erasure (RQ-1 … RQ-8): {} received, {} running, {} waiting, {} verifying, {} failed",
            self.received, self.running, self.waiting, self.verifying, self.failed
        )?;
        if let Some(due) = self.earliest_due {
            write!(f, "; earliest due {}", due.to_rfc3339())?;
        }
        Ok(())
    }
}

impl Inspect for Erase {
    /// The scopes no other kind owns; a session's and a run's erasure is looked up by `explain`
    /// before their own kind's verdict ([`super::explain::SUBJECTS`]).
    const SUBJECTS: &'static [&'static str] = &["account", "conversation", "agent"];

    type Preview = Preview;

    /// What an erasure says of it ([`super::explain::explain`]); one that exists and no request
    /// covers is retained: only a request erases it.
    async fn explain(
        look: Look<'_, ErasureSettings>,
        subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        let Ok(id) = Uuid::parse_str(id) else {
            return Ok(None);
        };
        let key = look.settings.receipt_key.as_ref();
        if let Some(said) = super::explain::explain(look.conn, key, subject, id).await? {
            return Ok(Some(said));
        }
        let account: Option<Option<Uuid>> = sqlx::query_scalar(
            "SELECT a.id FROM accounts a WHERE $1 = 'account' AND a.id = $2
             UNION ALL SELECT c.account_id FROM conversations c
             WHERE $1 = 'conversation' AND c.id = $2
             UNION ALL SELECT g.account_id FROM agents g WHERE $1 = 'agent' AND g.id = $2",
        )
        .bind(subject)
        .bind(id)
        .fetch_optional(&mut *look.conn)
        .await?;
        Ok(account.map(|account_id| Explanation {
            job: Erase::NAME,
            subject,
            id: id.to_string(),
            account_id,
            policy: "erasure on request only (RQ-1): no request covers it".to_owned(),
            measured_from: None,
            age_at: None,
            cutoff: None,
            verdict: Verdict::Retained,
            reasons: vec![Reason::new(
                "RQ-1",
                "not_requested",
                format!(
                    "no erasure request covers this {subject}: sexton erase --{subject} {id} \
                     asks for one; what it holds goes by each kind's retention meanwhile"
                ),
            )],
            removed_at: None,
            removed_by: None,
        }))
    }

    async fn preview(
        look: Look<'_, ErasureSettings>,
        _accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let preview = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'received') AS received,
                    count(*) FILTER (WHERE state = 'running') AS running,
                    count(*) FILTER (WHERE state = 'waiting') AS waiting,
                    count(*) FILTER (WHERE state = 'verifying') AS verifying,
                    count(*) FILTER (WHERE state = 'failed') AS failed,
                    min(due_at) AS earliest_due
             FROM sexton.erasures WHERE state <> 'completed'",
        )
        .fetch_one(look.conn)
        .await?;
        Ok(vec![preview])
    }
}
