//! Attachment bytes (SPEC §4, AT-1): a nightly pass of `attachment_expiry` through the queue
//! against a plain loop over the same rows — read the live rows in id order, stat each file,
//! unlink the old ones and mark their rows, a thousand at a time — on identical copies of one
//! database with identical file trees.
//!
//! The rows are spread over a few accounts; every other file was last modified before the
//! cutoff (31–400 days before the pass), the rest after it (1–29 days), and one row in a
//! thousand has no file. Nothing else is in the database, so the pass's other jobs find nothing.
//! With `--baseline-sexton`, sexton's methods once more pair by pair with the earlier build.

mod plain;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use self::plain::{plain, plain_objects};
use crate::cli::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::compare::{self, Comparison, Side};
use crate::disk::{self, Rng, files_left};
use crate::method::{Method, Rounds};
use crate::objects::Server;
use crate::part::Bench;
use crate::results::{machine, member};
use crate::sexton::{Pass, ROOTS, Worker, pass_start, run_sexton, sexton};
use crate::table::{Column, columns, f, facts, mb, measured, or_dash};

/// The methods, in the order they run; the `… s3` ones only with an object store.
const METHODS: [&str; 6] = [
    "sexton",
    "sexton c=1",
    "plain",
    "plain+record",
    "sexton s3",
    "plain s3",
];

/// The part: measured, then written into the results.
pub fn run<'a>(bench: &'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>> {
    Box::pin(async move {
        let attachments = measure(bench.cli, bench.admin, bench.base).await?;
        bench
            .report
            .write(&[("attachments", member(&attachments)?)])?;
        Ok(attachments.before_after)
    })
}

/// The part's section of latest.md, from latest.json's `attachments`.
pub fn render(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
    let Some(attachments) = json.get("attachments") else {
        return Ok(None);
    };
    Ok(Some(markdown(&serde_json::from_value(
        attachments.clone(),
    )?)))
}

/// The database every method's copy is made from.
const TEMPLATE: &str = "benchatt_template";
const SEED: u64 = 0xa77a_c4ed_0001;
/// `[attachments] max_age_days`, the default.
const MAX_AGE_DAYS: i64 = 30;
/// One row in this many has no file.
const MISSING_EVERY: u64 = 1000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attachments {
    measured_at: DateTime<Utc>,
    machine: String,
    /// Measured by `--only`, without the scales.
    separate_run: bool,
    cache: String,
    /// The 1-minute load average before the first method and after the last.
    load_average: String,
    rows: u64,
    accounts: u32,
    /// Rows whose file is past the age: what each method marks and unlinks.
    expired: u64,
    /// Rows without a file: examined, left alone.
    missing: u64,
    max_age_days: i64,
    /// Building the template and writing one tree.
    fill_seconds: f64,
    /// Rounds of every method; each method's row is its median round.
    #[serde(default = "crate::method::one_round")]
    rounds: u32,
    methods: Vec<AttachmentMethod>,
    /// With `--baseline-sexton`: sexton's methods by both builds, pair by pair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    before_after: Vec<Comparison>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct AttachmentMethod {
    /// As the other parts: seconds, rates (of rows examined), hop latencies, peak RSS.
    #[serde(flatten)]
    method: Method,
    marked: u64,
    files_deleted: u64,
    /// The CPU time of the method's database backends.
    db_cpu_seconds: Option<f64>,
}

impl AttachmentMethod {
    /// Its run as one side of a comparison of two builds.
    fn side(&self) -> Side {
        Side {
            writer_wait_ms: None,
            ..self.method.side()
        }
    }
}

/// The row a file is written for.
struct Row {
    id: Uuid,
    account: usize,
    path: String,
    mtime: DateTime<Utc>,
    size: usize,
    missing: bool,
}

/// The rows, in a fixed order from [`SEED`].
fn rows(count: u64, accounts: u32) -> Vec<Row> {
    let mut rng = Rng::new(SEED);
    (0..count)
        .map(|i| {
            let id = rng.uuid();
            let account = (i % u64::from(accounts)) as usize;
            let days = if i % 2 == 0 {
                31.0 + rng.unit() * 369.0
            } else {
                1.0 + rng.unit() * 28.0
            };
            let mtime = pass_start() - chrono::Duration::seconds((days * 86_400.0) as i64);
            Row {
                id,
                account,
                path: format!("account-{account}/{:02x}/{id}.bin", id.as_bytes()[0]),
                mtime,
                size: 1024 + rng.below(3073) as usize,
                missing: i % MISSING_EVERY == MISSING_EVERY / 2,
            }
        })
        .collect()
}

