//! PruneExecutionDetails (SPEC §2, seed 003): removes the execution detail of conversation runs
//! whose account's retention window has passed, keeping the conversation itself.
//!
//! A nightly pass per account is a chain of hops (EX-7). Each hop reads one bounded window of
//! candidates through `runs_execution_details_window` in (age, id) order after its cursor, and
//! takes them through short transactions of several owners each, sized by time: conversation
//! rows locked first, then the runs (EX-6), eligibility re-checked under those locks (EX-1,
//! EX-2, EX-5), detail deleted and markers set together (EX-3, EX-9). Owned output files are
//! recorded in `sexton.pending_file_deletions` inside that transaction and unlinked after it
//! commits. The hop then reports the next hop's arguments — same cutoff, advanced cursor — if
//! the window was full or its time budget ran out.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::clock::Clock;
use crate::cutoff::{EARLIEST, days_before};
use crate::estimate::Read;
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::files::{self, DrainError, PathSettings, Root};
use crate::health::{Health, Indicator};
pub use crate::job::HopOutcome;
use crate::job::{AccountRange, Env, Job, Position, Report, Scope};
use crate::owner_loop::{
    self, Bounds, Candidates, Chunks, Files, Hop, Mode, Progress, Taken, Window, Windowed, busy_or,
};
use crate::payload::V1;
use crate::settings::{Check, Raw};

/// The age of a run for execution retention, as the window index spells it (EX-2).
const AGE: &str = "(CASE WHEN kind = 'conversation' THEN completed_at \
                    WHEN settled_at IS NOT NULL THEN terminal_at END)";

/// A run that is an owner (EX-2) and still holds its detail: the window index's predicate.
const UNPRUNED_OWNER: &str = "details_pruned_at IS NULL AND conversation_id IS NOT NULL \
                              AND kind IN ('conversation', 'direct_reply')";

/// What holds an owner back (EX-5), in the order reasons are reported.
const BLOCKERS: [RetainReason; 4] = [
    RetainReason::PendingWork,
    RetainReason::PendingSettlement,
    RetainReason::OutstandingDelegation,
    RetainReason::ActiveHistoryRequest,
];

/// The condition under which `reason` holds back the run whose id is the SQL expression `run`
/// (EX-5); `None` for the reasons found otherwise.
fn blocks(reason: RetainReason, run: &str) -> Option<String> {
    Some(match reason {
        RetainReason::PendingWork => format!(
            "EXISTS (SELECT 1 FROM invocation_attempts \
                     WHERE run_id = {run} AND status IN ('pending', 'running'))"
        ),
        RetainReason::PendingSettlement => format!(
            "EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = {run} AND status = 'pending')"
        ),
        RetainReason::OutstandingDelegation => format!(
            "EXISTS (SELECT 1 FROM delegations \
                     WHERE parent_run_id = {run} AND status = 'outstanding')"
        ),
        RetainReason::ActiveHistoryRequest => format!(
            "EXISTS (SELECT 1 FROM history_request_sources s \
                     JOIN history_requests h ON h.id = s.history_request_id \
                     WHERE s.source_run_id = {run} AND h.sealed_at IS NULL)"
        ),
        RetainReason::NotEligible | RetainReason::Busy | RetainReason::InvalidWindow => {
            return None;
        }
    })
}

/// The blockers' conditions on the run id expression `run`, each rendered by `render`.
fn blockers(run: &str, render: impl Fn(RetainReason, String) -> String, separator: &str) -> String {
    BLOCKERS
        .iter()
        .filter_map(|reason| blocks(*reason, run).map(|sql| render(*reason, sql)))
        .collect::<Vec<_>>()
        .join(separator)
}

/// `runner_effects` of a pruned run and its variant (EX-3).
pub fn pruned_runner_effects() -> serde_json::Value {
    serde_json::json!({"status": "unavailable", "runners": [], "reason": "execution_details_pruned"})
}

/// The seven execution-detail tables, in deletion order.
pub const DETAIL_TABLES: [&str; 7] = [
    "run_task_edges",
    "run_tasks",
    "tool_results",
    "sealed_requests",
    "reasoning_traces",
    "invocation_attempts",
    "output_files",
];

/// Every table a hop writes: the detail tables, the markers' tables, the file records.
const WRITTEN: [&str; DETAIL_TABLES.len() + 3] = {
    let others = ["runs", "variants", "pending_file_deletions"];
    let mut written = [""; DETAIL_TABLES.len() + 3];
    let mut i = 0;
    while i < written.len() {
        written[i] = if i < DETAIL_TABLES.len() {
            DETAIL_TABLES[i]
        } else {
            others[i - DETAIL_TABLES.len()]
        };
        i += 1;
    }
    written
};

/// One hop's payload: which account, which pass, where the window starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    pub version: V1,
    pub account_id: Uuid,
    /// When the pass started (the nightly slot); the cutoff is measured back from it.
    pub pass_started_at: DateTime<Utc>,
    /// Fixed by the first hop and carried by every later one.
    pub cutoff: Option<DateTime<Utc>>,
    /// The last candidate a previous hop visited; the window starts after it.
    pub cursor: Option<Cursor>,
    /// 0 for the first hop of a pass.
    pub hop: u32,
}

