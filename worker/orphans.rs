//! `sexton orphans scan [--root NAME] [--confirm] [--json]` (DC-3, OP-1): files no row owns,
//! by the `[orphans]` grace, whether or not the background job is enabled. Without `--confirm`
//! it lists — one line per file or directory with its root, path, bytes, mtime and reason — and
//! deletes nothing; with it, it removes what it lists (each asked about again just before) and
//! records the scan for `status` and the metrics. The output is streamed: a root of millions of
//! orphans is never held in memory. A root that is missing, not a directory or unreadable is
//! reported and nothing is deleted there; the others are scanned.

use std::io::Write as _;
use std::sync::atomic::AtomicBool;

use chrono::{DateTime, SecondsFormat, Utc};
use clap::Subcommand;
use serde::Serialize;
use sexton_jobs::files::Root;
use sexton_jobs::job::Job as _;
use sexton_jobs::orphans::{
    Listed, Observer, OrphanReport, OrphanSettings, Orphans, REASONS, ROOTS, Scan, record,
};

use crate::config::Settings;
use crate::{clock, db, text};

#[derive(Debug, Subcommand)]
pub enum OrphansCommand {
    /// List what no row owns (root, path, bytes, mtime, reason per file, then totals); delete
    /// it only with --confirm.
    Scan {
        /// Only this root: outputs, attachments, sessions or traces.
        #[arg(long, value_name = "NAME")]
        root: Option<String>,
        /// Delete what is listed (without it nothing is deleted).
        #[arg(long)]
        confirm: bool,
        /// Print one JSON object: {"files": [...], "totals": {...}}.
        #[arg(long)]
        json: bool,
    },
}

/// A command that cannot run as asked (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--root: expected one of {}, got {given:?}", names())]
    UnknownRoot { given: String },
}

impl Error {
    /// Whether the command was asked for something that cannot be (bad usage, exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::UnknownRoot { .. })
    }
}

fn names() -> String {
    ROOTS.map(Root::as_str).join(", ")
}

/// Prints each listed entry as it is listed: a line of text, or an element of the JSON
/// object's `files` array.
struct Lines {
    json: bool,
    first: bool,
}

impl Observer for Lines {
    fn listed(&mut self, entry: &Listed) {
        let mut out = std::io::stdout().lock();
        let written = if self.json {
            let separator = if self.first { "" } else { "," };
            serde_json::to_string(entry)
                .map_err(std::io::Error::other)
                .and_then(|line| writeln!(out, "{separator}{line}"))
        } else {
            writeln!(
                out,
                "{}  {}  {} bytes  {}  {}",
                entry.root,
                text::printable(&entry.path),
                entry.bytes,
                entry.mtime.to_rfc3339_opts(SecondsFormat::Secs, true),
                entry.reason
            )
        };
        // A closed stdout (a pager quit) stops nothing: the scan goes on and reports.
        written.ok();
        self.first = false;
    }
}

/// The totals printed after the list.
#[derive(Debug, Serialize)]
struct Totals<'a> {
    at: DateTime<Utc>,
    #[serde(flatten)]
    report: &'a OrphanReport,
}

/// Runs an `orphans` command.
///
/// # Errors
/// [`Error::UnknownRoot`] (exit 2); a database failure (exit 1).
pub async fn run(settings: &Settings, command: OrphansCommand) -> anyhow::Result<()> {
    let OrphansCommand::Scan {
        root,
        confirm,
        json,
    } = command;
    let roots: Vec<Root> = match root {
        None => ROOTS.to_vec(),
        Some(given) => match ROOTS.iter().find(|root| root.as_str() == given) {
            Some(root) => vec![*root],
            None => return Err(Error::UnknownRoot { given }.into()),
        },
    };
    let orphans: &OrphanSettings = settings.jobs.get(Orphans::NAME);
    let access = if confirm {
        db::Access::Write
    } else {
        db::Access::Read
    };
    let pool = db::connect(&settings.database, access).await?;
    let at = clock::database_now(&pool).await?;
    let mut conn = pool.acquire().await?;
    if json {
        writeln!(std::io::stdout(), "{{\"files\":[").ok();
    }
    let scan = Scan {
        paths: &settings.paths,
        roots: &roots,
        grace_days: orphans.grace_days,
        now: at,
        confirm,
    };
    let mut lines = Lines { json, first: true };
    let report = scan
        .run(&mut conn, &mut lines, &AtomicBool::new(false))
        .await?;
    if confirm {
        record(&mut conn, "sexton orphans scan", at, &report).await?;
    }
    let totals = Totals {
        at,
        report: &report,
    };
    let tail = if json {
        format!("],\"totals\":{}}}\n", serde_json::to_string(&totals)?)
    } else {
        render(&report)
    };
    // A closed stdout (a pager quit) is no failure of the scan.
    write!(std::io::stdout(), "{tail}").ok();
    Ok(())
}

fn render(report: &OrphanReport) -> String {
    let mut out = format!(
        "\norphans (DC-1 … DC-5), grace {} days:\n",
        report.grace_days
    );
    for (root, counts) in &report.roots {
        if let Some(error) = &counts.error {
            out += &format!(
                "  {root:<12} not scanned ({}): {}; nothing deleted there\n",
                counts.state,
                text::printable(error)
            );
            continue;
        }
        let by: Vec<String> = REASONS
            .iter()
            .map(|reason| format!("{reason} {}", counts.of(reason)))
            .collect();
        out += &format!(
            "  {root:<12} {}; listed {} ({} bytes)",
            by.join(", "),
            counts.listed,
            counts.listed_bytes
        );
        if report.confirmed {
            out += &format!(
                "; removed {} ({} files, {} bytes), {} could not be removed",
                counts.gone, counts.removed.deleted, counts.removed.bytes, counts.removed.errors
            );
        }
        out.push('\n');
    }
    if !report.confirmed {
        out += "dry run: nothing was deleted; run again with --confirm to delete\n";
    }
    out
}
