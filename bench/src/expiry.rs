//! The short-lived records (SPEC §4, TTL-1 and TTL-4): a template with a large backlog of
//! expired handoffs and conversation events (`INSERT … SELECT` from `generate_series`, no seed)
//! beside a tenth as many young ones that must stay; the backlog expired by a sexton pass of one
//! kind and by a raw batched `DELETE … WHERE id = ANY($1)` on identical copies, with an
//! application writer beside each that touches old and young records alike; with
//! `--baseline-sexton`, the sexton pass once more pair by pair with the earlier build; and the
//! part's section of latest.md.

mod kinds;
mod markdown;
mod raw;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::bail;
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use self::kinds::{EXPIRING, Expiring, counts, fill};
use self::raw::{RAW_LOCKED, run_raw};
use crate::cli::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::compare::{self, Comparison};
use crate::method::{Latency, Method, max_ms, score};
use crate::part::Bench;
use crate::results::{machine, member};
use crate::sexton::{Pass, ROOTS, Worker, run_sexton, sexton};
use crate::writer::{TimedLock, Writes, at_rate, beside, idle_baseline};

/// The part: measured, then written into the results.
pub fn run<'a>(bench: &'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>> {
    Box::pin(async move {
        let expiry = measure(bench.cli, bench.admin, bench.base).await?;
        bench.report.write(&[("expiry", member(&expiry)?)])?;
        Ok(expiry.before_after)
    })
}

/// The part's section of latest.md, from latest.json's `expiry`.
pub fn render(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
    let Some(expiry) = json.get("expiry") else {
        return Ok(None);
    };
    let twice = 2.0 * crate::scales::transaction_target_ms()?;
    Ok(Some(markdown::markdown(
        &serde_json::from_value(expiry.clone())?,
        twice,
    )))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Expiry {
    measured_at: DateTime<Utc>,
    machine: String,
    /// Measured by `--only expiry`, in another run than the scales.
    separate_run: bool,
    /// Expired rows asked for per table (a tenth as many young ones).
    rows: u64,
    batch_size: u32,
    writer_rate: u32,
    /// Building the template: migrations, rows, indexes' growth, VACUUM and ANALYZE.
    fill_seconds: f64,
    tables: Vec<ExpiryTable>,
    /// With `--baseline-sexton`: each table's sexton pass by both builds, pair by pair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    before_after: Vec<Comparison>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ExpiryTable {
    table: String,
    job: String,
    days: i32,
    expired: i64,
    young: i64,
    idle_writer: Latency,
    idle_writer_longest_lock_wait_ms: f64,
    methods: Vec<ExpiryMethod>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ExpiryMethod {
    /// Rates are of rows deleted (`owners_per_s` = `rows_per_s`).
    #[serde(flatten)]
    method: Method,
    deleted: i64,
    /// Expired rows left: sexton skips a row the writer holds (`busy`), for the next pass.
    left: i64,
}

/// The template every method's copy is made from.
const TEMPLATE: &str = "benchexp_template";

/// The short-lived records: one template with `rows` expired handoffs and conversation events
/// and a tenth as many young ones; on a copy per method, a sexton pass of one kind and the raw
/// batched delete of the same rows, with the application writer beside each.
async fn measure(cli: &Cli, admin: &PgPool, base: &PgConnectOptions) -> anyhow::Result<Expiry> {
    let files = cli.scratch.join("files-expiry");
    let (fill_seconds, prepared) = template(cli, admin, base, &files).await?;
    let (mut tables, mut before_after) = (Vec::new(), Vec::new());
    for kind in &prepared {
        tables.push(measure_kind(cli, admin, base, &files, kind).await?);
        let compared = compare::pairs(
            cli,
            "expiry",
            format!("{} · sexton", kind.kind.table),
            "rows/s",
            async |build| {
                let binary = build.binary;
                let run = measure_method(cli, admin, base, &files, kind, "sexton", binary).await?;
                Ok(run.method.side())
            },
        );
        before_after.extend(compared.await?);
    }
    drop_db(admin, TEMPLATE).await?;
    let _ = std::fs::remove_dir_all(&files);
    Ok(Expiry {
        measured_at: Utc::now(),
        machine: machine(),
        separate_run: !cli.with_scales(),
        rows: cli.expiry_rows,
        batch_size: cli.expiry_batch,
        writer_rate: cli.writer_rate,
        fill_seconds,
        tables,
        before_after,
    })
}

/// A kind as the template holds it: its expired and young rows, the writer's records (a
/// hundred old ones, the pass's, and a hundred young ones) and the parent of its new ones.
struct Prepared {
    kind: &'static Expiring,
    expired: i64,
    young: i64,
    targets: Vec<String>,
    parent: String,
}

impl Prepared {
    /// What `kind` holds in the template on `pool`.
    async fn read(pool: &PgPool, kind: &'static Expiring) -> anyhow::Result<Self> {
        let (expired, young) = counts(pool, kind).await?;
        let targets: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "(SELECT id::text FROM {t} WHERE created_at < $1 ORDER BY md5(id::text) LIMIT 100)
             UNION ALL
             (SELECT id::text FROM {t} WHERE created_at >= $1 ORDER BY md5(id::text) LIMIT 100)",
            t = kind.table
        )))
        .bind(kind.cutoff())
        .fetch_all(pool)
        .await?;
        let parent: String = sqlx::query_scalar(kind.parent).fetch_one(pool).await?;
        Ok(Self {
            kind,
            expired,
            young,
            targets,
            parent,
        })
    }

    /// The application writer on this kind's records, at `rate` per second until `stop`.
    fn writes(
        &self,
        pool: PgPool,
        rate: u32,
        stop: Arc<AtomicBool>,
    ) -> impl Future<Output = anyhow::Result<Writes>> + Send + 'static {
        let (targets, parent) = (self.targets.clone(), self.parent.clone());
        touch_at_rate(pool, self.kind, targets, parent, rate, stop)
    }
}

