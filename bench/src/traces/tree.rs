//! A run-traces tree and its rules: how a tree of a given size is written (no seed command:
//! `<agent_id>/run-NNN.trace.jsonl`, a hundred per agent directory, each starting with a valid
//! signature and a 1–4 KiB body, with mtimes spread evenly over 0–120 days, all from one seed,
//! so that every method gets the same tree, written afresh), its decoys (bad signatures,
//! symlinks in and out of the root, live sessions' traces), the agents the platform holds for
//! it, which entries each method's rule removes, and the check of a method's end state.

use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::cli::Cli;
use crate::cluster::connect;
use crate::disk::{self, Rng};

const SEED: u64 = 0x7ace_5eed_0001;
pub const FILES_PER_AGENT: u64 = 100;
const SESSIONS_PER_AGENT: u64 = 10;
/// Every this many agents, the agent's current and main sessions (two of its ten) are live.
pub const LIVE_AGENT_EVERY: u64 = 50;
/// One file in this many has a bad signature …
pub const BAD_EVERY: u64 = 1000;
/// … and one in this many is a symlink.
pub const LINK_EVERY: u64 = 2000;
/// Files' ages are spread over this many days.
pub const SPAN_DAYS: f64 = 120.0;
/// No age falls this close below or above the age limit: `find -mtime +N` deletes files at least
/// N + 1 whole days old, sexton those older than N days, and a run comes minutes after its tree
/// was written. Outside this gap the two rules agree.
const GAP_BELOW_DAYS: f64 = 0.25;
const GAP_ABOVE_DAYS: f64 = 1.25;
pub const DAY_NS: i128 = 86_400 * 1_000_000_000;
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A valid trace of a session no agent has as current or main.
    Trace,
    /// A valid trace of an agent's current or main session.
    Live,
    BadSignature,
    Symlink,
}

pub struct Entry {
    /// Relative to the traces root.
    pub path: String,
    pub kind: Kind,
    /// As stored (read back after writing).
    pub mtime_ns: i128,
    /// Allocated bytes (blocks × 512), as the quota counts them.
    pub allocated: u64,
}

pub struct Agent {
    pub id: Uuid,
    pub current: Option<Uuid>,
    pub main: Option<Uuid>,
}

pub struct Tree {
    pub entries: Vec<Entry>,
    pub agents: Vec<Agent>,
}

impl Tree {
    pub fn count(&self, kind: Kind) -> u64 {
        self.entries.iter().filter(|e| e.kind == kind).count() as u64
    }

    /// Allocated bytes of the candidates (valid traces, live ones included).
    pub fn allocated(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| matches!(e.kind, Kind::Trace | Kind::Live))
            .map(|e| e.allocated)
            .sum()
    }
}

/// What method `name`'s rule removes, entry by entry: sexton's age the traces of no live
/// session older than the cutoff, `find` every entry older than it, the quota what
/// [`quota_plan`] sends to bring the candidates down to `max_bytes`.
pub fn goes(tree: &Tree, name: &str, cut_ns: i128, max_bytes: u64) -> Vec<bool> {
    match name {
        "sexton age"
        | "walk+sig age"
        | "walk+every-sig age"
        | "sexton age s3"
        | "list+sig s3"
        | "sexton age throttled s3" => tree
            .entries
            .iter()
            .map(|e| e.kind == Kind::Trace && e.mtime_ns < cut_ns)
            .collect(),
        "find age" | "list-delete s3" => tree.entries.iter().map(|e| e.mtime_ns < cut_ns).collect(),
        _ => quota_plan(tree, max_bytes),
    }
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

/// The agents, as the platform holds them: one per directory, every fiftieth with a current and
/// a main session (whose traces are live).
pub async fn add_agents(
    base: &PgConnectOptions,
    db: &str,
    agents: &[&Agent],
) -> anyhow::Result<()> {
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
pub fn generate(
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
pub fn check(
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
