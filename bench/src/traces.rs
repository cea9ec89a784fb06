//! Run traces (SPEC §4, TR-1 … TR-4): `sexton traces clean --confirm` against
//! `find ROOT -name '*.trace.jsonl' -mtime +N -delete` and against the walks that reach sexton's
//! end state, on identical trees of 10 k, 100 k and 1 M files, and sexton with a quota that
//! sends about half of them, each with its peak RSS; on the object store too, when there is one;
//! with `--baseline-sexton`, sexton's methods once more pair by pair with the earlier build.
//! Every method gets its own tree, written afresh ([`tree`]), and its end state is checked
//! against what its rule says, entry by entry.

mod markdown;
mod methods;
mod scratch;
mod tree;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgConnectOptions;

use self::methods::{OnTree, Run, run_method};
use self::scratch::Scratch;
use self::tree::{Agent, DAY_NS, Kind, Tree, add_agents, check, generate, goes};
use crate::cli::Cli;
use crate::cluster::drop_db;
use crate::compare::{self, Comparison, Side};
use crate::disk;
use crate::method::Rounds;
use crate::objects::Server;
use crate::part::Bench;
use crate::results::{machine, member};

/// The object-store methods run on trees of at most this many files: s3s-fs answers every page
/// of a listing by walking and sorting its whole bucket (s3s-fs 0.14 `list_objects_v2`), so a
/// listing of a million keys costs a thousand walks of a million files and times out — a
/// measure of the test server, not of sexton.
const S3_MAX_FILES: u64 = 100_000;

/// The methods, in the order they run on each size; the `… s3` ones only with an object store.
pub const METHODS: [&str; 9] = [
    "sexton age",
    "walk+sig age",
    "walk+every-sig age",
    "find age",
    "sexton quota",
    "sexton age s3",
    "list+sig s3",
    "list-delete s3",
    "sexton age throttled s3",
];

/// The part: every size of `--trace-files`, each written into the results as it is done.
pub fn run<'a>(bench: &'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>> {
    Box::pin(async move {
        let cli = bench.cli;
        let mut traces = Traces {
            measured_at: Utc::now(),
            machine: machine(),
            separate_run: !cli.with_scales(),
            cache: String::new(),
            load_average: String::new(),
            age_days: cli.trace_age_days,
            small_bodies: cli.trace_small,
            agent_rows: if cli.trace_live_agents_only {
                "only the agents with live sessions"
            } else {
                "one per directory"
            }
            .to_owned(),
            scales: Vec::new(),
            rss_ratio_age: None,
            rss_ratio_quota: None,
            before_after: Vec::new(),
        };
        let load_before = disk::load_average();
        for &files in &cli.trace_files {
            let (scale, dropped, compared) = measure_scale(bench, files).await?;
            traces.cache = disk::cache_state(dropped).to_owned();
            traces.load_average = format!("{load_before} / {}", disk::load_average());
            traces.scales.push(scale);
            traces.rss_ratio_age = rss_ratio(&traces.scales, "sexton age");
            traces.rss_ratio_quota = rss_ratio(&traces.scales, "sexton quota");
            traces.before_after.extend(compared);
            bench.report.write(&[("traces", member(&traces)?)])?;
        }
        Ok(traces.before_after)
    })
}

/// The part's section of latest.md, from latest.json's `traces`.
pub fn render(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
    let Some(traces) = json.get("traces") else {
        return Ok(None);
    };
    Ok(Some(markdown::markdown(&serde_json::from_value(
        traces.clone(),
    )?)))
}

fn rss_ratio(scales: &[TraceScale], method: &str) -> Option<f64> {
    let rss = |s: &TraceScale| {
        s.methods
            .iter()
            .find(|m| m.name == method)
            .and_then(|m| m.peak_rss_kb)
    };
    let fewest = scales.iter().min_by_key(|s| s.files)?;
    let most = scales.iter().max_by_key(|s| s.files)?;
    if fewest.files == most.files {
        return None;
    }
    Some(rss(most)? as f64 / rss(fewest)? as f64)
}

/// One size's runs: its trees' size and the moment they are aged from, and the age limit's
/// cutoff.
struct Runs<'a> {
    cli: &'a Cli,
    base: &'a PgConnectOptions,
    files: u64,
    now_ns: i128,
    cut_ns: i128,
}