impl Args {
    /// The first hop of an account's pass.
    pub fn first(account_id: Uuid, pass_started_at: DateTime<Utc>) -> Self {
        Self {
            version: V1,
            account_id,
            pass_started_at,
            cutoff: None,
            cursor: None,
            hop: 0,
        }
    }
}

/// A position in the (age, id) order of candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    pub age: DateTime<Utc>,
    pub run_id: Uuid,
}

/// How much one hop may do.
#[derive(Debug, Clone)]
pub struct HopSettings {
    /// Candidates read per hop.
    pub window_size: u32,
    /// The most owners taken together through one transaction; a busy one is retried alone.
    pub owners_per_transaction: u32,
    /// How long one such transaction should last: the number of owners taken together is
    /// adjusted after each transaction to approach it, which keeps a writer's wait near it.
    pub transaction_target: Duration,
    /// Time after which a hop stops taking new owners and hands over to the next hop.
    pub budget: Duration,
    /// Longest wait for an owner's conversation or run lock before it is skipped as busy.
    pub owner_lock_timeout: Duration,
    /// Root that `output_files.relative_path` is resolved under.
    pub output_root: PathBuf,
}

/// Why an owner was left in place this pass (EX-5, EX-6), as counted in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetainReason {
    /// An invocation attempt is pending or running.
    PendingWork,
    /// A settlement receipt is pending.
    PendingSettlement,
    /// A delegation from this run is outstanding.
    OutstandingDelegation,
    /// The run is a source of an unsealed history request (inherited sources included).
    ActiveHistoryRequest,
    /// Under lock the run was no longer old enough or no longer an owner.
    NotEligible,
    /// The conversation or run lock was not granted in time.
    Busy,
    /// The account's window is 0 or less, which the platform's table allows but which means
    /// nothing (EX-1): nothing of the account is old. Counted once per pass, not per owner.
    InvalidWindow,
}

impl RetainReason {
    pub const ALL: [RetainReason; 7] = [
        RetainReason::PendingWork,
        RetainReason::PendingSettlement,
        RetainReason::OutstandingDelegation,
        RetainReason::ActiveHistoryRequest,
        RetainReason::NotEligible,
        RetainReason::Busy,
        RetainReason::InvalidWindow,
    ];

    /// The labels of [`RetainReason::ALL`], in that order.
    pub const NAMES: [&'static str; 7] = {
        let mut names = [""; 7];
        let mut i = 0;
        while i < names.len() {
            names[i] = RetainReason::ALL[i].as_str();
            i += 1;
        }
        names
    };

    pub const fn as_str(self) -> &'static str {
        match self {
            RetainReason::PendingWork => "pending_work",
            RetainReason::PendingSettlement => "pending_settlement",
            RetainReason::OutstandingDelegation => "outstanding_delegation",
            RetainReason::ActiveHistoryRequest => "active_history_request",
            RetainReason::NotEligible => "not_eligible",
            RetainReason::Busy => "busy",
            RetainReason::InvalidWindow => "invalid_window",
        }
    }
}

/// What one hop did.
#[derive(Debug, Clone, Serialize)]
pub struct HopReport {
    pub outcome: HopOutcome,
    pub candidates: u32,
    pub pruned: u32,
    pub retained: BTreeMap<RetainReason, u32>,
    /// Detail rows deleted, per table.
    pub rows: BTreeMap<&'static str, u64>,
    pub files_deleted: u64,
    pub bytes_reclaimed: u64,
    /// Files that could not be deleted (unreadable, escaping the root): counted, not retried.
    pub file_errors: u64,
    /// The next hop, if the pass goes on.
    pub next: Option<Args>,
    /// Time spent inside owners' transactions, from begin to commit or rollback.
    pub owner_seconds: f64,
    /// The red indicator that stopped the hop early, if one did.
    pub throttled: Option<Indicator>,
}

impl HopReport {
    fn new() -> Self {
        Self {
            outcome: HopOutcome::Finished,
            candidates: 0,
            pruned: 0,
            retained: BTreeMap::new(),
            rows: DETAIL_TABLES.iter().map(|t| (*t, 0)).collect(),
            files_deleted: 0,
            bytes_reclaimed: 0,
            file_errors: 0,
            next: None,
            owner_seconds: 0.0,
            throttled: None,
        }
    }

    /// In the terms every job shares.
    fn shared(&self, window: u32) -> Report<Args> {
        Report {
            outcome: self.outcome.as_str(),
            window,
            candidates: self.candidates.into(),
            pruned: self.pruned.into(),
            retained: self
                .retained
                .iter()
                .map(|(reason, n)| (reason.as_str(), u64::from(*n)))
                .collect(),
            rows: self.rows.iter().map(|(t, n)| (*t, *n)).collect(),
            files: files::FileCounts {
                deleted: self.files_deleted,
                bytes: self.bytes_reclaimed,
                errors: self.file_errors,
            },
            owner_seconds: self.owner_seconds,
            next: self.next.clone(),
            throttled: self.throttled,
        }
    }

    fn retain(&mut self, reason: RetainReason) {
        *self.retained.entry(reason).or_default() += 1;
    }

    /// Counts what one owner transaction's statement found and did.
    fn record(&mut self, locked: &[Locked]) {
        for owner in locked {
            match owner.verdict() {
                Verdict::Prune => self.pruned += 1,
                Verdict::Retain(reason) => self.retain(reason),
                Verdict::AlreadyPruned => {}
            }
        }
        if let Some(first) = locked.first() {
            for (table, deleted) in DETAIL_TABLES.iter().zip(&first.deleted) {
                *self.rows.entry(table).or_default() += (*deleted).max(0) as u64;
            }
        }
    }

