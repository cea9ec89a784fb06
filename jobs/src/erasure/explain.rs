//! `sexton explain` of anything an erasure covers (RQ-7): which open request removes it next or
//! withholds it and why (the hold by id and case), or which completed request removed it and when
//! — found by the subject's keyed hash, the only trace of it a completed request keeps (RQ-6).

use chrono::{DateTime, SecondsFormat, Utc};
use uuid::Uuid;

use super::{Erase, Subject, Withheld};
use crate::explain::{Explanation, Reason, Verdict};
use crate::job::Job as _;
use crate::receipts::ReceiptKey;

/// What an erasure can name, by its scope or its members: what `explain` asks it about before
/// the kind that owns the subject.
pub const SUBJECTS: [&str; 5] = ["account", "conversation", "agent", "session", "run"];

/// The open request covering a subject.
#[derive(Debug, sqlx::FromRow)]
struct Covering {
    id: Uuid,
    scope: Subject,
    state: super::State,
    #[sqlx(rename = "ref")]
    reference: String,
    account_id: Option<Uuid>,
    due_at: DateTime<Utc>,
    last_error: Option<String>,
}

/// The open request whose scope covers `subject` `id`, the oldest first: its own scope, the
/// account, agent or conversation it is of, or a member found by a pass (a fork, a delegated
/// child). As [`super::request::covering`], and for runs too.
const COVERING: &str = "
WITH owner AS (
    SELECT c.account_id, NULL::uuid AS agent_id, NULL::uuid AS conversation_id
    FROM conversations c WHERE $1 = 'conversation' AND c.id = $2
    UNION ALL SELECT g.account_id, NULL, NULL FROM agents g WHERE $1 = 'agent' AND g.id = $2
    UNION ALL SELECT s.account_id, s.agent_id, NULL FROM sessions s
    WHERE $1 = 'session' AND s.id = $2
    UNION ALL SELECT r.account_id, NULL, r.conversation_id FROM runs r
    WHERE $1 = 'run' AND r.id = $2)
SELECT e.id, e.scope, e.state, e.ref, e.account_id, e.due_at, e.last_error
FROM sexton.erasures e
WHERE e.state <> 'completed'
  AND ((e.scope = $1 AND e.scope_id = $2)
       OR (e.scope = 'account' AND e.scope_id IN (SELECT account_id FROM owner))
       OR (e.scope = 'agent' AND e.scope_id IN (SELECT agent_id FROM owner))
       OR (e.scope = 'conversation' AND e.scope_id IN (SELECT conversation_id FROM owner))
       OR EXISTS (SELECT 1 FROM sexton.erasure_members m
                  WHERE m.request_id = e.id AND m.id = $2 AND m.kind = $1))
ORDER BY e.received_at, e.id LIMIT 1";

/// Whether `$1` `$2` still exists, and every reason request `$3`'s next pass would withhold it
/// for (the statements its pass and verification judge by), with the hold's case.
const WITHHELD: &str = "
WITH thing AS (
    SELECT r.id FROM runs r WHERE $1 = 'run' AND r.id = $2
    UNION ALL SELECT c.id FROM conversations c WHERE $1 = 'conversation' AND c.id = $2
    UNION ALL SELECT s.id FROM sessions s WHERE $1 = 'session' AND s.id = $2
    UNION ALL SELECT g.id FROM agents g WHERE $1 = 'agent' AND g.id = $2
    UNION ALL SELECT a.id FROM accounts a WHERE $1 = 'account' AND a.id = $2),