fn cutoff() -> DateTime<Utc> {
    pass_start() - chrono::Duration::days(MAX_AGE_DAYS)
}

/// Writes every row's file under `root` (removed first), then syncs.
fn write_tree(root: &Path, rows: &[Row]) -> anyhow::Result<()> {
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    let body = vec![b'a'; 4096];
    for row in rows.iter().filter(|r| !r.missing) {
        let path = root.join(&row.path);
        let file = match std::fs::File::create(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path.parent().context("a parent")?)?;
                std::fs::File::create(&path)?
            }
            Err(err) => return Err(err.into()),
        };
        use std::io::Write as _;
        (&file).write_all(&body[..row.size])?;
        file.set_modified(UNIX_EPOCH + Duration::from_secs(u64::try_from(row.mtime.timestamp())?))?;
    }
    disk::sync();
    Ok(())
}

/// The attachment bytes: sexton through the queue (two hops at a time, the default, and one),
/// and the plain loops; then, with `--baseline-sexton`, sexton's methods pair by pair.
async fn measure(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
) -> anyhow::Result<Attachments> {
    let scratch = Scratch::make(cli.scratch.join("attachments"))?;
    eprintln!("attachments: {} rows", cli.attachment_rows);
    let started = Instant::now();
    let rows = rows(cli.attachment_rows, cli.attachment_accounts);
    template(cli, admin, base, &scratch.roots, &rows).await?;
    let counts = Counts::of(&rows);
    let mut fill_seconds = None;
    let mut dropped = true;
    let mut methods = Vec::new();
    let load_before = disk::load_average();
    // On the object store too, when there is one: the same rows, the tree in a bucket.
    let server = Server::of(cli);
    let bucket = match &server {
        Some(server) => Some((server, Scratch::make(server.bucket("benchatt"))?)),
        None => None,
    };
    let place = |name: &str| match &bucket {
        Some((server, bucket)) if name.ends_with(" s3") => (bucket, Some(*server)),
        _ => (&scratch, None),
    };
    let on_copy = async |name: &'static str, binary: &Path| {
        let db = format!("benchatt_{}", name.replace([' ', '=', '+'], "_"));
        recreate(admin, &db, Some(TEMPLATE)).await?;
        let (scratch, server) = place(name);
        write_tree(&scratch.root, &rows)?;
        let dropped = disk::start_alike(&scratch.root, cli.warm);
        eprintln!("attachments: {name}");
        let on = On {
            scratch,
            server,
            db: &db,
            counts: &counts,
        };
        let method = measure_method(cli, admin, base, &on, name, binary).await?;
        drop_db(admin, &db).await?;
        anyhow::Ok((method, dropped))
    };
    // Round by round, the methods taking turns; each method's median round is kept.
    let mut rounds = Rounds::new();
    for _ in 0..cli.attachment_rounds {
        for (at, name) in METHODS
            .into_iter()
            .filter(|name| !name.ends_with(" s3") || bucket.is_some())
            .enumerate()
        {
            let (method, cold) = on_copy(name, &cli.sexton).await?;
            fill_seconds.get_or_insert(started.elapsed().as_secs_f64());
            dropped &= cold;
            rounds.add(at, method);
        }
    }
    methods.extend(rounds.medians(|run: &AttachmentMethod| run.method.seconds));
    let mut before_after = Vec::new();
    for name in METHODS
        .into_iter()
        .filter(|name| name.starts_with("sexton"))
    {
        if name.ends_with(" s3") && bucket.is_none() {
            continue;
        }
        let pairs = compare::pairs(cli, "attachments", name.to_owned(), "rows/s", async |b| {
            Ok(on_copy(name, b.binary).await?.0.side())
        });
        before_after.extend(pairs.await?);
    }
    drop_db(admin, TEMPLATE).await?;
    let _ = std::fs::remove_dir_all(&scratch.dir);
    if let Some((_, bucket)) = &bucket {
        let _ = std::fs::remove_dir_all(&bucket.dir);
    }
    Ok(Attachments {
        measured_at: Utc::now(),
        machine: machine(),
        separate_run: !cli.with_scales(),
        cache: disk::cache_state(dropped).to_owned(),
        load_average: format!("{load_before} / {}", disk::load_average()),
        rows: cli.attachment_rows,
        accounts: cli.attachment_accounts,
        expired: counts.expired,
        missing: counts.missing,
        max_age_days: MAX_AGE_DAYS,
        fill_seconds: fill_seconds.unwrap_or_default(),
        rounds: cli.attachment_rounds,
        methods,
        before_after,
    })
}

