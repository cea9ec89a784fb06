//! One hop over a kind's expired rows: batch after batch through the owner loop, each batch
//! read, locked, re-checked and deleted by one statement.

use std::marker::PhantomData;
use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::cutoff::EARLIEST;
use crate::job::Report;
use crate::owner_loop::{End, Owners, Then, Took};
use crate::pass::Step;

use super::{Error, Expire, Record, RecordReason, sql};

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
/// (the owner loop, [`crate::owner_loop::Hop::run`]).
///
/// # Errors
/// [`Error::Database`]; every batch before the failing one is committed, and the hop can be
/// run again.
pub(super) async fn hop<R: Record>(
    step: Step<'_, Expire<R>>,
    report: &mut Report<RecordReason>,
) -> Result<End<(DateTime<Utc>, String)>, Error> {
    let settings = step.settings;
    report.window = settings.batch_size;
    let mut batches = Batches::<R> {
        cutoff: step.cutoff,
        size: settings.batch_size,
        sql: sql::batch::<R>(),
        kind: PhantomData,
    };
    step.hop.run(&mut batches, step.cursor, report).await
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
    type Report = Report<RecordReason>;

    const TABLES: &'static [&'static str] = &[R::TABLE];

    async fn step(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Self::Cursor>,
        _room: Option<u32>,
        report: &mut Report<RecordReason>,
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
        report.deleted(R::TABLE, deleted);
        report.retain(RecordReason::Busy, read.saturating_sub(deleted + held));
        report.retain(RecordReason::LegalHold, held);
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
