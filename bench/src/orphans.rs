//! Derivative cleanup (SPEC §12, DC-4): `sexton orphans scan --root outputs --confirm` against
//! the floor that reaches the same end state — a walk of the root, a batched anti-join of its
//! paths against `output_files` through the path-key index, an unlink of what no row names —
//! on trees of 100 k and 1 M files of which a tenth no row owns, each with its files/s and
//! sexton's peak RSS; on the object store too, when there is one, against a listing, the same
//! anti-join and DeleteObjects per thousand keys ([`floor`]). Every method's end state is
//! checked: each orphan gone, every file a row names still there.

mod floor;
mod markdown;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::cluster::{connect, drop_db, recreate};
use crate::compare::Comparison;
use crate::disk;
use crate::objects::Server;
use crate::part::Bench;
use crate::results::{machine, member};
use crate::sexton::{ROOTS, sexton, sexton_env};

/// Files in each run's directory: nine its `output_files` rows name, one no row does.
const PER_RUN: u64 = 10;
/// Runs of each account.
const RUNS_PER_ACCOUNT: u64 = 1_000;
/// How old every file is: past the default grace of 7 days, so that every orphan goes.
const AGE_DAYS: u64 = 30;
/// The name of the file no row names in each run's directory.
const ORPHAN: &str = "orphan.bin";
/// A file's bytes.
const BODY: &[u8] = &[b'x'; 64];

/// The part's figures (latest.json's `orphans`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Orphans {
    pub measured_at: DateTime<Utc>,
    pub machine: String,
    pub separate_run: bool,
    pub cache: String,
    pub load_average: String,
    pub scales: Vec<Scale>,
    /// sexton's peak RSS on the largest tree on disk over the smallest.
    pub rss_ratio: Option<f64>,
}

/// One tree: where it is, its size, and each method's run on it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Scale {
    /// `disk`, or `s3` for a tree in a bucket of the object store.
    pub store: String,
    pub files: u64,
    pub orphans: u64,
    /// Seconds to write the tree and its rows.
    pub fill_seconds: f64,
    pub methods: Vec<Measured>,
}

/// One method's run on a tree.
#[derive(Debug, Serialize, Deserialize)]
pub struct Measured {
    pub name: String,
    pub command: String,
    /// The median round's seconds.
    pub seconds: f64,
    /// Each round's seconds, in the order run, with `--orphan-rounds` above 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<f64>,
    /// Files of the tree judged per second (every file, not only the orphans).
    pub files_per_second: f64,
    /// sexton's process (the floors run inside the benchmark's own).
    pub peak_rss_kb: Option<u64>,
    pub removed: u64,
}

/// The part: each size of `--orphan-files` on disk, then `--orphan-objects` on the object store
/// when there is one, each written into the results as it is done.
pub fn run<'a>(bench: &'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>> {
    Box::pin(async move {
        let cli = bench.cli;
        let load_before = disk::load_average();
        let mut orphans = Orphans {
            measured_at: Utc::now(),
            machine: machine(),
            separate_run: !cli.with_scales(),
            cache: String::new(),
            load_average: String::new(),
            scales: Vec::new(),
            rss_ratio: None,
        };
        let server = Server::of(cli);
        let mut sizes: Vec<(u64, Option<&Server>)> =
            cli.orphan_files.iter().map(|n| (*n, None)).collect();
        if let Some(server) = &server {
            sizes.push((cli.orphan_objects, Some(server)));
        }
        let mut dropped = true;
        for (files, server) in sizes {
            let (scale, cold) = measure(bench, files, server).await?;
            dropped &= cold;
            orphans.scales.push(scale);
            orphans.cache = disk::cache_state(dropped).to_owned();
            orphans.load_average = format!("{load_before} / {}", disk::load_average());
            orphans.rss_ratio = rss_ratio(&orphans.scales);
            bench.report.write(&[("orphans", member(&orphans)?)])?;
        }
        Ok(Vec::new())
    })
}

/// The part's section of latest.md, from latest.json's `orphans`.
pub fn render(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
    let Some(orphans) = json.get("orphans") else {
        return Ok(None);
    };
    Ok(Some(markdown::markdown(&serde_json::from_value(
        orphans.clone(),
    )?)))
}

