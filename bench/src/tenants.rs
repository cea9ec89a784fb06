//! Many accounts, the same due work (SPEC §8, PF-5): the whole night — `sexton tick`, then one
//! worker through the queue until idle, every job kind at its default settings — over 10 k,
//! 100 k and 1 M accounts of which the same 10 k hold a small backlog each, and the operator's
//! two views (`status`, `preview`) after it, and the status page a fleet worker serves then
//! (OP-6, [`served`]). With `--baseline-sexton` an earlier binary (built
//! from its own commit) runs the same nights, on databases migrated by it, pair by pair with this
//! build at the sizes `--tenant-baseline-accounts` names.
//!
//! Every account has a window of 30 days, an enabled session policy, one conversation with a
//! young run (3 days old) and one agent with a young session. A due account also has three old
//! runs (60 days) with detail and an output file each, one of them held back by a pending
//! settlement (EX-5), an old main session (100 days, past the fallback 60) with its history row
//! and archive directory, and an attachment whose file is 60 days old. Each night is checked to
//! end in exactly the state the rules give before its figures count.

mod accounts;
mod served;

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::bail;
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use self::accounts::{check, fill};
use self::served::{Served, served};
use crate::cli::Cli;
use crate::cluster::{connect, drop_db, recreate};
use crate::compare::{self, Build, Comparison, Side};
use crate::disk::{self, Timed};
use crate::part::Bench;
use crate::results::{machine, member};
use crate::sexton::{ROOTS, sexton_env};
use crate::table::{Column, columns, f, facts, flat, or_dash, table};

/// The part's section of latest.md, from latest.json's `tenants`.
pub fn render(json: &serde_json::Value) -> anyhow::Result<Option<String>> {
    let Some(tenants) = json.get("tenants") else {
        return Ok(None);
    };
    Ok(Some(markdown(&serde_json::from_value(tenants.clone())?)))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tenants {
    measured_at: DateTime<Utc>,
    machine: String,
    due_accounts: u64,
    nights: Vec<Night>,
    /// With `--baseline-sexton`: the nights by both builds, pair by pair (this run's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    before_after: Vec<Comparison>,
}

/// One night on one database.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Night {
    /// `sexton` (this build) or `baseline` (`--baseline-sexton`).
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
    /// This build's status page after the night, served by a fleet worker (OP-6); none for a
    /// baseline build, and in nights measured before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    served: Option<Served>,
}

/// One run of an operator's command after the night.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct View {
    seconds: f64,
    peak_rss_kb: Option<u64>,
    lines: u64,
    bytes: u64,
}

/// The part: this build's nights, then with `--baseline-sexton` both builds' nights pair by
/// pair, each written into the results as it is done. Nights of other runs are kept, each with
/// its date, unless this run measures them again.
pub fn run<'a>(bench: &'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>> {
    Box::pin(async move {
        let cli = bench.cli;
        let mut tenants = Tenants {
            measured_at: Utc::now(),
            machine: machine(),
            due_accounts: cli.tenant_due,
            nights: earlier(cli)?,
            before_after: Vec::new(),
        };
        let paired =
            |n: &u64| cli.baseline_sexton.is_some() && cli.tenant_baseline_accounts.contains(n);
        let this_build = Build {
            binary: &cli.sexton,
            code: "sexton",
        };
        for &accounts in cli.tenant_accounts.iter().filter(|n| !paired(n)) {
            measure(bench, &mut tenants, this_build, accounts).await?;
        }
        if cli.baseline_sexton.is_some() {
            for &accounts in &cli.tenant_baseline_accounts {
                let case = format!("{accounts} accounts");
                let pairs = compare::pairs(cli, "tenants", case, "accounts/s", async |build| {
                    measure(bench, &mut tenants, build, accounts).await
                });
                let compared = pairs.await?;
                tenants.before_after.extend(compared);
                bench.report.write(&[("tenants", member(&tenants)?)])?;
            }
        }
        Ok(tenants.before_after)
    })
}