why (reason, hold) AS (
    SELECT w.reason, w.hold FROM runs r, sexton.erasure_run_withheld(r.id, r.status) w
    WHERE $1 = 'run' AND r.id = $2
    UNION ALL
    SELECT w.reason, w.hold
    FROM conversations c, sexton.erasure_conversation_withheld(c.id, c.account_id) w
    WHERE $1 = 'conversation' AND c.id = $2
    UNION ALL
    SELECT w.reason, w.hold
    FROM sessions s, sexton.erasure_session_withheld($3, s.id, s.account_id, s.agent_id, s.state) w
    WHERE $1 = 'session' AND s.id = $2
    UNION ALL
    SELECT w.reason, w.hold FROM agents g, sexton.erasure_agent_withheld(g.id, g.account_id) w
    WHERE $1 = 'agent' AND g.id = $2
    UNION ALL
    SELECT 'legal_hold', h.id FROM accounts a, sexton.account_holds(a.id) h
    WHERE $1 = 'account' AND a.id = $2)
SELECT EXISTS (SELECT 1 FROM thing) AS present, w.reason, w.hold, h.case_ref
FROM (SELECT 1) one
LEFT JOIN why w ON true
LEFT JOIN sexton.holds h ON h.id = w.hold
ORDER BY w.reason, w.hold";

/// Whether a subject exists, and one reason to withhold it with its hold and case (none: the
/// one row of a subject nothing withholds).
#[derive(Debug, sqlx::FromRow)]
struct Why {
    present: bool,
    reason: Option<Withheld>,
    hold: Option<Uuid>,
    case_ref: Option<String>,
}

/// The completed request that removed a subject, found by its hash.
#[derive(Debug, sqlx::FromRow)]
struct Completed {
    id: Uuid,
    scope: Subject,
    #[sqlx(rename = "ref")]
    reference: String,
    received_at: DateTime<Utc>,
    completed_at: DateTime<Utc>,
    verified_at: Option<DateTime<Utc>>,
    receipt: Option<i64>,
    /// Its account's row stays as the anchor of the usage records kept by law (RQ-2).
    anchor: bool,
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The rule a reason to withhold comes from.
fn rule(reason: Withheld) -> &'static str {
    match reason {
        Withheld::InFlight | Withheld::PointedAt | Withheld::Busy => "RQ-3",
        Withheld::LegalHold | Withheld::WithheldChild => "RQ-4",
    }
}

