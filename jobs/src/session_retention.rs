//! SessionRetention (SPEC §3, seeds 000 and 002): deletes old agent sessions with their history
//! — live entries, archives and archive entries — and, after commit, their archive frame
//! directories; handoffs that point at a deleted session keep their rows with the reference
//! nulled.
//!
//! A nightly pass per account is one chain of hops over the account's sessions, kind by kind
//! (main, task, subagent), each kind in (last activity, id) order through
//! `sessions_retention_window`; the kinds share a hop's window and budget, so that a hop hands
//! over only when one of them is spent (FL-8). The policy is the account's persisted one (SS-1: missing or
//! disabled prunes nothing) or, for `sexton sessions prune`, ages given by the operator. The
//! verdict on a session — old enough (SS-2), not protected (SS-3), with its evidence (SS-4) —
//! is `sexton.session_verdict`, one SQL function used for the window, the re-check and the
//! preview alike. Sessions go in short transactions of a few: their agents are share-locked and
//! the sessions locked (SKIP LOCKED: a busy session is counted and revisited next pass), the
//! verdict re-checked under those locks (SS-5), and a session's whole history deleted with its
//! row in the same transaction, so no surviving session ever loses part of its history. The
//! store guard (`sexton.guard_protected_session`) refuses the delete of a protected session
//! independently of all this.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::cutoff::{EARLIEST, days_before};
use crate::estimate::Read;
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::files::{self, DrainError, FileCounts, PathSettings, Root};
use crate::health::{Health, Indicator};
pub use crate::job::HopOutcome;
use crate::job::{AccountRange, Env, Job, Position, Report, Scope};
use crate::owner_loop::{
    self, Bounds, Candidates, Chunks, Files, Hop, Mode, Progress, Taken, Window, Windowed,
};
use crate::payload::V1;
use crate::settings::{Check, Raw};

/// A session kind, in the order a pass visits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    Main,
    Task,
    Subagent,
}

impl SessionKind {
    pub const ALL: [SessionKind; 3] = [SessionKind::Main, SessionKind::Task, SessionKind::Subagent];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Main => "main",
            SessionKind::Task => "task",
            SessionKind::Subagent => "subagent",
        }
    }

    fn next(self) -> Option<SessionKind> {
        match self {
            SessionKind::Main => Some(SessionKind::Task),
            SessionKind::Task => Some(SessionKind::Subagent),
            SessionKind::Subagent => None,
        }
    }
}

/// Ages in days per kind (SS-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ages {
    pub main_days: i32,
    pub task_days: i32,
    pub subagent_days: i32,
}

impl Ages {
    /// The fallback ages of an enabled policy, and the CLI's defaults: 60, 30, 7 days.
    pub const FALLBACK: Ages = Ages {
        main_days: 60,
        task_days: 30,
        subagent_days: 7,
    };

    fn days(&self, kind: SessionKind) -> i32 {
        match kind {
            SessionKind::Main => self.main_days,
            SessionKind::Task => self.task_days,
            SessionKind::Subagent => self.subagent_days,
        }
    }

    /// The kinds whose age is 0 or less: the platform's table allows it, but nothing of such a
    /// kind is old (SS-1), as the CLI refuses the same value.
    fn invalid(&self) -> impl Iterator<Item = SessionKind> + '_ {
        SessionKind::ALL
            .into_iter()
            .filter(|kind| !crate::cutoff::valid_window(self.days(*kind)))
    }

    fn cutoffs(&self, reference: DateTime<Utc>) -> Cutoffs {
        Cutoffs {
            main: days_before(reference, self.main_days),
            task: days_before(reference, self.task_days),
            subagent: days_before(reference, self.subagent_days),
        }
    }
}

/// Where the ages come from (SS-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Policy {
    /// The account's `session_retention_policies` row: missing or disabled prunes nothing; an
    /// enabled one's missing ages fall back to [`Ages::FALLBACK`]. The nightly job.
    Persisted,
    /// Ages the operator gave (`sexton sessions prune`), whatever the persisted policy says.
    Fixed(Ages),
}

/// An account's row of `session_retention_policies`, if it has one.
#[derive(Debug, Clone)]
struct PolicyRow {
    enabled: Option<bool>,
    main_days: Option<i32>,
    task_days: Option<i32>,
    subagent_days: Option<i32>,
}

impl PolicyRow {
    /// The ages of an enabled policy, its missing ones falling back (SS-1); `None` when the
    /// policy is missing or disabled: nothing goes.
    fn ages(&self) -> Option<Ages> {
        (self.enabled == Some(true)).then(|| Ages {
            main_days: self.main_days.unwrap_or(Ages::FALLBACK.main_days),
            task_days: self.task_days.unwrap_or(Ages::FALLBACK.task_days),
            subagent_days: self.subagent_days.unwrap_or(Ages::FALLBACK.subagent_days),
        })
    }
}