/// The part's scratch: its directory and the roots sexton is given under it, the attachments'
/// root among them.
struct Scratch {
    dir: PathBuf,
    roots: PathBuf,
    root: PathBuf,
}

impl Scratch {
    /// Makes the roots under `dir` (removed first).
    fn make(dir: PathBuf) -> anyhow::Result<Self> {
        let roots = dir.join("roots");
        let root = roots.join("attachments");
        let _ = std::fs::remove_dir_all(&dir);
        for (_, name) in ROOTS {
            std::fs::create_dir_all(roots.join(name))?;
        }
        Ok(Self { dir, roots, root })
    }
}

/// What the rows hold, and so what every method must end with: the rows it examines, the
/// files past the age (each unlinked and its row marked), the rows without a file and those
/// with one.
struct Counts {
    examined: usize,
    expired: u64,
    missing: u64,
    with_files: u64,
}

impl Counts {
    /// The counts of `rows`.
    fn of(rows: &[Row]) -> Self {
        let expired = rows
            .iter()
            .filter(|r| !r.missing && r.mtime < cutoff())
            .count() as u64;
        let missing = rows.iter().filter(|r| r.missing).count() as u64;
        Self {
            examined: rows.len(),
            expired,
            missing,
            with_files: rows.len() as u64 - missing,
        }
    }
}

/// Builds the template under `roots`: migrated, then filled with the accounts and `rows`,
/// frozen and analysed.
async fn template(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    roots: &Path,
    rows: &[Row],
) -> anyhow::Result<()> {
    recreate(admin, TEMPLATE, None).await?;
    if !sexton(&cli.sexton, TEMPLATE, roots, &["migrate"])
        .status()
        .await?
        .success()
    {
        bail!("migrating {TEMPLATE} failed");
    }
    let pool = connect(base, TEMPLATE, "bench").await?;
    fill(&pool, cli.attachment_accounts, rows).await?;
    sqlx::query("VACUUM (FREEZE, ANALYZE)")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

/// The template's rows: `accounts` accounts (execution retention off), then a row per
/// attachment, ten thousand in a statement.
async fn fill(pool: &PgPool, accounts: u32, rows: &[Row]) -> anyhow::Result<()> {
    let mut account_ids = Vec::new();
    for n in 0..accounts {
        let id: Uuid = sqlx::query_scalar(
            "INSERT INTO accounts (name, execution_details_retention_days)
             VALUES ($1, NULL) RETURNING id",
        )
        .bind(format!("bench {n}"))
        .fetch_one(pool)
        .await?;
        account_ids.push(id);
    }
    for chunk in rows.chunks(10_000) {
        let ids: Vec<Uuid> = chunk.iter().map(|r| r.id).collect();
        let owners: Vec<Uuid> = chunk.iter().map(|r| account_ids[r.account]).collect();
        let paths: Vec<&str> = chunk.iter().map(|r| r.path.as_str()).collect();
        let sizes: Vec<i64> = chunk.iter().map(|r| r.size as i64).collect();
        let created: Vec<DateTime<Utc>> = chunk.iter().map(|r| r.mtime).collect();
        sqlx::query(
            "INSERT INTO attachments (id, account_id, relative_path, bytes, created_at)
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::timestamptz[])",
        )
        .bind(&ids)
        .bind(&owners)
        .bind(&paths)
        .bind(&sizes)
        .bind(&created)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// What a method runs on: the scratch its tree was written in (in a bucket of `server`, for an
/// `… s3` method), its copy of the database, and what every method must end with.
struct On<'a> {
    scratch: &'a Scratch,
    server: Option<&'a Server>,
    db: &'a str,
    counts: &'a Counts,
}

/// Method `name` (sexton's by the build `binary`) on its copy and the tree written for it, its
/// database backends' CPU time sampled; checked to end as the counts say, and scored by the
/// rows it examined.
async fn measure_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    on: &On<'_>,
    name: &'static str,
    binary: &Path,
) -> anyhow::Result<AttachmentMethod> {
    let On {
        scratch,
        server,
        db,
        counts,
    } = *on;
    let attachment_expiry = Pass {
        job: "attachment_expiry",
        global: false,
    };
    let (mut method, db_cpu_seconds) = match (name, server) {
        ("sexton" | "sexton c=1" | "sexton s3", _) => {
            let env = match server {
                Some(server) => server.env("ATTACHMENTS_ROOT", &scratch.root)?,
                None => Vec::new(),
            };
            let worker = Worker {
                binary,
                name,
                concurrency: if name == "sexton c=1" { 1 } else { 2 },
                pass: &attachment_expiry,
                env: &env,
            };
            let run = run_sexton(cli, admin, db, &scratch.roots, &worker);
            disk::with_backend_cpu(base, db, "sexton", run).await?
        }
        (_, Some(server)) => {
            let run = plain_objects(base, db, server.root(&scratch.root)?, cutoff());
            disk::with_backend_cpu(base, db, "bench-plain", run).await?
        }
        (_, None) => {
            let record = name == "plain+record";
            let run = plain(base, db, &scratch.root, cutoff(), record);
            disk::with_backend_cpu(base, db, "bench-plain", run).await?
        }
    };
    method.owners_per_s = counts.examined as f64 / method.seconds;
    method.rows_per_s = method.owners_per_s;
    let left = check(base, db, &scratch.root, name, counts).await?;
    Ok(AttachmentMethod {
        method,
        marked: counts.expired,
        files_deleted: counts.with_files - left,
        db_cpu_seconds,
    })
}