/// What an erasure says of `subject` `id` (one of [`SUBJECTS`]): an open request covering it
/// (eligible, withheld with every reason, or removed already by its pass), else a completed
/// request of that scope whose subject hash under `key` is `id`'s (removed, when, by which
/// request: a run, never a request's scope, is found only while one is open); `None`
/// when no request covers it, and with no key no completed one can be found.
///
/// # Errors
/// A database error.
pub async fn explain(
    conn: &mut sqlx::PgConnection,
    key: Option<&ReceiptKey>,
    subject: &'static str,
    id: Uuid,
) -> Result<Option<Explanation>, sqlx::Error> {
    let explanation = |verdict, policy: String, reasons: Vec<Reason>| Explanation {
        job: Erase::NAME,
        subject,
        id: id.to_string(),
        account_id: None,
        policy,
        measured_from: None,
        age_at: None,
        cutoff: None,
        verdict,
        reasons,
        removed_at: None,
        removed_by: None,
    };
    let open: Option<Covering> = sqlx::query_as(COVERING)
        .bind(subject)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(open) = open {
        let rows: Vec<Why> = sqlx::query_as(WITHHELD)
            .bind(subject)
            .bind(id)
            .bind(open.id)
            .fetch_all(&mut *conn)
            .await?;
        let exists = rows.first().is_some_and(|why| why.present);
        let by = format!("erasure request {} (ref {})", open.id, open.reference);
        let policy = format!(
            "erasure on request: {by} of {} {}, {}, due {}",
            match open.scope {
                Subject::Account => "an",
                _ => "a",
            },
            open.scope,
            open.state.as_str(),
            time(open.due_at),
        );
        let mut reasons: Vec<Reason> = rows
            .iter()
            .filter_map(|why| {
                let reason = why.reason?;
                let detail = match (why.hold, &why.case_ref) {
                    (Some(hold), Some(case)) => {
                        format!("{by} waits on it: hold {hold}, case {case}")
                    }
                    (Some(hold), None) => format!("{by} waits on it: hold {hold}"),
                    _ => format!("{by} waits on it: {}", reason_text(reason)),
                };
                Some(Reason::new(rule(reason), reason.as_str(), detail))
            })
            .collect();
        if exists && reasons.is_empty() && open.state == super::State::Waiting {
            // An account stays while anything under it is withheld.
            reasons.push(Reason::new(
                rule(Withheld::WithheldChild),
                Withheld::WithheldChild.as_str(),
                format!(
                    "{by} waits on what is under it (sexton erase status {})",
                    open.id
                ),
            ));
        }
        if open.state == super::State::Failed {
            reasons.push(Reason::new(
                "RQ-5",
                "request_failed",
                format!(
                    "{by} failed: {}; sexton erase retry {} runs it again",
                    open.last_error.as_deref().unwrap_or("no error recorded"),
                    open.id
                ),
            ));
        }
        let (verdict, reasons) = match (exists, reasons.is_empty()) {
            (false, _) => (
                Verdict::Removed,
                vec![Reason::new(
                    "RQ-2",
                    "erased",
                    format!(
                        "removed by {by}, which has not completed yet ({})",
                        open.state.as_str()
                    ),
                )],
            ),
            (true, true) => (
                Verdict::Eligible,
                vec![Reason::new(
                    "RQ-2",
                    "erasure_requested",
                    format!("{by}: its next pass removes it, whatever its age"),
                )],
            ),
            (true, false) => (Verdict::Retained, reasons),
        };
        let mut said = explanation(verdict, policy, reasons);
        said.account_id = open.account_id;
        if verdict == Verdict::Removed {
            said.removed_by = Some(by);
        }
        return Ok(Some(said));
    }
    let Some(key) = key else {
        return Ok(None);
    };
    let done: Option<Completed> = sqlx::query_as(
        "SELECT e.id, e.scope, e.ref, e.received_at, e.completed_at, e.verified_at,
                (SELECT r.seq FROM sexton.receipts r WHERE r.request_id = e.id) AS receipt,
                e.kept ? 'accounts' AS anchor
         FROM sexton.erasures e
         WHERE e.subject_hash = $1 AND e.key_id = $2 AND e.scope = $3 AND e.state = 'completed'
         ORDER BY e.completed_at, e.id LIMIT 1",
    )
    .bind(key.subject_hash(id))
    .bind(key.key_id())
    .bind(subject)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(done) = done else {
        return Ok(None);
    };
    let by = format!("erasure request {} (ref {})", done.id, done.reference);
    let mut reasons = vec![Reason::new(
        "RQ-6",
        "erased",
        format!(
            "{by} of this {} removed it: received {}, completed {}, verified {}{}; found by \
             its keyed hash, the only trace of it the request keeps",
            done.scope,
            time(done.received_at),
            time(done.completed_at),
            done.verified_at.map_or_else(|| "-".to_owned(), time),
            done.receipt
                .map(|seq| format!(", receipt {seq}"))
                .unwrap_or_default(),
        ),
    )];
    if done.anchor {
        reasons.push(Reason::new(
            "RQ-2",
            "kept_by_law",
            format!(
                "the account's row stays, named {}, as the anchor of the usage records kept by law",
                done.id
            ),
        ));
    }
    let mut said = explanation(
        Verdict::Removed,
        format!("erasure on request: {by}"),
        reasons,
    );
    said.removed_at = Some(done.completed_at);
    said.removed_by = Some(by);
    Ok(Some(said))
}

fn reason_text(reason: Withheld) -> &'static str {
    match reason {
        Withheld::LegalHold => "a hold covers it",
        Withheld::InFlight => "it is in flight (a run, an attempt or a history request not done)",
        Withheld::PointedAt => "an agent not erased with it points at it (SS-3)",
        Withheld::WithheldChild => "something under it is withheld",
        Withheld::Busy => "the platform had it locked",
    }
}
