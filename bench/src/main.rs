//! The benchmark of SPEC §8, run by a person with `bash bench/run.sh` (never by the tests).
//!
//! For each scale it seeds one template database with `sexton seed`, then on identical copies
//! (`CREATE DATABASE … TEMPLATE`) removes the detail of exactly the same owners in several ways —
//! sexton (tick and a worker through the queue, default settings but every other age-driven job
//! kind off, so that it measures the job alone; timed from the worker taking the nightly slot to
//! its last hop), the raw floor (batched `DELETE … WHERE run_id = ANY($1)`, 500 owners per
//! transaction, no checks), the same floor setting the markers sexton's end state has
//! (`raw+markers`), that floor also unlinking the owners' output files after each batch commits,
//! beside the next batch (`raw+markers+files`: sexton's whole end state, disk included; both are
//! checked to leave none of the owners' unreferenced files on disk), that floor under the
//! platform's lock order (`+locks`) and keeping every rule sexton's owner transaction keeps
//! (`+rules`: sexton's own owner statement in the same plain loop, what the rules cost timed
//! alone), and the naive delete (one `DELETE` per table over all owners) — while an application
//! writer runs at a fixed rate. Each method's WAL is read from the cluster's position before and
//! after it. At one scale (the largest up to 10) sexton runs once more under a WAL budget, a
//! quarter of the rate its unbudgeted pass wrote at. It prints a markdown table, a summary of the
//! PF targets against the same run's figures, and writes them, with the raw figures as JSON, to
//! `bench/results/`. The default scales are 1, 10 and 400 (about a million runs).
//!
//! The short-lived records (SPEC §4, TTL-1 and TTL-4) have their own part: a template with a
//! large backlog of expired handoffs and conversation events (`INSERT … SELECT` from
//! `generate_series`, no seed), expired by a sexton pass and by a raw batched
//! `DELETE … WHERE id = ANY($1)` on identical copies, with an application writer beside each.
//! `--only expiry` measures that part alone and merges it into the existing results.
//!
//! The file-side jobs have two more parts (their own modules): run traces (`--only traces`,
//! `sexton traces clean` against `find … -delete` on trees of up to a million files, with peak
//! RSS) and attachment bytes (`--only attachments`, a pass through the queue against a plain
//! stat-and-unlink loop). `--only` takes a list: `--only traces,attachments`.
//!
//! Here: the command line, and the parts run in that order, each its own module ([`scales`],
//! [`expiry`], [`traces`], [`attachments`], [`tenants`]), on what they share: [`sexton`] runs the
//! binary and times a pass, [`writer`] and [`sampler`] run beside each method, [`method`] holds
//! its figures, [`cluster`] the databases and the WAL position, [`disk`] the file parts' trees,
//! caches and timed processes, and [`results`] writes latest.json and latest.md.

mod attachments;
mod cluster;
mod disk;
mod expiry;
mod method;
mod objects;
mod results;
mod sampler;
mod scales;
mod sexton;
mod tenants;
mod traces;
mod writer;

use std::path::PathBuf;

use clap::Parser;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::results::{Section, write_results};

