//! sexton as the benchmark runs it: the moment every pass starts at, the binary's command and
//! environment (the file roots under a run's files), the job kinds switched off around the one
//! measured, and a timed pass through the queue ([`run_sexton`]): a tick, then one worker until
//! the queue is idle, its log followed for the pass's hops.

use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;

use crate::cli::Cli;
use crate::cluster::{connect, wal_position};
use crate::method::{Latency, Method, method};

/// The moment the data is seeded relative to and the pass starts at: in the past, so that the
/// database's now (which caps every cutoff, EX-1) never binds.
pub fn pass_start() -> DateTime<Utc> {
    "2026-11-01T03:00:00Z".parse().expect("a valid constant")
}

/// The file roots sexton is given (`[paths]`), each a directory under the run's files.
pub const ROOTS: [(&str, &str); 5] = [
    ("OUTPUT_ROOT", "outputs"),
    ("ATTACHMENTS_ROOT", "attachments"),
    ("ARTIFACTS_ROOT", "artifacts"),
    ("SESSIONS_ROOT", "sessions"),
    ("TRACES_ROOT", "traces"),
];

/// The environment of a sexton process on database `db` with file roots under `files`.
pub fn sexton_env(db: &str, files: &Path) -> Vec<(String, std::ffi::OsString)> {
    let mut env = vec![
        ("PGDATABASE".to_owned(), db.into()),
        // Health throttling off: autovacuum on the freshly loaded copies would pause
        // the pass, and the comparison is of the work itself.
        ("SEXTON_HEALTH__PAUSE_ON_VACUUM".to_owned(), "false".into()),
        (
            "SEXTON_HEALTH__MAX_REPLICATION_LAG_BYTES".to_owned(),
            "0".into(),
        ),
    ];
    for (setting, dir) in ROOTS {
        env.push((format!("SEXTON_PATHS__{setting}"), files.join(dir).into()));
    }
    env
}

/// A command of the sexton `binary` on database `db` with its file roots under `files`, its
/// output discarded.
pub fn sexton(binary: &Path, db: &str, files: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(binary);
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, files))
        .stdout(Stdio::null());
    cmd
}

/// The ages the expiry jobs read, as `SEXTON_EXPIRY__…` names them.
pub const EXPIRY_AGES: [&str; 4] = [
    "HANDOFFS_DAYS",
    "DREAM_PRELOADS_DAYS",
    "WORKING_RECORDS_DAYS",
    "CONVERSATION_EVENTS_DAYS",
];

/// Every other age-driven job kind switched off, so that a sexton method measures `job` alone
/// and on the CPU the other methods have (the seed holds expired records of every kind): the
/// expiry ages and the attachments' age at 0 but the measured job's (the caller's environment
/// sets an expiry age it measures). Sessions wait for their policies; traces are off by default.
pub fn alone(job: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = EXPIRY_AGES
        .iter()
        .map(|age| (format!("SEXTON_EXPIRY__{age}"), "0".to_owned()))
        .collect();
    if job != "attachment_expiry" {
        env.push((
            "SEXTON_ATTACHMENTS__MAX_AGE_DAYS".to_owned(),
            "0".to_owned(),
        ));
    }
    env
}

/// The job a run of sexton is timed by. A job per account runs one chain of hops per account,
/// up to `queue.concurrency` at once; a global job runs one chain, a hop at a time.
pub struct Pass {
    pub job: &'static str,
    pub global: bool,
}

/// A sexton pass as a method runs it: which build, under what name, how many hops at once
/// (`queue.concurrency`: the default is 2; 1 leaves the database more room), the job it is
/// timed by, and the worker's settings overridden (`SEXTON_…` variables).
pub struct Worker<'a> {
    pub binary: &'a Path,
    pub name: &'static str,
    pub concurrency: u32,
    pub pass: &'a Pass,
    pub env: &'a [(String, String)],
}

