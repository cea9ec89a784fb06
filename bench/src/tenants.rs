//! Many accounts, the same due work (SPEC §8, PF-5): the whole night — `sexton tick`, then one
//! worker through the queue until idle, every job kind at its default settings — over 10 k,
//! 100 k and 1 M accounts of which the same 10 k hold a small backlog each, and the operator's
//! two views (`status`, `preview`) after it. With `--tenant-baseline` an earlier binary (today's
//! code before FL-8, built from its own commit) runs the same nights, on databases migrated by
//! it, at the sizes `--tenant-baseline-accounts` names.
//!
//! Every account has a window of 30 days, an enabled session policy, one conversation with a
//! young run (3 days old) and one agent with a young session. A due account also has three old
//! runs (60 days) with detail and an output file each, one of them held back by a pending
//! settlement (EX-5), an old main session (100 days, past the fallback 60) with its history row
//! and archive directory, and an attachment whose file is 60 days old. Each night is checked to
//! end in exactly the state the rules give before its figures count.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::disk::{self, Timed};
use crate::results::{Section, machine, write_results};
use crate::sexton::{ROOTS, sexton_env};

/// The heading the tenants' section starts with, in latest.md.
pub const TENANTS_HEADING: &str = "## Many accounts";

/// Old runs per due account, one of them held back.
const OLD_RUNS: i64 = 3;

#[derive(Debug, Clone, Serialize)]
pub struct Tenants {
    measured_at: DateTime<Utc>,
    machine: String,
    due_accounts: u64,
    nights: Vec<Night>,
}

/// One night on one database.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Night {
    /// `sexton` (this build) or `baseline` (`--tenant-baseline`).
    code: String,
    measured_at: DateTime<Utc>,
    accounts: u64,
    fill_seconds: f64,
    /// From the worker taking the nightly slot to the last job done (the queue's own times).
    pass_seconds: f64,
    /// The nightly slot job: discovery, ledger rows and first hops of every kind.
    fan_out_seconds: f64,
    /// `worker --exit-when-idle` from spawn to exit.
    worker_seconds: f64,
    worker_peak_rss_kb: Option<u64>,
    queue_jobs: i64,
    ledger_rows: i64,
    apalis_jobs_bytes: i64,
    status: View,
    status_json: View,
    preview: View,
}

/// One run of an operator's command after the night.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct View {
    seconds: f64,
    peak_rss_kb: Option<u64>,
    lines: u64,
    bytes: u64,
}

