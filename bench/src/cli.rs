//! The command line: which parts run, at what sizes, against which builds. The method each flag
//! changes is described in docs/benchmark.md.

use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    about = "The performance benchmark of SPEC §8 (run by bench/run.sh, never by the tests)",
    args_override_self = true
)]
pub struct Cli {
    /// Measure these parts only (a comma-separated list), keeping the other parts' figures in
    /// the results files.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Write latest.md anew from latest.json, measuring nothing.
    #[arg(long)]
    pub render: bool,
    /// The sexton binary (a release build): the build measured, the "after" of a comparison.
    #[arg(long, default_value = "target/release/sexton")]
    pub sexton: PathBuf,
    /// An earlier sexton binary (built from its own commit), the "before": every sexton method
    /// also runs pair by pair, the two builds alternately on identical copies.
    #[arg(long, alias = "tenant-baseline")]
    pub baseline_sexton: Option<PathBuf>,
    /// The scales' methods: rounds of each at every scale up to `--scale-rounds-upto`, the
    /// methods taking turns; each method's row is its median round (a pass of a second or two
    /// moves by a fifth from run to run).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub scale_rounds: u32,
    /// The largest scale run in rounds (`--scale-rounds`); larger ones run once.
    #[arg(long, default_value_t = 10)]
    pub scale_rounds_upto: u64,
    /// Pairs of (before, after) runs per sexton method, with `--baseline-sexton`.
    #[arg(long, default_value_t = 5)]
    pub pairs: u32,
    /// Seed scales to measure (`sexton seed --scale`).
    #[arg(long, value_delimiter = ',', default_value = "1,10,400")]
    pub scales: Vec<u64>,
    /// Application writer transactions per second.
    #[arg(long, default_value_t = 50)]
    pub writer_rate: u32,
    /// How long the writer's idle baseline runs.
    #[arg(long, default_value_t = 10)]
    pub baseline_seconds: u64,
    /// The scales and run traces: measure these methods only, by their names in the tables (a
    /// comma-separated list: `--methods sexton,raw+markers+files`); all of them when not given.
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// Where the markdown table and JSON go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Scratch directory for the file roots.
    #[arg(long, default_value = "/tmp/sexton-bench")]
    pub scratch: PathBuf,
    /// Short-lived records: expired rows of each table (a tenth as many young ones stay).
    #[arg(long, default_value_t = 1_000_000)]
    pub expiry_rows: u64,
    /// Short-lived records: rows per batch, for sexton (`expiry.batch_size`) and the raw delete.
    #[arg(long, default_value_t = 2000)]
    pub expiry_batch: u32,
    /// Run traces: the trees' sizes in files (a hundred per agent directory).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    pub trace_files: Vec<u64>,
    /// Run traces: the age limit in days, sexton's `max_age_days` and `find -mtime +N`.
    #[arg(long, default_value_t = 60)]
    pub trace_age_days: u32,
    /// Run traces: rounds of every method at each tree up to `--trace-rounds-upto` files, the
    /// methods taking turns; each method's row is its median round (at 10 k objects one round
    /// of the object store's methods moves by a tenth).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub trace_rounds: u32,
    /// The largest tree run in rounds (`--trace-rounds`); larger ones run once.
    #[arg(long, default_value_t = 10_000)]
    pub trace_rounds_upto: u64,
    /// Run traces: bodies of the signature line alone (one 4 KiB block per file).
    #[arg(long)]
    pub trace_small: bool,
    /// Run traces: the agents table holds only the agents with live sessions.
    #[arg(long)]
    pub trace_live_agents_only: bool,
    /// Attachment bytes: rows, each with a file (half of them past the age).
    #[arg(long, default_value_t = 100_000)]
    pub attachment_rows: u64,
    /// Attachment bytes: accounts the rows are spread over.
    #[arg(long, default_value_t = 4)]
    pub attachment_accounts: u32,
    /// Attachment bytes: rounds of every method, the methods taking turns; each method's time
    /// is its median round (at 10 k rows one round of the object store's methods moves by a
    /// third with the machine's other work).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub attachment_rounds: u32,
    /// Many accounts (PF-5): the account counts of this build's nights (none when given no
    /// value).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "10000,100000,1000000")]
    pub tenant_accounts: Vec<u64>,
    /// Many accounts: how many of them hold the same small backlog, at every size.
    #[arg(long, default_value_t = 10_000)]
    pub tenant_due: u64,
    /// Many accounts: the account counts of the nights run pair by pair with
    /// `--baseline-sexton`.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    pub tenant_baseline_accounts: Vec<u64>,
    /// Many accounts: keep each night's database, and the last night's file roots, instead of
    /// dropping them: for a look afterwards, on a cluster that outlives the bench (run.sh's is
    /// thrown away when it ends).
    #[arg(long)]
    pub tenant_keep: bool,
    /// Erasure (PF-8): runs of the erased account, each with its execution detail.
    #[arg(long, default_value_t = 100_000)]
    pub erasure_runs: u64,
    /// Erasure: rounds of sexton's erasure and the floor, taking turns; each side's row is its
    /// median round (one round of either moved by a fifth from run to run).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub erasure_rounds: u32,
    /// Erasure: sessions of the erased account, each with its history and an archive.
    #[arg(long, default_value_t = 5_000)]
    pub erasure_sessions: u64,
    /// Erasure: files of the erased account (half outputs, a quarter session frames, 15 %
    /// attachments, the rest traces).
    #[arg(long, default_value_t = 10_000)]
    pub erasure_files: u64,
    /// Erasure: other accounts, each with a small backlog, whose nightly pass runs alone and
    /// beside the erasure.
    #[arg(long, default_value_t = 1_000)]
    pub erasure_others: u64,
    /// Files no row owns (DC-4): the outputs trees' sizes in files, a tenth of them orphans.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    pub orphan_files: Vec<u64>,
    /// Files no row owns: the tree's size in objects on the object store, when there is one.
    #[arg(long, default_value_t = 100_000)]
    pub orphan_objects: u64,
    /// Files no row owns: rounds of every method on each tree, the methods taking turns; each
    /// method's time is its median round (the store's and the disk's pace drift over minutes).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub orphan_rounds: u32,
    /// Run traces and attachment bytes: start each method after a walk of its tree instead of
    /// dropping the page cache.
    #[arg(long)]
    pub warm: bool,
    /// Attachment bytes and run traces also on an S3-compatible server at this endpoint.
    #[arg(long, requires = "s3_dir")]
    pub s3_endpoint: Option<String>,
    /// The directory the `--s3-endpoint` server keeps its buckets in.
    #[arg(long)]
    pub s3_dir: Option<PathBuf>,
    /// Requests in flight at once on the object store, for sexton (`[storage] max_in_flight`)
    /// and for the floors alike (PF-7).
    #[arg(long, default_value_t = sexton_jobs::files::object::DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Run traces on the object store once more behind a proxy that answers `503 SlowDown`
    /// above this many requests a second (PF-7).
    #[arg(long, default_value_t = 300)]
    pub s3_throttle_rate: u32,
    /// Keep each sexton worker's log (JSON lines) in this directory, one file per database.
    #[arg(long)]
    pub logs: Option<PathBuf>,
    /// The scales: active holds placed on each template, on scopes that hold nothing of the
    /// seed (HD-3's lookups alone differ). Needs a build with holds.
    #[arg(long, default_value_t = 0)]
    pub holds: u32,
}

impl Cli {
    /// Whether part `name` runs: `--only` names it, or names none.
    pub fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|part| part == name)
    }

    /// Whether this run measures the scales too: a part's figures then come from the same run
    /// as theirs.
    pub fn with_scales(&self) -> bool {
        self.runs("scales")
    }

    /// Rounds of each of the scales' methods at `scale` (`--scale-rounds` up to
    /// `--scale-rounds-upto`, one above).
    pub fn scale_rounds_at(&self, scale: u64) -> u32 {
        rounds_upto(self.scale_rounds, self.scale_rounds_upto, scale)
    }

    /// Rounds of each run-traces method on a tree of `files` (`--trace-rounds` up to
    /// `--trace-rounds-upto`, one above).
    pub fn trace_rounds_at(&self, files: u64) -> u32 {
        rounds_upto(self.trace_rounds, self.trace_rounds_upto, files)
    }
}

/// `rounds` at a size up to `upto`, one above it.
fn rounds_upto(rounds: u32, upto: u64, size: u64) -> u32 {
    if size <= upto { rounds } else { 1 }
}
