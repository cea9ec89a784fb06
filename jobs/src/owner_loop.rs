//! The owner loop: what a hop of every row-owning job kind does between its transactions,
//! written once. A kind declares what it reads and how it takes it ([`Owners`], or [`Window`]
//! for a kind that reads a bounded window of candidates first and takes them in chunks); the
//! loop owns the rest, the same for every kind:
//!
//! - **the bounds**: a hop reads at most its window and stops taking steps once its budget is
//!   spent, but always takes its first step, so that every hop moves its pass forward;
//! - **the stop flag** (FL-5): checked before every step, the first one included; the step in
//!   hand is finished, no other is taken, and the rest goes to the next hop;
//! - **health and WAL pacing**, between transactions only: the pace waits before each step and
//!   after the last, and a red indicator on one of [`Owners::TABLES`] ends the hop throttled;
//! - **the files**: the removals an earlier hop recorded and did not reach are drained first,
//!   those the steps record are drained beside the hop (on a connection of their own) or after
//!   it, and the hop's last drain takes whatever is left;
//! - **the next hop**: where the pass stands when the hop ends ([`End`]).
//!
//! What a step does inside its transaction — the locks in the kind's order, the re-check under
//! them, the delete and the file records — is the kind's, through the helpers below
//! ([`begin`], [`lock`], [`busy_or`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::files::{self, Beside, DrainError, FileCounts, Root, Store};
use crate::health::{Health, Indicator};
use crate::report::{HopOutcome, Reason, Report};

/// How much one hop may do.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Candidates read per hop at most; `None` for a kind whose steps read and take at once,
    /// bounded by the budget alone.
    pub window: Option<u32>,
    /// Time after which no further step is taken.
    pub budget: Duration,
}

impl Bounds {
    pub const fn new(window: Option<u32>, budget: Duration) -> Self {
        Self { window, budget }
    }

    /// A run that takes what it needs in one hop: no window, no budget (a kind that walks a
    /// root whole under its lease).
    pub const fn whole() -> Self {
        Self::new(None, Duration::MAX)
    }
}

/// The removals the hop's steps record, and where they go.
#[derive(Debug, Clone, Copy)]
pub struct Files<'a> {
    pub root: Root,
    pub store: &'a Store,
    /// The account, for a per-account job.
    pub scope: Option<Uuid>,
    /// A pool to drain from beside the hop, for a kind that declares the connection
    /// (`Job::CONNECTIONS`); without one the files are drained after the hop's last step.
    pub beside: Option<&'a PgPool>,
}

/// One hop's loop, from [`Hop::start`] to [`Hop::run`].
pub struct Hop<'a> {
    /// The hop's connection: the kind reads what its pass needs on it between the two.
    pub conn: &'a mut PgConnection,
    health: &'a Health,
    stop: &'a AtomicBool,
    bounds: Bounds,
    files: Option<Files<'a>>,
    /// The last file record the first drain claimed.
    drained: i64,
}

/// What one step took.
#[derive(Debug)]
pub struct Took<C> {
    /// Candidates it looked at.
    pub read: u64,
    /// Where the pass stands after it, if it moved.
    pub at: Option<C>,
    /// File removals it may have recorded.
    pub recorded: u64,
    /// Time spent inside its transactions.
    pub seconds: f64,
    pub then: Then<C>,
}

/// What follows a step.
#[derive(Debug)]
pub enum Then<C> {
    /// More may follow where the pass stands.
    More,
    /// Nothing more follows where the pass stands: it goes on at this cursor (a kind's next
    /// segment, as sessions go kind after kind), or, `None`, it is complete.
    End(Option<C>),
}

impl<C> Took<C> {
    /// A step that took nothing and found its segment ended.
    pub fn end(next: Option<C>) -> Self {
        Self {
            read: 0,
            at: None,
            recorded: 0,
            seconds: 0.0,
            then: Then::End(next),
        }
    }
}

/// How a hop's loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End<C> {
    /// The pass is complete.
    Finished,
    /// The window or the budget was spent, or the worker is stopping: the next hop goes on
    /// from this cursor (`None`: from where this hop started, before any cursor).
    Continued(Option<C>),
    /// A red indicator stopped the hop: the next hop, later, goes on from this cursor.
    Throttled(Option<C>),
}

impl<C> End<C> {
    pub fn outcome(&self) -> HopOutcome {
        match self {
            End::Finished => HopOutcome::Finished,
            End::Continued(_) => HopOutcome::Continued,
            End::Throttled(_) => HopOutcome::Throttled,
        }
    }