/// The nights, then the section of the results files.
pub async fn measure(cli: &Cli, admin: &PgPool, base: &PgConnectOptions) -> anyhow::Result<()> {
    // Nights of other runs are kept, each with its date, unless this run measures them again.
    let mut nights = earlier(cli)?;
    // This build's nights first: the baseline's take the longest.
    let mut plan: Vec<(&'static str, &Path, u64)> = cli
        .tenant_accounts
        .iter()
        .map(|&n| ("sexton", cli.sexton.as_path(), n))
        .collect();
    if let Some(baseline) = &cli.tenant_baseline {
        for &n in &cli.tenant_baseline_accounts {
            plan.push(("baseline", baseline.as_path(), n));
        }
    }
    for (code, binary, accounts) in plan {
        eprintln!("tenants: {code}, {accounts} accounts");
        let measured = night(cli, admin, base, code, binary, accounts).await?;
        nights.retain(|n| (n.code.as_str(), n.accounts) != (code, accounts));
        nights.push(measured);
        nights.sort_by(|a, b| (&a.code, a.accounts).cmp(&(&b.code, b.accounts)));
        let tenants = Tenants {
            measured_at: Utc::now(),
            machine: machine(),
            due_accounts: cli.tenant_due,
            nights: nights.clone(),
        };
        write_results(cli, Section::Tenants(&tenants))?;
    }
    let tenants = Tenants {
        measured_at: Utc::now(),
        machine: machine(),
        due_accounts: cli.tenant_due,
        nights,
    };
    println!("{}", markdown(&tenants));
    Ok(())
}

/// The nights latest.json holds already.
fn earlier(cli: &Cli) -> anyhow::Result<Vec<Night>> {
    let Ok(text) = std::fs::read_to_string(cli.out.join("latest.json")) else {
        return Ok(Vec::new());
    };
    let json: serde_json::Value = serde_json::from_str(&text)?;
    Ok(match json.pointer("/tenants/nights") {
        Some(nights) => serde_json::from_value(nights.clone())?,
        None => Vec::new(),
    })
}

/// One night of `binary` (`code`) over `accounts` accounts: the database migrated and filled,
/// the night run and checked, the queue's figures read, then the operator's views.
async fn night(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    code: &'static str,
    binary: &Path,
    accounts: u64,
) -> anyhow::Result<Night> {
    let db = format!("benchtenants_{code}_{accounts}");
    let roots = cli.scratch.join("tenants");
    let _ = std::fs::remove_dir_all(&roots);
    for (_, name) in ROOTS {
        std::fs::create_dir_all(roots.join(name))?;
    }
    let started = Instant::now();
    recreate(admin, &db, None).await?;
    if !command(binary, &db, &roots, &["migrate"])
        .status()
        .await?
        .success()
    {
        bail!("migrating {db} failed");
    }
    let pool = connect(base, &db, "bench").await?;
    // Tonight, not the other parts' fixed pass start: `status` after the night then sees the
    // steady state an operator does, young runs and sessions still inside their windows.
    let now = Utc::now();
    fill(&pool, &roots, now, accounts, cli.tenant_due).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let worker = run_night(binary, &db, &roots, now).await?;
    check(&pool, &roots, now, cli.tenant_due).await?;
    let queue = Queue::read(&pool).await?;
    pool.close().await;
    let out = cli.scratch.join("tenants-view.out");
    let status = view(binary, &db, &roots, &["status"], &out).await?;
    let status_json = view(binary, &db, &roots, &["status", "--json"], &out).await?;
    let preview = view(binary, &db, &roots, &["preview"], &out).await?;
    let _ = std::fs::remove_file(&out);
    drop_db(admin, &db).await?;
    let _ = std::fs::remove_dir_all(&roots);
    Ok(Night {
        code: code.to_owned(),
        measured_at: Utc::now(),
        accounts,
        fill_seconds,
        pass_seconds: queue.pass_seconds,
        fan_out_seconds: queue.fan_out_seconds,
        worker_seconds: worker.seconds,
        worker_peak_rss_kb: worker.peak_rss_kb,
        queue_jobs: queue.jobs,
        ledger_rows: queue.ledger_rows,
        apalis_jobs_bytes: queue.apalis_jobs_bytes,
        status,
        status_json,
        preview,
    })
}

/// `binary args` on `db` with its file roots under `roots`, its output discarded.
fn command(binary: &Path, db: &str, roots: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(binary);
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .envs(sexton_env(db, roots))
        .stdout(Stdio::null());
    cmd
}

/// The night itself: `binary tick` at `now`, then one worker until the queue is idle, timed
/// from spawn to exit.
async fn run_night(
    binary: &Path,
    db: &str,
    roots: &Path,
    now: DateTime<Utc>,
) -> anyhow::Result<Timed> {
    if !command(binary, db, roots, &["tick", "--at", &now.to_rfc3339()])
        .status()
        .await?
        .success()
    {
        bail!("sexton tick failed on {db}");
    }
    disk::timed(binary, &["worker", "--exit-when-idle"], |cmd| {
        cmd.env_remove("DATABASE_URL")
            .envs(sexton_env(db, roots))
            .env("SEXTON_LOG__LEVEL", "warn");
    })
    .await
}

/// The queue after a night, by its own times: the pass and its fan-out (the nightly slot job),
/// the jobs it holds, the ledger's rows and the size of `apalis.jobs`.
struct Queue {
    pass_seconds: f64,
    fan_out_seconds: f64,
    jobs: i64,
    ledger_rows: i64,
    apalis_jobs_bytes: i64,
}

impl Queue {
    /// The queue's figures on `pool`; the ledger's rows are `sexton.passes` and, where the
    /// code has it, `sexton.fan_outs`.
    async fn read(pool: &PgPool) -> anyhow::Result<Self> {
        let (pass_seconds, fan_out_seconds, jobs, ledger_rows, apalis_jobs_bytes): (
            f64,
            f64,
            i64,
            i64,
            i64,
        ) = sqlx::query_as(
            "SELECT EXTRACT(EPOCH FROM max(j.done_at) - s.lock_at)::float8,
                    EXTRACT(EPOCH FROM s.done_at - s.lock_at)::float8,
                    count(*),
                    (SELECT count(*) FROM sexton.passes),
                    pg_total_relation_size('apalis.jobs')
             FROM apalis.jobs j
             CROSS JOIN (SELECT lock_at, done_at FROM apalis.jobs
                         WHERE job_type = 'sexton.nightly' ORDER BY lock_at LIMIT 1) s
             GROUP BY s.lock_at, s.done_at",
        )
        .fetch_one(pool)
        .await?;
        // The code before FL-8 has no fan-out table.
        let fan_outs: bool =
            sqlx::query_scalar("SELECT to_regclass('sexton.fan_outs') IS NOT NULL")
                .fetch_one(pool)
                .await?;
        let ledger_rows = if fan_outs {
            ledger_rows
                + sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sexton.fan_outs")
                    .fetch_one(pool)
                    .await?
        } else {
            ledger_rows
        };
        Ok(Self {
            pass_seconds,
            fan_out_seconds,
            jobs,
            ledger_rows,
            apalis_jobs_bytes,
        })
    }
}

/// `binary args` on `db`, its output counted in `out`.
async fn view(
    binary: &Path,
    db: &str,
    roots: &Path,
    args: &[&str],
    out: &Path,
) -> anyhow::Result<View> {
    let file = std::fs::File::create(out)?;
    let timed = disk::timed(binary, args, |cmd| {
        cmd.env_remove("DATABASE_URL")
            .envs(sexton_env(db, roots))
            .stdout(file);
    })
    .await?;
    let text = std::fs::read(out)?;
    Ok(View {
        seconds: timed.seconds,
        peak_rss_kb: timed.peak_rss_kb,
        lines: text.iter().filter(|b| **b == b'\n').count() as u64,
        bytes: text.len() as u64,
    })
}

/// The accounts and their rows (plain SQL over `generate_series`), aged from `now` (the night's
/// slot is at most a day earlier), then the due accounts' files.
async fn fill(
    pool: &PgPool,
    roots: &Path,
    now: DateTime<Utc>,
    accounts: u64,
    due: u64,
) -> anyhow::Result<()> {
    let statements = every_account(now, accounts, due)
        .into_iter()
        .chain(backlog(now));
    let mut conn = pool.acquire().await?;
    for statement in statements {
        sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
            .execute(&mut *conn)
            .await
            .with_context(|| format!("filling: {statement}"))?;
    }
    drop(conn);
    sqlx::query("VACUUM (FREEZE, ANALYZE)")
        .execute(pool)
        .await?;
    write_files(pool, roots, now).await
}

/// `days` before `now`, as an SQL timestamp.
fn at(now: DateTime<Utc>, days: i64) -> String {
    format!(
        "'{}'::timestamptz",
        (now - chrono::Duration::days(days)).to_rfc3339()
    )
}

/// The statements that make the `accounts` accounts (the first `due` of them due) in a
/// temporary table `tenant`, and what every one holds: a 30-day window, an enabled session
/// policy, a conversation with a young run and an agent with a young session.
fn every_account(now: DateTime<Utc>, accounts: u64, due: u64) -> Vec<String> {
    let young = at(now, 3);
    vec![
        format!(
            "CREATE TEMP TABLE tenant AS
             SELECT n, gen_random_uuid() AS id, gen_random_uuid() AS conversation,
                    gen_random_uuid() AS agent, n <= {due} AS due
             FROM generate_series(1, {accounts}) n"
        ),
        "INSERT INTO accounts (id, name, execution_details_retention_days)
         SELECT id, 'tenant ' || n, 30 FROM tenant"
            .into(),
        "INSERT INTO conversations (id, account_id) SELECT conversation, id FROM tenant".into(),
        "INSERT INTO agents (id, account_id) SELECT agent, id FROM tenant".into(),
        "INSERT INTO session_retention_policies (account_id, enabled) SELECT id, true FROM tenant"
            .into(),
        format!(
            "INSERT INTO runs (account_id, conversation_id, status, completed_at)
             SELECT id, conversation, 'completed', {young} FROM tenant"
        ),
        format!(
            "INSERT INTO sessions (account_id, agent_id, kind, last_activity_at)
             SELECT id, agent, 'main', {young} FROM tenant"
        ),
    ]
}

/// The statements that give each due account of `tenant` its backlog: the old runs with
/// detail and an output file each, one held back by a pending settlement; an old main session
/// with its history row; an old attachment.
fn backlog(now: DateTime<Utc>) -> Vec<String> {
    let (old, stale) = (at(now, 60), at(now, 100));
    vec![
        format!(
            "CREATE TEMP TABLE old_run AS
             SELECT gen_random_uuid() AS run, t.id AS account, t.conversation, k = 1 AS held
             FROM tenant t CROSS JOIN generate_series(1, {OLD_RUNS}) k WHERE t.due"
        ),
        format!(
            "INSERT INTO runs (id, account_id, conversation_id, status, completed_at)
             SELECT run, account, conversation, 'completed', {old} FROM old_run"
        ),
        "INSERT INTO run_tasks (run_id, name) SELECT run, 'root' FROM old_run".into(),
        "INSERT INTO tool_results (run_id, tool_name, body)
         SELECT run, 'search', 'results' FROM old_run"
            .into(),
        "INSERT INTO output_files (run_id, relative_path, bytes)
         SELECT run, account || '/' || run || '/out.bin', 5 FROM old_run"
            .into(),
        "INSERT INTO settlement_receipts (run_id, status)
         SELECT run, 'pending' FROM old_run WHERE held"
            .into(),
        format!(
            "INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
             SELECT id, agent, 'main', 'completed', {stale} FROM tenant WHERE due"
        ),
        format!(
            "INSERT INTO conversation_entries (session_id, entry_id)
             SELECT id, 'e1' FROM sessions WHERE last_activity_at = {stale}"
        ),
        format!(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             SELECT id, id || '/a.bin', 5, {old} FROM tenant WHERE due"
        ),
    ]
}

/// The due accounts' files under `roots`, each 60 days old: every old run's output, every old
/// session's directory (a frame in it) and every attachment's file; then syncs.
async fn write_files(pool: &PgPool, roots: &Path, now: DateTime<Utc>) -> anyhow::Result<()> {
    let outputs: Vec<String> = sqlx::query_scalar("SELECT relative_path FROM output_files")
        .fetch_all(pool)
        .await?;
    let sessions: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM sessions WHERE state = 'completed'")
            .fetch_all(pool)
            .await?;
    let attachments: Vec<String> = sqlx::query_scalar("SELECT relative_path FROM attachments")
        .fetch_all(pool)
        .await?;
    let old_mtime = std::time::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(
            (now - chrono::Duration::days(60)).timestamp(),
        )?);
    for (root, relative) in outputs
        .iter()
        .map(|p| ("outputs", p.clone()))
        .chain(
            sessions
                .iter()
                .map(|s| ("sessions", format!("{s}/frame.json"))),
        )
        .chain(attachments.iter().map(|p| ("attachments", p.clone())))
    {
        let path = roots.join(root).join(relative);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        let file = std::fs::File::create(&path)?;
        file.set_modified(old_mtime)?;
    }
    disk::sync();
    Ok(())
}

