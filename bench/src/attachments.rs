//! Attachment bytes (SPEC §4, AT-1): a nightly pass of `attachment_expiry` through the queue
//! against a plain loop over the same rows — read the live rows in id order, stat each file,
//! unlink the old ones and mark their rows, a thousand at a time — on identical copies of one
//! database with identical file trees.
//!
//! The rows are spread over a few accounts; every other file was last modified before the
//! cutoff (31–400 days before the pass), the rest after it (1–29 days), and one row in a
//! thousand has no file. Nothing else is in the database, so the pass's other jobs find nothing.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use serde::Serialize;
use sexton_jobs::files::object::ObjectRoot;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::cluster::{connect, drop_db, recreate};
use crate::disk::{self, Rng};
use crate::method::{Method, method};
use crate::objects::Server;
use crate::results::{Section, machine, write_results};
use crate::sexton::{Pass, ROOTS, pass_start, run_sexton, sexton};
use crate::{Cli, Part};

/// The heading the attachment bytes' section starts with, in latest.md.
pub const ATTACHMENTS_HEADING: &str = "## Attachment bytes";

/// The database every method's copy is made from.
const TEMPLATE: &str = "benchatt_template";
const SEED: u64 = 0xa77a_c4ed_0001;
/// `[attachments] max_age_days`, the default.
const MAX_AGE_DAYS: i64 = 30;
/// One row in this many has no file.
const MISSING_EVERY: u64 = 1000;
/// Rows the plain loop reads, checks and marks together.
const PLAIN_BATCH: i64 = 1000;

#[derive(Debug, Clone, Serialize)]
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
    methods: Vec<AttachmentMethod>,
}