/// The cutoff of each kind; `None` where the window reaches back past the calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cutoffs {
    pub main: Option<DateTime<Utc>>,
    pub task: Option<DateTime<Utc>>,
    pub subagent: Option<DateTime<Utc>>,
}

impl Cutoffs {
    pub fn of(&self, kind: SessionKind) -> Option<DateTime<Utc>> {
        match kind {
            SessionKind::Main => self.main,
            SessionKind::Task => self.task,
            SessionKind::Subagent => self.subagent,
        }
    }

    /// The stricter of two cutoffs, kind by kind (EX-7's rule, for sessions).
    fn min(&self, other: &Cutoffs) -> Cutoffs {
        let min =
            |a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>| a.zip(b).map(|(a, b)| a.min(b));
        Cutoffs {
            main: min(self.main, other.main),
            task: min(self.task, other.task),
            subagent: min(self.subagent, other.subagent),
        }
    }
}

/// A position in a pass: the kind being visited and the last session visited in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    pub kind: SessionKind,
    /// The last session visited of that kind; `None` at the start of the kind.
    pub after: Option<(DateTime<Utc>, Uuid)>,
}

/// One hop's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    pub version: V1,
    pub account_id: Uuid,
    pub pass_started_at: DateTime<Utc>,
    pub policy: Policy,
    /// Fixed by the first hop and carried by every later one.
    pub cutoffs: Option<Cutoffs>,
    pub cursor: Option<Cursor>,
    /// 0 for the first hop of a pass.
    pub hop: u32,
}

impl Args {
    /// The first hop of an account's pass under `policy`.
    pub fn first(account_id: Uuid, pass_started_at: DateTime<Utc>, policy: Policy) -> Self {
        Self {
            version: V1,
            account_id,
            pass_started_at,
            policy,
            cutoffs: None,
            cursor: None,
            hop: 0,
        }
    }
}

/// How much one hop may do.
#[derive(Debug, Clone)]
pub struct HopSettings {
    /// Sessions read per hop.
    pub window_size: u32,
    /// Sessions deleted together in one transaction (a session's whole history goes with it).
    pub sessions_per_transaction: u32,
    /// Time after which a hop stops taking sessions and hands over to the next hop.
    pub budget: Duration,
    /// Longest wait for any lock inside a deletion (child rows an application holds).
    pub lock_timeout: Duration,
    /// Root of the per-session archive frame directories.
    pub sessions_root: PathBuf,
}

/// Why a session was left in place this pass, as counted in metrics. `invalid_policy` counts a
/// kind whose policy age is 0 or less, once per pass (SS-1).
pub const RETAIN_REASONS: [&str; 8] = [
    "not_eligible",
    "protected_state",
    "protected_pointer",
    "missing_evidence",
    "malformed_evidence",
    "task_not_terminal",
    "busy",
    INVALID_POLICY,
];

const INVALID_POLICY: &str = "invalid_policy";

/// The history tables, in the order reports list them; `sessions` itself last.
pub const TABLES: [&str; 4] = [
    "conversation_entries",
    "conversation_archive_entries",
    "conversation_archives",
    "sessions",
];

/// Every table a hop writes: the history, the handoffs it unlinks, the file records.
const WRITTEN: [&str; 6] = [
    TABLES[0],
    TABLES[1],
    TABLES[2],
    TABLES[3],
    "handoffs",
    "pending_file_deletions",
];

/// What one hop did.
#[derive(Debug, Clone, Serialize)]
pub struct HopReport {
    pub outcome: HopOutcome,
    pub candidates: u64,
    /// Sessions deleted.
    pub deleted: u64,
    pub retained: BTreeMap<&'static str, u64>,
    /// Rows deleted per table of [`TABLES`].
    pub rows: BTreeMap<&'static str, u64>,
    /// Handoffs whose reference to a deleted session was nulled.
    pub handoffs_unlinked: u64,
    pub files: FileCounts,
    pub owner_seconds: f64,
    pub next: Option<Args>,
    /// The red indicator that stopped the hop early, if one did.
    pub throttled: Option<Indicator>,
}

impl HopReport {
    fn new() -> Self {
        Self {
            outcome: HopOutcome::Finished,
            candidates: 0,
            deleted: 0,
            retained: BTreeMap::new(),
            rows: TABLES.iter().map(|t| (*t, 0)).collect(),
            handoffs_unlinked: 0,
            files: FileCounts::default(),
            owner_seconds: 0.0,
            next: None,
            throttled: None,
        }
    }

    fn retain(&mut self, reason: &str) {
        let reason = RETAIN_REASONS
            .iter()
            .find(|r| **r == reason)
            .copied()
            .unwrap_or("not_eligible");
        *self.retained.entry(reason).or_default() += 1;
    }
}

