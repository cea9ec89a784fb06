//! Run traces (SPEC §4, TR-1 … TR-4): `sexton traces clean --confirm` against
//! `find ROOT -name '*.trace.jsonl' -mtime +N -delete` on identical trees of 10 k, 100 k and 1 M
//! files, and sexton with a quota that sends about half of them, each with its peak RSS.
//!
//! A tree is written directly (no seed command): `<agent_id>/run-NNN.trace.jsonl`, a hundred per
//! agent directory, each starting with a valid signature and a 1–4 KiB body, with mtimes spread
//! evenly over 0–120 days, all from one seed, so that every method gets the same tree, written
//! afresh. A few files are decoys sexton must keep and `find` deletes: one in a thousand has a
//! bad signature, one in two thousand is a symlink (to a trace beside it, or to one outside the
//! root), and the traces of every fiftieth agent's current and main sessions are live. A
//! symlinked directory at the root leads to a trace outside the root, which no method may touch.
//! Every method's end state is checked against what its rule says, file by file.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use serde::Serialize;
use sexton_jobs::files::object::ObjectRoot;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::cluster::{connect, drop_db, recreate};
use crate::disk::{self, Rng, Timed};
use crate::objects::Server;
use crate::results::{Section, machine, write_results};
use crate::sexton::{ROOTS, sexton, sexton_env};
use crate::{Cli, Part};

/// The heading the run traces' section starts with, in latest.md.
pub const TRACES_HEADING: &str = "## Run traces";

const SEED: u64 = 0x7ace_5eed_0001;
const FILES_PER_AGENT: u64 = 100;
const SESSIONS_PER_AGENT: u64 = 10;
/// Every this many agents, the agent's current and main sessions (two of its ten) are live.
const LIVE_AGENT_EVERY: u64 = 50;
/// One file in this many has a bad signature …
const BAD_EVERY: u64 = 1000;
/// … and one in this many is a symlink.
const LINK_EVERY: u64 = 2000;
/// Files' ages are spread over this many days.
const SPAN_DAYS: f64 = 120.0;
/// No age falls this close below or above the age limit: `find -mtime +N` deletes files at least
/// N + 1 whole days old, sexton those older than N days, and a run comes minutes after its tree
/// was written. Outside this gap the two rules agree.
const GAP_BELOW_DAYS: f64 = 0.25;
const GAP_ABOVE_DAYS: f64 = 1.25;
const DAY_NS: i128 = 86_400 * 1_000_000_000;
/// What sexton's plan of a run is printed to (`--json`), then read back for its totals.
const PLAN_FILE: &str = "plan.json";
/// The object-store methods run on trees of at most this many files: s3s-fs answers every page
/// of a listing by walking and sorting its whole bucket (s3s-fs 0.14 `list_objects_v2`), so a
/// listing of a million keys costs a thousand walks of a million files and times out — a
/// measure of the test server, not of sexton.
const S3_MAX_FILES: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A valid trace of a session no agent has as current or main.
    Trace,
    /// A valid trace of an agent's current or main session.
    Live,
    BadSignature,
    Symlink,
}

struct Entry {
    /// Relative to the traces root.
    path: String,
    kind: Kind,
    /// As stored (read back after writing).
    mtime_ns: i128,
    /// Allocated bytes (blocks × 512), as the quota counts them.
    allocated: u64,
}

struct Agent {
    id: Uuid,
    current: Option<Uuid>,
    main: Option<Uuid>,
}

struct Tree {
    entries: Vec<Entry>,
    agents: Vec<Agent>,
}

impl Tree {
    fn count(&self, kind: Kind) -> u64 {
        self.entries.iter().filter(|e| e.kind == kind).count() as u64
    }

    /// Allocated bytes of the candidates (valid traces, live ones included).
    fn allocated(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| matches!(e.kind, Kind::Trace | Kind::Live))
            .map(|e| e.allocated)
            .sum()
    }
}

#[derive(Debug, Clone, Serialize)]
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
    agent_rows: &'static str,
    scales: Vec<TraceScale>,
    /// Peak RSS at the most files over that at the fewest, sexton's age and quota runs.
    rss_ratio_age: Option<f64>,
    rss_ratio_quota: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
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
            methods: Vec::new(),
            object_store: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct TraceMethod {
    name: &'static str,
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
}

