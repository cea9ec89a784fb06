//! One account's passes run in-process against the test's database: PruneExecutionDetails hops
//! with small limits, file roots in a temp dir, and the clock the test controls.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::clock::ManualClock;
use sexton_jobs::files::{PathSettings, Root, Store};
use sexton_jobs::health::Health;
use sexton_jobs::prune_execution_details::{
    self as job, Args, HopSettings, PruneExecutionDetails, RetainReason,
};
use sqlx::PgPool;
use uuid::Uuid;

use super::fixture::{self, RunSpec, pass_start};

/// What one hop of PruneExecutionDetails did, and where its pass goes on.
pub type Hopped = super::run::Hopped<PruneExecutionDetails>;

pub struct Env {
    pub pool: PgPool,
    /// Holds the file roots for as long as the test runs.
    pub dir: tempfile::TempDir,
    pub clock: ManualClock,
    pub settings: HopSettings,
}

impl Env {
    pub async fn new(pool: PgPool) -> Self {
        super::migrate(&pool).await;
        let dir = super::backend::tempdir();
        let outputs = dir.path().join("outputs");
        let settings = HopSettings {
            window_size: 500,
            owners_per_transaction: 50,
            transaction_target: Duration::from_millis(50),
            budget: Duration::from_secs(600),
            owner_lock_timeout: Duration::from_millis(200),
        };
        std::fs::create_dir_all(&outputs).unwrap();
        Self {
            pool,
            dir,
            clock: ManualClock::new(pass_start()),
            settings,
        }
    }

    /// The preview of `accounts` (every account when `None`) at `now`.
    pub async fn preview(
        &self,
        now: DateTime<Utc>,
        accounts: Option<&[Uuid]>,
    ) -> Vec<job::Preview> {
        super::run::preview::<job::PruneExecutionDetails>(
            &self.pool,
            &self.settings,
            self.dir.path(),
            now,
            accounts,
        )
        .await
    }

    /// Where the outputs' files are on disk (on the object backend, the server's files).
    pub fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("outputs")
    }

    /// Where the job finds the outputs.
    pub fn store(&self) -> Store {
        self.paths().store(Root::Outputs)
    }

    pub async fn run(&self, spec: RunSpec) -> fixture::Run {
        fixture::run(&self.pool, &self.root(), spec).await
    }

    /// The file roots the hops are given.
    pub fn paths(&self) -> PathSettings {
        super::backend::paths(self.dir.path())
    }

    /// One hop, as the worker would run it.
    ///
    /// # Errors
    /// What the hop failed with.
    pub async fn try_hop(&self, args: &Args) -> Result<Hopped, job::Error> {
        try_hop_at(&self.pool, &self.clock, &self.paths(), &self.settings, args).await
    }

    pub async fn hop(&self, args: &Args) -> Hopped {
        self.try_hop(args).await.unwrap()
    }

    /// One hop on a task of its own, for the cases where the test holds locks meanwhile.
    pub fn spawn_hop(&self, args: Args) -> tokio::task::JoinHandle<Hopped> {
        let (pool, clock, settings, paths) = (
            self.pool.clone(),
            self.clock.clone(),
            self.settings.clone(),
            self.paths(),
        );
        tokio::spawn(async move {
            try_hop_at(&pool, &clock, &paths, &settings, &args)
                .await
                .unwrap()
        })
    }

    /// A whole pass from `args`, hop after hop; returns every hop's report.
    pub async fn pass_from(&self, mut args: Args) -> Vec<Hopped> {
        let mut reports = Vec::new();
        loop {
            let hopped = self.hop(&args).await;
            let next = hopped.next.clone();
            reports.push(hopped);
            match next {
                Some(next) => args = next,
                None => return reports,
            }
        }
    }

    /// A whole nightly pass for one account at the fixtures' pass start.
    pub async fn pass(&self, account: Uuid) -> Vec<Hopped> {
        self.pass_from(Args::first(Some(account), pass_start()))
            .await
    }

    pub fn output_file(&self, account: Uuid, run: Uuid) -> std::path::PathBuf {
        self.root().join(format!("{account}/{run}/out.bin"))
    }
}

/// A completed conversation run at `completed_at`.
pub fn run_at(account: Uuid, conversation: Uuid, completed_at: DateTime<Utc>) -> RunSpec {
    RunSpec {
        completed_at: Some(completed_at),
        ..RunSpec::conversation(account, conversation, 0.0)
    }
}

/// How many owners the hops of `reports` retained for `reason`.
pub fn retained(reports: &[Hopped], reason: RetainReason) -> u64 {
    reports.iter().map(|r| r.retained(reason)).sum()
}

/// One hop at the time `clock` says, on a connection of `pool`.
///
/// # Errors
/// What the hop failed with.
pub async fn try_hop_at(
    pool: &PgPool,
    clock: &ManualClock,
    paths: &PathSettings,
    settings: &HopSettings,
    args: &Args,
) -> Result<Hopped, job::Error> {
    let health = Health::off();
    super::run::try_hop_at::<PruneExecutionDetails>(
        pool, clock, paths, &health, settings, args, false,
    )
    .await
}
