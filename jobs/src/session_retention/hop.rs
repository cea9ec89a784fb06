//! One hop of session retention: the account's sessions through the owner loop, kind after
//! kind, a few sessions per transaction with their agents share-locked and the verdict
//! re-checked under the locks (SS-5), each session's whole history with it (SS-6).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::cutoff::EARLIEST;
use crate::job::Report;
use crate::owner_loop::{self, Candidates, Chunks, End, Mode, Taken, Window, Windowed};
use crate::pass::Step;

use super::sql::{DELETE_SESSIONS, WINDOW};
use super::{
    Ages, Cursor, Cutoffs, Error, HopOutcome, HopSettings, Policy, PolicyRow, SessionKind,
    SessionReason, SessionRetention, TABLES, WRITTEN,
};

/// One hop: the owner loop ([`crate::owner_loop::Hop::run`]) over one window of the account's
/// sessions, kind after kind, in short transactions.
///
/// # Errors
/// [`Error`] when the database or the file root fails; nothing is half-done and the hop can
/// be run again.
pub(super) async fn hop(
    step: Step<'_, SessionRetention>,
    report: &mut Report<SessionReason>,
) -> Result<End<Cursor>, Error> {
    let settings = step.settings;
    let account_id = step.account.unwrap_or_default();
    let hop = step.hop;
    // The ages again, for the kinds a policy gives no valid age (counted once per pass).
    let ages = match ages(&mut *hop.conn, account_id, settings.policy).await? {
        Ok(ages) => ages,
        Err(_) => return Ok(End::Finished),
    };
    // The kinds share the hop and its chain: it hands over only when its window or its budget
    // is spent, not when a kind runs out (FL-8).
    let mut sessions = Windowed::new(
        Sessions {
            account_id,
            ages,
            bound: step.cutoff,
            kind: SessionKind::Main,
            settings,
        },
        Chunks::Timed {
            first: FIRST_TOGETHER,
            most: settings.sessions_per_transaction as usize,
            target: settings.transaction_target,
        },
    );
    hop.run(&mut sessions, step.cursor, report).await
}

/// Sessions taken together by a hop's first transaction, before any has been measured.
const FIRST_TOGETHER: usize = 20;

/// An account's sessions as the owner loop takes them: kind after kind, each in (last
/// activity, id) order through `sessions_retention_window`.
pub(super) struct Sessions<'a> {
    account_id: Uuid,
    ages: Ages,
    /// The stricter of the carried cutoffs and the current ones, kind by kind.
    bound: Cutoffs,
    /// The kind of the window in hand.
    kind: SessionKind,
    settings: &'a HopSettings,
}

/// A session as the window read it: its id, its agent, its last activity and its verdict
/// (`None`: it goes).
pub(super) type Candidate = (Uuid, Uuid, DateTime<Utc>, Option<SessionReason>);

impl Window for Sessions<'_> {
    type Candidate = Candidate;
    type Cursor = Cursor;
    type Report = Report<SessionReason>;

    const TABLES: &'static [&'static str] = &WRITTEN;

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Cursor>,
        room: u32,
        report: &mut Report<SessionReason>,
    ) -> Result<Candidates<Candidate, Cursor>, Error> {
        let cursor = at.copied().unwrap_or(Cursor {
            kind: SessionKind::Main,
            after: None,
        });
        let kind = cursor.kind;
        self.kind = kind;
        if cursor.after.is_none() && self.ages.invalid().any(|invalid| invalid == kind) {
            // Never "every session is old": none of this kind is (SS-1).
            tracing::warn!(
                account = %self.account_id,
                kind = kind.as_str(),
                days = self.ages.days(kind),
                "the account's session retention policy gives this kind an age of 0 or less \
                 (must be > 0): none of its sessions is pruned"
            );
            report.retain(SessionReason::InvalidPolicy, 1);
        }
        let (after_at, after_id) = cursor.after.unwrap_or((EARLIEST, Uuid::nil()));
        // The verdict is taken first without locks, so that only sessions that would go are
        // locked: a retained session (protected, lacking evidence) is never held from the
        // platform.
        let candidates = match self.bound.of(kind) {
            None => Vec::new(),
            Some(cutoff) => {
                sqlx::query_as(WINDOW)
                    .bind(self.account_id)
                    .bind(kind.as_str())
                    .bind(cutoff)
                    .bind(after_at.max(EARLIEST))
                    .bind(after_id)
                    .bind(i64::from(room))
                    .fetch_all(&mut *conn)
                    .await?
            }
        };
        Ok(Candidates {
            candidates,
            tail: kind.next().map(|kind| Cursor { kind, after: None }),
        })
    }

    fn cursor(&self, (id, _, at, _): &Candidate) -> Cursor {
        Cursor {
            kind: self.kind,
            after: Some((*at, *id)),
        }
    }

    async fn take(
        &mut self,
        conn: &mut PgConnection,
        chunk: &[Candidate],
        report: &mut Report<SessionReason>,
    ) -> Result<Taken, Error> {
        let deleted_before = report.pruned;
        let mut sessions: Vec<(Uuid, Uuid)> = Vec::with_capacity(chunk.len());
        for (session, agent, _, verdict) in chunk {
            match verdict {
                None => sessions.push((*session, *agent)),
                Some(reason) => report.retain(*reason, 1),
            }
        }
        if sessions.is_empty() {
            return Ok(Taken::default());
        }
        let (settings, account, kind) = (self.settings, self.account_id, self.kind);
        let cutoff = self.bound.of(kind);
        match delete_sessions(conn, settings, account, kind, cutoff, &sessions).await? {
            Deleted::Done(outcome) => record(report, &outcome),
            // The store guard saw what the statement's snapshot did not (an agent pointed at a
            // session just now): take them one by one, and keep the one it guards.
            Deleted::Guarded => {
                for session in &sessions {
                    match delete_sessions(conn, settings, account, kind, cutoff, &[*session])
                        .await?
                    {
                        Deleted::Done(outcome) => record(report, &outcome),
                        Deleted::Guarded => report.retain(SessionReason::ProtectedPointer, 1),
                    }
                }
            }
        }
        Ok(Taken {
            recorded: report.pruned - deleted_before,
            sized_by: None,
        })
    }
}

