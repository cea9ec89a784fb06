//! `sexton seed`: deterministic, realistic synthetic platform data over every table of SPEC §1,
//! with the files on disk that rows point at — for demos, tests and benchmarks.
//!
//! The same `--seed` and `--now` give the same rows and files. Volume grows linearly with the
//! scale: one unit is four accounts' worth of conversations (about 2,500 runs with ~40,000
//! execution-detail rows), agents, sessions and files. Rows go in with `COPY`, a batch of
//! conversations per transaction; files are written by background threads meanwhile.
//!
//! A role that may set `session_replication_role` (a superuser, or one granted `SET` on it)
//! writes [`LANES`] batches at once, each on its own connection, with foreign-key checks and
//! triggers off for the batch's transaction: the rows reference each other correctly by
//! construction (a checked seed writes the same rows: see the seed tests), and a database's
//! work on one batch — index entries, each `COPY`'s round trips — overlaps the next. Any other
//! role, or `--checked`, writes one batch at a time, every row checked. An unchecked seed that
//! fails midway may leave a later batch without an earlier one it references: the database is
//! then to be recreated (the seed is for throw-away databases; it refuses one holding accounts
//! unless `--force`).
//!
//! One module per domain, each holding the edge cases its jobs must meet:
//! - `accounts`: retention settings (EX-1, SS-1) and per-account files;
//! - `conversations`: forks, turns, regenerated variants, delegations, history requests and
//!   follow-ups;
//! - `runs`: a run's times and status (EX-2), its execution detail (EX-3) and what holds it
//!   back (EX-5);
//! - `agents`: agents and sessions of every kind and state, their history and archives
//!   (SS-3, SS-4, SS-6);
//! - `records`: short-lived records and files (TR, AT and TTL rules);
//! - `tables`, `random` and `files`: where rows, draws and files go.

mod accounts;
mod agents;
mod conversations;
mod copy;
mod files;
mod random;
mod records;
mod runs;
mod tables;

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::PgPool;
use tokio::task::JoinSet;

use self::accounts::Account;
use self::files::Disk;
use self::random::Random;
use self::tables::Tables;
use crate::config::PathSettings;

/// Conversations per scale unit.
const CONVERSATIONS_PER_SCALE: u64 = 400;
/// Conversations written per transaction.
const BATCH: u64 = 1000;
/// Batches written at once when foreign-key checks may be skipped.
const LANES: usize = 4;
/// Conversations per agent (agents, sessions and their records follow the conversation volume).
const CONVERSATIONS_PER_AGENT: u64 = 20;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SeedOptions {
    pub scale: u64,
    pub seed: u64,
    /// The moment the data is generated relative to: ages are measured back from it.
    pub now: DateTime<Utc>,
    pub show_progress: bool,
    /// Every row checked by its foreign keys and triggers, one batch at a time, even when the
    /// role could skip them.
    pub checked: bool,
}

/// What was generated.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SeedReport {
    pub accounts: u64,
    pub conversations: u64,
    pub runs: u64,
    pub rows: u64,
    pub files: u64,
    pub file_bytes: u64,
}

/// Why seeding failed.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("writing {table}: {source}")]
    Copy {
        table: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("writing file {}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Accounts for a scale: four at scale 1, then one more for every five units.
pub fn account_count(scale: u64) -> u64 {
    4 + scale.saturating_sub(1) / 5
}

/// Generates and writes everything.
///
/// # Errors
/// [`SeedError`] naming the table or file that could not be written.
pub async fn seed(
    pool: &PgPool,
    paths: &PathSettings,
    options: &SeedOptions,
) -> Result<SeedReport, SeedError> {
    let mut generator = Generator::new(paths, options);
    let conversations = options.scale.max(1) * CONVERSATIONS_PER_SCALE;
    let progress = if options.show_progress {
        ProgressBar::new(conversations)
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template(
            "seeding {bar:40} {pos}/{len} conversations ({per_sec}, eta {eta})",
        )
        .expect("a valid progress template"),
    );

    generator.serials = Serials::after(pool).await?;
    let mut lanes = Lanes::open(pool, options.checked).await?;
    generator.accounts(account_count(options.scale));
    lanes.write(generator.take_rows()).await?;
    // Every later batch hangs off the accounts: they are in before any other batch starts.
    lanes.wait().await?;

    let mut done = 0;
    while done < conversations {
        let n = BATCH.min(conversations - done);
        for i in done..done + n {
            generator.conversation(i)?;
            if i % CONVERSATIONS_PER_AGENT == 0 {
                generator.agent(i / CONVERSATIONS_PER_AGENT)?;
            }
        }
        // The sequences move past the ids a batch holds before it is written.
        generator.serials.catch_up(pool).await?;
        lanes.write(generator.take_rows()).await?;
        done += n;
        progress.inc(n);
    }
    generator.account_files()?;
    lanes.wait().await?;
    generator.report.rows = lanes.rows;
    generator.disk.finish()?;
    progress.finish_and_clear();
    Ok(generator.report())
}

/// The ids of the tables whose ids a sequence gives: the seed gives them itself, in generation
/// order — batches written side by side would otherwise draw them in whatever order they land,
/// and the same seed would not write the same rows.
#[derive(Default)]
struct Serials {
    event: i64,
    entry: i64,
}

impl Serials {
    /// After the highest id already given: the highest row's, or the sequence's if rows were
    /// deleted since.
    async fn after(pool: &PgPool) -> Result<Self, SeedError> {
        let highest = |table: &str| {
            format!(
                "(SELECT greatest(max(id), pg_sequence_last_value( \
                     pg_get_serial_sequence('{table}', 'id')::regclass), 0) FROM {table})"
            )
        };
        let (event, entry) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {}, {}",
            highest("conversation_events"),
            highest("conversation_entries")
        )))
        .fetch_one(pool)
        .await?;
        Ok(Self { event, entry })
    }

    fn next_event(&mut self) -> i64 {
        self.event += 1;
        self.event
    }

    fn next_entry(&mut self) -> i64 {
        self.entry += 1;
        self.entry
    }

    /// Moves each sequence past the ids given so far (never back), for the application's next
    /// rows.
    async fn catch_up(&self, pool: &PgPool) -> Result<(), SeedError> {
        for (table, given) in [
            ("conversation_events", self.event),
            ("conversation_entries", self.entry),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT setval(pg_get_serial_sequence('{table}', 'id'), $1) \
                 WHERE $1 > coalesce(pg_sequence_last_value( \
                     pg_get_serial_sequence('{table}', 'id')::regclass), 0)"
            )))
            .bind(given)
            .execute(pool)
            .await?;
        }
        Ok(())
    }
}