    fn add_files(&mut self, files: files::FileCounts) {
        self.files_deleted += files.deleted;
        self.bytes_reclaimed += files.bytes;
        self.file_errors += files.errors;
    }
}

impl Progress for HopReport {
    fn took(&mut self, candidates: u64, seconds: f64) {
        self.candidates += u32::try_from(candidates).unwrap_or(u32::MAX);
        self.owner_seconds += seconds;
    }

    fn files(&mut self, counts: files::FileCounts) {
        self.add_files(counts);
    }

    fn throttled(&mut self, red: Indicator) {
        self.throttled = Some(red);
    }
}

/// Why a hop failed; every variant is transient and the hop is retried (EX-8).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Files(#[from] DrainError),
}

/// Runs one hop, with two connections of `pool` (see [`hop`]). When `stop` is raised
/// (shutdown, FL-5) the hop finishes the owner in hand, takes no more, and hands the rest of
/// its window to the next hop.
///
/// # Errors
/// [`Error::Database`] when the database fails; nothing is half-done, and the hop can be run
/// again.
pub async fn run(
    pool: &PgPool,
    clock: &dyn Clock,
    settings: &HopSettings,
    args: &Args,
    stop: &AtomicBool,
) -> Result<HopReport, Error> {
    let mut conn = pool.acquire().await?;
    hop(&mut conn, pool, clock, &Health::off(), settings, args, stop).await
}

/// [`run`] on a connection of the caller's: one connection for the owner transactions, no
/// pool round trip per owner transaction, and one more from `pool`, while the hop runs, for
/// unlinking the files of the owners pruned meanwhile ([`files::Beside`]): a hop needs two
/// connections, as [`Job::CONNECTIONS`] declares.
///
/// # Errors
/// As [`run`].
pub async fn hop(
    conn: &mut PgConnection,
    pool: &PgPool,
    clock: &dyn Clock,
    health: &Health,
    settings: &HopSettings,
    args: &Args,
    stop: &AtomicBool,
) -> Result<HopReport, Error> {
    let mut report = HopReport::new();
    hop_into(conn, pool, clock, health, settings, args, stop, &mut report).await?;
    Ok(report)
}

/// [`hop`] into `report`, which holds what was committed when it fails: the owner loop
/// ([`Hop::run`]) over one window of the account's candidates.
#[allow(clippy::too_many_arguments)]
async fn hop_into(
    conn: &mut PgConnection,
    pool: &PgPool,
    clock: &dyn Clock,
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
        root: Root::Outputs,
        path: &settings.output_root,
        scope: Some(args.account_id),
        beside: Some(pool),
    };
    let hop = Hop::start(conn, health, stop, bounds, Some(files), report).await?;
    let account: Option<(Option<i32>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT execution_details_retention_days, now() FROM accounts WHERE id = $1",
    )
    .bind(args.account_id)
    .fetch_optional(&mut *hop.conn)
    .await?;
    let (days, database_now) = match account {
        None => {
            report.outcome = HopOutcome::AccountGone;
            return Ok(());
        }
        Some((None, _)) => {
            report.outcome = HopOutcome::Disabled;
            return Ok(());
        }
        Some((Some(days), _)) if !crate::cutoff::valid_window(days) => {
            // Never "everything is old": nothing of the account is (EX-1).
            tracing::warn!(
                account = %args.account_id,
                execution_details_retention_days = days,
                "the account's execution_details_retention_days is not a window (must be > 0): \
                 nothing of it is pruned"
            );
            report.retain(RetainReason::InvalidWindow);
            return Ok(());
        }
        Some((Some(days), now)) => (days, now),
    };
    // A slot, a payload or a clock in the future never moves a cutoff past the database's
    // now (EX-1).
    let reference = crate::cutoff::reference(args.pass_started_at, database_now);
    let Some(current) = days_before(reference, days) else {
        // A window longer than the calendar: nothing is old enough, the pass ends (EX-1).
        return Ok(());
    };
    let cutoff = args.cutoff.unwrap_or(current);
    let pass = Pass {
        account_id: args.account_id,
        clock,
        settings,
        // Never past the stricter of the carried cutoff and the current setting (EX-1, EX-7).
        bound: cutoff.min(current),
        reference,
    };
    let chunks = Chunks::Timed {
        first: FIRST_TOGETHER,
        most: settings.owners_per_transaction as usize,
        target: settings.transaction_target,
    };
    let mut owners = Windowed::new(pass, chunks);
    let end = hop.run(&mut owners, args.cursor, report).await?;
    report.outcome = end.outcome();
    report.next = end.next().map(|cursor| Args {
        version: V1,
        account_id: args.account_id,
        pass_started_at: args.pass_started_at,
        cutoff: Some(cutoff),
        cursor,
        hop: args.hop + 1,
    });
    Ok(())
}

/// Owners taken together by a hop's first transaction, before any has been measured.
const FIRST_TOGETHER: usize = 50;