/// The run traces at every size of `--trace-files`, each written into the results as it is done.
pub async fn measure(cli: &Cli, admin: &PgPool, base: &PgConnectOptions) -> anyhow::Result<()> {
    let mut traces = Traces {
        measured_at: Utc::now(),
        machine: machine(),
        separate_run: !cli.only.is_empty() && !cli.only.contains(&Part::Scales),
        cache: String::new(),
        load_average: String::new(),
        age_days: cli.trace_age_days,
        small_bodies: cli.trace_small,
        agent_rows: if cli.trace_live_agents_only {
            "only the agents with live sessions"
        } else {
            "one per directory"
        },
        scales: Vec::new(),
        rss_ratio_age: None,
        rss_ratio_quota: None,
    };
    let load_before = disk::load_average();
    for &files in &cli.trace_files {
        let (scale, dropped) = measure_scale(cli, admin, base, files).await?;
        traces.cache = disk::cache_state(dropped).to_owned();
        traces.load_average = format!("{load_before} / {}", disk::load_average());
        traces.scales.push(scale);
        traces.rss_ratio_age = rss_ratio(&traces.scales, "sexton age");
        traces.rss_ratio_quota = rss_ratio(&traces.scales, "sexton quota");
        write_results(cli, Section::Traces(&traces))?;
    }
    println!("{}", markdown(&traces));
    Ok(())
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

/// The three methods on three identical trees of `files` files.
async fn measure_scale(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    files: u64,
) -> anyhow::Result<(TraceScale, bool)> {
    let scratch = Scratch::prepare(cli, admin, files).await?;
    // Every tree is written at the same ages: from one reference, the first tree's time.
    let now_ns = i128::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos())?;
    let cut_ns = now_ns - i128::from(cli.trace_age_days) * DAY_NS;
    let mut scale = None;
    let mut methods = Vec::new();
    let mut dropped = true;
    // On the object store too, when there is one: the same tree but its symlinks, in a bucket.
    let mut server = Server::of(cli);
    let too_many = server.is_some() && files > S3_MAX_FILES;
    if too_many {
        server = None;
    }
    let mut object_store = too_many.then(|| {
        format!("not run above {S3_MAX_FILES} files: s3s-fs walks its whole bucket for every page of a listing")
    });
    let bucket = match &server {
        Some(server) => Some(scratch.in_bucket(server)?),
        None => None,
    };
    let mut names = vec![
        "sexton age",
        "walk+sig age",
        "walk+every-sig age",
        "find age",
        "sexton quota",
    ];
    if bucket.is_some() {
        names.extend(["sexton age s3", "list-delete s3"]);
    }
    for name in names {
        let (scratch, server) = match (&bucket, &server) {
            (Some(bucket), Some(server)) if name.ends_with(" s3") => (bucket, Some(server)),
            _ => (&scratch, None),
        };
        eprintln!("traces {files}: writing the tree for {name}");
        let started = Instant::now();
        let links = server.is_none();
        let tree = generate(&scratch.root, &scratch.outside, files, now_ns, cli, links)?;
        let generate_seconds = started.elapsed().as_secs_f64();
        let scale = scale.get_or_insert_with(|| TraceScale::of(files, &tree, generate_seconds));
        if methods.is_empty() {
            let agents: Vec<&Agent> = tree
                .agents
                .iter()
                .filter(|a| !cli.trace_live_agents_only || a.current.is_some())
                .collect();
            add_agents(base, &scratch.db, &agents).await?;
        }
        let max_bytes = scale.allocated_bytes / 2;
        let goes = goes(&tree, name, cut_ns, max_bytes);
        dropped &= disk::start_alike(&scratch.root, cli.warm);
        eprintln!("traces {files}: {name}");
        let run = match run_method(cli, base, scratch, server, name, max_bytes, &tree, &goes).await
        {
            Ok(run) => run,
            // The local methods' figures stay when the test server fails.
            Err(e) if server.is_some() => {
                eprintln!("traces {files}: {name} failed: {e:#}");
                object_store = Some(format!("{name} failed: {e:#}"));
                break;
            }
            Err(e) => return Err(e),
        };
        let deleted = check(&scratch.root, &scratch.outside, &tree, &goes, name)?;
        methods.push(run.row(name, deleted, tree.entries.len() as u64));
    }
    drop_db(admin, &scratch.db).await?;
    let _ = std::fs::remove_dir_all(&scratch.dir);
    if let Some(bucket) = &bucket {
        let _ = std::fs::remove_dir_all(&bucket.dir);
    }
    let mut scale = scale.context("no method ran")?;
    scale.methods = methods;
    scale.object_store = object_store;
    Ok((scale, dropped))
}

/// One scale's scratch: its directory, the roots sexton is given under it (the traces root
/// among them), a directory outside them that symlinks lead to, and its database.
struct Scratch {
    files: u64,
    dir: PathBuf,
    roots: PathBuf,
    root: PathBuf,
    outside: PathBuf,
    db: String,
}