impl Progress for HopReport {
    fn took(&mut self, candidates: u64, seconds: f64) {
        self.candidates += candidates;
        self.owner_seconds += seconds;
    }

    fn files(&mut self, counts: FileCounts) {
        self.files.add(counts);
    }

    fn throttled(&mut self, red: Indicator) {
        self.throttled = Some(red);
    }
}

/// Why a hop failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Files(#[from] DrainError),
}

/// Runs one hop on a connection of the pool (tests, and `sexton sessions prune`).
///
/// # Errors
/// [`Error`] when the database or the file root fails; nothing is half-done and the hop can
/// be run again.
pub async fn run(
    pool: &PgPool,
    settings: &HopSettings,
    args: &Args,
    stop: &AtomicBool,
) -> Result<HopReport, Error> {
    let mut conn = pool.acquire().await?;
    hop(&mut conn, &Health::off(), settings, args, stop).await
}

/// One hop on the caller's connection: one window of sessions, kind after kind, in short
/// transactions.
///
/// # Errors
/// As [`run`].
pub async fn hop(
    conn: &mut PgConnection,
    health: &Health,
    settings: &HopSettings,
    args: &Args,
    stop: &AtomicBool,
) -> Result<HopReport, Error> {
    let mut report = HopReport::new();
    hop_into(conn, health, settings, args, stop, &mut report).await?;
    Ok(report)
}

/// [`hop`] into `report`, which holds what was committed when it fails: the owner loop
/// ([`Hop::run`]) over the account's sessions, kind after kind.
async fn hop_into(
    conn: &mut PgConnection,
    health: &Health,
    settings: &HopSettings,
    args: &Args,
    stop: &AtomicBool,
    report: &mut HopReport,
) -> Result<(), Error> {
    let bounds = Bounds {
        window: Some(settings.window_size),
        budget: settings.budget,
    };
    let files = Files {
        root: Root::Sessions,
        path: &settings.sessions_root,
        scope: Some(args.account_id),
        beside: None,
    };
    let hop = Hop::start(conn, health, stop, bounds, Some(files), report).await?;
    let Some((ages, database_now)) = ages(hop.conn, args.account_id, args.policy, report).await?
    else {
        return Ok(());
    };
    let current = ages.cutoffs(crate::cutoff::reference(args.pass_started_at, database_now));
    let cutoffs = args.cutoffs.unwrap_or(current);
    // The kinds share the hop and its chain: it hands over only when its window or its budget
    // is spent, not when a kind runs out (FL-8).
    let mut sessions = Windowed::new(
        Sessions {
            account_id: args.account_id,
            ages,
            bound: cutoffs.min(&current),
            kind: SessionKind::Main,
            settings,
        },
        Chunks::Fixed(settings.sessions_per_transaction as usize),
    );
    let end = hop.run(&mut sessions, args.cursor, report).await?;
    report.outcome = end.outcome();
    report.next = end.next().map(|cursor| Args {
        version: V1,
        account_id: args.account_id,
        pass_started_at: args.pass_started_at,
        policy: args.policy,
        cutoffs: Some(cutoffs),
        cursor,
        hop: args.hop + 1,
    });
    Ok(())
}

/// An account's sessions as the owner loop takes them: kind after kind, each in (last
/// activity, id) order through `sessions_retention_window`.
struct Sessions<'a> {
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
type Candidate = (Uuid, Uuid, DateTime<Utc>, Option<String>);

impl Window for Sessions<'_> {
    type Candidate = Candidate;
    type Cursor = Cursor;
    type Report = HopReport;
    type Error = Error;

    const TABLES: &'static [&'static str] = &WRITTEN;

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Cursor>,
        room: u32,
        report: &mut HopReport,
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
            report.retain(INVALID_POLICY);
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
        report: &mut HopReport,
    ) -> Result<Taken, Error> {
        let deleted_before = report.deleted;
        let mut sessions: Vec<(Uuid, Uuid)> = Vec::with_capacity(chunk.len());
        for (session, agent, _, verdict) in chunk {
            match verdict {
                None => sessions.push((*session, *agent)),
                Some(reason) => report.retain(reason),
            }
        }
        if sessions.is_empty() {
            return Ok(Taken::default());
        }
        let (settings, account, kind) = (self.settings, self.account_id, self.kind);
        let cutoff = self.bound.of(kind);
        match delete_sessions(conn, settings, account, kind, cutoff, &sessions).await? {
            Deleted::Done(outcome) => report.record(&outcome),
            // The store guard saw what the statement's snapshot did not (an agent pointed at a
            // session just now): take them one by one, and keep the one it guards.
            Deleted::Guarded => {
                for session in &sessions {
                    match delete_sessions(conn, settings, account, kind, cutoff, &[*session])
                        .await?
                    {
                        Deleted::Done(outcome) => report.record(&outcome),
                        Deleted::Guarded => report.retain("protected_pointer"),
                    }
                }
            }
        }
        Ok(Taken {
            recorded: report.deleted - deleted_before,
            sized_by: None,
        })
    }
}

