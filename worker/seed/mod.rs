//! `sexton seed`: deterministic, realistic synthetic platform data over every table of SPEC §1,
//! with the files on disk that rows point at — for demos, tests and benchmarks.
//!
//! The same `--seed` and `--now` give the same rows and files. Volume grows linearly with the
//! scale: one unit is four accounts' worth of conversations (about 2,500 runs with ~40,000
//! execution-detail rows), agents, sessions and files. Rows go in with `COPY`, a batch of
//! conversations per transaction.
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

use self::accounts::Account;
use self::files::Disk;
use self::random::Random;
use self::tables::Tables;
use crate::config::PathSettings;

/// Conversations per scale unit.
const CONVERSATIONS_PER_SCALE: u64 = 400;
/// Conversations written per transaction.
const BATCH: u64 = 250;
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

    let mut tx = pool.begin().await?;
    generator.accounts(account_count(options.scale));
    generator.flush(&mut tx).await?;
    tx.commit().await?;

    let mut done = 0;
    while done < conversations {
        let n = BATCH.min(conversations - done);
        for i in done..done + n {
            generator.conversation(i)?;
            if i % CONVERSATIONS_PER_AGENT == 0 {
                generator.agent(i / CONVERSATIONS_PER_AGENT)?;
            }
        }
        let mut tx = pool.begin().await?;
        generator.flush(&mut tx).await?;
        tx.commit().await?;
        done += n;
        progress.inc(n);
    }
    generator.account_files()?;
    progress.finish_and_clear();
    Ok(generator.report())
}

/// Everything generated so far and not yet written, and what later records refer back to.
struct Generator<'a> {
    rng: Random,
    now: DateTime<Utc>,
    disk: Disk<'a>,
    accounts: Vec<Account>,
    report: SeedReport,
    t: Tables,
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
        }
    }

    /// Copies every buffered row, parents first, and empties the buffers.
    async fn flush(&mut self, conn: &mut sqlx::PgConnection) -> Result<(), SeedError> {
        for table in self.t.in_order() {
            let name = table.table();
            self.report.rows += table.flush(conn).await.map_err(|source| SeedError::Copy {
                table: name,
                source,
            })?;
        }
        Ok(())
    }

    fn report(&self) -> SeedReport {
        SeedReport {
            files: self.disk.files(),
            file_bytes: self.disk.bytes(),
            ..self.report.clone()
        }
    }
}