impl Window for Pass<'_> {
    /// A run, its conversation, its age.
    type Candidate = (Uuid, Uuid, DateTime<Utc>);
    type Cursor = Cursor;
    type Report = HopReport;
    type Error = Error;

    const TABLES: &'static [&'static str] = &WRITTEN;

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Cursor>,
        room: u32,
        _report: &mut HopReport,
    ) -> Result<Candidates<Self::Candidate, Cursor>, Error> {
        let after = at.copied().unwrap_or(Cursor {
            age: EARLIEST,
            run_id: Uuid::nil(),
        });
        let candidates = sqlx::query_as(sqlx::AssertSqlSafe(&**WINDOW))
            .bind(self.account_id)
            .bind(self.bound)
            .bind(after.age.max(EARLIEST))
            .bind(after.run_id)
            .bind(i64::from(room))
            .fetch_all(&mut *conn)
            .await?;
        Ok(Candidates {
            candidates,
            tail: None,
        })
    }

    fn cursor(&self, (run_id, _, age): &Self::Candidate) -> Cursor {
        Cursor {
            age: *age,
            run_id: *run_id,
        }
    }

    async fn take(
        &mut self,
        conn: &mut PgConnection,
        chunk: &[Self::Candidate],
        report: &mut HopReport,
    ) -> Result<Taken, Error> {
        let owners: Vec<Owner> = chunk
            .iter()
            .map(|(run_id, conversation_id, _)| Owner {
                run_id: *run_id,
                conversation_id: *conversation_id,
            })
            .collect();
        let files_before = report.rows["output_files"];
        let started = Instant::now();
        // Together first; whoever could not be locked at once goes alone, with a bounded wait.
        let alone = prune_together(conn, self, &owners, report).await?;
        let together = started.elapsed();
        for owner in alone {
            prune_owner(conn, self, &owner, report).await?;
        }
        Ok(Taken {
            recorded: report.rows["output_files"] - files_before,
            sized_by: Some(together),
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Owner {
    run_id: Uuid,
    conversation_id: Uuid,
}

/// What every owner of a hop is judged against.
struct Pass<'a> {
    account_id: Uuid,
    clock: &'a dyn Clock,
    settings: &'a HopSettings,
    /// The stricter of the carried cutoff and the current setting.
    bound: DateTime<Utc>,
    /// What the current setting is measured back from: the pass start, or the database's
    /// now if that is earlier.
    reference: DateTime<Utc>,
}

/// One owner as the owner transaction's statement found it under lock, with — the same on
/// every row — what that statement deleted.
#[derive(sqlx::FromRow)]
struct Locked {
    id: Uuid,
    pruned: bool,
    eligible: bool,
    /// Whether each of [`BLOCKERS`] holds it back, in that order.
    blocked: Vec<bool>,
    /// Detail rows deleted, per table in [`DETAIL_TABLES`] order.
    deleted: Vec<i64>,
}

enum Verdict {
    Prune,
    Retain(RetainReason),
    /// Already pruned since the window was read.
    AlreadyPruned,
}

impl Locked {
    /// The statement prunes exactly the owners judged [`Verdict::Prune`] here: not yet pruned,
    /// eligible, and held back by no blocker (see [`prune_locked`]).
    fn verdict(&self) -> Verdict {
        if self.pruned {
            return Verdict::AlreadyPruned;
        }
        if !self.eligible {
            return Verdict::Retain(RetainReason::NotEligible);
        }
        match BLOCKERS
            .iter()
            .zip(&self.blocked)
            .find(|(_, blocked)| **blocked)
        {
            Some((reason, _)) => Verdict::Retain(*reason),
            None => Verdict::Prune,
        }
    }
}

/// The owner transaction's statement, once the runs' conversations are locked; the runs' lock
/// is taken as `lock` says (`SKIP LOCKED`, or waiting). It locks the runs in id order (EX-6),
/// re-checks each under its lock (EX-1, EX-2, EX-5) and, for those still to go, deletes their
/// detail, records their files in `sexton.pending_file_deletions` — each path once, and only
/// if no surviving row still references it under any spelling (`sexton.path_key`) — and sets the markers on runs and on variants of
/// the account's own conversations (EX-3, EX-4, EX-9). One row per run locked. The other rows'
/// view of `output_files` is the statement's snapshot, which still holds the rows being
/// deleted: hence "not of a run pruned here". The rendered statements are in
/// `jobs/golden/prune_execution_details/`.
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
fn prune_locked(lock: &str) -> String {
    let recheck = recheck_columns("c.conversation_id");
    let names: Vec<&str> = BLOCKERS.iter().map(|reason| reason.as_str()).collect();
    let any_blocker = names.join(" OR ");
    let blocked = names.join(", ");
    // Each table's deleted rows are the CTE `<table>_gone`; `output_files_gone` keeps the paths.
    let deletes = DETAIL_TABLES
        .iter()
        .map(|table| {
            let returning = if *table == "output_files" {
                "relative_path"
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
             WHERE NOT pruned AND eligible AND NOT ({any_blocker})),
         {deletes},
         pending AS (INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
                     SELECT DISTINCT 'outputs', $5, g.relative_path FROM output_files_gone g
                     WHERE NOT EXISTS (
                         SELECT 1 FROM output_files o
                         WHERE sexton.path_key(o.relative_path) = sexton.path_key(g.relative_path)
                           AND o.run_id <> ALL((SELECT runs FROM prune)::uuid[]))),
         run AS (UPDATE runs SET details_pruned_at = $6, runner_effects = $7
                 WHERE id = ANY((SELECT runs FROM prune)::uuid[])),
         variant AS (UPDATE variants v SET details_pruned_at = $6, runner_effects = $7
                     FROM turns t JOIN conversations cv ON cv.id = t.conversation_id
                     WHERE v.id = ANY((SELECT variants FROM prune)::uuid[])
                       AND t.id = v.turn_id AND cv.account_id = $5)
         SELECT id, pruned, eligible, ARRAY[{blocked}]::bool[] AS blocked,
                ARRAY[{deleted}]::bigint[] AS deleted
         FROM locked"
    )
}

/// The window of a hop: `$1` the account, `$2` the bound, `$3`/`$4` the cursor (age, run),
/// `$5` the window size. Candidates in (age, id) order through the window index.
static WINDOW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id, conversation_id, {AGE} AS age FROM runs
         WHERE account_id = $1
           AND {UNPRUNED_OWNER}
           AND {AGE} < $2
           AND ({AGE}, id) > ($3, $4)
         ORDER BY {AGE}, id
         LIMIT $5"
    )
});