/// The window of one kind: `$1` the account, `$2` the kind, `$3` its cutoff, `$4`/`$5` the
/// cursor (last activity, id), `$6` the room left in the hop; each session with its verdict.
const WINDOW: &str = "
    SELECT s.id, s.agent_id, s.last_activity_at,
           sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
                                  s.last_activity_at, $3)
    FROM sessions s
    WHERE s.account_id = $1 AND s.kind = $2 AND s.last_activity_at < $3
      AND (s.last_activity_at, s.id) > ($4, $5)
    ORDER BY s.last_activity_at, s.id
    LIMIT $6";

/// The ages in force for the account and the database's now, or `None` (with the outcome set)
/// when the account is gone or its policy prunes nothing (SS-1).
async fn ages(
    conn: &mut PgConnection,
    account_id: Uuid,
    policy: Policy,
    report: &mut HopReport,
) -> Result<Option<(Ages, DateTime<Utc>)>, Error> {
    type Row = (
        Option<bool>,
        Option<i32>,
        Option<i32>,
        Option<i32>,
        DateTime<Utc>,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT p.enabled, p.main_days, p.task_days, p.subagent_days, now()
         FROM accounts a LEFT JOIN session_retention_policies p ON p.account_id = a.id
         WHERE a.id = $1",
    )
    .bind(account_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((enabled, main, task, subagent, now)) = row else {
        report.outcome = HopOutcome::AccountGone;
        return Ok(None);
    };
    let ages = match policy {
        Policy::Fixed(ages) => ages,
        Policy::Persisted if enabled == Some(true) => Ages {
            main_days: main.unwrap_or(Ages::FALLBACK.main_days),
            task_days: task.unwrap_or(Ages::FALLBACK.task_days),
            subagent_days: subagent.unwrap_or(Ages::FALLBACK.subagent_days),
        },
        Policy::Persisted => {
            report.outcome = HopOutcome::Disabled;
            return Ok(None);
        }
    };
    Ok(Some((ages, now)))
}

/// What one deletion transaction found and did.
struct Outcome {
    /// Sessions of the chunk that could not be locked at once.
    busy: u64,
    /// The verdict on each session locked: `None` for deleted.
    verdicts: Vec<Option<String>>,
    /// Rows deleted per table of [`TABLES`].
    rows: [i64; 4],
    handoffs: i64,
}

enum Deleted {
    Done(Outcome),
    /// The store guard refused a session: nothing of the transaction happened.
    Guarded,
}

impl HopReport {
    fn record(&mut self, outcome: &Outcome) {
        for _ in 0..outcome.busy {
            self.retain("busy");
        }
        for verdict in &outcome.verdicts {
            match verdict {
                None => self.deleted += 1,
                Some(reason) => self.retain(reason),
            }
        }
        for (table, n) in TABLES.iter().zip(outcome.rows) {
            *self.rows.entry(table).or_default() += n.max(0) as u64;
        }
        self.handoffs_unlinked += outcome.handoffs.max(0) as u64;
    }
}

/// Deletes the sessions of `chunk` that are still to go, in one transaction: their agents
/// share-locked (so no pointer to them can be set meanwhile) and the sessions locked, each
/// only if free at once; the verdict re-checked under those locks (SS-5); history, session
/// and frame-directory record together (SS-6).
async fn delete_sessions(
    conn: &mut PgConnection,
    settings: &HopSettings,
    account_id: Uuid,
    kind: SessionKind,
    cutoff: Option<DateTime<Utc>>,
    chunk: &[(Uuid, Uuid)],
) -> Result<Deleted, Error> {
    let mut tx = owner_loop::begin(conn, settings.lock_timeout, true).await?;
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
                handoffs: 0,
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
        handoffs: count(4),
    }))
}

/// One session as the deletion statement found it under lock.
#[derive(sqlx::FromRow)]
struct Judged {
    verdict: Option<String>,
    /// The same on every row: see [`DELETE_SESSIONS`].
    counts: Vec<i64>,
}

