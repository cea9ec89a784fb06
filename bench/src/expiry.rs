//! The short-lived records (SPEC §4, TTL-1 and TTL-4): a template with a large backlog of
//! expired handoffs and conversation events (`INSERT … SELECT` from `generate_series`, no seed)
//! beside a tenth as many young ones that must stay; the backlog expired by a sexton pass of one
//! kind and by a raw batched `DELETE … WHERE id = ANY($1)` on identical copies, with an
//! application writer beside each that touches old and young records alike; and the part's
//! section of latest.md.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::bail;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::cluster::{connect, drop_db, recreate};
use crate::method::{Latency, Method, max_ms, method, score};
use crate::results::machine;
use crate::sexton::{EXPIRY_AGES, Pass, ROOTS, pass_start, run_sexton, sexton};
use crate::writer::{TimedLock, Writes, at_rate, beside, idle_baseline};
use crate::{Cli, Part};

/// The heading the short-lived records' section starts with, in latest.md.
pub const EXPIRY_HEADING: &str = "## Short-lived records";

/// A short-lived record kind the expiry part measures (SPEC §4).
struct Expiring {
    table: &'static str,
    job: &'static str,
    /// Its age setting, as an environment override names it (`SEXTON_EXPIRY__…`).
    setting: &'static str,
    /// Its age in days, the default (config/default.toml).
    days: i32,
    id: Id,
    /// Adds rows: `$1` the pass start, `$2` how many, created evenly from `$3` to `$4` days
    /// before the pass, oldest first (an append-only table's order), with a 100-byte payload.
    fill: &'static str,
    /// What the writer's new records hang on, and the insert of one (`$1` that parent).
    parent: &'static str,
    insert: &'static str,
}

/// A record kind's id type.
#[derive(Debug, Clone, Copy)]
enum Id {
    Uuid,
    BigInt,
}

impl Id {
    fn sql(self) -> &'static str {
        match self {
            Id::Uuid => "uuid",
            Id::BigInt => "bigint",
        }
    }
}

/// The oldest expired record, in days before the pass.
const OLDEST_DAYS: f64 = 400.0;

static EXPIRING: [Expiring; 2] = [
    Expiring {
        table: "handoffs",
        job: "expire_handoffs",
        setting: "HANDOFFS_DAYS",
        days: 14,
        id: Id::Uuid,
        fill: "WITH p AS (SELECT array_agg(id ORDER BY id) AS agents FROM agents)
            INSERT INTO handoffs (account_id, agent_id, payload, created_at)
            SELECT a.account_id, a.id, jsonb_build_object('text', repeat('x', 100)),
                   $1 - $3 * interval '1 day' + (g::float8 / $2) * ($3 - $4) * interval '1 day'
            FROM p CROSS JOIN generate_series(1, $2) g
            JOIN agents a ON a.id = p.agents[1 + g % cardinality(p.agents)]",
        parent: "SELECT id::text FROM agents ORDER BY id LIMIT 1",
        insert: "INSERT INTO handoffs (account_id, agent_id, payload)
            SELECT account_id, id, jsonb_build_object('text', repeat('x', 100))
            FROM agents WHERE id = $1::uuid",
    },
    Expiring {
        table: "conversation_events",
        job: "expire_conversation_events",
        setting: "CONVERSATION_EVENTS_DAYS",
        days: 30,
        id: Id::BigInt,
        fill: "WITH p AS (SELECT array_agg(id ORDER BY id) AS conversations FROM conversations)
            INSERT INTO conversation_events (conversation_id, kind, payload, created_at)
            SELECT p.conversations[1 + g % cardinality(p.conversations)], 'delta',
                   jsonb_build_object('text', repeat('x', 100)),
                   $1 - $3 * interval '1 day' + (g::float8 / $2) * ($3 - $4) * interval '1 day'
            FROM p, generate_series(1, $2) g",
        parent: "SELECT id::text FROM conversations ORDER BY id LIMIT 1",
        insert: "INSERT INTO conversation_events (conversation_id, kind, payload)
            VALUES ($1::uuid, 'delta', jsonb_build_object('text', repeat('x', 100)))",
    },
];

impl Expiring {
    /// The cutoff of a pass at the pass start: rows created before it expire.
    fn cutoff(&self) -> DateTime<Utc> {
        pass_start() - chrono::Duration::days(self.days.into())
    }

    /// The worker's settings for a pass of this kind alone: its age, the batch, every other
    /// kind off.
    fn sexton_env(&self, batch: u32) -> Vec<(String, String)> {
        let mut env = vec![("SEXTON_EXPIRY__BATCH_SIZE".to_owned(), batch.to_string())];
        for age in EXPIRY_AGES {
            let days = if age == self.setting { self.days } else { 0 };
            env.push((format!("SEXTON_EXPIRY__{age}"), days.to_string()));
        }
        env
    }
}