/// [`prune_locked`] for owners taken together: a run that is not free at once is left out.
static PRUNE_LOCKED: LazyLock<String> = LazyLock::new(|| prune_locked("SKIP LOCKED"));
/// [`prune_locked`] for an owner taken alone: its run's lock is waited for.
static PRUNE_WAITING: LazyLock<String> = LazyLock::new(|| prune_locked(""));

/// The re-check of EX-1, EX-2 and EX-5 under lock, for `runs r JOIN accounts a`, with the
/// conversation the run must still belong to written as `conversation`; $3 is the bound and $4
/// what the current setting is measured back from. The window is compared as an interval, so
/// that a window longer than the calendar is "not old enough", never an overflow (EX-1).
fn recheck_columns(conversation: &str) -> String {
    format!(
        "r.id, r.variant_id,
         r.details_pruned_at IS NOT NULL AS pruned,
         COALESCE(r.conversation_id = {conversation}
                  AND r.kind IN ('conversation', 'direct_reply')
                  AND {AGE} < $3
                  AND a.execution_details_retention_days > 0
                  AND CASE WHEN isfinite({AGE})
                           THEN $4 - {AGE} > make_interval(days => a.execution_details_retention_days)
                      END,
                  false) AS eligible,
         {}",
        blockers(
            "r.id",
            |reason, sql| format!("{sql} AS {}", reason.as_str()),
            ",\n"
        )
    )
}

/// Starts an owner transaction: bounded lock waits, and a commit that need not wait for its WAL
/// flush — no file is unlinked before a synchronous commit made it durable (see
/// [`files::drain`]), so a database crash may undo the last few prunes, rows and file records
/// together, never half of one.
async fn begin<'c>(
    conn: &'c mut PgConnection,
    pass: &Pass<'_>,
) -> Result<Transaction<'c, Postgres>, Error> {
    Ok(owner_loop::begin(conn, pass.settings.owner_lock_timeout, false).await?)
}

/// Runs [`prune_locked`] for `runs` in the owner transaction `tx`.
async fn run_prune_locked(
    tx: &mut Transaction<'_, Postgres>,
    pass: &Pass<'_>,
    statement: &str,
    runs: &[Uuid],
    conversations: &[Uuid],
) -> Result<Vec<Locked>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(statement))
        .bind(runs)
        .bind(conversations)
        .bind(pass.bound)
        .bind(pass.reference)
        .bind(pass.account_id)
        .bind(pass.clock.now())
        .bind(pruned_runner_effects())
        .fetch_all(&mut **tx)
        .await
}

/// Several owners in one transaction, under the platform's lock order (EX-6): their
/// conversations first, in id order, then their runs, in id order — each taken only if free at
/// once (SKIP LOCKED), so this transaction never waits on a writer. Four round trips: begin,
/// conversations, runs with everything else, commit. Returns the owners it could not lock, to
/// be taken alone.
async fn prune_together(
    conn: &mut PgConnection,
    pass: &Pass<'_>,
    owners: &[Owner],
    report: &mut HopReport,
) -> Result<Vec<Owner>, Error> {
    let mut tx = begin(conn, pass).await?;
    let conversations: Vec<Uuid> = owners.iter().map(|o| o.conversation_id).collect();
    let locked = owner_loop::lock(&mut tx, "conversations", Mode::Update, &conversations).await?;
    let (runs, expected): (Vec<Uuid>, Vec<Uuid>) = owners
        .iter()
        .filter(|o| locked.contains(&o.conversation_id))
        .map(|o| (o.run_id, o.conversation_id))
        .unzip();
    let locked = run_prune_locked(&mut tx, pass, &PRUNE_LOCKED, &runs, &expected).await;
    // A detail or variant row an application holds past the lock timeout: nothing of this
    // transaction happened, and every owner is taken alone.
    let Some(locked) = busy_or(locked)? else {
        drop(tx);
        return Ok(owners.to_vec());
    };
    tx.commit().await?;
    report.record(&locked);
    Ok(owners
        .iter()
        .filter(|o| !locked.iter().any(|l| l.id == o.run_id))
        .copied()
        .collect())
}