/// Builds the template under `files` — migrated, then filled — and reads what each kind holds
/// in it. Returns the seconds the building took, and the kinds.
async fn template(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    files: &Path,
) -> anyhow::Result<(f64, Vec<Prepared>)> {
    recreate(admin, TEMPLATE, None).await?;
    let _ = std::fs::remove_dir_all(files);
    for (_, dir) in ROOTS {
        std::fs::create_dir_all(files.join(dir))?;
    }
    eprintln!("expiry: filling {} expired rows per table", cli.expiry_rows);
    let started = Instant::now();
    if !sexton(&cli.sexton, TEMPLATE, files, &["migrate"])
        .status()
        .await?
        .success()
    {
        bail!("migrating {TEMPLATE} failed");
    }
    let pool = connect(base, TEMPLATE, "bench").await?;
    fill(&pool, cli.expiry_rows).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let mut prepared = Vec::new();
    for kind in &EXPIRING {
        prepared.push(Prepared::read(&pool, kind).await?);
    }
    // A template is copied only with no one connected.
    pool.close().await;
    Ok((fill_seconds, prepared))
}

/// One kind's table: the writer's idle baseline, then each method on its own copy.
async fn measure_kind(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    files: &Path,
    prepared: &Prepared,
) -> anyhow::Result<ExpiryTable> {
    let Prepared {
        kind,
        expired,
        young,
        ..
    } = *prepared;
    eprintln!(
        "expiry: {} ({expired} expired, {young} young): idle writer",
        kind.table
    );
    let writes = |pool, stop| prepared.writes(pool, cli.writer_rate, stop);
    let (idle, _) = idle_baseline(cli, admin, base, TEMPLATE, "benchexp_idle", writes).await?;
    let idle_writer_longest_lock_wait_ms = max_ms(&idle.lock_wait_ms);
    let idle_writer = Latency::of(idle.total_ms);
    let mut methods = Vec::new();
    for name in ["sexton", "raw", RAW_LOCKED] {
        eprintln!("expiry: {} {name}", kind.table);
        let sexton = &cli.sexton;
        methods.push(measure_method(cli, admin, base, files, prepared, name, sexton).await?);
    }
    Ok(ExpiryTable {
        table: kind.table.to_owned(),
        job: kind.job.to_owned(),
        days: kind.days,
        expired,
        young,
        idle_writer,
        idle_writer_longest_lock_wait_ms,
        methods,
    })
}

/// Method `name` on a fresh copy of the template (sexton's by the build `binary`), the writer
/// beside it: checked to leave every young row and no expired one but those the writer held,
/// and scored.
async fn measure_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    files: &Path,
    prepared: &Prepared,
    name: &'static str,
    binary: &Path,
) -> anyhow::Result<ExpiryMethod> {
    let kind = prepared.kind;
    let db = format!("benchexp_{}_{}", name.replace('+', "_"), kind.table);
    recreate(admin, &db, Some(TEMPLATE)).await?;
    let writer_pool = connect(base, &db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = prepared.writes(writer_pool.clone(), cli.writer_rate, stop.clone());
    let (writer, sampler) = beside(base, &db, writes, &stop).await?;
    let mut method = match name {
        "sexton" => {
            let pass = Pass {
                job: kind.job,
                global: true,
            };
            let env = kind.sexton_env(cli.expiry_batch);
            let worker = Worker {
                binary,
                name,
                concurrency: 2,
                pass: &pass,
                env: &env,
            };
            run_sexton(cli, admin, &db, files, &worker).await?
        }
        _ => run_raw(base, &db, kind, cli.expiry_batch, name == RAW_LOCKED).await?,
    };
    stop.store(true, Ordering::Relaxed);
    let writer = writer.await??;
    let longest = sampler.await??;
    writer_pool.close().await;
    let check = connect(base, &db, "bench").await?;
    let (left, young_after) = counts(&check, kind).await?;
    check.close().await;
    let young = prepared.young;
    // Only the writer's old records can be held when the pass goes by.
    if young_after != young || (name == "raw" && left > 0) || left > 100 {
        bail!(
            "{name} left {left} expired {} and {young_after} of {young} young ones",
            kind.table
        );
    }
    let deleted = prepared.expired - left;
    score(&mut method, deleted, deleted, writer, longest);
    drop_db(admin, &db).await?;
    Ok(ExpiryMethod {
        method,
        deleted,
        left,
    })
}

/// An application on short-lived records at `rate` per second: lock one record (old or young,
/// by turns), update it if it is still there, and add a new one.
async fn touch_at_rate(
    pool: PgPool,
    kind: &'static Expiring,
    targets: Vec<String>,
    parent: String,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Writes> {
    let (table, id) = (kind.table, kind.id.sql());
    let lock = TimedLock::new(&format!("SELECT 1 FROM {table} WHERE id = $1::{id}"));
    let update =
        format!("UPDATE {table} SET payload = payload || '{{\"seen\": true}}' WHERE id = $1::{id}");
    at_rate(rate, stop, targets, move |target| {
        let (pool, parent, lock, update) =
            (pool.clone(), parent.clone(), lock.clone(), update.clone());
        async move {
            let mut tx = pool.begin().await?;
            let (found, lock_wait) = lock.take(&mut tx, target.clone()).await?;
            if found > 0 {
                sqlx::query(sqlx::AssertSqlSafe(update))
                    .bind(&target)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(kind.insert)
                .bind(&parent)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(lock_wait)
        }
    })
    .await
}