    /// Where the next hop starts, if one follows.
    pub fn next(self) -> Option<Option<C>> {
        match self {
            End::Finished => None,
            End::Continued(at) | End::Throttled(at) => Some(at),
        }
    }
}

/// What a hop's report counts of the loop's work, whatever else it counts.
pub trait Progress {
    /// A step looked at `candidates`, spending `seconds` inside transactions.
    fn took(&mut self, candidates: u64, seconds: f64);
    fn files(&mut self, counts: FileCounts);
    fn throttled(&mut self, red: Indicator);
}

impl<R: Reason> Progress for Report<R> {
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

/// Why a hop on the owner loop failed; it is retried unless the database refused the statement
/// itself ([`crate::job::refused`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Files(#[from] DrainError),
}

/// A row-owning job kind as its hop's loop sees it.
pub trait Owners: Send {
    /// Where a pass stands.
    type Cursor: Clone + Send + Sync;
    type Report: Progress + Send;

    /// Every table its transactions write: a vacuum on one of them pauses its hops.
    const TABLES: &'static [&'static str];

    /// One step from `at` (the pass's start when `None`), reading at most `room` candidates
    /// when the hop has a window: a transaction or a few, counted into `report` as they
    /// commit.
    fn step(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Self::Cursor>,
        room: Option<u32>,
        report: &mut Self::Report,
    ) -> impl Future<Output = Result<Took<Self::Cursor>, Error>> + Send;
}

impl<'a> Hop<'a> {
    /// Starts a hop: the removals an earlier hop recorded and did not reach go first, whatever
    /// the pass then finds (an account gone, a job turned off).
    ///
    /// # Errors
    /// The drain's.
    pub async fn start<R: Progress>(
        conn: &'a mut PgConnection,
        health: &'a Health,
        stop: &'a AtomicBool,
        bounds: Bounds,
        files: Option<Files<'a>>,
        report: &mut R,
    ) -> Result<Self, DrainError> {
        let mut drained = 0;
        if let Some(f) = &files {
            let (earlier, last) = files::drain_from(conn, f.root, f.store, f.scope, 0).await?;
            report.files(earlier);
            drained = last;
        }
        Ok(Self {
            conn,
            health,
            stop,
            bounds,
            files,
            drained,
        })
    }

    /// Runs the loop from `start`: steps until the pass is complete, the window or the budget
    /// is spent, the worker stops or the database's health says wait; then the hop's last
    /// drain.
    ///
    /// # Errors
    /// The first step's or drain's error; what committed before it is counted in `report`.
    pub async fn run<O: Owners>(
        self,
        owners: &mut O,
        start: Option<O::Cursor>,
        report: &mut O::Report,
    ) -> Result<End<O::Cursor>, Error> {
        let Hop {
            conn,
            health,
            stop,
            bounds,
            files,
            mut drained,
        } = self;
        let started = Instant::now();
        let mut beside = files.and_then(|f| {
            f.beside
                .map(|pool| Beside::new(pool, f.root, f.store, f.scope, drained))
        });
        let mut pace = health.pace();
        let mut at = start;
        let mut room = bounds.window;
        let mut steps = 0u64;
        let end = loop {
            let spent = steps > 0 && started.elapsed() >= bounds.budget;
            if room == Some(0) || spent || stop.load(Ordering::Relaxed) {
                break End::Continued(at);
            }
            // Between transactions only: nothing is ever half-done.
            if let Some(pace) = pace.as_mut() {
                pace.wait(conn, stop).await?;
            }
            if let Some(red) = health.red(conn, O::TABLES).await? {
                report.throttled(red);
                break End::Throttled(at);
            }
            let took = owners.step(conn, at.as_ref(), room, report).await?;
            steps += 1;
            report.took(took.read, took.seconds);
            room = room.map(|room| room.saturating_sub(took.read.try_into().unwrap_or(u32::MAX)));
            if let Some(moved) = took.at {
                at = Some(moved);
            }
            if let Some(beside) = beside.as_mut() {
                beside.recorded(took.recorded).await?;
            }
            match took.then {
                Then::More => {}
                Then::End(Some(next)) => at = Some(next),
                Then::End(None) => break End::Finished,
            }
        };
        // The last transaction's WAL counts too: the rate holds across hops.
        if let Some(pace) = pace.as_mut() {
            pace.wait(conn, stop).await?;
        }
        if let Some(beside) = beside {
            let (counts, last) = beside.finish().await?;
            report.files(counts);
            drained = last;
        }
        if let Some(f) = &files {
            let (counts, _) = files::drain_from(conn, f.root, f.store, f.scope, drained).await?;
            report.files(counts);
        }
        Ok(end)
    }
}