/// The deletion statement: `$1` the sessions whose agents are locked, `$2` the account, `$3`
/// the kind, `$4` its cutoff. One row per session locked, with its verdict (NULL: deleted) and,
/// the same on every row, the rows deleted per table of [`TABLES`] and the handoffs unlinked.
/// The frame directory of each deleted session is recorded for removal after commit.
const DELETE_SESSIONS: &str = "
    WITH locked AS (
        SELECT s.id, sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
                                            s.last_activity_at, $4) AS verdict
        FROM sessions s
        WHERE s.id = ANY($1) AND s.account_id = $2 AND s.kind = $3
        ORDER BY s.id
        FOR UPDATE OF s SKIP LOCKED),
    doomed AS (SELECT COALESCE(array_agg(id), '{}') AS ids FROM locked WHERE verdict IS NULL),
    archive_entries_gone AS (
        DELETE FROM conversation_archive_entries
        WHERE archive_id IN (SELECT id FROM conversation_archives
                             WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[]))
        RETURNING 1),
    archives_gone AS (
        DELETE FROM conversation_archives WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[])
        RETURNING 1),
    entries_gone AS (
        DELETE FROM conversation_entries WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[])
        RETURNING 1),
    unlinked AS (
        SELECT count(*) AS n FROM handoffs
        WHERE from_session_id = ANY((SELECT ids FROM doomed)::uuid[])
           OR to_session_id = ANY((SELECT ids FROM doomed)::uuid[])),
    sessions_gone AS (
        DELETE FROM sessions WHERE id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING id),
    frames AS (
        INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
        SELECT 'sessions', $2, id::text FROM sessions_gone)
    SELECT verdict,
           ARRAY[(SELECT count(*) FROM entries_gone),
                 (SELECT count(*) FROM archive_entries_gone),
                 (SELECT count(*) FROM archives_gone),
                 (SELECT count(*) FROM sessions_gone),
                 (SELECT n FROM unlinked)]::bigint[] AS counts
    FROM locked";

/// The accounts of `range` whose nightly pass for `slot` has something to do (FL-8): with an
/// enabled persisted policy, a session of some kind past that kind's cutoff (protected or not:
/// what protects it is looked at again) or a kind whose age is 0 or less (the pass reports it,
/// SS-1); whatever the policy, archive directories waiting to be removed. The slot bounds the
/// cutoffs from above, as it bounds every hop's.
///
/// # Errors
/// A database error.
pub async fn due(
    conn: &mut PgConnection,
    slot: DateTime<Utc>,
    range: AccountRange,
) -> Result<Vec<Uuid>, sqlx::Error> {
    range
        .query(&DUE)
        .bind(slot)
        .bind(EARLIEST)
        .bind(Ages::FALLBACK.main_days)
        .bind(Ages::FALLBACK.task_days)
        .bind(Ages::FALLBACK.subagent_days)
        .fetch_all(conn)
        .await
}

/// Discovery: `$1`/`$2` the range, `$3` the slot, `$4` the earliest finite age, `$5`..`$7` the
/// fallback ages. A cutoff is computed only where the age leaves one (never "out of range").
static DUE: LazyLock<String> = LazyLock::new(|| {
    let kind = |kind: &str, days: &str| {
        format!(
            "EXISTS (SELECT 1 FROM sessions s
                     WHERE s.account_id = a.id AND s.kind = '{kind}'
                       AND s.last_activity_at >= $4
                       AND s.last_activity_at < {})",
            crate::cutoff::days_before_sql("$3", days, "$4")
        )
    };
    format!(
        "SELECT a.id FROM accounts a
         LEFT JOIN session_retention_policies p ON p.account_id = a.id AND p.enabled
         CROSS JOIN LATERAL (SELECT COALESCE(p.main_days, $5) AS main,
                                    COALESCE(p.task_days, $6) AS task,
                                    COALESCE(p.subagent_days, $7) AS subagent) d
         WHERE ($1::uuid IS NULL OR a.id > $1) AND a.id <= $2
           AND ((p.account_id IS NOT NULL
                 AND (d.main <= 0 OR d.task <= 0 OR d.subagent <= 0 OR {} OR {} OR {}))
                OR {})
         ORDER BY a.id",
        kind("main", "d.main"),
        kind("task", "d.task"),
        kind("subagent", "d.subagent"),
        files::waiting_sql(Root::Sessions, "a.id")
    )
});

/// How far past its cutoff the oldest session still to go is, over every account whose policy
/// is enabled, in seconds (0 when none waits). Read per policy and kind through
/// `sessions_retention_window`, or in one scan of `sessions` when there are fewer than about
/// ten per policy ([`crate::estimate`]): both give the same figure.
///
/// # Errors
/// [`Error::Database`] on a database error.
pub async fn backlog_seconds(pool: &PgPool, now: DateTime<Utc>) -> Result<f64, Error> {
    let read =
        crate::estimate::cheaper_read(pool, "sessions", "session_retention_policies").await?;
    backlog_read(pool, now, read).await
}