/// The ages in force for the account, or why its pass ends: the account is gone, or its
/// policy prunes nothing (SS-1).
pub(super) async fn ages(
    conn: &mut PgConnection,
    account_id: Uuid,
    policy: Policy,
) -> Result<Result<Ages, HopOutcome>, Error> {
    let row: Option<PolicyRow> = sqlx::query_as(
        "SELECT p.enabled, p.main_days, p.task_days, p.subagent_days
         FROM accounts a LEFT JOIN session_retention_policies p ON p.account_id = a.id
         WHERE a.id = $1",
    )
    .bind(account_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(persisted) = row else {
        return Ok(Err(HopOutcome::AccountGone));
    };
    Ok(match policy {
        Policy::Fixed(ages) => Ok(ages),
        Policy::Persisted => persisted.ages().ok_or(HopOutcome::Disabled),
    })
}

/// What one deletion transaction found and did.
pub(super) struct Outcome {
    /// Sessions of the chunk that could not be locked at once.
    busy: u64,
    /// The verdict on each session locked: `None` for deleted.
    verdicts: Vec<Option<SessionReason>>,
    /// Rows deleted per table of [`TABLES`].
    rows: [i64; 4],
}

pub(super) enum Deleted {
    Done(Outcome),
    /// The store guard refused a session: nothing of the transaction happened.
    Guarded,
}

/// Counts what one deletion transaction found and did.
fn record(report: &mut Report<SessionReason>, outcome: &Outcome) {
    report.retain(SessionReason::Busy, outcome.busy);
    for verdict in &outcome.verdicts {
        match verdict {
            None => report.pruned += 1,
            Some(reason) => report.retain(*reason, 1),
        }
    }
    for (table, n) in TABLES.iter().zip(outcome.rows) {
        report.deleted(table, n.max(0) as u64);
    }
}

/// Deletes the sessions of `chunk` that are still to go, in one transaction: their agents
/// share-locked (so no pointer to them can be set meanwhile) and the sessions locked, each
/// only if free at once; the verdict re-checked under those locks (SS-5); history, session
/// and frame-directory record together (SS-6).
pub(super) async fn delete_sessions(
    conn: &mut PgConnection,
    settings: &HopSettings,
    account_id: Uuid,
    kind: SessionKind,
    cutoff: Option<DateTime<Utc>>,
    chunk: &[(Uuid, Uuid)],
) -> Result<Deleted, Error> {
    let mut tx = owner_loop::begin(conn, Some(settings.lock_timeout), true).await?;
    let mut agents: Vec<Uuid> = chunk.iter().map(|(_, agent)| *agent).collect();
    agents.sort();
    agents.dedup();
    let locked_agents = owner_loop::lock(&mut tx, "agents", Mode::Share, &agents).await?;
    let sessions: Vec<Uuid> = chunk
        .iter()
        .filter(|(_, agent)| locked_agents.contains(agent))
        .map(|(session, _)| *session)
        .collect();
    let rows: Result<Vec<Judged>, sqlx::Error> = sqlx::query_as(DELETE_SESSIONS)
        .bind(&sessions)
        .bind(account_id)
        .bind(kind.as_str())
        .bind(cutoff)
        .fetch_all(&mut *tx)
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(sqlx::Error::Database(db))
            if db.message().contains("is protected and cannot be deleted") =>
        {
            return Ok(Deleted::Guarded);
        }
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
            // A child row an application holds: the chunk is busy, revisited next pass.
            return Ok(Deleted::Done(Outcome {
                busy: chunk.len() as u64,
                verdicts: Vec::new(),
                rows: [0; 4],
            }));
        }
        Err(err) => return Err(err.into()),
    };
    tx.commit().await?;
    let counts = rows.first().map(|r| r.counts.clone()).unwrap_or_default();
    let count = |i: usize| counts.get(i).copied().unwrap_or_default();
    Ok(Deleted::Done(Outcome {
        busy: (chunk.len() - rows.len()) as u64,
        verdicts: rows.into_iter().map(|r| r.verdict).collect(),
        rows: [count(0), count(1), count(2), count(3)],
    }))
}

/// One session as the deletion statement found it under lock.
#[derive(sqlx::FromRow)]
pub(super) struct Judged {
    verdict: Option<SessionReason>,
    /// The same on every row: see [`DELETE_SESSIONS`].
    counts: Vec<i64>,
}