/// The end state the rules give: the two free old runs of each due account pruned and their
/// files gone, the held one and every young run untouched; each old session and its directory
/// gone, every young one kept; each old attachment expired and its file gone.
async fn check(pool: &PgPool, roots: &Path, now: DateTime<Utc>, due: u64) -> anyhow::Result<()> {
    let due = i64::try_from(due)?;
    let (pruned, unpruned_old, old_sessions, young_sessions, expired, pending): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM runs WHERE details_pruned_at IS NOT NULL),
                (SELECT count(*) FROM runs r WHERE details_pruned_at IS NULL AND completed_at < $1
                   AND EXISTS (SELECT 1 FROM output_files f WHERE f.run_id = r.id)),
                (SELECT count(*) FROM sessions WHERE state = 'completed'),
                (SELECT count(*) FROM sessions WHERE state = 'idle'),
                (SELECT count(*) FROM attachments WHERE bytes_expired_at IS NOT NULL),
                (SELECT count(*) FROM sexton.pending_file_deletions)",
    )
    .bind(now - chrono::Duration::days(30))
    .fetch_one(pool)
    .await?;
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(pool)
        .await?;
    let files = |root: &str| crate::attachments::files_left(&roots.join(root));
    let (outputs, session_files, attachment_files) =
        (files("outputs")?, files("sessions")?, files("attachments")?);
    let expected = (
        (OLD_RUNS - 1) * due,
        due,
        0,
        accounts,
        due,
        0,
        u64::try_from(due)?,
        0,
        0,
    );
    let found = (
        pruned,
        unpruned_old,
        old_sessions,
        young_sessions,
        expired,
        pending,
        outputs,
        session_files,
        attachment_files,
    );
    if found != expected {
        bail!(
            "the night did not end as the rules say: (pruned runs, held old runs, old sessions, \
             young sessions, expired attachments, pending deletions, output files, session \
             files, attachment files) = {found:?}, expected {expected:?}"
        );
    }
    Ok(())
}