impl Scratch {
    /// Makes the directories for `files` trace files (removed first), checks that the disk has
    /// room for the tree, and creates the database and migrates it.
    async fn prepare(cli: &Cli, admin: &PgPool, files: u64) -> anyhow::Result<Self> {
        let dir = cli.scratch.join(format!("traces-{files}"));
        let roots = dir.join("roots");
        let root = roots.join("traces");
        let outside = dir.join("outside");
        let _ = std::fs::remove_dir_all(&dir);
        for (_, name) in ROOTS {
            std::fs::create_dir_all(roots.join(name))?;
        }
        std::fs::create_dir_all(&outside)?;
        // A 1–4 KiB body takes one or two 4 KiB blocks; the signature alone, one.
        let need = files * if cli.trace_small { 4096 } else { 5000 } + (1 << 30);
        let free = disk::free_bytes(&dir)?;
        if free < need {
            bail!(
                "{files} trace files need about {} MB under {}, {} MB are free: free some, or pass \
                 --trace-small (bodies of the signature line alone)",
                need >> 20,
                dir.display(),
                free >> 20
            );
        }
        let db = format!("benchtr_{files}");
        recreate(admin, &db, None).await?;
        if !sexton(cli, &db, &roots, &["migrate"])
            .status()
            .await?
            .success()
        {
            bail!("migrating {db} failed");
        }
        Ok(Self {
            files,
            dir,
            roots,
            root,
            outside,
            db,
        })
    }

    /// The same scratch in a bucket of `server` (its roots prefixes there, made afresh), on the
    /// same database.
    fn in_bucket(&self, server: &Server) -> anyhow::Result<Self> {
        let dir = server.bucket("benchtraces");
        let roots = dir.join("roots");
        let _ = std::fs::remove_dir_all(&dir);
        for (_, name) in ROOTS {
            std::fs::create_dir_all(roots.join(name))?;
        }
        Ok(Self {
            files: self.files,
            root: roots.join("traces"),
            roots,
            outside: dir.join("outside"),
            db: self.db.clone(),
            dir,
        })
    }

    /// Where sexton's plan of a run is printed to.
    fn plan_file(&self) -> PathBuf {
        self.dir.join(PLAN_FILE)
    }
}

/// What method `name`'s rule removes, entry by entry: sexton's age the traces of no live
/// session older than the cutoff, `find` every entry older than it, the quota what
/// [`quota_plan`] sends to bring the candidates down to `max_bytes`.
fn goes(tree: &Tree, name: &str, cut_ns: i128, max_bytes: u64) -> Vec<bool> {
    match name {
        "sexton age" | "walk+sig age" | "walk+every-sig age" | "sexton age s3" => tree
            .entries
            .iter()
            .map(|e| e.kind == Kind::Trace && e.mtime_ns < cut_ns)
            .collect(),
        "find age" | "list-delete s3" => tree.entries.iter().map(|e| e.mtime_ns < cut_ns).collect(),
        _ => quota_plan(tree, max_bytes),
    }
}

/// What a method's process did: the command, as run on the tree, its timing, and for sexton
/// what it kept, by reason, and its database backend's CPU time.
struct Run {
    command: String,
    timed: Timed,
    kept: BTreeMap<String, u64>,
    db_cpu_seconds: Option<f64>,
}

impl Run {
    /// A loop of the benchmark's own, timed from `started` (no process, no RSS of its own).
    fn in_process(command: &str, started: Instant) -> Self {
        Self {
            command: command.to_owned(),
            timed: Timed {
                seconds: started.elapsed().as_secs_f64(),
                cpu_seconds: None,
                peak_rss_kb: None,
            },
            kept: BTreeMap::new(),
            db_cpu_seconds: None,
        }
    }

    /// The method's row: its figures over the `examined` entries, `deleted` of them gone.
    fn row(self, name: &'static str, deleted: u64, examined: u64) -> TraceMethod {
        let examined = examined as f64;
        TraceMethod {
            name,
            command: self.command,
            seconds: self.timed.seconds,
            examined_per_s: examined / self.timed.seconds,
            deleted,
            deleted_per_s: deleted as f64 / self.timed.seconds,
            kept: self.kept,
            peak_rss_kb: self.timed.peak_rss_kb,
            cpu_seconds: self.timed.cpu_seconds,
            db_cpu_seconds: self.db_cpu_seconds,
        }
    }
}

/// Method `name` on the tree: `find`, or sexton with the method's limits (a quota of
/// `max_bytes` for the quota run), held to delete as many entries as `goes` says its rule
/// removes. sexton's plan file is removed after it.
#[allow(clippy::too_many_arguments)]
async fn run_method(
    cli: &Cli,
    base: &PgConnectOptions,
    scratch: &Scratch,
    server: Option<&Server>,
    name: &str,
    max_bytes: u64,
    tree: &Tree,
    goes: &[bool],
) -> anyhow::Result<Run> {
    let cut = Utc::now() - chrono::Duration::days(i64::from(cli.trace_age_days));
    let run = match (name, server) {
        ("find age", _) => run_find(cli, &scratch.root).await?,
        ("walk+sig age", _) => {
            walk_signatures(base, &scratch.db, &scratch.root, cut, Signatures::Old).await?
        }
        ("walk+every-sig age", _) => {
            walk_signatures(base, &scratch.db, &scratch.root, cut, Signatures::Every).await?
        }
        ("list-delete s3", Some(server)) => list_delete(&*server.root(&scratch.root)?, cut).await?,
        _ => {
            let expected = tree
                .entries
                .iter()
                .zip(goes)
                .filter(|(_, goes)| **goes)
                .count() as u64;
            let env = match server {
                Some(server) => server.env("TRACES_ROOT", &scratch.root)?,
                None => Vec::new(),
            };
            run_clean(cli, base, scratch, name, max_bytes, expected, &env).await?
        }
    };
    let _ = std::fs::remove_file(scratch.plan_file());
    Ok(run)
}