/// sexton as an operator runs it, on database `db` with its file roots under `files`: a tick
/// (the slot held a second, so that the worker has started when it takes it), then one worker
/// through the queue until idle, both of `worker.binary`. The pass is timed as a running fleet
/// sees it: from the worker taking the nightly slot (its fan-out line) to its last hop of
/// `pass.job` — neither the process start, nor its queue consumers registering and opening
/// their connections, nor the wait for an idle queue — and its WAL over the same span, read on
/// `admin`.
pub async fn run_sexton(
    cli: &Cli,
    admin: &PgPool,
    db: &str,
    files: &Path,
    worker: &Worker<'_>,
) -> anyhow::Result<Method> {
    let Worker {
        binary,
        name,
        concurrency,
        pass,
        env,
    } = *worker;
    let tick = sexton(
        binary,
        db,
        files,
        &["tick", "--at", &pass_start().to_rfc3339()],
    )
    .status()
    .await?;
    if !tick.success() {
        bail!("sexton tick failed");
    }
    // The slot waits a second, so that the worker has started when it takes it (its queue
    // consumers registered, its connections open), as a running fleet's idle worker has: a
    // worker's start would otherwise run beside the pass's first hundredths of a second.
    // Here a worker starts in 0.05–0.1 s.
    let queue = connect(&admin.connect_options(), db, "bench").await?;
    let held = sqlx::query(
        "UPDATE apalis.jobs SET run_at = now() + interval '1 second'
         WHERE job_type = 'sexton.nightly' AND status = 'Pending'",
    )
    .execute(&queue)
    .await?
    .rows_affected();
    queue.close().await;
    if held != 1 {
        bail!("the tick left {held} pending nightly slots to hold, where one was expected");
    }
    let log = match &cli.logs {
        Some(dir) => Some(std::io::BufWriter::new(std::fs::File::create(log_file(
            dir, db,
        )?)?)),
        None => None,
    };
    let mut child = tokio::process::Command::new("/usr/bin/time")
        .args(["-f", "max_rss_kb=%M"])
        .arg(binary)
        .args(["worker", "--exit-when-idle"])
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, files))
        .env("SEXTON_LOG__FORMAT", "json")
        .env("SEXTON_QUEUE__CONCURRENCY", concurrency.to_string())
        .envs(alone(pass.job))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("/usr/bin/time (Debian package time) runs the worker")?;
    let stderr = child.stderr.take().expect("piped");
    let timeline = Timeline::follow(admin, stderr, log, pass.job).await?;
    if !child.wait().await?.success() {
        bail!("the sexton worker failed");
    }
    // How many of this job's hops can run at once: a global job's pass is one chain.
    let lanes = if pass.global {
        1.0
    } else {
        f64::from(concurrency)
    };
    timeline.method(name, lanes)
}

/// The first free name for the log of a worker on `db` under `dir`: `db.log`, then `db.2.log`
/// and on (the two builds of a comparison run on copies of one name).
fn log_file(dir: &Path, db: &str) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut file = dir.join(format!("{db}.log"));
    let mut n = 1;
    while file.exists() {
        n += 1;
        file = dir.join(format!("{db}.{n}.log"));
    }
    Ok(file)
}

/// When the worker logged `event`, by its JSON log's timestamp.
fn logged_at(event: &serde_json::Value) -> Option<DateTime<Utc>> {
    event["timestamp"].as_str()?.parse().ok()
}

/// What a worker's log tells of its pass, as [`run_sexton`] follows it.
struct Timeline {
    /// The worker's start until it takes the nightly slot, then the pass's.
    started: Instant,
    /// The WAL position at the pass's start and at its last hop.
    wal_start: i64,
    wal_end: i64,
    /// The milliseconds of each hop with candidates, and its µs per candidate.
    hops: Vec<f64>,
    per_candidate: Vec<f64>,
    /// Seconds in the hops, and in their owner transactions, summed over every hop.
    hop_s: f64,
    owner_s: f64,
    /// When the worker logged taking the slot, and seconds from then to the start of its first
    /// hop (both by the log's own timestamps); seconds from the pass's start to the end of its
    /// last hop.
    slot_taken: Option<DateTime<Utc>>,
    first_hop: Option<f64>,
    last_hop: f64,
    rss: Option<u64>,
    start_seconds: Option<f64>,
}

