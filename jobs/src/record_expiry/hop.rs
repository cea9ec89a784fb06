//! One hop over a kind's expired rows: batch after batch through the owner loop, each batch
//! read, locked, re-checked and deleted by one statement.

use std::marker::PhantomData;
use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::cutoff::{self, EARLIEST, days_before};
use crate::health::Health;
use crate::job::Report;
use crate::owner_loop::{Bounds, Hop, Owners, Then, Took};
use crate::payload::V1;

use super::{Args, Error, ExpirySettings, HopOutcome, RETAIN_REASONS, Record, sql};

/// What one batch read and did.
#[derive(sqlx::FromRow)]
pub(super) struct Batch {
    read: i64,
    held: i64,
    deleted: i64,
    last_at: Option<DateTime<Utc>>,
    last_id: Option<String>,
}

/// One hop: batches until the expired rows run out, the budget is spent or the worker stops
/// (the owner loop, [`Hop::run`]).
///
/// # Errors
/// [`Error::Database`]; every batch before the failing one is committed, and the hop can be
/// run again.
pub async fn hop<R: Record>(
    conn: &mut PgConnection,
    health: &Health,
    settings: &ExpirySettings,
    args: &Args,
    stop: &std::sync::atomic::AtomicBool,
    report: &mut Report<Args>,
) -> Result<(), Error> {
    *report = Report::new(&RETAIN_REASONS);
    report.window = settings.batch_size;
    report.rows = vec![(R::TABLE, 0)];
    let bounds = Bounds {
        window: None,
        budget: settings.budget,
    };
    let hop = Hop::start(conn, health, stop, bounds, None, report).await?;
    let days = R::days(settings);
    if days == 0 {
        report.outcome = HopOutcome::Disabled;
        return Ok(());
    }
    let database_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *hop.conn)
        .await?;
    let current = days_before(cutoff::reference(args.pass_started_at, database_now), days);
    let cutoff = match args.cutoff {
        Some(carried) => current.map(|current| current.min(carried)),
        None => current,
    };
    let Some(cutoff) = cutoff else {
        return Ok(());
    };
    let mut batches = Batches::<R> {
        cutoff,
        size: settings.batch_size,
        sql: sql::batch::<R>(),
        kind: PhantomData,
    };
    let end = hop.run(&mut batches, args.after.clone(), report).await?;
    report.outcome = end.outcome();
    report.next = end.next().map(|after| Args {
        version: V1,
        pass_started_at: args.pass_started_at,
        cutoff: Some(cutoff),
        after,
        hop: args.hop + 1,
    });
    Ok(())
}

/// A pass over one record kind as the owner loop takes it: each step one batch, read, locked,
/// re-checked and deleted by one statement.
pub(super) struct Batches<R> {
    cutoff: DateTime<Utc>,
    size: u32,
    /// The kind's batch statement ([`sql::batch`]), rendered once per hop.
    sql: String,
    kind: PhantomData<R>,
}

impl<R: Record> Owners for Batches<R> {
    /// The last row visited: its age and id as text.
    type Cursor = (DateTime<Utc>, String);
    type Report = Report<Args>;

    const TABLES: &'static [&'static str] = &[R::TABLE];

    async fn step(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Self::Cursor>,
        _room: Option<u32>,
        report: &mut Report<Args>,
    ) -> Result<Took<Self::Cursor>, Error> {
        let (after_at, after_id) = at
            .cloned()
            .unwrap_or_else(|| (EARLIEST, R::FIRST_ID.to_owned()));
        let started = Instant::now();
        // Through the hold gate (HD-3): a hold placed meanwhile waits for this batch.
        let mut tx = crate::owner_loop::begin(conn, None, true).await?;
        let batch: Batch = sqlx::query_as(sqlx::AssertSqlSafe(&*self.sql))
            .bind(self.cutoff)
            .bind(after_at.max(EARLIEST))
            .bind(after_id)
            .bind(i64::from(self.size))
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        let seconds = started.elapsed().as_secs_f64();
        let [read, held, deleted] =
            [batch.read, batch.held, batch.deleted].map(|n| n.max(0) as u64);
        report.pruned += deleted;
        report.rows[0].1 += deleted;
        report.retained[0].1 += read.saturating_sub(deleted + held);
        report.retained[1].1 += held;
        Ok(Took {
            read,
            at: batch.last_at.zip(batch.last_id),
            recorded: 0,
            seconds,
            then: if read == u64::from(self.size) {
                Then::More
            } else {
                Then::End(None)
            },
        })
    }
}