fn rss_ratio(scales: &[Scale]) -> Option<f64> {
    let on_disk: Vec<&Scale> = scales.iter().filter(|s| s.store == "disk").collect();
    let fewest = on_disk.iter().min_by_key(|s| s.files)?;
    let most = on_disk.iter().max_by_key(|s| s.files)?;
    let rss = |s: &Scale| s.methods.iter().find_map(|m| m.peak_rss_kb);
    (fewest.files < most.files).then_some(rss(most)? as f64 / rss(fewest)? as f64)
}

/// One tree of `files` files (on disk, or in a bucket of `server`) and its rows, each method run
/// on it in turn and the orphans written back between them. Returns whether every method
/// started with the page cache dropped.
async fn measure(
    bench: &Bench<'_>,
    files: u64,
    server: Option<&Server>,
) -> anyhow::Result<(Scale, bool)> {
    let cli = bench.cli;
    let store = if server.is_some() { "s3" } else { "disk" };
    let dir = match server {
        Some(server) => server.bucket("benchorphans"),
        None => cli.scratch.join(format!("orphans-{files}")),
    };
    let roots = dir.join("roots");
    let root = roots.join("outputs");
    let _ = std::fs::remove_dir_all(&dir);
    for (_, name) in ROOTS {
        std::fs::create_dir_all(roots.join(name))?;
    }
    let free = disk::free_bytes(&dir)?;
    let need = files * 4096 + (1 << 30);
    if free < need {
        bail!(
            "{files} files need about {} MB under {}, {} MB are free",
            need >> 20,
            dir.display(),
            free >> 20
        );
    }
    let db = format!("benchor_{store}_{files}");
    recreate(bench.admin, &db, None).await?;
    if !sexton(&cli.sexton, &db, &roots, &["migrate"])
        .status()
        .await?
        .success()
    {
        bail!("migrating {db} failed");
    }
    let pool = connect(bench.base, &db, "bench-orphans").await?;
    eprintln!("orphans: {files} files ({store}): writing the rows and the tree");
    let started = Instant::now();
    let runs = seed(&pool, files.div_ceil(PER_RUN)).await?;
    write_tree(&root, &runs, true)?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let orphans = runs.len() as u64;
    let files = orphans * PER_RUN;
    let mut methods: Vec<Measured> = Vec::new();
    let mut dropped = true;
    let names: &[&str] = if server.is_some() {
        &["sexton s3", "list+anti-join s3"]
    } else {
        &["sexton", "walk+anti-join"]
    };
    let turns = names
        .iter()
        .cycle()
        .take(names.len() * cli.orphan_rounds as usize);
    for (n, name) in turns.enumerate() {
        if n > 0 {
            write_tree(&root, &runs, false)?;
        }
        dropped &= disk::start_alike(&root, cli.warm);
        eprintln!("orphans: {files} files ({store}): {name}");
        let (command, seconds, peak_rss_kb) = if name.starts_with("sexton") {
            let mut env = sexton_env(&db, &roots);
            if let Some(server) = server {
                env.extend(
                    server
                        .env("OUTPUT_ROOT", &root)?
                        .into_iter()
                        .map(|(k, v)| (k, v.into())),
                );
            }
            let args = [
                "orphans",
                "scan",
                "--root",
                "outputs",
                "--confirm",
                "--json",
            ];
            let timed = disk::timed(&cli.sexton, &args, |cmd| {
                cmd.env_remove("DATABASE_URL").envs(env);
            })
            .await?;
            let command = format!("sexton {}", args.join(" "));
            (command, timed.seconds, timed.peak_rss_kb)
        } else {
            let started = Instant::now();
            let command = match server {
                Some(server) => floor::list_anti_join(&pool, &*server.root(&root)?).await?,
                None => floor::walk_anti_join(&pool, &root).await?,
            };
            (command, started.elapsed().as_secs_f64(), None)
        };
        let removed = check(&root, &runs)?;
        if removed != orphans {
            bail!("{name} removed {removed} of the {orphans} orphans");
        }
        match methods.iter_mut().find(|m| m.name == *name) {
            Some(measured) => {
                measured.rounds.push(seconds);
                measured.peak_rss_kb = measured.peak_rss_kb.max(peak_rss_kb);
            }
            None => methods.push(Measured {
                name: (*name).to_owned(),
                command,
                seconds,
                rounds: vec![seconds],
                files_per_second: 0.0,
                peak_rss_kb,
                removed,
            }),
        }
    }
    for measured in &mut methods {
        measured.seconds = median(&measured.rounds);
        measured.files_per_second = files as f64 / measured.seconds;
        if measured.rounds.len() == 1 {
            measured.rounds.clear();
        }
    }
    pool.close().await;
    drop_db(bench.admin, &db).await?;
    let _ = std::fs::remove_dir_all(&dir);
    let scale = Scale {
        store: store.to_owned(),
        files,
        orphans,
        fill_seconds,
        methods,
    };
    Ok((scale, dropped))
}