#[derive(Debug, Clone, Serialize)]
struct AttachmentMethod {
    /// As the other parts: seconds, rates (of rows examined), hop latencies, peak RSS.
    #[serde(flatten)]
    method: Method,
    marked: u64,
    files_deleted: u64,
    /// The CPU time of the method's database backends.
    db_cpu_seconds: Option<f64>,
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

/// Files left under `root` (its subdirectories walked).
pub fn files_left(root: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(entry.path());
            } else {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// The attachment bytes: sexton through the queue (two hops at a time, the default, and one),
/// and the plain loop.
pub async fn measure(cli: &Cli, admin: &PgPool, base: &PgConnectOptions) -> anyhow::Result<()> {
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
    let mut names = vec!["sexton", "sexton c=1", "plain", "plain+record"];
    if bucket.is_some() {
        names.extend(["sexton s3", "plain s3"]);
    }
    for name in names {
        let db = format!("benchatt_{}", name.replace([' ', '=', '+'], "_"));
        recreate(admin, &db, Some(TEMPLATE)).await?;
        let (place, scratch) = match &bucket {
            Some((server, bucket)) if name.ends_with(" s3") => (Some(*server), bucket),
            _ => (None, &scratch),
        };
        write_tree(&scratch.root, &rows)?;
        fill_seconds.get_or_insert(started.elapsed().as_secs_f64());
        dropped &= disk::start_alike(&scratch.root, cli.warm);
        eprintln!("attachments: {name}");
        let method = measure_method(cli, admin, base, scratch, place, &db, name, &counts);
        methods.push(method.await?);
        drop_db(admin, &db).await?;
    }
    drop_db(admin, TEMPLATE).await?;
    let _ = std::fs::remove_dir_all(&scratch.dir);
    if let Some((_, bucket)) = &bucket {
        let _ = std::fs::remove_dir_all(&bucket.dir);
    }
    let attachments = Attachments {
        measured_at: Utc::now(),
        machine: machine(),
        separate_run: !cli.only.is_empty() && !cli.only.contains(&Part::Scales),
        cache: disk::cache_state(dropped).to_owned(),
        load_average: format!("{load_before} / {}", disk::load_average()),
        rows: cli.attachment_rows,
        accounts: cli.attachment_accounts,
        expired: counts.expired,
        missing: counts.missing,
        max_age_days: MAX_AGE_DAYS,
        fill_seconds: fill_seconds.unwrap_or_default(),
        methods,
    };
    write_results(cli, Section::Attachments(&attachments))?;
    println!("{}", markdown(&attachments));
    Ok(())
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
    if !sexton(cli, TEMPLATE, roots, &["migrate"])
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

/// Method `name` on database `db` and the tree written for it, its database backends' CPU
/// time sampled; checked to end as `counts` says, and scored by the rows it examined.
#[allow(clippy::too_many_arguments)]
async fn measure_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    scratch: &Scratch,
    server: Option<&Server>,
    db: &str,
    name: &'static str,
    counts: &Counts,
) -> anyhow::Result<AttachmentMethod> {
    let attachment_expiry = Pass {
        job: "attachment_expiry",
        global: false,
    };
    let (mut method, db_cpu_seconds) = match (name, server) {
        ("sexton" | "sexton c=1" | "sexton s3", _) => {
            let concurrency = if name == "sexton c=1" { 1 } else { 2 };
            let env = match server {
                Some(server) => server.env("ATTACHMENTS_ROOT", &scratch.root)?,
                None => Vec::new(),
            };
            let run = run_sexton(
                cli,
                admin,
                db,
                &scratch.roots,
                name,
                concurrency,
                &attachment_expiry,
                &env,
            );
            disk::with_backend_cpu(base, db, "sexton", run).await?
        }
        (_, Some(server)) => {
            let run = plain_objects(base, db, server.root(&scratch.root)?);
            disk::with_backend_cpu(base, db, "bench-plain", run).await?
        }
        (_, None) => {
            let record = name == "plain+record";
            let run = plain(base, db, &scratch.root, record);
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

/// The plain loop: the next thousand live rows in id order, a stat of each file (not following a
/// symlink), the old ones unlinked, then their rows marked in one statement. With `record`, the
/// order a crash cannot break instead (what sexton's durable file record costs, ER-3): the old
/// rows marked and their files recorded in one statement and committed, the files unlinked,
/// then their records deleted.
async fn plain(
    base: &PgConnectOptions,
    db: &str,
    root: &Path,
    record: bool,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-plain").await?;
    let cutoff = cutoff().timestamp();
    let mut after = Uuid::nil();
    loop {
        let batch = live_rows(&pool, after).await?;
        let Some((last, _)) = batch.last() else {
            break;
        };
        after = *last;
        let mut expired = Vec::new();
        for (id, path) in &batch {
            let path = root.join(path);
            if let Ok(meta) = std::fs::symlink_metadata(&path)
                && meta.is_file()
                && meta.mtime() < cutoff
            {
                if !record {
                    std::fs::remove_file(&path)?;
                }
                expired.push(*id);
            }
        }
        if !record {
            mark(&pool, &expired).await?;
            continue;
        }
        let recorded: Vec<(i64, String)> = sqlx::query_as(
            "WITH marked AS (
                 UPDATE attachments SET bytes_expired_at = now() WHERE id = ANY($1)
                 RETURNING account_id, relative_path)
             INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
             SELECT 'attachments', account_id, relative_path FROM marked
             RETURNING id, relative_path",
        )
        .bind(&expired)
        .fetch_all(&pool)
        .await?;
        for (_, path) in &recorded {
            std::fs::remove_file(root.join(path))?;
        }
        let ids: Vec<i64> = recorded.iter().map(|(id, _)| *id).collect();
        sqlx::query("DELETE FROM sexton.pending_file_deletions WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&pool)
            .await?;
    }
    pool.close().await;
    let mut m = method(if record { "plain+record" } else { "plain" });
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// The plain loops' next thousand live rows after `after`, in id order.
async fn live_rows(pool: &PgPool, after: Uuid) -> anyhow::Result<Vec<(Uuid, String)>> {
    Ok(sqlx::query_as(
        "SELECT id, relative_path FROM attachments
         WHERE bytes_expired_at IS NULL AND id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(PLAIN_BATCH)
    .fetch_all(pool)
    .await?)
}

/// The plain loops' marking of `expired` rows, in one statement.
async fn mark(pool: &PgPool, expired: &[Uuid]) -> anyhow::Result<()> {
    sqlx::query("UPDATE attachments SET bytes_expired_at = now() WHERE id = ANY($1)")
        .bind(expired)
        .execute(pool)
        .await?;
    Ok(())
}

/// The plain loop on the object store: one listing of the root for every object's
/// `LastModified`, then the next thousand live rows in id order, the old ones' objects deleted in
/// one DeleteObjects call, their rows marked in one statement.
async fn plain_objects(
    base: &PgConnectOptions,
    db: &str,
    root: Arc<ObjectRoot>,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-plain").await?;
    let mut modified = HashMap::new();
    let mut listing = root.list_all();
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        if let Some(relative) = root.relative(&meta.location) {
            modified.insert(relative, meta.last_modified);
        }
    }
    let mut after = Uuid::nil();
    loop {
        let batch = live_rows(&pool, after).await?;
        let Some((last, _)) = batch.last() else {
            break;
        };
        after = *last;
        let (mut expired, mut keys) = (Vec::new(), Vec::new());
        for (id, path) in &batch {
            if modified.get(path).is_some_and(|at| *at < cutoff()) {
                keys.push(root.key(path).map_err(anyhow::Error::msg)?);
                expired.push(*id);
            }
        }
        for outcome in root.delete(&keys).await {
            outcome.map_err(anyhow::Error::msg)?;
        }
        mark(&pool, &expired).await?;
    }
    pool.close().await;
    let mut m = method("plain s3");
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// The attachment bytes' section of latest.md.
pub fn markdown(a: &Attachments) -> String {
    let when = if a.separate_run {
        "in a separate run from the tables above (`bash bench/run.sh --only attachments`)"
    } else {
        "in the same run as the tables above"
    };
    let mut md = format!(
        "{ATTACHMENTS_HEADING}\n\nMeasured {} on {}, {when}. {} attachment rows over {} accounts, each with a 1–4 KiB file under `account-N/xx/<id>.bin`; {} files were last modified before the cutoff (31–400 days before the pass, `max_age_days = {}`), the rest after it (1–29 days), and {} rows have no file. Each method runs on its own copy of the database with its own tree, written from the same seed; page cache: {}. sexton: `sexton tick` at the pass start, then one worker (`--exit-when-idle`, default settings: `window_size = 1000`) running `queue.concurrency` hops at a time (one account each), timed from the worker taking the nightly slot to its last `attachment_expiry` hop; its files go through `files::drain` within the hops. plain: `SELECT id, relative_path … WHERE bytes_expired_at IS NULL AND id > $1 ORDER BY id LIMIT 1000`, `lstat` each file, unlink the old ones, `UPDATE attachments SET bytes_expired_at = now() WHERE id = ANY($1)`, one lane, timed from connecting to its last batch. plain+record: the same, but in the order a crash cannot break (sexton's, ER-3): the old rows marked and their files recorded in `sexton.pending_file_deletions` in one statement, committed, the files unlinked, then their records deleted — without sexton's lock and re-check of each row, hold check or second look at each file before its unlink. `… s3`: the same on an S3-compatible server on loopback (s3s-fs, each object a file of the same tree in a bucket's directory): sexton with its attachments root `s3://…` (each object read with a HEAD before it is judged and again just before its batched delete, OS-2), plain s3 one listing of the root for every `LastModified`, then per thousand rows one DeleteObjects call of the old ones; each `… s3` ratio is against plain s3. Rows examined per second count every live row; database CPU is that of the method's backends (sampled from `/proc`). 1-minute load average before the first method and after the last: {}.\n\n| rows | expired | method | seconds | rows examined/s | vs plain | rows marked | files deleted | hop median / p99 ms | database CPU s | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        a.measured_at.format("%Y-%m-%d"),
        a.machine,
        a.rows,
        a.accounts,
        a.expired,
        a.max_age_days,
        a.missing,
        a.cache,
        a.load_average,
    );
    // Each method against the plain loop on the same backend: the disk's, or the object store's.
    let plain = |name: &str| {
        let floor = if name.ends_with(" s3") {
            "plain s3"
        } else {
            "plain"
        };
        a.methods
            .iter()
            .find(|m| m.method.name == floor)
            .map_or(0.0, |m| m.method.rows_per_s)
    };
    for AttachmentMethod {
        method: m,
        marked,
        files_deleted,
        db_cpu_seconds,
    } in &a.methods
    {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.0} | {:.2}× | {} | {} | {} | {} | {} |\n",
            a.rows,
            a.expired,
            m.name,
            m.seconds,
            m.rows_per_s,
            m.rows_per_s / plain(m.name),
            marked,
            files_deleted,
            m.hop.map_or("—".into(), |h| format!(
                "{:.0} / {:.0}",
                h.p50_ms, h.p99_ms
            )),
            db_cpu_seconds.map_or("—".into(), |s| format!("{s:.1}")),
            m.peak_rss_kb
                .map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
        ));
    }
    md
}
