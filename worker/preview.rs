//! `sexton preview` (OP-1): what every registered job would remove now, deleting nothing.
//!
//! By default a summary per job: for a per-account job, how many accounts its discovery finds
//! something due for (the passes a slot now would start, FL-8) and what their lines add up to;
//! a global job's lines as they are. `--account` gives one account's lines of every job, found
//! due or not; `--all` every due account's lines. The due accounts are found as the fan-out
//! finds them, from the candidates' side, and taken in batches of `queue.fan_out_batch`, each
//! written before the next is read: memory is bounded by a batch whatever the number of
//! accounts.

use std::io::Write;

use chrono::{DateTime, Utc};
use sexton_jobs::job::{self, Discovery, Scope};
use uuid::Uuid;

use crate::config::Settings;
use crate::registry::{self, Kind, PreviewLine};
use crate::text;

/// What `sexton preview` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Per job: accounts due and what their lines add up to.
    Summary,
    /// Every job's lines for this account.
    Account(Uuid),
    /// Every due account's lines.
    All,
}

/// Writes what every registered job would do now to `out`: for people, each job then its
/// lines indented (control characters escaped); with `json`, one array of objects, each naming
/// its `job`. A job whose preview fails while the holds cannot be read gets one line saying so
/// (`"error"` in JSON), and the others are shown all the same.
///
/// # Errors
/// A database error of any job's discovery or preview (the holds readable), or a failed write.
pub async fn write(
    conn: &mut sqlx::PgConnection,
    settings: &Settings,
    now: DateTime<Utc>,
    shown: Shown,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut sink = Sink {
        out,
        json,
        first: true,
        accounts: None,
    };
    if json {
        sink.out.write_all(b"[")?;
    }
    for kind in registry::KINDS {
        if !json {
            writeln!(sink.out, "{}", kind.name())?;
        }
        let previewed = preview_kind(conn, settings, now, shown, *kind, &mut sink).await;
        let Err(err) = previewed else { continue };
        // The holds unreadable, what each job would remove cannot be told, but the rest can:
        // the job's line says so (a pass removes nothing meanwhile, HD-3).
        let Some(unreadable) = holds_unreadable(conn).await else {
            return Err(err.context(format!("the preview of {} failed", kind.name())));
        };
        let text = format!(
            "what it would remove cannot be told: the holds could not be read ({unreadable}); \
             its passes remove nothing while they cannot (HD-3)"
        );
        let json = serde_json::json!({
            "job": kind.name(),
            "error": format!("{:#}", err.context("the holds could not be read")),
        });
        sink.line(&json, &text)?;
    }
    if json {
        sink.out.write_all(b"\n]\n")?;
    }
    Ok(())
}

/// Why the holds cannot be read, if they cannot (the table renamed, its privilege revoked).
async fn holds_unreadable(conn: &mut sqlx::PgConnection) -> Option<String> {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sexton.holds WHERE released_at IS NULL")
        .fetch_one(conn)
        .await
        .err()
        .map(|err| err.to_string())
}

/// Where the lines go, as they come.
struct Sink<'w, W: Write> {
    out: &'w mut W,
    json: bool,
    first: bool,
    /// How many accounts there are, once a summary has counted them (a read of every account,
    /// made once for every kind).
    accounts: Option<u64>,
}

impl<W: Write> Sink<'_, W> {
    fn line(&mut self, json: &serde_json::Value, text: &str) -> std::io::Result<()> {
        if self.json {
            let separator = if self.first { "\n" } else { ",\n" };
            self.first = false;
            write!(self.out, "{separator}{json}")
        } else {
            for row in text.lines() {
                writeln!(self.out, "  {}", text::printable(row))?;
            }
            Ok(())
        }
    }
}

async fn preview_kind<W: Write>(
    conn: &mut sqlx::PgConnection,
    settings: &Settings,
    now: DateTime<Utc>,
    shown: Shown,
    kind: &'static dyn Kind,
    sink: &mut Sink<'_, W>,
) -> anyhow::Result<()> {
    let write_all = |sink: &mut Sink<'_, W>, lines: Vec<PreviewLine>| -> std::io::Result<()> {
        lines
            .iter()
            .try_for_each(|line| sink.line(&line.json, &line.text))
    };
    match (shown, kind.scope()) {
        (Shown::Account(account), _) => {
            let lines = kind.preview(conn, settings, now, Some(&[account])).await?;
            write_all(sink, lines)?;
        }
        (_, Scope::Global) => {
            let lines = kind.preview(conn, settings, now, None).await?;
            write_all(sink, lines)?;
        }
        (Shown::All, Scope::Account) => {
            walk_due(conn, settings, now, kind, |lines| {
                write_all(sink, lines)?;
                sink.out.flush()
            })
            .await?;
        }
        (Shown::Summary, Scope::Account) => {
            let mut totals: Vec<(String, i64)> = Vec::new();
            let due = walk_due(conn, settings, now, kind, |lines| {
                for (what, n) in lines.into_iter().flat_map(|line| line.tally) {
                    match totals.iter_mut().find(|(known, _)| *known == what) {
                        Some((_, total)) => *total += n,
                        None => totals.push((what, n)),
                    }
                }
                Ok(())
            })
            .await?;
            let accounts = match sink.accounts {
                Some(accounts) => accounts,
                None => *sink.accounts.insert(job::accounts(conn).await?),
            };
            let counts: serde_json::Map<_, _> = totals
                .iter()
                .map(|(what, n)| (what.clone(), (*n).into()))
                .collect();
            let json = serde_json::json!({
                "job": kind.name(),
                "accounts": accounts,
                "due": due,
                "totals": counts,
            });
            let mut text = format!(
                "{due} of {accounts} accounts have something due (a pass would start for each)"
            );
            for (what, n) in &totals {
                text.push_str(&format!("\n  {what:<42} {n:>12}"));
            }
            sink.line(&json, &text)?;
        }
    }
    Ok(())
}

/// The accounts `kind`'s discovery finds, in batches of `queue.fan_out_batch` as the fan-out
/// takes them, the preview of each batch handed to `each` before the next is read. Returns how
/// many were found.
async fn walk_due(
    conn: &mut sqlx::PgConnection,
    settings: &Settings,
    now: DateTime<Utc>,
    kind: &'static dyn Kind,
    mut each: impl FnMut(Vec<PreviewLine>) -> std::io::Result<()>,
) -> anyhow::Result<u64> {
    let mut due_count = 0;
    let due = Discovery::open(conn, kind.due(settings, now)).await?;
    loop {
        let batch = due.next(conn, settings.queue.fan_out_batch).await?;
        if batch.is_empty() {
            break;
        }
        due_count += batch.len() as u64;
        each(kind.preview(conn, settings, now, Some(&batch)).await?)?;
    }
    due.close(conn).await?;
    Ok(due_count)
}