/// Whose signature line a [`walk_signatures`] floor reads.
#[derive(Clone, Copy, PartialEq)]
enum Signatures {
    /// The old traces' alone: what the deletion needs.
    Old,
    /// Every trace's, young ones too: what sexton reads, since TR-3 counts and reports every
    /// `*.trace.jsonl` whose signature is not valid, whatever its age, and the quota (TR-2)
    /// counts young live sessions' traces.
    Every,
}

/// The floor that reaches sexton's end state by age (PF-6), in process: a walk of the tree that
/// follows no symlink, the first line of each `*.trace.jsonl` regular file older than `cut`
/// (every one's, with [`Signatures::Every`]) read and its signature parsed, the live sessions' traces among each
/// thousand old ones skipped (one query), the rest unlinked — no lease, no re-check before the
/// unlink, no plan, no holds.
async fn walk_signatures(
    base: &PgConnectOptions,
    db: &str,
    root: &Path,
    cut: DateTime<Utc>,
    read: Signatures,
) -> anyhow::Result<Run> {
    #[derive(serde::Deserialize)]
    struct Signature {
        format: String,
        session_id: String,
    }
    let started = Instant::now();
    let pool = connect(base, db, "bench-walk").await?;
    let mut dirs = vec![root.to_owned()];
    let mut batch: Vec<(PathBuf, Uuid)> = Vec::new();
    let flush = async |batch: &mut Vec<(PathBuf, Uuid)>| -> anyhow::Result<()> {
        let sessions: Vec<Uuid> = batch.iter().map(|(_, s)| *s).collect();
        let live: Vec<Uuid> = sqlx::query_scalar(
            "SELECT s FROM unnest($1::uuid[]) s
             WHERE EXISTS (SELECT 1 FROM agents WHERE current_session_id = s)
                OR EXISTS (SELECT 1 FROM agents WHERE main_session_id = s)",
        )
        .bind(&sessions)
        .fetch_all(&pool)
        .await?;
        for (path, session) in batch.drain(..) {
            if !live.contains(&session) {
                std::fs::remove_file(path)?;
            }
        }
        Ok(())
    };
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                dirs.push(path);
                continue;
            }
            let named = entry.file_name().as_bytes().ends_with(b".trace.jsonl");
            if !kind.is_file() || !named {
                continue;
            }
            let old = entry.metadata()?.modified()? < cut.into();
            if !old && read == Signatures::Old {
                continue;
            }
            let mut first = Vec::with_capacity(512);
            std::fs::File::open(&path)?
                .take(64 * 1024)
                .read_to_end(&mut first)?;
            let line = first.split(|b| *b == b'\n').next().unwrap_or_default();
            let signed = serde_json::from_slice::<Signature>(line)
                .ok()
                .and_then(|sig| {
                    (sig.format == "run-trace/1").then(|| Uuid::parse_str(&sig.session_id).ok())?
                });
            if let Some(session) = signed.filter(|_| old) {
                batch.push((path, session));
                if batch.len() == 1000 {
                    flush(&mut batch).await?;
                }
            }
        }
    }
    flush(&mut batch).await?;
    pool.close().await;
    Ok(Run::in_process(
        "walk, signature line, live sessions per thousand, unlink (in process)",
        started,
    ))
}

/// The plain loop on the object store: one listing of the root, every `*.trace.jsonl` object
/// last modified before `cut` deleted, a DeleteObjects call per thousand — `find -delete`'s
/// work, reading no signature and checking no session.
async fn list_delete(root: &ObjectRoot, cut: DateTime<Utc>) -> anyhow::Result<Run> {
    let started = Instant::now();
    let mut listing = root.list_all();
    let mut keys = Vec::new();
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        if meta.location.as_ref().ends_with(".trace.jsonl") && meta.last_modified < cut {
            keys.push(meta.location);
        }
    }
    for outcome in root.delete(&keys).await {
        outcome.map_err(anyhow::Error::msg)?;
    }
    Ok(Run::in_process(
        "LIST the prefix; DeleteObjects of the old *.trace.jsonl, 1,000 a call",
        started,
    ))
}

/// `find ROOT -name '*.trace.jsonl' -mtime +N -delete` on the traces root, N the age limit.
async fn run_find(cli: &Cli, root: &Path) -> anyhow::Result<Run> {
    let find_age = format!("+{}", cli.trace_age_days);
    let args = [
        root.to_str().context("a UTF-8 scratch path")?,
        "-name",
        "*.trace.jsonl",
        "-mtime",
        &find_age,
        "-delete",
    ];
    let timed = disk::timed(Path::new("find"), &args, |_| {}).await?;
    let command = format!("find ROOT -name '*.trace.jsonl' -mtime {find_age} -delete");
    Ok(Run {
        command,
        timed,
        kept: BTreeMap::new(),
        db_cpu_seconds: None,
    })
}