/// Batches of rows on their way to the database: one at a time, checked, or up to [`LANES`]
/// at once, unchecked.
struct Lanes {
    pool: PgPool,
    unchecked: bool,
    writing: JoinSet<Result<u64, SeedError>>,
    rows: u64,
}

impl Lanes {
    /// Lanes on `pool`, unchecked unless `checked` or the role may not skip the checks.
    async fn open(pool: &PgPool, checked: bool) -> Result<Self, SeedError> {
        let unchecked = !checked && may_skip_checks(pool).await?;
        Ok(Self {
            pool: pool.clone(),
            unchecked,
            writing: JoinSet::new(),
            rows: 0,
        })
    }

    /// Starts writing `tables` in a transaction of their own, once a lane is free.
    async fn write(&mut self, tables: Tables) -> Result<(), SeedError> {
        let lanes = if self.unchecked { LANES } else { 1 };
        while self.writing.len() >= lanes {
            self.join_one().await?;
        }
        let (pool, unchecked) = (self.pool.clone(), self.unchecked);
        self.writing
            .spawn(async move { write_batch(&pool, tables, unchecked).await });
        Ok(())
    }

    /// Waits for every batch started so far.
    async fn wait(&mut self) -> Result<(), SeedError> {
        while !self.writing.is_empty() {
            self.join_one().await?;
        }
        Ok(())
    }

    async fn join_one(&mut self) -> Result<(), SeedError> {
        if let Some(written) = self.writing.join_next().await {
            self.rows += written.expect("a batch writer does not panic")?;
        }
        Ok(())
    }
}

/// Whether this role may turn foreign-key checks and triggers off for its transactions.
async fn may_skip_checks(pool: &PgPool) -> Result<bool, SeedError> {
    let mut tx = pool.begin().await?;
    match sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
    {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Copies every table of one batch, parents first, in one transaction.
async fn write_batch(pool: &PgPool, mut tables: Tables, unchecked: bool) -> Result<u64, SeedError> {
    let mut tx = pool.begin().await?;
    if unchecked {
        sqlx::query("SET LOCAL session_replication_role = replica")
            .execute(&mut *tx)
            .await?;
    }
    let mut rows = 0;
    for table in tables.in_order() {
        let name = table.table();
        rows += table
            .flush(&mut tx)
            .await
            .map_err(|source| SeedError::Copy {
                table: name,
                source,
            })?;
    }
    tx.commit().await?;
    Ok(rows)
}

/// Everything generated so far and not yet written, and what later records refer back to.
struct Generator<'a> {
    rng: Random,
    now: DateTime<Utc>,
    disk: Disk<'a>,
    accounts: Vec<Account>,
    report: SeedReport,
    t: Tables,
    serials: Serials,
}

impl<'a> Generator<'a> {
    fn new(paths: &'a PathSettings, options: &SeedOptions) -> Self {
        Self {
            rng: Random::new(options.seed, options.now),
            now: options.now,
            disk: Disk::new(paths),
            accounts: Vec::new(),
            report: SeedReport::default(),
            t: Tables::new(),
            serials: Serials::default(),
        }
    }

    /// The rows generated since the last call.
    fn take_rows(&mut self) -> Tables {
        std::mem::replace(&mut self.t, Tables::new())
    }

    fn report(&self) -> SeedReport {
        SeedReport {
            files: self.disk.files(),
            file_bytes: self.disk.bytes(),
            ..self.report.clone()
        }
    }
}
