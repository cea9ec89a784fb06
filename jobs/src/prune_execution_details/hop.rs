//! One hop of execution-detail pruning: the account's window through the owner loop, each chunk
//! of owners in one transaction under the platform's lock order (EX-6), re-checked under those
//! locks (EX-1, EX-2, EX-5).

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::clock::Clock;
use crate::cutoff::{EARLIEST, days_before};
use crate::files::Root;
use crate::health::Health;
use crate::owner_loop::{
    self, Bounds, Candidates, Chunks, Files, Hop, Mode, Taken, Window, Windowed, busy_or,
};
use crate::payload::V1;

use super::sql::{PRUNE_LOCKED, PRUNE_WAITING, WINDOW};
use super::{
    Args, Cursor, Error, HopOutcome, HopReport, HopSettings, Locked, RetainReason, WRITTEN,
    pruned_runner_effects,
};

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
pub(super) async fn hop_into(
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
        store: &settings.outputs,
        scope: Some(args.account_id),
        beside: Some(pool),
    };
    let hop = Hop::start(conn, health, stop, bounds, Some(files), report).await?;
    let Some((days, database_now)) = window_days(hop.conn, args.account_id, report).await? else {
        return Ok(());
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

/// The account's window in days and the database's now, or `None` (the outcome or the
/// retained reason set) when the account is gone, its retention disabled or its window not one
/// (EX-1).
async fn window_days(
    conn: &mut PgConnection,
    account_id: Uuid,
    report: &mut HopReport,
) -> Result<Option<(i32, DateTime<Utc>)>, Error> {
    let account: Option<(Option<i32>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT execution_details_retention_days, now() FROM accounts WHERE id = $1",
    )
    .bind(account_id)
    .fetch_optional(conn)
    .await?;
    Ok(match account {
        None => {
            report.outcome = HopOutcome::AccountGone;
            None
        }
        Some((None, _)) => {
            report.outcome = HopOutcome::Disabled;
            None
        }
        Some((Some(days), _)) if !crate::cutoff::valid_window(days) => {
            // Never "everything is old": nothing of the account is (EX-1).
            tracing::warn!(
                account = %account_id,
                execution_details_retention_days = days,
                "the account's execution_details_retention_days is not a window (must be > 0): \
                 nothing of it is pruned"
            );
            report.retain(RetainReason::InvalidWindow);
            None
        }
        Some((Some(days), now)) => Some((days, now)),
    })
}

/// Owners taken together by a hop's first transaction, before any has been measured: few, so
/// that a first chunk meeting cold pages stays near the transaction target; doubling, the
/// chunks reach `owners_per_transaction` (200 by default) within five transactions.
pub const FIRST_TOGETHER: usize = 8;

impl Window for Pass<'_> {
    /// A run, its conversation, its age.
    type Candidate = (Uuid, Uuid, DateTime<Utc>);
    type Cursor = Cursor;
    type Report = HopReport;

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
pub(super) struct Owner {
    run_id: Uuid,
    conversation_id: Uuid,
}

/// What every owner of a hop is judged against.
pub(super) struct Pass<'a> {
    account_id: Uuid,
    clock: &'a dyn Clock,
    settings: &'a HopSettings,
    /// The stricter of the carried cutoff and the current setting.
    bound: DateTime<Utc>,
    /// What the current setting is measured back from: the pass start, or the database's
    /// now if that is earlier.
    reference: DateTime<Utc>,
}

/// Starts an owner transaction: bounded lock waits, and a commit that need not wait for its WAL
/// flush — no file is unlinked before a synchronous commit made it durable (see
/// [`files::drain`]), so a database crash may undo the last few prunes, rows and file records
/// together, never half of one.
pub(super) async fn begin<'c>(
    conn: &'c mut PgConnection,
    pass: &Pass<'_>,
) -> Result<Transaction<'c, Postgres>, Error> {
    Ok(owner_loop::begin(conn, Some(pass.settings.owner_lock_timeout), false).await?)
}

/// Runs [`prune_locked`] for `runs` in the owner transaction `tx`.
pub(super) async fn run_prune_locked(
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
pub(super) async fn prune_together(
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
pub(super) async fn prune_owner(
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