#[derive(Debug, Parser)]
struct Cli {
    /// Seed scales to measure (`sexton seed --scale`).
    #[arg(long, value_delimiter = ',', default_value = "1,10,400")]
    scales: Vec<u64>,
    /// The sexton binary (a release build).
    #[arg(long, default_value = "target/release/sexton")]
    sexton: PathBuf,
    /// Application writer transactions per second.
    #[arg(long, default_value_t = 50)]
    writer_rate: u32,
    /// How long the writer's idle baseline runs.
    #[arg(long, default_value_t = 10)]
    baseline_seconds: u64,
    /// The scales: measure these methods only, by their names in the tables (a comma-separated
    /// list: `--methods sexton,raw+markers+files`); all of them when not given. A shorter side
    /// by side, e.g. of two builds at scale 400.
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
    /// Where the markdown table and JSON go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Scratch directory for the file roots.
    #[arg(long, default_value = "/tmp/sexton-bench")]
    scratch: PathBuf,
    /// Measure these parts only (a comma-separated list), keeping the other parts' figures in
    /// the results files.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Short-lived records: expired rows of each table (handoffs, conversation events); a tenth
    /// as many young ones stay.
    #[arg(long, default_value_t = 1_000_000)]
    expiry_rows: u64,
    /// Short-lived records: rows per batch, for sexton (`expiry.batch_size`) and the raw delete.
    #[arg(long, default_value_t = 2000)]
    expiry_batch: u32,
    /// Run traces: the trees' sizes in files (a hundred per agent directory).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    trace_files: Vec<u64>,
    /// Run traces: the age limit in days, sexton's `max_age_days` and `find -mtime +N`.
    #[arg(long, default_value_t = 60)]
    trace_age_days: u32,
    /// Run traces: bodies of the signature line alone (less written; still a block per file on
    /// a file system of 4 KiB blocks, against one or two).
    #[arg(long)]
    trace_small: bool,
    /// Run traces: the agents table holds only the agents with live sessions, not one row per
    /// directory (to tell the live-session check's cost from the walk's).
    #[arg(long)]
    trace_live_agents_only: bool,
    /// Attachment bytes: rows, each with a file (half of them past the age).
    #[arg(long, default_value_t = 100_000)]
    attachment_rows: u64,
    /// Attachment bytes: accounts the rows are spread over.
    #[arg(long, default_value_t = 4)]
    attachment_accounts: u32,
    /// Many accounts (PF-5): the account counts of the nights measured with this build (none
    /// when given no value: the baseline's nights alone).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "10000,100000,1000000")]
    tenant_accounts: Vec<u64>,
    /// Many accounts: how many of them hold the same small backlog, at every size.
    #[arg(long, default_value_t = 10_000)]
    tenant_due: u64,
    /// Many accounts: an earlier sexton binary (built from its own commit) to run the same
    /// nights with, beside this build's.
    #[arg(long)]
    tenant_baseline: Option<PathBuf>,
    /// Many accounts: the account counts of the earlier binary's nights.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    tenant_baseline_accounts: Vec<u64>,
    /// Run traces and attachment bytes: start each method after a walk of its tree instead of
    /// dropping the page cache (what the file system costs, told from what the method does).
    #[arg(long)]
    warm: bool,
    /// Attachment bytes and run traces also on an S3-compatible server at this endpoint
    /// (bench/run.sh starts s3s-fs on loopback and passes it), whose buckets are the
    /// directories of `--s3-dir`.
    #[arg(long, requires = "s3_dir")]
    s3_endpoint: Option<String>,
    /// The directory the `--s3-endpoint` server keeps its buckets in.
    #[arg(long)]
    s3_dir: Option<PathBuf>,
    /// Keep each sexton worker's log (JSON lines) in this directory, one file per method's
    /// database, to read its timeline afterwards.
    #[arg(long)]
    logs: Option<PathBuf>,
    /// The scales: active holds placed on each template (spread over the five scope kinds, on
    /// scopes that hold nothing of the seed, so that every method does the same work and the
    /// holds' lookups alone differ, HD-3). Needs a build with holds.
    #[arg(long, default_value_t = 0)]
    holds: u32,
}

/// The parts of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// PruneExecutionDetails and SessionRetention at each seed scale.
    Scales,
    /// The short-lived records' expiry jobs (handoffs, conversation events).
    Expiry,
    /// Run traces: `sexton traces clean` against `find -delete`, by age and by quota.
    Traces,
    /// Attachment bytes: `attachment_expiry` through the queue against a plain loop.
    Attachments,
    /// Many accounts, the same due work: the whole night and the operator's views (PF-5).
    Tenants,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    scales::check_methods(&cli)?;
    let base = PgConnectOptions::new();
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(base.clone())
        .await?;
    let runs = |part| cli.only.is_empty() || cli.only.contains(&part);
    if runs(Part::Scales) {
        let mut results = Vec::new();
        for &scale in &cli.scales {
            results.push(scales::measure(&cli, &admin, &base, scale).await?);
            write_results(&cli, Section::Scales(&results))?;
        }
        println!("{}", scales::markdown(&results));
    }
    if runs(Part::Expiry) {
        let expiry = expiry::measure(&cli, &admin, &base).await?;
        write_results(&cli, Section::Expiry(&expiry))?;
        println!("{}", expiry::markdown(&expiry));
    }
    if runs(Part::Traces) {
        traces::measure(&cli, &admin, &base).await?;
    }
    if runs(Part::Attachments) {
        attachments::measure(&cli, &admin, &base).await?;
    }
    if runs(Part::Tenants) {
        tenants::measure(&cli, &admin, &base).await?;
    }
    Ok(())
}