/// [`clean`] with method `name`'s limits (the age limit, or no age and a quota of
/// `max_bytes`), its database backend's CPU time sampled; fails unless its totals report the
/// `expected` deletions.
async fn run_clean(
    cli: &Cli,
    base: &PgConnectOptions,
    scratch: &Scratch,
    name: &str,
    max_bytes: u64,
    expected: u64,
    env: &[(String, String)],
) -> anyhow::Result<Run> {
    let (age, bytes) = match name {
        "sexton age" | "sexton age s3" => (cli.trace_age_days, 0),
        _ => (0, max_bytes),
    };
    let plan_file = scratch.plan_file();
    let ((timed, totals), db_cpu_seconds) = disk::with_backend_cpu(
        base,
        &scratch.db,
        "sexton",
        clean(
            cli,
            &scratch.db,
            &scratch.roots,
            &plan_file,
            (age, bytes),
            env,
        ),
    )
    .await?;
    let command = format!(
        "SEXTON_TRACES__MAX_AGE_DAYS={age} SEXTON_TRACES__MAX_BYTES={bytes} sexton traces clean --confirm --json"
    );
    let deleted = totals["deleted"].as_u64().unwrap_or_default();
    if deleted != expected {
        bail!(
            "{name} at {} files reports {deleted} deleted, its rule {expected}",
            scratch.files
        );
    }
    let kept = totals["kept"]
        .as_object()
        .map(|kept| {
            kept.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    Ok(Run {
        command,
        timed,
        kept,
        db_cpu_seconds,
    })
}

/// Which entries a quota of `max_bytes` sends (max_age_days 0), as TR-2 says: the candidates
/// go oldest first by (mtime, path) until the rest fit; a live session's trace stays and counts
/// toward the quota, so only the others go to meet it.
fn quota_plan(tree: &Tree, max_bytes: u64) -> Vec<bool> {
    let mut order: Vec<usize> = (0..tree.entries.len())
        .filter(|&i| tree.entries[i].kind == Kind::Trace)
        .collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&tree.entries[a], &tree.entries[b]);
        (a.mtime_ns, &a.path).cmp(&(b.mtime_ns, &b.path))
    });
    let excess = tree.allocated().saturating_sub(max_bytes);
    let mut goes = vec![false; tree.entries.len()];
    let mut covered = 0;
    for i in order {
        if covered >= excess {
            break;
        }
        covered += tree.entries[i].allocated;
        goes[i] = true;
    }
    goes
}

/// `sexton traces clean --confirm --json` with the limits given, its plan printed to
/// `plan_file`; returns its timing and totals.
async fn clean(
    cli: &Cli,
    db: &str,
    roots: &Path,
    plan_file: &Path,
    (max_age_days, max_bytes): (u32, u64),
    env: &[(String, String)],
) -> anyhow::Result<(Timed, serde_json::Value)> {
    let plan = std::fs::File::create(plan_file)?;
    let timed = disk::timed(
        &cli.sexton,
        &["traces", "clean", "--confirm", "--json"],
        |cmd| {
            cmd.env_remove("DATABASE_URL")
                .envs(sexton_env(db, roots))
                .env("SEXTON_TRACES__MAX_AGE_DAYS", max_age_days.to_string())
                .env("SEXTON_TRACES__MAX_BYTES", max_bytes.to_string())
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(plan);
        },
    )
    .await?;
    // `{"files":[…],"totals":{…}}`: the totals are at the end of what may be hundreds of MB.
    let mut plan = std::fs::File::open(plan_file)?;
    let len = plan.metadata()?.len();
    plan.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
    let mut tail = String::new();
    plan.read_to_string(&mut tail)?;
    let at = tail
        .rfind("\"totals\":")
        .context("the plan has no totals")?;
    let totals = tail[at + "\"totals\":".len()..].trim_end();
    let totals = totals.strip_suffix('}').context("the plan is cut short")?;
    Ok((timed, serde_json::from_str(totals)?))
}

/// The agents, as the platform holds them: one per directory, every fiftieth with a current and
/// a main session (whose traces are live).
async fn add_agents(base: &PgConnectOptions, db: &str, agents: &[&Agent]) -> anyhow::Result<()> {
    let pool = connect(base, db, "bench").await?;
    let account: Uuid = sqlx::query_scalar(
        "INSERT INTO accounts (name, execution_details_retention_days)
         VALUES ('bench', NULL) RETURNING id",
    )
    .fetch_one(&pool)
    .await?;
    for chunk in agents.chunks(10_000) {
        let ids: Vec<Uuid> = chunk.iter().map(|a| a.id).collect();
        let current: Vec<Option<Uuid>> = chunk.iter().map(|a| a.current).collect();
        let main: Vec<Option<Uuid>> = chunk.iter().map(|a| a.main).collect();
        sqlx::query(
            "INSERT INTO agents (id, account_id, name, current_session_id, main_session_id)
             SELECT id, $2, 'agent', c, m FROM unnest($1::uuid[], $3::uuid[], $4::uuid[]) AS u (id, c, m)",
        )
        .bind(&ids)
        .bind(account)
        .bind(&current)
        .bind(&main)
        .execute(&pool)
        .await?;
    }
    sqlx::query("ANALYZE agents").execute(&pool).await?;
    pool.close().await;
    Ok(())
}

