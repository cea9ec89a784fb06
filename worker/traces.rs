//! `sexton traces clean [--confirm] [--json]` (TR-4, OP-1): the `[traces]` limits applied now,
//! whether or not background trace retention is enabled. Without `--confirm` it prints the plan —
//! one line per file with its path, allocated bytes, mtime and reason — and deletes nothing; with
//! it, it takes the traces lease (TR-3) and deletes. The output is streamed: the plan of a root
//! holding millions of traces is never held in memory.

use std::io::Write as _;

use chrono::{SecondsFormat, Utc};
use serde::Serialize;
use sexton_jobs::files::{Root, Store};
use sexton_jobs::job::Job as _;
use sexton_jobs::trace_cleanup::{
    self as job, Error, Lease, Limits, Observer, Planned, TraceCleanup, TraceReport, TraceSettings,
};

use crate::config::{ConfigError, Problem, Settings};
use crate::db;

/// Prints each planned file as it is planned: a line of text, or an element of the JSON
/// object's `files` array.
struct Lines {
    json: bool,
    first: bool,
}

impl Observer for Lines {
    fn planned(&mut self, file: &Planned) {
        let mut out = std::io::stdout().lock();
        let written = if self.json {
            let separator = if self.first { "" } else { "," };
            serde_json::to_string(file)
                .map_err(std::io::Error::other)
                .and_then(|line| writeln!(out, "{separator}{line}"))
        } else {
            writeln!(
                out,
                "{}  {} bytes  {}  {}",
                crate::text::printable(&file.path),
                file.bytes,
                file.mtime.to_rfc3339_opts(SecondsFormat::Secs, true),
                file.reason.as_str()
            )
        };
        // A closed stdout (a pager quit) stops nothing: the run goes on and reports.
        written.ok();
        self.first = false;
    }
}

/// The totals printed after the plan.
#[derive(Debug, Serialize)]
struct Totals<'a> {
    limits: Limits,
    at: chrono::DateTime<Utc>,
    #[serde(flatten)]
    report: &'a TraceReport,
}

/// Plans, and with `confirm` deletes, printing as it goes.
///
/// # Errors
/// [`ConfigError`] (exit 2) when neither limit is set or the root is missing; a database or
/// root failure; [`Error::LeaseHeld`] (exit 1) when another cleaner holds the lease.
pub async fn clean(settings: &Settings, confirm: bool, json: bool) -> anyhow::Result<()> {
    let traces: &TraceSettings = settings.jobs.get(TraceCleanup::NAME);
    if !traces.limits.any() {
        return Err(ConfigError::Invalid(vec![Problem {
            setting: "traces.max_age_days".into(),
            message: "expected traces.max_age_days or traces.max_bytes above 0: with neither \
                      limit there is nothing to clean by (TR-1)"
                .into(),
        }])
        .into());
    }
    settings.check_dirs()?;
    settings.reach_stores().await?;
    let root = settings.paths.store(Root::Traces);
    // A confirmed run on an object root writes its lease row.
    let access = match (&root, confirm) {
        (Store::Object(_), true) => db::Access::Write,
        _ => db::Access::Read,
    };
    let pool = db::connect(&settings.database, access).await?;
    let at: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&pool).await?;
    let mut conn = pool.acquire().await?;
    let mut lease = if confirm {
        match Lease::take(&mut conn, &root, &job::holder("sexton traces clean", at)).await {
            Ok(lease) => Some(lease),
            Err(Error::LeaseHeld { holder }) => {
                let lease = match &root {
                    Store::Local(path) => path.join(job::LEASE_FILE).display().to_string(),
                    Store::Object(objects) => format!("the lease on {objects}"),
                };
                anyhow::bail!("another trace cleaner holds {lease}: {holder}; nothing was deleted")
            }
            Err(err) => return Err(err.into()),
        }
    } else {
        None
    };
    if json {
        writeln!(std::io::stdout(), "{{\"files\":[").ok();
    }
    let mut lines = Lines { json, first: true };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = job::clean(
        &mut conn,
        &root,
        traces.limits,
        at,
        lease.as_mut(),
        &mut lines,
        &stop,
    )
    .await;
    if let Some(lease) = lease {
        lease.release(&mut conn).await?;
    }
    let report = report?;
    let totals = Totals {
        limits: traces.limits,
        at,
        report: &report,
    };
    let tail = if json {
        format!("],\"totals\":{}}}\n", serde_json::to_string(&totals)?)
    } else {
        render(&totals)
    };
    // A closed stdout (a pager quit) is no failure of the run.
    write!(std::io::stdout(), "{tail}").ok();
    Ok(())
}

fn render(totals: &Totals<'_>) -> String {
    let r = totals.report;
    let planned: u64 = r.planned.values().sum();
    let by_reason: Vec<String> = r.planned.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let kept: Vec<String> = r.kept.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let mut out = format!(
        "\n{} trace files ({} bytes allocated) under the root; limits: max_age_days {}, max_bytes {}\n",
        r.candidates, r.candidate_bytes, totals.limits.max_age_days, totals.limits.max_bytes
    );
    out += &format!(
        "planned: {planned} files ({} bytes){}\n",
        r.planned_bytes,
        if by_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", by_reason.join(", "))
        }
    );
    out += &format!(
        "kept: {}\n",
        if kept.is_empty() {
            "nothing".to_owned()
        } else {
            kept.join(", ")
        }
    );
    if r.confirmed {
        out += &format!("deleted: {} files ({} bytes)\n", r.deleted, r.deleted_bytes);
    } else {
        out += "dry run: nothing was deleted; run again with --confirm to delete\n";
    }
    out
}