/// A kind that reads a bounded window of candidates, in its order after its cursor, and takes
/// them chunk by chunk, each chunk in transactions of its own.
pub trait Window: Send {
    type Candidate: Send + Sync;
    type Cursor: Clone + Send + Sync;
    type Report: Progress + Send;

    const TABLES: &'static [&'static str];

    /// At most `room` candidates after `at` (the pass's start when `None`).
    fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Self::Cursor>,
        room: u32,
        report: &mut Self::Report,
    ) -> impl Future<Output = Result<Candidates<Self::Candidate, Self::Cursor>, Error>> + Send;

    /// Where the pass stands once `candidate` is taken.
    fn cursor(&self, candidate: &Self::Candidate) -> Self::Cursor;

    /// Takes `chunk` in its transactions, counting into `report` as they commit.
    fn take(
        &mut self,
        conn: &mut PgConnection,
        chunk: &[Self::Candidate],
        report: &mut Self::Report,
    ) -> impl Future<Output = Result<Taken, Error>> + Send;
}

/// A window as [`Window::read`] read it.
#[derive(Debug)]
pub struct Candidates<K, C> {
    pub candidates: Vec<K>,
    /// Where the pass goes on when there are fewer than asked: the next segment's start, or
    /// `None` (complete).
    pub tail: Option<C>,
}

/// What a chunk's transactions did, as the loop needs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Taken {
    /// File removals they may have recorded.
    pub recorded: u64,
    /// The time [`Chunks::Timed`] sizes the next chunk by, when it is not the chunk's whole
    /// time: the shared transaction's, for a kind that then takes some owners alone, waiting
    /// on their locks.
    pub sized_by: Option<Duration>,
}

/// How many candidates a chunk holds.
#[derive(Debug, Clone, Copy)]
pub enum Chunks {
    /// Always this many.
    Fixed(usize),
    /// Sized by time: `first` before any is measured, then scaled toward `target` per chunk,
    /// at most doubled or halved at a time, from 1 to `most`.
    Timed {
        first: usize,
        most: usize,
        target: Duration,
    },
}

impl Chunks {
    /// The first chunk's size.
    pub fn first(self) -> usize {
        match self {
            Chunks::Fixed(n) => n.max(1),
            Chunks::Timed { first, most, .. } => first.min(most).max(1),
        }
    }

    /// The next chunk's size after one of `now` candidates took `took`.
    pub fn next(self, now: usize, took: Duration) -> usize {
        match self {
            Chunks::Fixed(n) => n.max(1),
            Chunks::Timed { most, target, .. } => {
                let scaled = now as f64 * target.as_secs_f64() / took.as_secs_f64().max(1e-6);
                (scaled as usize)
                    .clamp((now / 2).max(1), now.saturating_mul(2))
                    .clamp(1, most.max(1))
            }
        }
    }
}

/// A [`Window`] kind as [`Owners`]: each step reads a window when the last is used up and
/// takes its next chunk.
pub struct Windowed<W: Window> {
    kind: W,
    chunks: Chunks,
    size: usize,
    window: Vec<W::Candidate>,
    taken: usize,
    /// Where the pass goes on once the window in hand is used up, if it was short.
    tail: Option<Option<W::Cursor>>,
}

impl<W: Window> Windowed<W> {
    pub fn new(kind: W, chunks: Chunks) -> Self {
        Self {
            kind,
            chunks,
            size: chunks.first(),
            window: Vec::new(),
            taken: 0,
            tail: None,
        }
    }

    pub fn into_inner(self) -> W {
        self.kind
    }
}

impl<W: Window> Owners for Windowed<W> {
    type Cursor = W::Cursor;
    type Report = W::Report;

