//! The simplest owners: rows of one table, read in (age, id) order by one statement and taken
//! by another under a declared lock plan ([`Table`]). A kind of this shape declares its two
//! statements and its locks, and the owner loop does the rest ([`crate::owner_loop::Windowed`]).

use std::marker::PhantomData;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::cutoff::EARLIEST;
use crate::job::{Job, Report};
use crate::owner_loop::{self, Candidates, Chunks, End, Error, Mode, Taken, Window, Windowed};
use crate::pass::Step;

/// Where a pass of [`Rows`] stands: the last row's age and id.
pub type Cursor = (DateTime<Utc>, Uuid);

/// One lock a transaction takes before its statement, in the order the plan lists them (the
/// platform's lock order, EX-6).
#[derive(Debug, Clone, Copy)]
pub enum Lock {
    /// The scope's row of this table (the account), as the mode says.
    Scope(&'static str, Mode),
}

/// A kind whose owners are rows of one table ([`Job::TABLES`], the first of them; a vacuum on
/// any of them pauses the hop): its statements and its lock plan.
pub trait Table: Job<Cutoff = DateTime<Utc>, Cursor = Cursor> {
    /// Reads at most `$5` candidates `(id, age)` of the scope `$1` older than the cutoff `$2`,
    /// in (age, id) order after (`$3`, `$4`).
    const READ: &'static str;
    /// Takes those of the rows `$3` (`uuid[]`) of the scope `$1` still older than the cutoff
    /// `$2`, its verdict re-checked under the locks; returns how many went.
    const TAKE: &'static str;
    /// Taken in each transaction before [`Table::TAKE`], in this order.
    const LOCKS: &'static [Lock] = &[];
}

/// A pass over one [`Table`]'s rows of one scope, up to one cutoff.
pub struct Rows<T> {
    scope: Uuid,
    cutoff: DateTime<Utc>,
    table: PhantomData<T>,
}

impl<T: Table> Rows<T> {
    /// A pass of `step`'s scope up to its cutoff.
    pub fn of(step: &Step<'_, T>) -> Self {
        Self {
            scope: step.account.unwrap_or_default(),
            cutoff: step.cutoff,
            table: PhantomData,
        }
    }

    /// One hop of `T`: its rows through the owner loop, one chunk of `chunk` rows per
    /// transaction.
    ///
    /// # Errors
    /// The database's; what was committed stays.
    pub async fn run(
        step: Step<'_, T>,
        chunk: usize,
        report: &mut Report<T::Reason>,
    ) -> Result<End<Cursor>, Error> {
        let mut rows = Windowed::new(Self::of(&step), Chunks::Fixed(chunk));
        step.hop.run(&mut rows, step.cursor, report).await
    }
}

impl<T: Table> Window for Rows<T> {
    type Candidate = (Uuid, DateTime<Utc>);
    type Cursor = Cursor;
    type Report = Report<T::Reason>;

    const TABLES: &'static [&'static str] = T::TABLES;

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Cursor>,
        room: u32,
        _report: &mut Report<T::Reason>,
    ) -> Result<Candidates<Self::Candidate, Cursor>, Error> {
        let (after_at, after_id) = at.copied().unwrap_or((EARLIEST, Uuid::nil()));
        let candidates = sqlx::query_as(sqlx::AssertSqlSafe(T::READ))
            .bind(self.scope)
            .bind(self.cutoff)
            .bind(after_at.max(EARLIEST))
            .bind(after_id)
            .bind(i64::from(room))
            .fetch_all(conn)
            .await?;
        Ok(Candidates {
            candidates,
            tail: None,
        })
    }

    fn cursor(&self, (id, at): &Self::Candidate) -> Cursor {
        (*at, *id)
    }

    async fn take(
        &mut self,
        conn: &mut PgConnection,
        chunk: &[Self::Candidate],
        report: &mut Report<T::Reason>,
    ) -> Result<Taken, Error> {
        let mut tx = owner_loop::begin(conn, None, true).await?;
        for lock in T::LOCKS {
            let Lock::Scope(table, mode) = *lock;
            owner_loop::lock(&mut tx, table, mode, &[self.scope]).await?;
        }
        let ids: Vec<Uuid> = chunk.iter().map(|(id, _)| *id).collect();
        let taken = sqlx::query(sqlx::AssertSqlSafe(T::TAKE))
            .bind(self.scope)
            .bind(self.cutoff)
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        report.pruned += taken;
        if let Some(table) = T::TABLES.first() {
            report.deleted(table, taken);
        }
        Ok(Taken::default())
    }
}