/// One owner in one transaction, under the platform's lock order (EX-6), waiting for each
/// lock at most `owner_lock_timeout`; counted busy if a wait runs out.
async fn prune_owner(
    conn: &mut PgConnection,
    pass: &Pass<'_>,
    owner: &Owner,
    report: &mut HopReport,
) -> Result<(), Error> {
    let mut tx = begin(conn, pass).await?;
    // The conversation first, then the run: the order every platform writer uses.
    let conversation = sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
        .bind(owner.conversation_id)
        .fetch_optional(&mut *tx)
        .await;
    match busy_or(conversation)? {
        None => report.retain(RetainReason::Busy),
        Some(None) => {}
        Some(Some(_)) => {
            // The run's lock is taken by a statement of its own, so that the re-check below
            // runs on a snapshot taken after the wait: a writer that committed pending work
            // while this owner waited wins (EX-5, EX-6).
            let run = sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
                .bind(owner.run_id)
                .fetch_optional(&mut *tx)
                .await;
            if busy_or(run)?.is_none() {
                report.retain(RetainReason::Busy);
                return Ok(());
            }
            let locked = run_prune_locked(
                &mut tx,
                pass,
                &PRUNE_WAITING,
                &[owner.run_id],
                &[owner.conversation_id],
            )
            .await;
            match busy_or(locked)? {
                None => report.retain(RetainReason::Busy),
                Some(locked) => {
                    tx.commit().await?;
                    report.record(&locked);
                }
            }
        }
    }
    Ok(())
}

/// How far past its cutoff the oldest eligible owner of any account is, in seconds (0 when
/// nothing eligible waits): the backlog an operator watches grow or shrink (OP-3). An account
/// whose window reaches back past the calendar has nothing old enough, and infinite ages are
/// never candidates: neither can break the gauge (EX-1, EX-2). Read per account through the
/// window index, or in one scan of `runs` when there are fewer than about ten runs per account
/// ([`crate::estimate`]): both give the same figure.
///
/// # Errors
/// [`Error::Database`] on a database error.
pub async fn backlog_seconds(pool: &PgPool, now: DateTime<Utc>) -> Result<f64, Error> {
    let read = crate::estimate::cheaper_read(pool, "runs", "accounts").await?;
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
        .bind(EARLIEST);
    Ok(crate::estimate::backlog_seconds(pool, query).await?)
}

/// The backlog: `$1` now, `$2` the earliest finite age. Per account, the oldest eligible
/// owner through the window index.
static BACKLOG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT max(EXTRACT(EPOCH FROM (c.cutoff - o.age)))::float8
         FROM (SELECT id, $1 - make_interval(days => execution_details_retention_days) AS cutoff
               FROM accounts
               WHERE execution_details_retention_days > 0
                 AND make_interval(days => execution_details_retention_days) < $1 - $2) c
         CROSS JOIN LATERAL (
             SELECT {AGE} AS age FROM runs r
             WHERE r.account_id = c.id AND {UNPRUNED_OWNER} AND {AGE} < c.cutoff
               AND {AGE} > $2 AND {}
             ORDER BY {AGE}, r.id LIMIT 1) o",
        blockers("r.id", |_, sql| format!("NOT {sql}"), " AND ")
    )
});

/// The backlog in one scan of `runs`: owners older than the latest cutoff of any account, each
/// joined to its account through the primary key and checked against that account's cutoff,
/// then taken furthest past it first until one is not held back — what holds an owner back is
/// asked of as few as the per-account read asks. Parameters as [`BACKLOG`]'s.
static BACKLOG_SCAN: LazyLock<String> = LazyLock::new(|| {
    let cutoff = crate::cutoff::days_before_sql("$1", "a.execution_details_retention_days", "$2");
    format!(
        "SELECT EXTRACT(EPOCH FROM c.past)::float8
         FROM (SELECT r.id, {cutoff} - {AGE} AS past
               FROM runs r JOIN accounts a ON a.id = r.account_id
               WHERE {UNPRUNED_OWNER}
                 AND {AGE} < (SELECT max({cutoff}) FROM accounts a)
                 AND {AGE} < {cutoff} AND {AGE} > $2
               ORDER BY past DESC OFFSET 0) c
         WHERE {}
         ORDER BY c.past DESC LIMIT 1",
        blockers("c.id", |_, sql| format!("NOT {sql}"), " AND ")
    )
});

/// The accounts of `range` whose pass for `slot` has something to do (FL-8): an owner past the
/// cutoff the account's current window gives (held back or not: what holds it is looked at
/// again), a window of 0 or less (the pass reports it, EX-1), or output files waiting to be
/// removed. The slot bounds the cutoff from above, as it bounds every hop's: a slot ahead of the
/// database's now names more accounts, never fewer.
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
        .fetch_all(conn)
        .await
}

/// Discovery: `$1`/`$2` the range, `$3` the slot, `$4` the earliest finite age. The cutoff is
/// computed only where the window leaves one (a CASE: never "timestamp out of range").
static DUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT a.id FROM accounts a
         WHERE ($1::uuid IS NULL OR a.id > $1) AND a.id <= $2
           AND (a.execution_details_retention_days <= 0
                OR EXISTS (
                    SELECT 1 FROM runs r
                    WHERE r.account_id = a.id AND {UNPRUNED_OWNER} AND {AGE} >= $4
                      AND {AGE} < {})
                OR {})
         ORDER BY a.id",
        crate::cutoff::days_before_sql("$3", "a.execution_details_retention_days", "$4"),
        files::waiting_sql(files::Root::Outputs, "a.id")
    )
});

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