/// An age in days over [0, SPAN_DAYS), none in the gap around `limit`.
fn age_days(rng: &mut Rng, limit: f64) -> f64 {
    let gap = GAP_BELOW_DAYS + GAP_ABOVE_DAYS;
    let age = rng.unit() * (SPAN_DAYS - gap);
    if age >= limit - GAP_BELOW_DAYS {
        age + gap
    } else {
        age
    }
}

/// A trace body: JSON lines, cut to length.
fn filler() -> Vec<u8> {
    let line = b"{\"type\":\"step\",\"tool\":\"search\",\"text\":\"the quick brown fox jumps over the lazy dog\"}\n";
    line.iter().copied().cycle().take(4096).collect()
}

/// Writes the tree of `files` entries under `root` (removed first) from [`SEED`], ages relative
/// to `now_ns`, with the agents' directories spread over the cores; then syncs it and reads each
/// entry's mtime and allocated size back.
fn generate(
    root: &Path,
    outside: &Path,
    files: u64,
    now_ns: i128,
    cli: &Cli,
    links: bool,
) -> anyhow::Result<Tree> {
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    let started = Instant::now();
    std::fs::create_dir_all(root)?;
    let _ = std::fs::remove_dir_all(outside);
    std::fs::create_dir_all(outside)?;
    // Outside the root: a trace (old, validly signed) that symlinks point at.
    let victim = outside.join("victim.trace.jsonl");
    std::fs::write(
        &victim,
        format!(
            "{{\"format\":\"run-trace/1\",\"agent_id\":\"{}\",\"session_id\":\"{}\"}}\n",
            Uuid::nil(),
            Uuid::nil()
        ),
    )?;
    set_mtime(&victim, now_ns - 100 * DAY_NS)?;
    if links {
        std::os::unix::fs::symlink(outside, root.join("escape"))?;
    }
    let agents = files.div_ceil(FILES_PER_AGENT);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let body = filler();
    let mut written: Vec<(u64, Agent, Vec<Entry>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let body = &body;
                let victim = &victim;
                scope.spawn(move || -> anyhow::Result<Vec<(u64, Agent, Vec<Entry>)>> {
                    let mut out = Vec::new();
                    for a in (t..agents).step_by(threads as usize) {
                        let count = FILES_PER_AGENT.min(files - a * FILES_PER_AGENT);
                        let (agent, entries) =
                            write_agent(root, victim, a, count, now_ns, body, cli, links)?;
                        out.push((a, agent, entries));
                    }
                    Ok(out)
                })
            })
            .collect();
        let mut all = Vec::new();
        for worker in workers {
            all.extend(worker.join().expect("a writer thread")?);
        }
        anyhow::Ok(all)
    })?;
    written.sort_by_key(|(a, _, _)| *a);
    let writing = started.elapsed().as_secs_f64();
    disk::sync();
    let syncing = started.elapsed().as_secs_f64() - writing;
    let mut tree = Tree {
        entries: Vec::with_capacity(files as usize),
        agents: Vec::with_capacity(agents as usize),
    };
    for (_, agent, entries) in written {
        tree.agents.push(agent);
        tree.entries.extend(entries);
    }
    // As stored: the file system's mtime and blocks, after the writes have reached it.
    for entry in &mut tree.entries {
        let meta = std::fs::symlink_metadata(root.join(&entry.path))?;
        entry.mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        entry.allocated = meta.blocks() * 512;
    }
    eprintln!(
        "traces {files}: tree written in {writing:.1} s, synced in {syncing:.1} s, read back in {:.1} s",
        started.elapsed().as_secs_f64() - writing - syncing
    );
    Ok(tree)
}