impl Runs<'_> {
    /// A fresh tree in `scratch` (its symlinks only with `links`: an object store has none),
    /// and the seconds its writing took.
    fn tree(&self, scratch: &Scratch, links: bool) -> anyhow::Result<(Tree, f64)> {
        let started = Instant::now();
        let (root, outside) = (&scratch.root, &scratch.outside);
        let tree = generate(root, outside, self.files, self.now_ns, self.cli, links)?;
        Ok((tree, started.elapsed().as_secs_f64()))
    }

    /// Method `name` (sexton's by the build `binary`) on `tree`, written in `scratch` (a bucket
    /// of `server`'s, for an `… s3` method), after the page cache is dropped: its figures,
    /// its end state checked, and whether the cache could be dropped.
    async fn method(
        &self,
        on: (&Scratch, Option<&Server>),
        name: &str,
        binary: &Path,
        tree: &Tree,
        max_bytes: u64,
    ) -> anyhow::Result<(TraceMethod, bool)> {
        let (scratch, server) = on;
        let goes = goes(tree, name, self.cut_ns, max_bytes);
        let dropped = disk::start_alike(&scratch.root, self.cli.warm);
        eprintln!("traces {}: {name}", self.files);
        let on = OnTree {
            scratch,
            server,
            goes: &goes,
            max_bytes,
        };
        let run: Run = run_method(self.cli, self.base, &on, name, binary).await?;
        let deleted = check(&scratch.root, &scratch.outside, tree, &goes, name)?;
        let examined = tree.entries.len() as u64;
        Ok((TraceMethod::of(name, run, deleted, examined), dropped))
    }
}

/// The methods on identical trees of `files` files, then, with `--baseline-sexton`, sexton's
/// methods pair by pair; whether the page cache was dropped before every method.
async fn measure_scale(
    bench: &Bench<'_>,
    files: u64,
) -> anyhow::Result<(TraceScale, bool, Vec<Comparison>)> {
    let (cli, admin) = (bench.cli, bench.admin);
    let scratch = Scratch::prepare(cli, admin, files).await?;
    // Every tree is written at the same ages: from one reference, the first tree's time.
    let now_ns = i128::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos())?;
    let runs = Runs {
        cli,
        base: bench.base,
        files,
        now_ns,
        cut_ns: now_ns - i128::from(cli.trace_age_days) * DAY_NS,
    };
    // On the object store too, when there is one: the same tree but its symlinks, in a bucket.
    let mut server = Server::of(cli);
    let too_many = server.is_some() && files > S3_MAX_FILES;
    if too_many {
        server = None;
    }
    let mut object_store = too_many.then(|| format!("not run above {S3_MAX_FILES} files"));
    let bucket = match &server {
        Some(server) => Some(scratch.in_bucket(server)?),
        None => None,
    };
    let place = |name: &str| match (&bucket, &server) {
        (Some(bucket), Some(server)) if name.ends_with(" s3") => (bucket, Some(server)),
        _ => (&scratch, None),
    };
    let (mut scale, mut rounds, mut dropped) = (None, Rounds::new(), true);
    let mut agents_added = false;
    // Round by round, the methods taking turns; each method's median round is kept.
    'rounds: for _ in 0..cli.trace_rounds_at(files) {
        let chosen = METHODS.into_iter().filter(|name| {
            (!name.ends_with(" s3") || bucket.is_some()) && crate::scales::chosen(cli, name)
        });
        for (at, name) in chosen.enumerate() {
            let (scratch, server) = place(name);
            eprintln!("traces {files}: writing the tree for {name}");
            let (tree, generate_seconds) = runs.tree(scratch, server.is_none())?;
            let scale = scale.get_or_insert_with(|| TraceScale::of(files, &tree, generate_seconds));
            if !agents_added {
                let agents: Vec<&Agent> = tree
                    .agents
                    .iter()
                    .filter(|a| !cli.trace_live_agents_only || a.current.is_some())
                    .collect();
                add_agents(bench.base, &scratch.db, &agents).await?;
                agents_added = true;
            }
            let max_bytes = scale.allocated_bytes / 2;
            match runs
                .method((scratch, server), name, &cli.sexton, &tree, max_bytes)
                .await
            {
                Ok((method, cold)) => {
                    rounds.add(at, method);
                    dropped &= cold;
                }
                // The local methods' figures stay when the test server fails.
                Err(e) if server.is_some() => {
                    eprintln!("traces {files}: {name} failed: {e:#}");
                    object_store = Some(format!("{name} failed: {e:#}"));
                    break 'rounds;
                }
                Err(e) => return Err(e),
            }
        }
    }
    let methods = rounds.medians(|method: &TraceMethod| method.seconds);
    let mut scale = scale.context("no method ran")?;
    let mut compared = Vec::new();
    let sextons = methods.iter().filter(|m| m.name.starts_with("sexton"));
    let sextons: Vec<String> = sextons.map(|m| m.name.clone()).collect();
    for name in sextons {
        let (scratch, server) = place(&name);
        let max_bytes = scale.allocated_bytes / 2;
        let case = format!("{files} · {name}");
        let pairs = compare::pairs(cli, "traces", case, "examined/s", async |build| {
            let binary = build.binary;
            let (tree, _) = runs.tree(scratch, server.is_none())?;
            let run = runs.method((scratch, server), &name, binary, &tree, max_bytes);
            Ok(run.await?.0.side())
        });
        compared.extend(pairs.await?);
    }
    drop_db(admin, &scratch.db).await?;
    let _ = std::fs::remove_dir_all(&scratch.dir);
    if let Some(bucket) = &bucket {
        let _ = std::fs::remove_dir_all(&bucket.dir);
    }
    scale.methods = methods;
    scale.rounds = cli.trace_rounds_at(files);
    scale.object_store = object_store;
    Ok((scale, dropped, compared))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Traces {
    measured_at: DateTime<Utc>,
    machine: String,
    /// Measured by `--only`, without the scales.
    separate_run: bool,
    /// How each method found the page cache.
    cache: String,
    /// The 1-minute load average before the first method and after the last: others' work on
    /// the machine shows here.
    load_average: String,
    age_days: u32,
    /// Bodies of the signature line alone (`--trace-small`).
    small_bodies: bool,
    /// Agents' rows: one per directory, or only those with live sessions
    /// (`--trace-live-agents-only`).
    agent_rows: String,
    scales: Vec<TraceScale>,
    /// Peak RSS at the most files over that at the fewest, sexton's age and quota runs.
    rss_ratio_age: Option<f64>,
    rss_ratio_quota: Option<f64>,
    /// With `--baseline-sexton`: sexton's methods by both builds, pair by pair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    before_after: Vec<Comparison>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TraceScale {
    files: u64,
    agents: u64,
    /// Entries named `*.trace.jsonl` (files and symlinks): what every method examines.
    examined: u64,
    candidates: u64,
    live: u64,
    bad_signature: u64,
    symlinks: u64,
    /// The candidates' allocated bytes; the quota run allows half.
    allocated_bytes: u64,
    /// Writing one tree, syncing it and reading its sizes back.
    generate_seconds: f64,
    /// Rounds of each method; each method's row is its median round.
    #[serde(default = "crate::method::one_round")]
    rounds: u32,
    methods: Vec<TraceMethod>,
    /// Why the object-store methods did not run or stopped at this size, if they did.
    object_store: Option<String>,
}