    const TABLES: &'static [&'static str] = W::TABLES;

    async fn step(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&W::Cursor>,
        room: Option<u32>,
        report: &mut W::Report,
    ) -> Result<Took<W::Cursor>, Error> {
        if self.taken == self.window.len() {
            if let Some(tail) = self.tail.take() {
                return Ok(Took::end(tail));
            }
            let room = room.unwrap_or(u32::MAX);
            let Candidates {
                candidates: window,
                tail,
            } = self.kind.read(conn, at, room, report).await?;
            if window.is_empty() {
                return Ok(Took::end(tail));
            }
            self.tail = (window.len() < room as usize).then_some(tail);
            self.window = window;
            self.taken = 0;
        }
        let end = (self.taken + self.size).min(self.window.len());
        let chunk = &self.window[self.taken..end];
        let started = Instant::now();
        let taken = self.kind.take(conn, chunk, report).await?;
        let took = started.elapsed();
        self.size = self.chunks.next(self.size, taken.sized_by.unwrap_or(took));
        let at = chunk.last().map(|c| self.kind.cursor(c));
        let read = chunk.len() as u64;
        self.taken = end;
        let then = match (self.taken == self.window.len(), &self.tail) {
            (true, Some(_)) => Then::End(self.tail.take().flatten()),
            _ => Then::More,
        };
        Ok(Took {
            read,
            at,
            recorded: taken.recorded,
            seconds: took.as_secs_f64(),
            then,
        })
    }
}

/// Starts an owner transaction in one round trip: first through the hold gate ([`crate::gate`], HD-3:
/// a hold being placed waits for this transaction, and one placed before it is seen by its
/// next statement), then its lock waits bounded by `lock_timeout` (the
/// connection's own when `None`); with `durable` off, its commit does not wait for its WAL flush
/// (a kind whose files are unlinked only after the drain's synchronous commit made every record
/// durable may). Its statements run on their generic plans (`plan_cache_mode`), planned once
/// per connection rather than once per chunk for the first few: with 10 ms transactions, seven
/// scale-10 passes each way went 8% faster for execution details and 13% for sessions
/// (docs/benchmark.md). Every transaction of every kind that removes what a hold could cover
/// begins here.
///
/// # Errors
/// A database error.
pub async fn begin<'c>(
    conn: &'c mut PgConnection,
    lock_timeout: Option<Duration>,
    durable: bool,
) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
    let commit = if durable {
        ""
    } else {
        "; SET LOCAL synchronous_commit = off"
    };
    let lock_timeout = lock_timeout.map_or_else(String::new, |timeout| {
        format!("; SET LOCAL lock_timeout = {}", timeout.as_millis().max(1))
    });
    crate::gate::begin(
        conn,
        &format!("{lock_timeout}; SET LOCAL plan_cache_mode = force_generic_plan{commit}"),
    )
    .await
}

/// How a step locks the rows its owners hang from, before the owners themselves (the
/// platform's lock order, EX-6).
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Update,
    Share,
}

/// Locks those of `ids` in `table` that are free at once, in id order (the platform's order),
/// as `mode` says; returns the ids locked.
///
/// # Errors
/// A database error.
pub async fn lock(
    tx: &mut Transaction<'_, Postgres>,
    table: &'static str,
    mode: Mode,
    ids: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    let mode = match mode {
        Mode::Update => "UPDATE",
        Mode::Share => "SHARE",
    };
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {table} WHERE id = ANY($1) ORDER BY id FOR {mode} SKIP LOCKED"
    )))
    .bind(ids)
    .fetch_all(&mut **tx)
    .await
}

/// `Ok(None)` when a lock was not granted in time (SQLSTATE 55P03), else the result.
///
/// # Errors
/// Any other database error.
pub fn busy_or<T>(result: Result<T, sqlx::Error>) -> Result<Option<T>, sqlx::Error> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => Ok(None),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pf2_owner_transactions_approach_their_target_and_stay_within_bounds() {
        let timed = Chunks::Timed {
            first: 50,
            most: 500,
            target: Duration::from_millis(50),
        };
        let ms = Duration::from_millis;
        assert_eq!(timed.first(), 50);
        // Too slow: halved at most; far too slow: still halved, never below one.
        assert_eq!(timed.next(100, ms(75)), 66);
        assert_eq!(timed.next(100, ms(5000)), 50);
        assert_eq!(timed.next(1, ms(5000)), 1);
        // Fast: doubled at most, never past the most.
        assert_eq!(timed.next(100, ms(40)), 125);
        assert_eq!(timed.next(100, ms(1)), 200);
        assert_eq!(timed.next(400, ms(1)), 500);
        // Fixed chunks are what they say, and never empty.
        assert_eq!(Chunks::Fixed(0).first(), 1);
        assert_eq!(Chunks::Fixed(7).next(7, ms(9000)), 7);
    }
}