/// One agent's directory: its `count` entries, in the order of their names (symlinks among
/// them with `links`: an object store has none).
#[allow(clippy::too_many_arguments)]
fn write_agent(
    root: &Path,
    victim: &Path,
    a: u64,
    count: u64,
    now_ns: i128,
    body: &[u8],
    cli: &Cli,
    links: bool,
) -> anyhow::Result<(Agent, Vec<Entry>)> {
    let mut rng = Rng::new(SEED ^ (a + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let id = rng.uuid();
    let sessions: Vec<Uuid> = (0..SESSIONS_PER_AGENT).map(|_| rng.uuid()).collect();
    let live = a.is_multiple_of(LIVE_AGENT_EVERY);
    let agent = Agent {
        id,
        current: live.then_some(sessions[0]),
        main: live.then_some(sessions[1]),
    };
    let dir = root.join(id.to_string());
    std::fs::create_dir(&dir)?;
    let mut entries = Vec::with_capacity(count as usize);
    for k in 0..count {
        let g = a * FILES_PER_AGENT + k;
        let age = age_days(&mut rng, f64::from(cli.trace_age_days));
        let mtime_ns = now_ns - (age * DAY_NS as f64) as i128;
        let length = 1024 + rng.below(3073) as usize;
        let session = sessions[(k % SESSIONS_PER_AGENT) as usize];
        let name = format!("run-{k:03}.trace.jsonl");
        let path = dir.join(&name);
        let kind = if links && g % LINK_EVERY == LINK_EVERY - 1 {
            Kind::Symlink
        } else if g % BAD_EVERY == BAD_EVERY / 2 {
            Kind::BadSignature
        } else if live && k % SESSIONS_PER_AGENT < 2 {
            Kind::Live
        } else {
            Kind::Trace
        };
        if kind == Kind::Symlink {
            // Every other one leads out of the root; the rest to the first trace beside them.
            if (g / LINK_EVERY).is_multiple_of(2) {
                std::os::unix::fs::symlink(victim, &path)?;
            } else {
                std::os::unix::fs::symlink("run-000.trace.jsonl", &path)?;
            }
            disk::set_symlink_mtime(&path, mtime_ns)?;
        } else {
            let first = match kind {
                Kind::BadSignature if g.is_multiple_of(2) => "trace of a run\n".to_owned(),
                Kind::BadSignature => format!(
                    "{{\"format\":\"run-trace/0\",\"agent_id\":\"{id}\",\"session_id\":\"{session}\"}}\n"
                ),
                _ => format!(
                    "{{\"format\":\"run-trace/1\",\"agent_id\":\"{id}\",\"session_id\":\"{session}\"}}\n"
                ),
            };
            let mut file = std::fs::File::create(&path)?;
            file.write_all(first.as_bytes())?;
            if !cli.trace_small {
                file.write_all(&body[..length])?;
            }
            file.set_modified(UNIX_EPOCH + Duration::from_nanos(u64::try_from(mtime_ns)?))?;
        }
        entries.push(Entry {
            path: format!("{id}/{name}"),
            kind,
            mtime_ns,
            allocated: 0,
        });
    }
    Ok((agent, entries))
}

/// Sets a file's modification time.
fn set_mtime(path: &Path, ns: i128) -> anyhow::Result<()> {
    let file = std::fs::File::options().write(true).open(path)?;
    file.set_modified(UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns)?))?;
    Ok(())
}

/// The method's end state: exactly the entries its rule keeps are left, and nothing outside the
/// root was touched. Returns how many entries went.
fn check(
    root: &Path,
    outside: &Path,
    tree: &Tree,
    goes: &[bool],
    name: &str,
) -> anyhow::Result<u64> {
    let mut left = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if entry
                .file_name()
                .to_string_lossy()
                .ends_with(".trace.jsonl")
            {
                let path = entry.path();
                left.push(
                    path.strip_prefix(root)?
                        .to_str()
                        .context("a UTF-8 name")?
                        .to_owned(),
                );
            }
        }
    }
    left.sort();
    let mut expected: Vec<String> = tree
        .entries
        .iter()
        .zip(goes)
        .filter(|(_, goes)| !**goes)
        .map(|(e, _)| e.path.clone())
        .collect();
    expected.sort();
    if left != expected {
        let extra: Vec<&String> = left
            .iter()
            .filter(|p| expected.binary_search(p).is_err())
            .take(5)
            .collect();
        let missing: Vec<&String> = expected
            .iter()
            .filter(|p| left.binary_search(p).is_err())
            .take(5)
            .collect();
        bail!(
            "{name}: {} entries left, its rule keeps {}; left though it goes: {extra:?}; gone though it stays: {missing:?}",
            left.len(),
            expected.len()
        );
    }
    if !outside.join("victim.trace.jsonl").exists() {
        bail!("{name} deleted the trace outside the root");
    }
    Ok((tree.entries.len() - left.len()) as u64)
}

