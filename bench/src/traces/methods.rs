//! The run-traces methods, each on its own tree: sexton (`sexton traces clean --confirm
//! --json`, by age or by quota, on disk or on the object store), `find -delete`, the in-process
//! walks that reach sexton's end state by age (PF-6's floor), and the list-and-delete loop on the
//! object store.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::{StreamExt as _, TryStreamExt as _};
use sexton_jobs::files::object::ObjectRoot;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use super::scratch::Scratch;
use crate::cli::Cli;
use crate::cluster::connect;
use crate::disk::{self, Timed};
use crate::objects::Server;
use crate::sexton::sexton_env;

/// What a method's process did: the command, as run on the tree, its timing, and for sexton
/// what it kept, by reason, and its database backend's CPU time.
pub struct Run {
    pub command: String,
    pub timed: Timed,
    pub kept: BTreeMap<String, u64>,
    pub db_cpu_seconds: Option<f64>,
    /// Behind the throttling proxy: what it let through and answered `503` (PF-7).
    pub throttle: Option<Throttle>,
}

/// A run behind the proxy that answers `503 SlowDown` above `rate` requests a second.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Throttle {
    pub rate: u32,
    /// Requests the proxy forwarded to the server, and answered `503` itself.
    pub forwarded: usize,
    pub slowed_down: usize,
    /// Forwarded requests a second over the run, and that over `rate`.
    pub achieved_per_s: f64,
    pub of_rate: f64,
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
            throttle: None,
        }
    }
}

/// What a method runs on: the scratch its tree was written in (in a bucket of `server`, for an
/// `… s3` method), what the method's rule removes of the tree, entry by entry, and the quota
/// run's limit.
pub struct OnTree<'a> {
    pub scratch: &'a Scratch,
    pub server: Option<&'a Server>,
    pub goes: &'a [bool],
    pub max_bytes: u64,
}

/// Method `name` on the tree: `find`, a walk, the list-and-delete loop, or sexton (the build
/// `binary`) with the method's limits, held to delete as many entries as its rule removes.
/// sexton's plan file is removed after it.
pub async fn run_method(
    cli: &Cli,
    base: &PgConnectOptions,
    on: &OnTree<'_>,
    name: &str,
    binary: &Path,
) -> anyhow::Result<Run> {
    let (scratch, server) = (on.scratch, on.server);
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
        ("list+sig s3", Some(server)) => {
            let root = server.root(&scratch.root)?;
            list_signatures(base, &scratch.db, &root, cut).await?
        }
        ("sexton age throttled s3", Some(server)) => {
            throttled(cli, base, on, name, binary, server).await?
        }
        _ => run_clean(cli, base, on, name, binary).await?,
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
    let started = Instant::now();
    let pool = connect(base, db, "bench-walk").await?;
    let mut dirs = vec![root.to_owned()];
    let mut batch: Vec<(PathBuf, Uuid)> = Vec::new();
    let flush = async |batch: &mut Vec<(PathBuf, Uuid)>| -> anyhow::Result<()> {
        let sessions: Vec<Uuid> = batch.iter().map(|(_, s)| *s).collect();
        let live = live_sessions(&pool, &sessions).await?;
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
            if let Some(session) = signed_session(&first).filter(|_| old) {
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

/// The session a trace's first bytes sign for, if they start with a valid signature line.
fn signed_session(first: &[u8]) -> Option<Uuid> {
    #[derive(serde::Deserialize)]
    struct Signature {
        format: String,
        session_id: String,
    }
    let line = first.split(|b| *b == b'\n').next().unwrap_or_default();
    let sig = serde_json::from_slice::<Signature>(line).ok()?;
    (sig.format == "run-trace/1").then(|| Uuid::parse_str(&sig.session_id).ok())?
}

/// The sessions among `sessions` that are an agent's current or main one.
async fn live_sessions(pool: &sqlx::PgPool, sessions: &[Uuid]) -> anyhow::Result<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "SELECT s FROM unnest($1::uuid[]) s
         WHERE EXISTS (SELECT 1 FROM agents WHERE current_session_id = s)
            OR EXISTS (SELECT 1 FROM agents WHERE main_session_id = s)",
    )
    .bind(sessions)
    .fetch_all(pool)
    .await?)
}