impl TraceScale {
    /// A scale's figures, from its first tree (written in `generate_seconds`), with no
    /// methods yet.
    fn of(files: u64, tree: &Tree, generate_seconds: f64) -> Self {
        Self {
            files,
            agents: tree.agents.len() as u64,
            examined: tree.entries.len() as u64,
            candidates: tree.count(Kind::Trace) + tree.count(Kind::Live),
            live: tree.count(Kind::Live),
            bad_signature: tree.count(Kind::BadSignature),
            symlinks: tree.count(Kind::Symlink),
            allocated_bytes: tree.allocated(),
            generate_seconds,
            rounds: 1,
            methods: Vec::new(),
            object_store: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TraceMethod {
    name: String,
    /// The command, as run on the tree.
    command: String,
    seconds: f64,
    examined_per_s: f64,
    deleted: u64,
    deleted_per_s: f64,
    /// sexton: what it kept, by reason (its totals).
    kept: BTreeMap<String, u64>,
    peak_rss_kb: Option<u64>,
    /// The process's CPU time, user and system.
    cpu_seconds: Option<f64>,
    /// sexton: its database backend's CPU time (the live-session checks).
    db_cpu_seconds: Option<f64>,
    /// Behind the throttling proxy: what it let through against its rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    throttle: Option<methods::Throttle>,
}

impl TraceMethod {
    /// Method `name`'s figures from its `run`, over the `examined` entries, `deleted` of them
    /// gone.
    fn of(name: &str, run: Run, deleted: u64, examined: u64) -> Self {
        let seconds = run.timed.seconds;
        Self {
            name: name.to_owned(),
            command: run.command,
            seconds,
            examined_per_s: examined as f64 / seconds,
            deleted,
            deleted_per_s: deleted as f64 / seconds,
            kept: run.kept,
            peak_rss_kb: run.timed.peak_rss_kb,
            cpu_seconds: run.timed.cpu_seconds,
            db_cpu_seconds: run.db_cpu_seconds,
            throttle: run.throttle,
        }
    }

    /// Its run as one side of a comparison of two builds.
    fn side(&self) -> Side {
        Side {
            seconds: self.seconds,
            rate: self.examined_per_s,
            peak_rss_kb: self.peak_rss_kb,
            writer_wait_ms: None,
        }
    }
}