/// The method's end state: every expired row marked and its file unlinked, every other file
/// left and no deletion pending. Returns how many files are left.
async fn check(
    base: &PgConnectOptions,
    db: &str,
    root: &Path,
    name: &str,
    counts: &Counts,
) -> anyhow::Result<u64> {
    let Counts {
        expired,
        with_files,
        ..
    } = *counts;
    let check = connect(base, db, "bench").await?;
    let (marked, pending): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM attachments WHERE bytes_expired_at IS NOT NULL),
                (SELECT count(*) FROM sexton.pending_file_deletions)",
    )
    .fetch_one(&check)
    .await?;
    check.close().await;
    let left = files_left(root)?;
    if u64::try_from(marked)? != expired || left != with_files - expired || pending != 0 {
        bail!(
            "{name}: {marked} rows marked of {expired} expired, {left} files left of {}, {pending} deletions pending",
            with_files - expired
        );
    }
    Ok(left)
}

/// The attachment bytes' section of latest.md: the facts, then a row per method.
fn markdown(a: &Attachments) -> String {
    let mut md = facts(&[
        (
            "measured",
            measured(&a.measured_at, &a.machine, !a.separate_run),
        ),
        ("page cache", a.cache.clone()),
        ("1-minute load before / after", a.load_average.clone()),
        ("rows", a.rows.to_string()),
        ("accounts", a.accounts.to_string()),
        ("expired (files past the age)", a.expired.to_string()),
        ("rows without a file", a.missing.to_string()),
        ("max_age_days", a.max_age_days.to_string()),
        ("template and first tree in s", f(a.fill_seconds, 1)),
        ("rounds (each method's median shown)", a.rounds.to_string()),
    ]);
    let methods: Vec<(&Attachments, &AttachmentMethod)> =
        a.methods.iter().map(|m| (a, m)).collect();
    md.push_str(&format!(
        "\n### Methods\n\n{}",
        columns(METHOD_COLUMNS, &methods)
    ));
    if !a.before_after.is_empty() {
        let compared = compare::markdown(&a.before_after);
        md.push_str(&format!("\n### Before and after\n\n{compared}"));
    }
    md
}

/// A row per method: its time and rate against the plain loop on the same backend (the disk's
/// or the object store's), what it marked and deleted, its hops, database CPU and memory.
const METHOD_COLUMNS: &[Column<Attachments, AttachmentMethod>] = &[
    ("method", |_, m| m.method.name.clone()),
    ("s", |_, m| f(m.method.seconds, 1)),
    ("rows examined/s", |_, m| f(m.method.rows_per_s, 0)),
    ("vs plain", |a, m| {
        let floor = if m.method.name.ends_with(" s3") {
            "plain s3"
        } else {
            "plain"
        };
        let floor = a.methods.iter().find(|f| f.method.name == floor);
        or_dash(floor, |f| {
            format!("{:.2}×", m.method.rows_per_s / f.method.rows_per_s)
        })
    }),
    ("rows marked", |_, m| m.marked.to_string()),
    ("files deleted", |_, m| m.files_deleted.to_string()),
    ("hop median / p99 ms", |_, m| {
        or_dash(m.method.hop, |h| h.median_p99())
    }),
    ("database CPU s", |_, m| {
        or_dash(m.db_cpu_seconds, |s| f(s, 1))
    }),
    ("peak RSS MB", |_, m| mb(m.method.peak_rss_kb)),
];