/// The median of `seconds` (the lower middle of an even count).
fn median(seconds: &[f64]) -> f64 {
    let mut sorted = seconds.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(sorted.len() - 1) / 2]
}

/// `runs` runs with their rows, a thousand to an account, each naming nine output files of its
/// directory (`<account>/<run>/f<k>.bin`); returns each run's directory.
async fn seed(pool: &PgPool, runs: u64) -> anyhow::Result<Vec<(Uuid, Uuid)>> {
    let accounts = runs.div_ceil(RUNS_PER_ACCOUNT) as i64;
    let named = (PER_RUN - 1) as i64;
    let statements = [
        format!(
            "INSERT INTO accounts (name) SELECT 'orphans ' || n FROM generate_series(1, {accounts}) n"
        ),
        "INSERT INTO conversations (account_id) SELECT id FROM accounts".to_owned(),
        format!(
            "INSERT INTO runs (account_id, conversation_id, status, completed_at)
             SELECT c.account_id, c.id, 'completed', now()
             FROM conversations c, generate_series(1, {RUNS_PER_ACCOUNT}) k
             ORDER BY c.id, k LIMIT {runs}"
        ),
        format!(
            "INSERT INTO output_files (run_id, relative_path, bytes)
             SELECT r.id, r.account_id || '/' || r.id || '/f' || k || '.bin', {}
             FROM runs r, generate_series(1, {named}) k",
            BODY.len()
        ),
        "ANALYZE".to_owned(),
    ];
    for sql in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await?;
    }
    Ok(
        sqlx::query_as("SELECT account_id, id FROM runs ORDER BY account_id, id")
            .fetch_all(pool)
            .await?,
    )
}

/// Writes each run's directory under `root` — every file when `whole`, else only the orphan
/// each method removed — aged [`AGE_DAYS`].
fn write_tree(root: &Path, runs: &[(Uuid, Uuid)], whole: bool) -> anyhow::Result<()> {
    let old = SystemTime::now() - Duration::from_secs(AGE_DAYS * 86_400);
    let write = |path: PathBuf| -> anyhow::Result<()> {
        let file = std::fs::File::create(&path).with_context(|| path.display().to_string())?;
        std::io::Write::write_all(&mut &file, BODY)?;
        file.set_modified(old)?;
        Ok(())
    };
    for (account, run) in runs {
        let dir = root.join(account.to_string()).join(run.to_string());
        if whole {
            std::fs::create_dir_all(&dir)?;
            for k in 1..PER_RUN {
                write(dir.join(format!("f{k}.bin")))?;
            }
        }
        write(dir.join(ORPHAN))?;
    }
    Ok(())
}

/// How many orphans are gone; fails if a file a row names is gone too.
fn check(root: &Path, runs: &[(Uuid, Uuid)]) -> anyhow::Result<u64> {
    let mut gone = 0;
    for (account, run) in runs {
        let dir = root.join(account.to_string()).join(run.to_string());
        for k in 1..PER_RUN {
            let named = dir.join(format!("f{k}.bin"));
            if !named.exists() {
                bail!("{} is gone, but a row names it", named.display());
            }
        }
        gone += u64::from(!dir.join(ORPHAN).exists());
    }
    Ok(gone)
}