/// The backlog, read one way or the other (both are tested to agree).
///
/// # Errors
/// [`Error::Database`] on a database error.
pub async fn backlog_read(pool: &PgPool, now: DateTime<Utc>, read: Read) -> Result<f64, Error> {
    let sql = read.pick(&BACKLOG, &BACKLOG_SCAN);
    let query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(now)
        .bind(EARLIEST)
        .bind(Ages::FALLBACK.main_days)
        .bind(Ages::FALLBACK.task_days)
        .bind(Ages::FALLBACK.subagent_days);
    Ok(crate::estimate::backlog_seconds(pool, query).await?)
}

/// The backlog in one scan of `sessions`: the latest cutoff any enabled policy gives each kind
/// (from its shortest age), the sessions older than that (found first and apart: the planner
/// would otherwise join every session to its policy before filtering), each joined to its
/// account's policy and checked against its own cutoff, then taken furthest past it first
/// until one would go — the verdict is asked of as few as the per-policy read asks. Parameters
/// as [`BACKLOG`]'s.
static BACKLOG_SCAN: LazyLock<String> = LazyLock::new(|| {
    let days = |kind: &str, fallback: &str| format!("COALESCE(p.{kind}_days, {fallback})");
    let shortest = |kind: &str, fallback: &str| {
        let days = days(kind, fallback);
        format!("min({days}) FILTER (WHERE {days} > 0) AS {kind}")
    };
    let latest = |kind: &str| crate::cutoff::days_before_sql("$1", &format!("d.{kind}"), "$2");
    let own = format!(
        "CASE s.kind WHEN 'main' THEN {} WHEN 'task' THEN {} ELSE {} END",
        days("main", "$3"),
        days("task", "$4"),
        days("subagent", "$5")
    );
    format!(
        "
    WITH latest AS MATERIALIZED (
        SELECT {} AS main, {} AS task, {} AS subagent
        FROM (SELECT {}, {}, {}
              FROM session_retention_policies p WHERE p.enabled) d),
    old AS MATERIALIZED (
        SELECT s.* FROM latest l
        JOIN sessions s ON s.last_activity_at < CASE s.kind WHEN 'main' THEN l.main
                                                            WHEN 'task' THEN l.task
                                                            ELSE l.subagent END)
    SELECT EXTRACT(EPOCH FROM c.past)::float8
    FROM (SELECT s.id, s.account_id, s.kind, s.state, s.metadata, s.last_activity_at, k.cutoff,
                 k.cutoff - s.last_activity_at AS past
          FROM old s
          JOIN session_retention_policies p ON p.account_id = s.account_id AND p.enabled
          CROSS JOIN LATERAL (SELECT {} AS cutoff) k
          WHERE s.last_activity_at < k.cutoff AND s.last_activity_at > $2
          ORDER BY past DESC OFFSET 0) c
    WHERE sexton.session_verdict(c.id, c.account_id, c.kind, c.state, c.metadata,
                                 c.last_activity_at, c.cutoff) IS NULL
    ORDER BY c.past DESC LIMIT 1",
        latest("main"),
        latest("task"),
        latest("subagent"),
        shortest("main", "$3"),
        shortest("task", "$4"),
        shortest("subagent", "$5"),
        crate::cutoff::days_before_sql("$1", &own, "$2"),
    )
});

/// The backlog in one statement (a query per account and kind made `status` and the gauges
/// cost 60,000 round trips at 20,000 accounts): `$1` now, `$2` the earliest finite age,
/// `$3`..`$5` the fallback ages; per enabled policy and kind with a cutoff, the oldest session
/// that would go, through `sessions_retention_window`.
static BACKLOG: LazyLock<String> = LazyLock::new(|| {
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
          AND sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
                                     s.last_activity_at, k.cutoff) IS NULL
        ORDER BY s.last_activity_at, s.id LIMIT 1) o
    WHERE p.enabled AND k.cutoff IS NOT NULL",
        crate::cutoff::days_before_sql("$1", "d.days", "$2")
    )
});

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
           AND sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
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

