//! One hop of execution-detail pruning: the account's window through the owner loop, each chunk
//! of owners in one transaction under the platform's lock order (EX-6), re-checked under those
//! locks (EX-1, EX-2, EX-5).

use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use crate::clock::Clock;
use crate::cutoff::{EARLIEST, days_before};
use crate::job::Report;
use crate::owner_loop::{self, Candidates, Chunks, End, Mode, Taken, Window, Windowed, busy_or};
use crate::pass::{Now, Policy, Step};

use super::sql::{PRUNE_LOCKED, PRUNE_WAITING, WINDOW};
use super::{
    Cursor, Error, HopOutcome, HopSettings, Locked, PruneExecutionDetails, RetainReason, WRITTEN,
    pruned_runner_effects, record,
};

/// One hop: the owner loop ([`crate::owner_loop::Hop::run`]) over one window of the account's
/// candidates, each chunk of owners in one transaction.
///
/// # Errors
/// [`Error::Database`] when the database fails; nothing is half-done, and the hop can be run
/// again.
pub(super) async fn hop(
    step: Step<'_, PruneExecutionDetails>,
    report: &mut Report<RetainReason>,
) -> Result<End<Cursor>, Error> {
    let settings = step.settings;
    let pass = Pass {
        account_id: step.account.unwrap_or_default(),
        clock: step.env.clock,
        settings,
        bound: step.cutoff,
        reference: step.reference,
    };
    let chunks = Chunks::Timed {
        first: FIRST_TOGETHER,
        most: settings.owners_per_transaction as usize,
        target: settings.transaction_target,
    };
    let mut owners = Windowed::new(pass, chunks);
    step.hop.run(&mut owners, step.cursor, report).await
}

/// The account's current cutoff, measured back from `reference` (EX-1), or why its pass ends:
/// the account is gone, its retention disabled, or its window not one (counted
/// `invalid_window`, never "everything is old") or past the calendar.
pub(super) async fn policy(
    now: Now<'_, PruneExecutionDetails>,
) -> Result<Policy<DateTime<Utc>>, Error> {
    let Now {
        conn,
        account,
        reference,
        report,
        ..
    } = now;
    let account_id = account.unwrap_or_default();
    let account: Option<Option<i32>> =
        sqlx::query_scalar("SELECT execution_details_retention_days FROM accounts WHERE id = $1")
            .bind(account_id)
            .fetch_optional(conn)
            .await?;
    Ok(match account {
        None => Policy::Ends(HopOutcome::AccountGone),
        Some(None) => Policy::Ends(HopOutcome::Disabled),
        Some(Some(days)) if !crate::cutoff::valid_window(days) => {
            tracing::warn!(
                account = %account_id,
                execution_details_retention_days = days,
                "the account's execution_details_retention_days is not a window (must be > 0): \
                 nothing of it is pruned"
            );
            report.retain(RetainReason::InvalidWindow, 1);
            Policy::Ends(HopOutcome::Finished)
        }
        Some(Some(days)) => Policy::up_to(days_before(reference, days)),
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
    type Report = Report<RetainReason>;

    const TABLES: &'static [&'static str] = &WRITTEN;

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Cursor>,
        room: u32,
        _report: &mut Report<RetainReason>,
    ) -> Result<Candidates<Self::Candidate, Cursor>, Error> {
        let after = at.copied().unwrap_or(Cursor {
            age: EARLIEST,
            run_id: Uuid::nil(),
        });
        let candidates = sqlx::query_as(WINDOW)
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
        report: &mut Report<RetainReason>,
    ) -> Result<Taken, Error> {
        let owners: Vec<Owner> = chunk
            .iter()
            .map(|(run_id, conversation_id, _)| Owner {
                run_id: *run_id,
                conversation_id: *conversation_id,
            })
            .collect();
        let files_before = report.rows_of("output_files");
        let started = Instant::now();
        // Together first; whoever could not be locked at once goes alone, with a bounded wait.
        let alone = prune_together(conn, self, &owners, report).await?;
        let together = started.elapsed();
        for owner in alone {
            prune_owner(conn, self, &owner, report).await?;
        }
        Ok(Taken {
            recorded: report.rows_of("output_files") - files_before,
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
    report: &mut Report<RetainReason>,
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
    record(report, &locked);
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
    report: &mut Report<RetainReason>,
) -> Result<(), Error> {
    let mut tx = begin(conn, pass).await?;
    // The conversation first, then the run: the order every platform writer uses.
    let conversation = sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
        .bind(owner.conversation_id)
        .fetch_optional(&mut *tx)
        .await;
    match busy_or(conversation)? {
        None => report.retain(RetainReason::Busy, 1),
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
                report.retain(RetainReason::Busy, 1);
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
                None => report.retain(RetainReason::Busy, 1),
                Some(locked) => {
                    tx.commit().await?;
                    record(report, &locked);
                }
            }
        }
    }
    Ok(())
}