/// The tenants' section of latest.md.
pub fn markdown(t: &Tenants) -> String {
    let mut md = format!(
        "{TENANTS_HEADING}\n\nMeasured {} on {} (`bash bench/run.sh --only tenants`; each night's time is in the table: nights of other runs are kept). Every account has a 30-day window, an enabled session policy, a young run and a young session (3 days old at the tick); {} of them also hold a small backlog each: three old runs with detail and an output file (one held back by a pending settlement, EX-5), an old main session with its history and directory, and an expired attachment. One night each: `sexton tick`, then one worker (`--exit-when-idle`, default settings, every job kind) until the queue is idle; each night is checked to end in the state the rules give. pass: from the worker taking the nightly slot to the last job done; fan-out: the slot job alone (discovery, ledger rows, first hops); both from the queue's own times. Queue jobs and ledger rows (`sexton.passes` and `sexton.fan_outs`) are counted after the night, `apalis.jobs` with its indexes. `baseline` is the code before FL-8 (commit 985f33e), on databases migrated by it. `status`, `status --json` and `preview` run once each after the night: seconds, peak RSS, lines printed.\n\n| code | measured | accounts | pass s | fan-out s | worker s | queue jobs | ledger rows | apalis.jobs MB | worker RSS MB | status s / MB RSS / lines | status --json s / MB | preview s / MB RSS / lines |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        t.measured_at.format("%Y-%m-%d"),
        t.machine,
        t.due_accounts,
    );
    let mb = |kb: Option<u64>| kb.map_or("—".into(), |kb| format!("{:.0}", kb as f64 / 1024.0));
    for n in &t.nights {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {} | {:.2} / {} / {} | {:.2} / {:.1} | {:.2} / {} / {} |\n",
            n.code,
            n.measured_at.format("%Y-%m-%d %H:%M"),
            n.accounts,
            n.pass_seconds,
            n.fan_out_seconds,
            n.worker_seconds,
            n.queue_jobs,
            n.ledger_rows,
            n.apalis_jobs_bytes as f64 / 1_048_576.0,
            mb(n.worker_peak_rss_kb),
            n.status.seconds,
            mb(n.status.peak_rss_kb),
            n.status.lines,
            n.status_json.seconds,
            n.status_json.bytes as f64 / 1_048_576.0,
            n.preview.seconds,
            mb(n.preview.peak_rss_kb),
            n.preview.lines,
        ));
    }
    let ours: Vec<&Night> = t.nights.iter().filter(|n| n.code == "sexton").collect();
    if let (Some(first), Some(last)) = (ours.first(), ours.last())
        && ours.len() > 1
    {
        md.push_str(&format!(
            "\nPF-5: the night at {} accounts took {:.2}× the night at {} (at most 1.5×) and created {} queue jobs more ({} against {}).\n",
            last.accounts,
            last.pass_seconds / first.pass_seconds,
            first.accounts,
            last.queue_jobs - first.queue_jobs,
            last.queue_jobs,
            first.queue_jobs,
        ));
    }
    md
}