/// One night of `build` over `accounts` accounts, kept in `tenants` in place of any earlier one
/// of that build and size, and written into the results; returned as a side of a comparison.
async fn measure(
    bench: &Bench<'_>,
    tenants: &mut Tenants,
    build: Build<'_>,
    accounts: u64,
) -> anyhow::Result<Side> {
    let (cli, code) = (bench.cli, build.code);
    eprintln!("tenants: {code}, {accounts} accounts");
    let measured = night(cli, bench.admin, bench.base, build, accounts).await?;
    let side = Side {
        seconds: measured.pass_seconds,
        rate: accounts as f64 / measured.pass_seconds,
        peak_rss_kb: measured.worker_peak_rss_kb,
        writer_wait_ms: None,
    };
    let nights = &mut tenants.nights;
    nights.retain(|n| (n.code.as_str(), n.accounts) != (code, accounts));
    nights.push(measured);
    nights.sort_by(|a, b| (&a.code, a.accounts).cmp(&(&b.code, b.accounts)));
    tenants.measured_at = Utc::now();
    bench.report.write(&[("tenants", member(tenants)?)])?;
    Ok(side)
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

/// One night of `build` over `accounts` accounts: the database migrated (by that build) and
/// filled, the night run and checked, the queue's figures read, then the operator's views and
/// (this build's) status page.
async fn night(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    build: Build<'_>,
    accounts: u64,
) -> anyhow::Result<Night> {
    let Build { binary, code } = build;
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
    let served = if code == "sexton" {
        let pool = connect(base, &db, "bench").await?;
        let log = cli.scratch.join("tenants-serving-worker.log");
        let page = served(binary, &db, &roots, &pool, &log).await?;
        pool.close().await;
        Some(page)
    } else {
        None
    };
    if !cli.tenant_keep {
        drop_db(admin, &db).await?;
        let _ = std::fs::remove_dir_all(&roots);
    }
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
        served,
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

/// Times each operator's view is run: one run of a view that takes a few tenths of a second
/// moves by a tenth with the machine's other work (`status` at 10 k accounts gave 0.19 to
/// 0.26 s in five runs back to back), which alone decides a 2× bound.
const VIEW_RUNS: usize = 5;

/// `binary args` on `db`, run [`VIEW_RUNS`] times: the median of their seconds, the largest
/// peak RSS, and the last run's output counted in `out`.
async fn view(
    binary: &Path,
    db: &str,
    roots: &Path,
    args: &[&str],
    out: &Path,
) -> anyhow::Result<View> {
    let mut seconds = Vec::with_capacity(VIEW_RUNS);
    let mut peak_rss_kb = None;
    for _ in 0..VIEW_RUNS {
        let file = std::fs::File::create(out)?;
        let timed = disk::timed(binary, args, |cmd| {
            cmd.env_remove("DATABASE_URL")
                .envs(sexton_env(db, roots))
                .stdout(file);
        })
        .await?;
        seconds.push(timed.seconds);
        peak_rss_kb = peak_rss_kb.max(timed.peak_rss_kb);
    }
    seconds.sort_by(f64::total_cmp);
    let text = std::fs::read(out)?;
    Ok(View {
        seconds: seconds[VIEW_RUNS / 2],
        peak_rss_kb,
        lines: text.iter().filter(|b| **b == b'\n').count() as u64,
        bytes: text.len() as u64,
    })
}

/// The tenants' section of latest.md: the facts, each night and the operator's views after it,
/// PF-5 from the fewest accounts to the most, and the two builds compared.
fn markdown(t: &Tenants) -> String {
    let when = format!("{}, {}", t.measured_at.format("%Y-%m-%d"), t.machine);
    let mut md = facts(&[
        ("measured", when),
        ("due accounts", t.due_accounts.to_string()),
    ]);
    let nights = flat(&t.nights);
    let mut sections = vec![
        ("Nights", columns(NIGHTS, &nights)),
        (
            "The operator's views after the night",
            columns(VIEWS, &nights),
        ),
    ];
    let ours = || t.nights.iter().filter(|n| n.code == "sexton");
    if let (Some(first), Some(last)) = (
        ours().min_by_key(|n| n.accounts),
        ours().max_by_key(|n| n.accounts),
    ) && first.accounts < last.accounts
    {
        sections.push(("PF-5", pf5(first, last)));
    }
    if !t.before_after.is_empty() {
        sections.push(("Before and after", compare::markdown(&t.before_after)));
    }
    for (heading, body) in sections {
        md.push_str(&format!("\n### {heading}\n\n{body}"));
    }
    md
}

/// PF-5 from the fewest accounts (`first`) to the most (`last`), the same due work: the night
/// within 1.5× (SPEC §8), and what discovery and the operator's views cost within 2× (issue
/// #59: they grow with what is due, not with the accounts).
fn pf5(first: &Night, last: &Night) -> String {
    let rows = [
        (
            "the night (pass s)",
            first.pass_seconds,
            last.pass_seconds,
            1.5,
        ),
        (
            "fan-out s",
            first.fan_out_seconds,
            last.fan_out_seconds,
            2.0,
        ),
        (
            "preview s",
            first.preview.seconds,
            last.preview.seconds,
            2.0,
        ),
        ("status s", first.status.seconds, last.status.seconds, 2.0),
        (
            "status --json s",
            first.status_json.seconds,
            last.status_json.seconds,
            2.0,
        ),
    ]
    .into_iter()
    .map(|(what, from, to, bound)| {
        let ratio = to / from;
        vec![
            what.to_owned(),
            format!("{} → {}", first.accounts, last.accounts),
            format!("{from:.2} → {to:.2} = {ratio:.2}×"),
            format!("≤ {bound:.2}×"),
            if ratio <= bound { "met" } else { "**not met**" }.to_owned(),
        ]
    })
    .chain([vec![
        "queue jobs".to_owned(),
        format!("{} → {}", first.accounts, last.accounts),
        format!("{} → {}", first.queue_jobs, last.queue_jobs),
        "the same due work".to_owned(),
        if first.queue_jobs == last.queue_jobs {
            "met"
        } else {
            "**not met**"
        }
        .to_owned(),
    ]]);
    table(
        &["figure", "accounts", "measured", "bound", "verdict"],
        rows,
    )
}

/// A row per night: the pass and its fan-out by the queue's times, the worker, and what the
/// night left in the queue and the ledger.
const NIGHTS: &[Column<(), Night>] = &[
    ("code", |_, n| n.code.clone()),
    ("measured", |_, n| {
        n.measured_at.format("%Y-%m-%d %H:%M").to_string()
    }),
    ("accounts", |_, n| n.accounts.to_string()),
    ("pass s", |_, n| f(n.pass_seconds, 1)),
    ("fan-out s", |_, n| f(n.fan_out_seconds, 1)),
    ("worker s", |_, n| f(n.worker_seconds, 1)),
    ("queue jobs", |_, n| n.queue_jobs.to_string()),
    ("ledger rows", |_, n| n.ledger_rows.to_string()),
    ("apalis.jobs MB", |_, n| {
        f(n.apalis_jobs_bytes as f64 / 1_048_576.0, 1)
    }),
    ("worker RSS MB", |_, n| whole_mb(n.worker_peak_rss_kb)),
];

/// A row per night: each of the operator's views after it.
const VIEWS: &[Column<(), Night>] = &[
    ("code", |_, n| n.code.clone()),
    ("accounts", |_, n| n.accounts.to_string()),
    ("status s / RSS MB / lines", |_, n| seen(&n.status)),
    ("status --json s / MB", |_, n| {
        let mb = n.status_json.bytes as f64 / 1_048_576.0;
        format!("{:.2} / {mb:.1}", n.status_json.seconds)
    }),
    ("preview s / RSS MB / lines", |_, n| seen(&n.preview)),
    ("/status ms median / max / KB", |_, n| {
        or_dash(n.served.as_ref(), |s| s.status.cell())
    }),
    ("/status.json ms median / max / KB", |_, n| {
        or_dash(n.served.as_ref(), |s| s.status_json.cell())
    }),
    ("load while served", |_, n| {
        or_dash(n.served.as_ref(), |s| s.load.clone())
    }),
];

/// A view's seconds, peak RSS and lines printed.
fn seen(v: &View) -> String {
    format!(
        "{:.2} / {} / {}",
        v.seconds,
        whole_mb(v.peak_rss_kb),
        v.lines
    )
}

/// Kilobytes as whole megabytes, or "—".
fn whole_mb(kb: Option<u64>) -> String {
    or_dash(kb, |kb| f(kb as f64 / 1024.0, 0))
}