/// The run traces' section of latest.md.
pub fn markdown(t: &Traces) -> String {
    let when = if t.separate_run {
        "in a separate run from the tables above (`bash bench/run.sh --only traces`)"
    } else {
        "in the same run as the tables above"
    };
    let bodies = if t.small_bodies {
        "the signature line alone (`--trace-small`: one 4 KiB block each)"
    } else {
        "a signature line and a 1–4 KiB body (one or two 4 KiB blocks)"
    };
    let mut md = format!(
        "{TRACES_HEADING}\n\nMeasured {} on {}, {when}. Each tree: `<agent_id>/run-NNN.trace.jsonl`, {FILES_PER_AGENT} per agent directory, each {bodies}, mtimes spread evenly over 0–{SPAN_DAYS:.0} days (none within a day of the age limit, where `find`'s whole days and sexton's cutoff would differ); one in {BAD_EVERY} has a bad signature, one in {LINK_EVERY} is a symlink (to a trace beside it or out of the root), the traces of every {LIVE_AGENT_EVERY}th agent's current and main sessions are live (the agents table holds {}: every batch sexton deletes is checked against it), and a symlinked directory leads out of the root. Each method gets its own tree, written from the same seed; page cache: {}. sexton age: `sexton traces clean --confirm --json` (plan to a file) with `max_age_days = {}`; find age: `find ROOT -name '*.trace.jsonl' -mtime +{} -delete`, which also deletes the bad signatures, symlinks and live sessions' traces past the age that sexton keeps; walk+sig age (PF-6's floor, sexton age's end state): in process, a walk that follows no symlink, the first line of each old `*.trace.jsonl` regular file read and its signature parsed, the live sessions among each thousand asked in one query, the rest unlinked — without sexton's lease, plan, holds or re-check before the unlink; walk+every-sig age: the same walk reading the signature line of every `*.trace.jsonl` regular file, young ones too (what sexton reads: TR-3 counts every trace whose signature is not valid, whatever its age, and the quota counts young live sessions' traces), the same deleted; sexton age's ratio is against walk+sig age, the others' against find age. sexton quota: `max_age_days = 0`, `max_bytes` half the candidates' allocated bytes. `… s3`: the same tree without its symlinks (an object store has none), each file an object in a bucket of an S3-compatible server on loopback (s3s-fs): sexton age s3 with its traces root `s3://…` (a listing, a ranged GET of each signature, a HEAD of each object just before the batched delete, the lease a row in PostgreSQL), list-delete s3 one listing and a DeleteObjects call per thousand old `*.trace.jsonl` keys, in process; each `… s3` ratio is against list-delete s3. Every end state is checked entry by entry against the method's rule. Seconds are the process's wall time; examined counts every `*.trace.jsonl` entry; CPU is the process's user + system time and that of its database backend (sampled from `/proc`); peak RSS is the kernel's `ru_maxrss` (GNU time `%M`). 1-minute load average before the first and after the last method: {}.\n\n| files | agents | candidates (live) | allocated MB | method | seconds | examined/s | deleted | deleted/s | vs floor | kept by sexton | CPU s (process / database) | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        t.measured_at.format("%Y-%m-%d"),
        t.machine,
        t.agent_rows,
        t.cache,
        t.age_days,
        t.age_days,
        t.load_average,
    );
    for s in &t.scales {
        for m in &s.methods {
            md.push_str(&row(s, m));
        }
    }
    for s in &t.scales {
        if let Some(why) = &s.object_store {
            md.push_str(&format!("\nObject store at {} files: {why}.\n", s.files));
        }
    }
    let bound = |ratio: Option<f64>| {
        ratio.map_or("—".to_owned(), |r| {
            format!(
                "{r:.2}× ({})",
                if r <= 2.0 { "within 2×" } else { "over 2×" }
            )
        })
    };
    if let (Some(fewest), Some(most)) = (
        t.scales.iter().map(|s| s.files).min(),
        t.scales.iter().map(|s| s.files).max(),
    ) && fewest != most
    {
        md.push_str(&format!(
            "\nsexton's peak RSS at {most} files over that at {fewest}: age {}, quota {}.\n",
            bound(t.rss_ratio_age),
            bound(t.rss_ratio_quota)
        ));
    }
    md
}

/// One method's row of the table: each method against its floor on the same backend, sexton's
/// age run against the walk that reaches its end state (PF-6), that walk and the quota run
/// against `find`.
fn row(s: &TraceScale, m: &TraceMethod) -> String {
    let floor = |name: &str| {
        let floor = match name {
            "sexton age" => "walk+sig age",
            _ if name.ends_with(" s3") => "list-delete s3",
            _ => "find age",
        };
        let rate = s
            .methods
            .iter()
            .find(|m| m.name == floor)
            .map_or(0.0, |m| m.examined_per_s);
        (floor, rate)
    };
    let kept: Vec<String> = m.kept.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!(
        "| {} | {} | {} ({}) | {:.0} | {} | {:.1} | {:.0} | {} | {:.0} | {} | {} | {} / {} | {} |\n",
        s.files,
        s.agents,
        s.candidates,
        s.live,
        s.allocated_bytes as f64 / 1048576.0,
        m.name,
        m.seconds,
        m.examined_per_s,
        m.deleted,
        m.deleted_per_s,
        if matches!(m.name, "find age" | "list-delete s3") {
            "—".to_owned()
        } else {
            let (floor, rate) = floor(m.name);
            format!("{:.2}× {floor}", m.examined_per_s / rate)
        },
        if kept.is_empty() {
            "—".to_owned()
        } else {
            kept.join(", ")
        },
        m.cpu_seconds.map_or("—".into(), |s| format!("{s:.1}")),
        m.db_cpu_seconds.map_or("—".into(), |s| format!("{s:.1}")),
        m.peak_rss_kb
            .map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
    )
}