#[derive(Debug, Clone, Serialize)]
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
}

#[derive(Debug, Clone, Serialize)]
struct ExpiryTable {
    table: &'static str,
    job: &'static str,
    days: i32,
    expired: i64,
    young: i64,
    idle_writer: Latency,
    idle_writer_longest_lock_wait_ms: f64,
    methods: Vec<ExpiryMethod>,
}

#[derive(Debug, Clone, Serialize)]
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
pub async fn measure(cli: &Cli, admin: &PgPool, base: &PgConnectOptions) -> anyhow::Result<Expiry> {
    let files = cli.scratch.join("files-expiry");
    let (fill_seconds, prepared) = template(cli, admin, base, &files).await?;
    let mut tables = Vec::new();
    for kind in &prepared {
        tables.push(measure_kind(cli, admin, base, &files, kind).await?);
    }
    drop_db(admin, TEMPLATE).await?;
    let _ = std::fs::remove_dir_all(&files);
    Ok(Expiry {
        measured_at: Utc::now(),
        machine: machine(),
        separate_run: !cli.only.is_empty() && !cli.only.contains(&Part::Scales),
        rows: cli.expiry_rows,
        batch_size: cli.expiry_batch,
        writer_rate: cli.writer_rate,
        fill_seconds,
        tables,
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
    if !sexton(cli, TEMPLATE, files, &["migrate"])
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
        methods.push(measure_method(cli, admin, base, files, prepared, name).await?);
    }
    Ok(ExpiryTable {
        table: kind.table,
        job: kind.job,
        days: kind.days,
        expired,
        young,
        idle_writer,
        idle_writer_longest_lock_wait_ms,
        methods,
    })
}

/// Method `name` on a fresh copy of the template, the writer beside it: checked to leave every
/// young row and no expired one but those the writer held, and scored.
async fn measure_method(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    files: &Path,
    prepared: &Prepared,
    name: &'static str,
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
            run_sexton(cli, admin, &db, files, name, 2, &pass, &env).await?
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

/// The template's rows: an account (execution retention off) with ten agents and a hundred
/// conversations, and for each kind `rows` expired records and a tenth as many young ones.
/// Nothing else: the other jobs find no work.
async fn fill(pool: &PgPool, rows: u64) -> anyhow::Result<()> {
    let account: Uuid = sqlx::query_scalar(
        "INSERT INTO accounts (name, execution_details_retention_days)
         VALUES ('bench', NULL) RETURNING id",
    )
    .fetch_one(pool)
    .await?;
    sqlx::query(
        "INSERT INTO agents (account_id, name) SELECT $1, 'agent ' || g FROM generate_series(1, 10) g",
    )
    .bind(account)
    .execute(pool)
    .await?;
    sqlx::query("INSERT INTO conversations (account_id) SELECT $1 FROM generate_series(1, 100)")
        .bind(account)
        .execute(pool)
        .await?;
    let rows = i64::try_from(rows)?;
    for kind in &EXPIRING {
        let days = f64::from(kind.days);
        // Expired, then young (1 day to a day short of the age): far from the cutoff both.
        for (count, oldest, youngest) in [
            (rows, OLDEST_DAYS, days + 1.0),
            (rows / 10, days - 1.0, 1.0),
        ] {
            sqlx::query(kind.fill)
                .bind(pass_start())
                .bind(count)
                .bind(oldest)
                .bind(youngest)
                .execute(pool)
                .await?;
        }
    }
    // Every copy starts alike: hint bits set, visibility map full, statistics fresh.
    sqlx::query("VACUUM (FREEZE, ANALYZE)")
        .execute(pool)
        .await?;
    Ok(())
}

/// A kind's expired rows, and its young ones from before the pass (the writer's new records
/// come after it).
async fn counts(pool: &PgPool, kind: &Expiring) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE created_at < $1),
                count(*) FILTER (WHERE created_at >= $1 AND created_at < $2)
         FROM {}",
        kind.table
    )))
    .bind(kind.cutoff())
    .bind(pass_start())
    .fetch_one(pool)
    .await?)
}

/// The floor for short-lived records: the next `batch` expired ids in (created_at, id) order,
/// then `DELETE … WHERE id = ANY($1)`, each batch its own transaction; no lock, no re-check.
/// With `lock` (the floor with the lock sexton's batch takes, timed alone: HD-3 re-checks the
/// holds behind it and a held row is skipped as `busy`), the batch's rows are read
/// `FOR UPDATE SKIP LOCKED` first, so that a row the application holds is left.
async fn run_raw(
    base: &PgConnectOptions,
    db: &str,
    kind: &Expiring,
    batch: u32,
    lock: bool,
) -> anyhow::Result<Method> {
    let started = Instant::now();
    let pool = connect(base, db, "bench-raw").await?;
    match kind.id {
        Id::Uuid => raw_batches::<Uuid>(&pool, kind, batch, lock).await?,
        Id::BigInt => raw_batches::<i64>(&pool, kind, batch, lock).await?,
    }
    pool.close().await;
    let mut m = method(if lock { RAW_LOCKED } else { "raw" });
    m.seconds = started.elapsed().as_secs_f64();
    Ok(m)
}

