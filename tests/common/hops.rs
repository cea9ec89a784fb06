//! One account's passes run in-process against the test's database: PruneExecutionDetails hops
//! with small limits, file roots in a temp dir, and the clock the test controls.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sexton_jobs::clock::ManualClock;
use sexton_jobs::files::{Root, Store};
use sexton_jobs::prune_execution_details::{
    self as job, Args, HopReport, HopSettings, RetainReason,
};
use sqlx::PgPool;
use uuid::Uuid;

use super::fixture::{self, RunSpec, pass_start};

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
            outputs: super::backend::paths(dir.path()).store(Root::Outputs),
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
    pub fn store(&self) -> &Store {
        &self.settings.outputs
    }

    pub async fn run(&self, spec: RunSpec) -> fixture::Run {
        fixture::run(&self.pool, &self.root(), spec).await
    }

    /// One hop, as the worker would run it.
    ///
    /// # Errors
    /// What the hop failed with.
    pub async fn try_hop(&self, args: &Args) -> Result<HopReport, job::Error> {
        job::run(
            &self.pool,
            &self.clock,
            &self.settings,
            args,
            &AtomicBool::new(false),
        )
        .await
    }

    pub async fn hop(&self, args: &Args) -> HopReport {
        self.try_hop(args).await.unwrap()
    }

    /// One hop on a task of its own, for the cases where the test holds locks meanwhile.
    pub fn spawn_hop(&self, args: Args) -> tokio::task::JoinHandle<HopReport> {
        let (pool, clock, settings) =
            (self.pool.clone(), self.clock.clone(), self.settings.clone());
        tokio::spawn(async move {
            job::run(&pool, &clock, &settings, &args, &AtomicBool::new(false))
                .await
                .unwrap()
        })
    }

    /// A whole pass from `args`, hop after hop; returns every hop's report.
    pub async fn pass_from(&self, mut args: Args) -> Vec<HopReport> {
        let mut reports = Vec::new();
        loop {
            let report = self.hop(&args).await;
            let next = report.next.clone();
            reports.push(report);
            match next {
                Some(next) => args = next,
                None => return reports,
            }
        }
    }

    /// A whole nightly pass for one account at the fixtures' pass start.
    pub async fn pass(&self, account: Uuid) -> Vec<HopReport> {
        self.pass_from(Args::first(account, pass_start())).await
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
pub fn retained(reports: &[HopReport], reason: RetainReason) -> u32 {
    reports
        .iter()
        .map(|r| r.retained.get(&reason).copied().unwrap_or_default())
        .sum()
}