impl Timeline {
    /// Follows the worker's `stderr` to its end for the hops of `job`, copying each line to
    /// `log`; the WAL positions are read on `admin`.
    async fn follow(
        admin: &PgPool,
        stderr: ChildStderr,
        mut log: Option<std::io::BufWriter<std::fs::File>>,
        job: &str,
    ) -> anyhow::Result<Self> {
        let (started, wal_start) = (Instant::now(), wal_position(admin).await?);
        let mut timeline = Self {
            started,
            wal_start,
            wal_end: wal_start,
            hops: Vec::new(),
            per_candidate: Vec::new(),
            hop_s: 0.0,
            owner_s: 0.0,
            slot_taken: None,
            first_hop: None,
            last_hop: 0.0,
            rss: None,
            start_seconds: None,
        };
        let mut lines = BufReader::new(stderr).lines();
        while let Some(line) = lines.next_line().await? {
            if let Some(log) = log.as_mut() {
                writeln!(log, "{line}")?;
            }
            timeline.read(admin, &line, job).await?;
        }
        Ok(timeline)
    }

    /// One line of the worker's stderr: GNU time's peak RSS, or an event of its JSON log.
    async fn read(&mut self, admin: &PgPool, line: &str, job: &str) -> anyhow::Result<()> {
        if let Some(kb) = line.strip_prefix("max_rss_kb=") {
            self.rss = kb.trim().parse().ok();
            return Ok(());
        }
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            return Ok(());
        };
        if event["message"] == "worker started" {
            self.started = Instant::now();
        }
        if event["message"] == "fanning out nightly slot" {
            self.start_seconds = Some(self.started.elapsed().as_secs_f64());
            self.started = Instant::now();
            self.slot_taken = logged_at(&event);
            self.wal_start = wal_position(admin).await?;
        }
        if event["message"] == "hop done" && event["span"]["job"] == job {
            let ms = event["elapsed_ms"].as_f64().unwrap_or(0.0);
            let candidates = event["candidates"].as_f64().unwrap_or(0.0);
            if candidates > 0.0 {
                self.hops.push(ms);
                self.per_candidate.push(ms * 1000.0 / candidates);
            }
            self.last_hop = self.started.elapsed().as_secs_f64();
            if let (Some(taken), Some(done)) = (self.slot_taken, logged_at(&event)) {
                let began = (done - taken).as_seconds_f64() - ms / 1000.0;
                self.first_hop = Some(self.first_hop.map_or(began, |first| first.min(began)));
            }
            self.wal_end = wal_position(admin).await?;
            self.hop_s += ms / 1000.0;
            self.owner_s += event["owner_ms"].as_f64().unwrap_or(0.0) / 1000.0;
        }
        Ok(())
    }

    /// The pass's figures as method `name`, its hops spread over `lanes`; an error if the
    /// worker never logged taking the nightly slot, where the pass's time starts.
    fn method(self, name: &'static str, lanes: f64) -> anyhow::Result<Method> {
        let Some(start_seconds) = self.start_seconds else {
            bail!("the worker never logged \"fanning out nightly slot\": the pass has no start");
        };
        let wall = self.last_hop;
        let mut m = method(name);
        m.seconds = wall;
        m.start_seconds = Some(start_seconds);
        m.first_hop_seconds = self.first_hop;
        m.hop = Some(Latency::of(self.hops));
        m.hop_us_per_candidate = Some(Latency::of(self.per_candidate));
        m.peak_rss_kb = self.rss;
        m.share_outside_owner_transactions = Some(1.0 - self.owner_s / (wall * lanes));
        m.share_outside_hops = Some(1.0 - self.hop_s / (wall * lanes));
        m.wal_bytes = Some(self.wal_end - self.wal_start);
        Ok(m)
    }
}