/// Previews `accounts` (every account when `None`), in name order: one statement for the
/// accounts and their policies and one for all their sessions, whatever their number.
///
/// # Errors
/// [`Error::Database`] on a database error.
pub async fn preview(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    accounts: Option<&[Uuid]>,
) -> Result<Vec<Preview>, Error> {
    type Row = (
        Uuid,
        String,
        Option<bool>,
        Option<i32>,
        Option<i32>,
        Option<i32>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT a.id, a.name, p.enabled, p.main_days, p.task_days, p.subagent_days
         FROM accounts a LEFT JOIN session_retention_policies p ON p.account_id = a.id
         WHERE $1::uuid[] IS NULL OR a.id = ANY($1) ORDER BY a.name, a.id",
    )
    .bind(accounts)
    .fetch_all(&mut *conn)
    .await?;
    let mut previews: Vec<Preview> = rows
        .into_iter()
        .map(
            |(account_id, account_name, enabled, main, task, subagent)| {
                let mut preview = Preview {
                    account_id,
                    account_name,
                    ages: None,
                    cutoffs: None,
                    eligible: BTreeMap::new(),
                    retained: BTreeMap::new(),
                    rows: TABLES.iter().map(|t| (*t, 0)).collect(),
                };
                if enabled == Some(true) {
                    let ages = Ages {
                        main_days: main.unwrap_or(Ages::FALLBACK.main_days),
                        task_days: task.unwrap_or(Ages::FALLBACK.task_days),
                        subagent_days: subagent.unwrap_or(Ages::FALLBACK.subagent_days),
                    };
                    preview.ages = Some(ages);
                    preview.cutoffs = Some(ages.cutoffs(now));
                    // As the pass counts it: once per kind (SS-1).
                    let invalid = ages.invalid().count() as i64;
                    if invalid > 0 {
                        preview.retained.insert(INVALID_POLICY.to_owned(), invalid);
                    }
                }
                preview
            },
        )
        .collect();
    let counts: Vec<(Uuid, String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(&**PREVIEW))
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

/// The preview of some accounts' sessions under their enabled policies: `$1` the accounts
/// (every account when NULL), `$2` now, `$3` the earliest finite age, `$4`..`$6` the fallback
/// ages. Per account, sessions past their kind's cutoff by verdict, then the history rows of
/// those that would go.
static PREVIEW: LazyLock<String> = LazyLock::new(|| {
    let days = "CASE s.kind WHEN 'main' THEN COALESCE(p.main_days, $4) \
                WHEN 'task' THEN COALESCE(p.task_days, $5) \
                ELSE COALESCE(p.subagent_days, $6) END";
    format!(
        "WITH judged AS (
             SELECT s.account_id, s.id, s.kind,
                    sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
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
async fn explain_session(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    session: Uuid,
) -> Result<Option<Explanation>, Error> {
    type Row = (
        Uuid,
        String,
        DateTime<Utc>,
        Option<bool>,
        Option<i32>,
        Option<i32>,
        Option<i32>,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT s.account_id, s.kind, s.last_activity_at,
                p.enabled, p.main_days, p.task_days, p.subagent_days
         FROM sessions s LEFT JOIN session_retention_policies p ON p.account_id = s.account_id
         WHERE s.id = $1",
    )
    .bind(session)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((account, kind, last_activity, enabled, main, task, subagent)) = row else {
        return Ok(None);
    };
    let policy = PolicyRow {
        enabled,
        main_days: main,
        task_days: task,
        subagent_days: subagent,
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
        policy: match (enabled, ages) {
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
    if ages.is_none() {
        explanation.reasons.push(ExplainReason::new(
            "SS-1",
            "no_policy",
            "no enabled session retention policy for the account",
        ));
        return Ok(Some(explanation));
    }
    let (verdict, protection, evidence): (Option<String>, Option<String>, Option<String>) =
        sqlx::query_as(
            "SELECT sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
                                           s.last_activity_at, $2),
                    sexton.session_protection(s.id, s.state),
                    sexton.session_evidence(s.kind, s.metadata, s.account_id)
             FROM sessions s WHERE s.id = $1",
        )
        .bind(session)
        .bind(cutoff)
        .fetch_one(&mut *conn)
        .await?;
    let invalid = ages
        .zip(kind_of)
        .map(|(ages, kind)| ages.days(kind))
        .filter(|days| !crate::cutoff::valid_window(*days));
    if let Some(days) = invalid {
        explanation.reasons.push(ExplainReason::new(
            "SS-1",
            INVALID_POLICY,
            format!(
                "the policy's age for a {kind} session is {days} days, which is not an age \
                 (it must be more than 0): none of its kind is old"
            ),
        ));
    } else if !cutoff.is_some_and(|c| last_activity < c && last_activity > EARLIEST) {
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
    Ok(Some(explanation))
}

/// The `[sessions]` section as given.
#[derive(Debug, Deserialize)]
struct RawSettings {
    window_size: Raw<i64>,
    sessions_per_transaction: Raw<i64>,
    hop_budget_ms: Raw<i64>,
    lock_timeout_ms: Raw<i64>,
}

/// The job kind, as the worker registers it.
pub struct SessionRetention;

impl Job for SessionRetention {
    const NAME: &'static str = "session_retention";
    const QUEUE: &'static str = "sexton.session_retention";
    const SCOPE: Scope = Scope::Account;
    const SECTION: &'static str = "sessions";
    const SUBJECTS: &'static [&'static str] = &["session"];
    const RETAIN_REASONS: &'static [&'static str] = &RETAIN_REASONS;

    type Args = Args;
    type Settings = HopSettings;
    type Preview = Preview;
    type Error = Error;

    fn settings(
        section: &serde_json::Value,
        paths: &PathSettings,
        c: &mut Check<'_>,
    ) -> Option<HopSettings> {
        let s: RawSettings = c.section(Self::SECTION, section)?;
        let window_size = c.int(
            "sessions.window_size",
            &s.window_size,
            1..=100_000,
            "an integer from 1 to 100000",
        );
        let sessions_per_transaction = c.int(
            "sessions.sessions_per_transaction",
            &s.sessions_per_transaction,
            1..=1000,
            "an integer from 1 to 1000",
        );
        let budget = c.millis("sessions.hop_budget_ms", &s.hop_budget_ms);
        let lock_timeout = c.millis("sessions.lock_timeout_ms", &s.lock_timeout_ms);
        Some(HopSettings {
            window_size: window_size?,
            sessions_per_transaction: sessions_per_transaction?,
            budget: budget?,
            lock_timeout: lock_timeout?,
            sessions_root: paths.sessions_root.clone(),
        })
    }

    async fn due(
        conn: &mut PgConnection,
        _settings: &HopSettings,
        slot: DateTime<Utc>,
        range: AccountRange,
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        due(conn, slot, range).await
    }

    fn first(account: Option<Uuid>, slot: DateTime<Utc>) -> Args {
        Args::first(account.unwrap_or_default(), slot, Policy::Persisted)
    }

    fn position(args: &Args) -> Position {
        Position {
            account: Some(args.account_id),
            pass_started_at: args.pass_started_at,
            hop: args.hop,
        }
    }

    async fn run(
        env: Env<'_>,
        settings: &HopSettings,
        args: &Args,
        report: &mut Report<Args>,
    ) -> Result<(), Error> {
        // The worker's roots are the ones in force, whatever the settings were loaded with.
        let settings = &HopSettings {
            sessions_root: env.paths.sessions_root.clone(),
            ..settings.clone()
        };
        let mut done = HopReport::new();
        let result = hop_into(env.conn, env.health, settings, args, env.stop, &mut done).await;
        *report = Report {
            outcome: done.outcome.as_str(),
            window: settings.window_size,
            candidates: done.candidates,
            pruned: done.deleted,
            retained: done.retained.iter().map(|(r, n)| (*r, *n)).collect(),
            rows: done.rows.iter().map(|(t, n)| (*t, *n)).collect(),
            files: done.files,
            owner_seconds: done.owner_seconds,
            next: done.next,
            throttled: done.throttled,
        };
        result
    }

    async fn backlog_seconds(
        pool: &PgPool,
        _settings: &HopSettings,
        now: DateTime<Utc>,
    ) -> Result<Option<f64>, Error> {
        backlog_seconds(pool, now).await.map(Some)
    }

    async fn explain(
        conn: &mut PgConnection,
        _settings: &HopSettings,
        _paths: &PathSettings,
        now: DateTime<Utc>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        match Uuid::parse_str(id) {
            Ok(session) => explain_session(conn, now, session).await,
            Err(_) => Ok(None),
        }
    }

    async fn preview(
        conn: &mut PgConnection,
        _settings: &HopSettings,
        _paths: &PathSettings,
        now: DateTime<Utc>,
        accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        preview(conn, now, accounts).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_matches_its_golden_file() {
        crate::golden::check("session_retention/delete_sessions", DELETE_SESSIONS);
    }

    #[test]
    fn fl1_args_round_trip_and_refuse_unknown_fields() {
        let args = Args::first(
            Uuid::nil(),
            "2026-12-01T03:00:00Z".parse().unwrap(),
            Policy::Fixed(Ages::FALLBACK),
        );
        let json = serde_json::to_value(&args).unwrap();
        assert_eq!(serde_json::from_value::<Args>(json.clone()).unwrap(), args);
        let mut bad = json;
        bad["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Args>(bad).is_err());
    }

    #[test]
    fn ss1_cutoffs_take_the_stricter_of_carried_and_current_kind_by_kind() {
        let at = |s: &str| Some(s.parse::<DateTime<Utc>>().unwrap());
        let carried = Cutoffs {
            main: at("2026-10-01T00:00:00Z"),
            task: at("2026-11-01T00:00:00Z"),
            subagent: None,
        };
        let current = Cutoffs {
            main: at("2026-10-15T00:00:00Z"),
            task: at("2026-10-20T00:00:00Z"),
            subagent: at("2026-11-20T00:00:00Z"),
        };
        assert_eq!(
            carried.min(&current),
            Cutoffs {
                main: at("2026-10-01T00:00:00Z"),
                task: at("2026-10-20T00:00:00Z"),
                subagent: None,
            }
        );
    }
}