/// PF-7's floor for traces on the object store, reaching sexton's end state by age: one
/// listing of the root, a ranged GET of the first 64 KiB of each `*.trace.jsonl` object last
/// modified before `cut` (as many in flight as sexton is configured for: the root's window, the
/// same client), the live sessions' traces among each thousand signed ones skipped (one query),
/// the rest deleted in one DeleteObjects call per thousand — no lease, no HEAD before the
/// delete, no plan, no holds.
async fn list_signatures(
    base: &PgConnectOptions,
    db: &str,
    root: &ObjectRoot,
    cut: DateTime<Utc>,
) -> anyhow::Result<Run> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-list-sig").await?;
    let mut signed = root
        .list_all()
        .map_err(anyhow::Error::from)
        .try_filter(|meta| {
            let old = meta.location.as_ref().ends_with(".trace.jsonl") && meta.last_modified < cut;
            std::future::ready(old)
        })
        .map_ok(|meta| async move {
            let first = root.first_bytes(&meta.location, meta.size, 64 * 1024).await;
            let first = first.map_err(anyhow::Error::msg)?;
            Ok(signed_session(&first).map(|session| (meta.location, session)))
        })
        .try_buffer_unordered(root.at_once())
        .try_filter_map(|signed| std::future::ready(Ok(signed)))
        .try_chunks(1000)
        .boxed();
    while let Some(thousand) = signed.next().await {
        let thousand = thousand.map_err(|err| err.1)?;
        let sessions: Vec<Uuid> = thousand.iter().map(|(_, session)| *session).collect();
        let live = live_sessions(&pool, &sessions).await?;
        let keys: Vec<_> = thousand
            .into_iter()
            .filter(|(_, session)| !live.contains(session))
            .map(|(key, _)| key)
            .collect();
        for outcome in root.delete(&keys).await {
            outcome.map_err(anyhow::Error::msg)?;
        }
    }
    pool.close().await;
    Ok(Run::in_process(
        "LIST the prefix; ranged GET of each old signature (the window's requests in flight); \
         live sessions per thousand; DeleteObjects per thousand",
        started,
    ))
}

/// sexton by age on the object store behind the proxy (`tests/common/proxy.rs`) answering
/// `503 SlowDown` above `--s3-throttle-rate` requests a second: its run, with what the proxy
/// let through against that rate.
async fn throttled(
    cli: &Cli,
    base: &PgConnectOptions,
    on: &OnTree<'_>,
    name: &str,
    binary: &Path,
    server: &Server,
) -> anyhow::Result<Run> {
    let proxy = crate::proxy::Proxy::start(server.endpoint()).await;
    proxy.limit_rate(Some(cli.s3_throttle_rate));
    let through = server.through(proxy.endpoint());
    let on = OnTree {
        server: Some(&through),
        ..*on
    };
    let mut run = run_clean(cli, base, &on, name, binary).await?;
    let forwarded = proxy.forwarded();
    let achieved_per_s = forwarded as f64 / run.timed.seconds;
    run.throttle = Some(Throttle {
        rate: cli.s3_throttle_rate,
        forwarded,
        slowed_down: proxy.throttled(),
        achieved_per_s,
        of_rate: achieved_per_s / f64::from(cli.s3_throttle_rate),
    });
    run.command = format!(
        "{} (through a proxy answering 503 SlowDown above {} requests/s)",
        run.command, cli.s3_throttle_rate
    );
    Ok(run)
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
        throttle: None,
    })
}

/// [`clean`] by the build `binary` with method `name`'s limits (the age limit, or no age and the
/// quota), its database backend's CPU time sampled; fails unless its totals report as many
/// deletions as the method's rule removes.
async fn run_clean(
    cli: &Cli,
    base: &PgConnectOptions,
    on: &OnTree<'_>,
    name: &str,
    binary: &Path,
) -> anyhow::Result<Run> {
    let scratch = on.scratch;
    let (age, bytes) = match name {
        "sexton age" | "sexton age s3" | "sexton age throttled s3" => (cli.trace_age_days, 0),
        _ => (0, on.max_bytes),
    };
    let expected = on.goes.iter().filter(|goes| **goes).count() as u64;
    let env = match on.server {
        Some(server) => server.env("TRACES_ROOT", &scratch.root)?,
        None => Vec::new(),
    };
    let plan_file = scratch.plan_file();
    let ((timed, totals), db_cpu_seconds) = disk::with_backend_cpu(
        base,
        &scratch.db,
        "sexton",
        clean(
            binary,
            &scratch.db,
            &scratch.roots,
            &plan_file,
            (age, bytes),
            &env,
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
        throttle: None,
    })
}

/// `sexton traces clean --confirm --json` with the limits given, its plan printed to
/// `plan_file`; returns its timing and totals.
async fn clean(
    binary: &Path,
    db: &str,
    roots: &Path,
    plan_file: &Path,
    (max_age_days, max_bytes): (u32, u64),
    env: &[(String, String)],
) -> anyhow::Result<(Timed, serde_json::Value)> {
    let plan = std::fs::File::create(plan_file)?;
    let timed = disk::timed(binary, &["traces", "clean", "--confirm", "--json"], |cmd| {
        cmd.env_remove("DATABASE_URL")
            .envs(sexton_env(db, roots))
            .env("SEXTON_TRACES__MAX_AGE_DAYS", max_age_days.to_string())
            .env("SEXTON_TRACES__MAX_BYTES", max_bytes.to_string())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(plan);
    })
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