/// The raw floor with the lock and skip of rows an application holds.
const RAW_LOCKED: &str = "raw+lock";

async fn raw_batches<T>(
    pool: &PgPool,
    kind: &Expiring,
    batch: u32,
    lock: bool,
) -> anyhow::Result<()>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    Vec<T>: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let next = format!(
        "SELECT id FROM {} WHERE created_at < $1 ORDER BY created_at, id LIMIT $2{}",
        kind.table,
        if lock { " FOR UPDATE SKIP LOCKED" } else { "" }
    );
    let delete = format!("DELETE FROM {} WHERE id = ANY($1)", kind.table);
    loop {
        let mut tx = pool.begin().await?;
        let ids: Vec<T> = sqlx::query_scalar(sqlx::AssertSqlSafe(next.clone()))
            .bind(kind.cutoff())
            .bind(i64::from(batch))
            .fetch_all(&mut *tx)
            .await?;
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(delete.clone()))
            .bind(ids)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
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

/// The short-lived records' section of latest.md.
pub fn markdown(e: &Expiry) -> String {
    let when = if e.separate_run {
        "in a separate run from the tables above (`bash bench/run.sh --only expiry`)"
    } else {
        "in the same run as the tables above"
    };
    let mut md = format!(
        "{EXPIRY_HEADING}\n\nMeasured {} on {}, {when}. Each table holds {} expired rows (created evenly from {OLDEST_DAYS:.0} days to a day past its age before the pass, oldest first) and {} young ones that must stay, built in {:.0} s; each method runs on its own copy. sexton: `sexton tick` at the pass start, then one worker (`--exit-when-idle`, default settings but `expiry.batch_size = {}` and every other kind at 0 days), timed from the worker taking the nightly slot to its last hop. raw: `SELECT id … WHERE created_at < cutoff ORDER BY created_at, id LIMIT {}`, then `DELETE … WHERE id = ANY($1)`, each batch its own transaction, with no lock and no re-check. raw+lock: the same with the batch's `SELECT … FOR UPDATE SKIP LOCKED` (as sexton's batch locks its rows: one an application holds is skipped as `busy`, never waited for, and the holds are re-checked behind the lock, HD-3) and its `DELETE` in one transaction: the lock timed alone, which writes each row twice (a lock, then the delete). Beside each, an application writer ({} per second) locks one record (old or young, by turns), updates it if it is still there, inserts a new one and commits. \"left\" counts expired rows sexton skipped because the writer held them (`busy`, for the next pass).\n\n| table | expired rows | method | seconds | rows deleted | left | rows/s | vs raw | vs raw+lock | writer p50 / p99 / max ms (idle) | writer longest lock wait ms (idle) | longest write tx ms | hop median / p99 ms | µs per row read (median hop) | peak RSS MB | outside batch statements |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        e.measured_at.format("%Y-%m-%d"),
        e.machine,
        e.rows,
        e.rows / 10,
        e.fill_seconds,
        e.batch_size,
        e.batch_size,
        e.writer_rate,
    );
    for t in &e.tables {
        let rate = |name| {
            t.methods
                .iter()
                .find(|m| m.method.name == name)
                .map_or(0.0, |m| m.method.rows_per_s)
        };
        let (raw, locked) = (rate("raw"), rate(RAW_LOCKED));
        for ExpiryMethod {
            method: m,
            deleted,
            left,
        } in &t.methods
        {
            md.push_str(&format!(
                "| {} | {} | {} | {:.1} | {} | {} | {:.0} | {:.2}× | {:.2}× | {:.1} / {:.1} / {:.1} ({:.1} / {:.1} / {:.1}) | {:.1} ({:.1}) | {:.0} | {} | {} | {} | {} |\n",
                t.table, t.expired, m.name, m.seconds, deleted, left, m.rows_per_s, m.rows_per_s / raw, m.rows_per_s / locked,
                m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
                t.idle_writer.p50_ms, t.idle_writer.p99_ms, t.idle_writer.max_ms,
                m.writer_longest_lock_wait_ms, t.idle_writer_longest_lock_wait_ms,
                m.longest_transaction_ms,
                m.hop.map_or("—".into(), |h| format!("{:.0} / {:.0}", h.p50_ms, h.p99_ms)),
                m.hop_us_per_candidate.map_or("—".into(), |h| format!("{:.1}", h.p50_ms)),
                m.peak_rss_kb.map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
                m.share_outside_owner_transactions.map_or("—".into(), |x| format!("{:.0}%", x * 100.0)),
            ));
        }
    }
    md
}