/// Previews `accounts` (every account when `None`), in name order: one statement for the
/// accounts and one for all their owners, whatever their number.
///
/// # Errors
/// [`Error::Database`] on a database error.
pub async fn preview(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    accounts: Option<&[Uuid]>,
) -> Result<Vec<Preview>, Error> {
    let rows: Vec<(Uuid, String, Option<i32>)> = sqlx::query_as(
        "SELECT id, name, execution_details_retention_days FROM accounts
         WHERE $1::uuid[] IS NULL OR id = ANY($1) ORDER BY name, id",
    )
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

/// The preview of some accounts: `$1` their ids (every account when NULL), `$2` now, `$3` the
/// earliest finite age. Per account, owners by verdict, then the detail rows and bytes of the
/// eligible ones.
static PREVIEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH candidates AS (
             SELECT r.account_id, r.id, isfinite({AGE}) AS finite
             FROM accounts a JOIN runs r ON r.account_id = a.id
             WHERE ($1::uuid[] IS NULL OR a.id = ANY($1)) AND {UNPRUNED_OWNER} AND {AGE} < {}),
         classified AS (
             SELECT c.account_id, c.id,
                    CASE WHEN NOT c.finite THEN 'not_eligible' {} ELSE 'eligible' END AS class
             FROM candidates c),
         eligible AS (SELECT account_id, id FROM classified WHERE class = 'eligible')
         SELECT account_id, class, count(*) FROM classified GROUP BY account_id, class
         {rows}
         UNION ALL SELECT e.account_id, 'bytes', COALESCE(sum(f.bytes), 0)::bigint
                   FROM output_files f JOIN eligible e ON f.run_id = e.id GROUP BY e.account_id",
        crate::cutoff::days_before_sql("$2", "a.execution_details_retention_days", "$3"),
        blockers("c.id", |reason, sql| format!("WHEN {sql} THEN '{}'", reason.as_str()), " "),
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
/// statement's `locked` columns, without a lock.
static EXPLAIN: LazyLock<String> = LazyLock::new(|| {
    let recheck = recheck_columns("r.conversation_id");
    let blocked = BLOCKERS
        .iter()
        .map(|reason| reason.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH judged AS (
             SELECT {recheck}
             FROM runs r JOIN accounts a ON a.id = r.account_id
             WHERE r.id = $1 AND r.account_id = $2)
         SELECT id, pruned, eligible, ARRAY[{blocked}]::bool[] AS blocked,
                ARRAY[]::bigint[] AS deleted
         FROM judged"
    )
});

/// The rows behind a blocker, for people.
async fn blocker_detail(
    conn: &mut PgConnection,
    reason: RetainReason,
    run: Uuid,
) -> Result<String, sqlx::Error> {
    let sql = match reason {
        RetainReason::PendingWork => {
            "SELECT 'invocation_attempts ' || id || ' ' || status || ' since '
                    || to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
             FROM invocation_attempts WHERE run_id = $1 AND status IN ('pending', 'running')"
        }
        RetainReason::PendingSettlement => {
            "SELECT 'settlement_receipts ' || id || ' status pending since '
                    || to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
             FROM settlement_receipts WHERE run_id = $1 AND status = 'pending'"
        }
        RetainReason::OutstandingDelegation => {
            "SELECT 'delegations ' || id || ' outstanding since '
                    || to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
             FROM delegations WHERE parent_run_id = $1 AND status = 'outstanding'"
        }
        RetainReason::ActiveHistoryRequest => {
            "SELECT 'history_requests ' || h.id || ' unsealed, assembling run ' || h.run_id
             FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id
             WHERE s.source_run_id = $1 AND h.sealed_at IS NULL"
        }
        RetainReason::NotEligible | RetainReason::Busy | RetainReason::InvalidWindow => {
            return Ok(String::new());
        }
    };
    let rows: Vec<String> = sqlx::query_scalar(sql).bind(run).fetch_all(conn).await?;
    Ok(rows.join("; "))
}

/// The job's verdict on one run.
async fn explain_run(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    run: Uuid,
) -> Result<Option<Explanation>, Error> {
    type Row = (
        Uuid,
        Option<i32>,
        String,
        Option<Uuid>,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
        Option<String>,
    );
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.account_id, a.execution_details_retention_days, r.kind, r.conversation_id,
                r.details_pruned_at, {AGE},
                CASE WHEN r.kind = 'conversation' THEN 'completed_at'
                     ELSE 'terminal_at (settled)' END
         FROM runs r JOIN accounts a ON a.id = r.account_id WHERE r.id = $1"
    )))
    .bind(run)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((account, days, kind, conversation, pruned_at, age, measured_from)) = row else {
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
    let reason = |rule, code: &str, detail: String| ExplainReason::new(rule, code, detail);
    if let Some(at) = pruned_at {
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
        explanation.reasons.push(reason(
            "EX-3",
            "pruned",
            "its execution detail was deleted and its markers set; its text stays".into(),
        ));
        return Ok(Some(explanation));
    }
    // Every precondition that fails is a reason; any of them keeps the run.
    if cutoff.is_none() {
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
        explanation.reasons.push(reason("EX-1", code, detail));
    }
    let owner = conversation.is_some() && matches!(kind.as_str(), "conversation" | "direct_reply");
    if !owner {
        explanation.measured_from = None;
        explanation.reasons.push(reason(
            "EX-2",
            "not_an_owner",
            format!("a {kind} run without a conversation owns no execution detail to prune"),
        ));
    } else if age.is_none() {
        explanation.reasons.push(reason(
            "EX-2",
            "no_age",
            "not completed yet (or, for a direct reply, not settled)".into(),
        ));
    }
    let Some(cutoff) = cutoff.filter(|_| owner && age.is_some()) else {
        return Ok(Some(explanation));
    };
    let judged: Option<Locked> = sqlx::query_as(sqlx::AssertSqlSafe(&**EXPLAIN))
        .bind(run)
        .bind(account)
        .bind(cutoff)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(judged) = judged else {
        return Ok(None);
    };
    if !judged.eligible {
        explanation.reasons.push(reason(
            "EX-1",
            RetainReason::NotEligible.as_str(),
            "not old enough: its age is not before the cutoff (or is infinite, EX-2)".to_owned(),
        ));
    }
    for (blocker, blocked) in BLOCKERS.iter().zip(&judged.blocked) {
        if *blocked {
            let detail = blocker_detail(conn, *blocker, run).await?;
            explanation
                .reasons
                .push(reason("EX-5", blocker.as_str(), detail));
        }
    }
    // The verdict is the job's own, from the same columns its owner statement reads.
    if let Verdict::Prune = judged.verdict() {
        explanation.verdict = ExplainVerdict::Eligible;
        explanation.reasons.push(reason(
            "EX-1",
            "expired",
            "older than the window and held back by nothing: the next pass prunes it".into(),
        ));
    }
    Ok(Some(explanation))
}

/// The `[execution_details]` section as given.
#[derive(Debug, Deserialize)]
struct RawSettings {
    window_size: Raw<i64>,
    owners_per_transaction: Raw<i64>,
    transaction_target_ms: Raw<i64>,
    hop_budget_ms: Raw<i64>,
    owner_lock_timeout_ms: Raw<i64>,
}

/// The job kind, as the worker registers it.
pub struct PruneExecutionDetails;

impl Job for PruneExecutionDetails {
    const NAME: &'static str = "prune_execution_details";
    const QUEUE: &'static str = "sexton.prune_execution_details";
    const SCOPE: Scope = Scope::Account;
    const SECTION: &'static str = "execution_details";
    /// The owner transactions' and the files' drain beside them ([`files::Beside`]).
    const CONNECTIONS: u32 = 2;
    const RETAIN_REASONS: &'static [&'static str] = &RetainReason::NAMES;
    const SUBJECTS: &'static [&'static str] = &["run"];

    type Args = Args;
    type Settings = HopSettings;
    type Preview = Preview;
    type Error = Error;

    fn settings(
        section: &serde_json::Value,
        paths: &PathSettings,
        c: &mut Check<'_>,
    ) -> Option<HopSettings> {
        let e: RawSettings = c.section(Self::SECTION, section)?;
        let window_size = c.int(
            "execution_details.window_size",
            &e.window_size,
            1..=100_000,
            "an integer from 1 to 100000",
        );
        let owners_per_transaction = c.int(
            "execution_details.owners_per_transaction",
            &e.owners_per_transaction,
            1..=10_000,
            "an integer from 1 to 10000",
        );
        let transaction_target = c.millis(
            "execution_details.transaction_target_ms",
            &e.transaction_target_ms,
        );
        let budget = c.millis("execution_details.hop_budget_ms", &e.hop_budget_ms);
        let owner_lock_timeout = c.millis(
            "execution_details.owner_lock_timeout_ms",
            &e.owner_lock_timeout_ms,
        );
        Some(HopSettings {
            window_size: window_size?,
            owners_per_transaction: owners_per_transaction?,
            transaction_target: transaction_target?,
            budget: budget?,
            owner_lock_timeout: owner_lock_timeout?,
            output_root: paths.output_root.clone(),
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
        Args::first(account.unwrap_or_default(), slot)
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
            output_root: env.paths.output_root.clone(),
            ..settings.clone()
        };
        let mut done = HopReport::new();
        let result = hop_into(
            env.conn, env.pool, env.clock, env.health, settings, args, env.stop, &mut done,
        )
        .await;
        *report = done.shared(settings.window_size);
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
            Ok(run) => explain_run(conn, now, run).await,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_matches_its_golden_file() {
        let g = crate::golden::check;
        g("prune_execution_details/window", &WINDOW);
        g("prune_execution_details/prune_together", &PRUNE_LOCKED);
        g("prune_execution_details/prune_alone", &PRUNE_WAITING);
        g("prune_execution_details/backlog", &BACKLOG);
        g("prune_execution_details/backlog_scan", &BACKLOG_SCAN);
        g("prune_execution_details/preview", &PREVIEW);
    }

    #[test]
    fn fl1_args_round_trip_and_refuse_unknown_fields() {
        let args = Args::first(Uuid::nil(), "2026-12-01T03:00:00Z".parse().unwrap());
        let json = serde_json::to_value(&args).unwrap();
        assert_eq!(serde_json::from_value::<Args>(json.clone()).unwrap(), args);
        let mut bad = json;
        bad["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Args>(bad).is_err());
    }
}
