//! `sexton erase` (SPEC §11, RQ-1): a request recorded and its pass started at once through the
//! queue; `erase status` and `erase retry`; `--dry-run` lists what would go and what would be
//! withheld, recording nothing.

use clap::Subcommand;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sexton_jobs::clock::SystemClock;
use sexton_jobs::erasure::request::{self, Opened};
use sexton_jobs::erasure::verify::{self, Left};
use sexton_jobs::erasure::{Erase, Erasure, ErasureSettings, Request, Subject, plan};
use sexton_jobs::job::Job as _;
use sexton_jobs::receipts::ReceiptKey;
use sqlx::{Connection as _, PgPool};
use uuid::Uuid;

use crate::config::Settings;
use crate::context::JobContext;
use crate::{registry, tick};

/// Why `sexton erase` refused: bad usage or a missing setting (exit 2), or a request it does not
/// know (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "erasure.receipt_key is not set: an erasure's receipt names its subject only by a keyed \
         hash (RQ-6); set SEXTON_ERASURE__RECEIPT_KEY in the environment (16 characters or more)"
    )]
    NoKey,
    #[error("{0}")]
    Usage(String),
    #[error("no erasure request {0}")]
    NoRequest(Uuid),
    #[error("request {0} has completed: a completed request is never run again")]
    Completed(Uuid),
}

impl Error {
    /// Whether the command was asked wrongly or cannot run as configured (exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::NoKey | Error::Usage(_))
    }
}

/// The erasure kind's settings.
pub fn settings_of(settings: &Settings) -> &ErasureSettings {
    settings.jobs.get::<ErasureSettings>(Erase::NAME)
}

/// The receipt key, or why there is none.
///
/// # Errors
/// [`Error::NoKey`].
pub fn key(settings: &Settings) -> Result<&ReceiptKey, Error> {
    settings_of(settings)
        .receipt_key
        .as_ref()
        .ok_or(Error::NoKey)
}

/// What to erase, as given on the command line.
#[derive(Debug, Clone)]
pub struct Asked {
    pub scope: Option<(Subject, Uuid)>,
    pub reference: Option<String>,
    pub by: Option<String>,
    pub due: Option<DateTime<Utc>>,
}

impl Asked {
    /// The request it makes, or what is wrong with it.
    fn erasure(self, now: DateTime<Utc>) -> Result<Erasure, Error> {
        let usage = |why: &str| Error::Usage(why.to_owned());
        let (subject, id) = self.scope.ok_or_else(|| {
            usage("sexton erase needs one of --account, --conversation, --agent or --session ID")
        })?;
        let nonempty = |value: Option<String>, flag: &str| match value {
            Some(value) if !value.trim().is_empty() => Ok(value),
            _ => Err(Error::Usage(format!(
                "{flag} must name something (not empty): {}",
                if flag == "--ref" {
                    "the request's ticket, e.g. a data-subject request number"
                } else {
                    "who asks for the erasure"
                }
            ))),
        };
        let reference = nonempty(self.reference, "--ref")?;
        let requested_by = nonempty(self.by, "--by")?;
        if let Some(due) = self.due
            && due <= now
        {
            return Err(Error::Usage(format!(
                "--due {} is not in the future (now is {})",
                due.to_rfc3339(),
                now.to_rfc3339()
            )));
        }
        Ok(Erasure {
            subject,
            id,
            reference,
            requested_by,
            due_at: self.due,
        })
    }
}

/// What `sexton erase` prints.
#[derive(Debug, Serialize)]
pub struct Answer {
    pub id: Uuid,
    pub state: &'static str,
    pub due_at: DateTime<Utc>,
    /// The request already open for this scope was returned.
    pub existing: bool,
}

/// Records the request and starts its pass (RQ-1).
///
/// # Errors
/// [`Error`] for bad usage or a missing key; a database or queue error.
pub async fn request(pool: &PgPool, settings: &Settings, asked: Asked) -> anyhow::Result<Answer> {
    let key = key(settings)?;
    let mut conn = pool.acquire().await?;
    let now = crate::clock::database_now(pool).await?;
    let erasure = asked.erasure(now)?;
    let opened = request::open(&mut conn, &erasure, key, settings_of(settings).deadline).await?;
    let (request, existing) = match opened {
        Opened::New(request) => (request, false),
        Opened::Open(request) => (request, true),
    };
    drop(conn);
    start_pass(pool, settings).await?;
    Ok(Answer {
        id: request.id,
        state: request.state.as_str(),
        due_at: request.due_at,
        existing,
    })
}

/// Starts a pass of the erasure kind now (its first hop keyed by this moment).
///
/// # Errors
/// A database or queue error.
pub async fn start_pass(pool: &PgPool, settings: &Settings) -> anyhow::Result<()> {
    let kind = registry::KINDS
        .iter()
        .find(|kind| kind.name() == Erase::NAME)
        .copied()
        .expect("the erasure kind is registered");
    let ctx = JobContext::new(
        pool.clone(),
        Arc::new(settings.clone()),
        Arc::new(SystemClock),
    );
    let now = crate::clock::database_now(pool).await?;
    tick::start_period(&ctx, kind, now).await?;
    Ok(())
}

/// Makes the waiting requests' next pass due now and starts one (a hold was released: RQ-4).
///
/// # Errors
/// A database or queue error.
pub async fn resume(pool: &PgPool, settings: &Settings) -> anyhow::Result<u64> {
    let resumed = request::resume_waiting(pool).await?;
    if resumed > 0 {
        start_pass(pool, settings).await?;
    }
    Ok(resumed)
}

/// `sexton erase retry ID`: a failed or waiting request runs again now.
///
/// # Errors
/// [`Error::NoRequest`], [`Error::Completed`]; a database or queue error.
pub async fn retry(pool: &PgPool, settings: &Settings, id: Uuid) -> anyhow::Result<Request> {
    let mut conn = pool.acquire().await?;
    let Some(request) = request::retry(&mut conn, id).await? else {
        return Err(match request::get(&mut conn, id).await? {
            Some(_) => Error::Completed(id),
            None => Error::NoRequest(id),
        }
        .into());
    };
    drop(conn);
    start_pass(pool, settings).await?;
    Ok(request)
}

/// What `--dry-run` found: what would go, per table and root, and what would be withheld.
#[derive(Debug, Serialize)]
pub struct DryRun {
    pub scope: Subject,
    pub dry_run: bool,
    #[serde(flatten)]
    pub left: Left,
}

/// What an erasure of `asked` would remove now, and withhold, recording nothing: its scope's
/// ids are found as a pass finds them, read, and rolled back.
///
/// # Errors
/// [`Error`] for bad usage; a database error or a root that cannot be listed.
pub async fn dry_run(pool: &PgPool, settings: &Settings, asked: Asked) -> anyhow::Result<DryRun> {
    let now = crate::clock::database_now(pool).await?;
    let erasure = asked.erasure(now)?;
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let probe = Uuid::new_v4();
    sqlx::query(sqlx::AssertSqlSafe(plan::members(erasure.subject, false)))
        .bind(probe)
        .bind(erasure.id)
        .execute(&mut *tx)
        .await?;
    let left = verify::left(
        &mut tx,
        None,
        &settings.paths,
        probe,
        settings_of(settings).keep_usage_records,
        verify::Reading::Before,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    tx.rollback().await?;
    Ok(DryRun {
        scope: erasure.subject,
        dry_run: true,
        left,
    })
}

/// A dry run for people.
pub fn dry_run_text(dry: &DryRun) -> String {
    let mut out = format!("dry run: an erasure of this {} would remove\n", dry.scope);
    if dry.left.rows.is_empty() && dry.left.files.is_empty() {
        out.push_str("  nothing: no row or file of it is left\n");
    }
    for (table, n) in &dry.left.rows {
        let _ = writeln!(out, "  {table:<30} {n:>10} rows");
    }
    for (root, n) in &dry.left.files {
        let _ = writeln!(out, "  {root:<30} {n:>10} files (root {root})");
    }
    if !dry.left.withheld.is_empty() {
        out.push_str(
            "and would withhold, until they can go (with what they hang from: the conversation \
             of a withheld run, the agent of a withheld session, and their rows):\n",
        );
        for item in &dry.left.items {
            let _ = writeln!(out, "  {}", withheld_line(item));
        }
    }
    out.push_str("nothing was recorded or deleted\n");
    out
}

fn withheld_line(item: &verify::Item) -> String {
    let item = serde_json::to_value(item).unwrap_or_default();
    withheld_value(&item)
}

/// A withheld item as a request's row keeps it: `{what, id, reason, hold, case_ref}`.
fn withheld_value(item: &serde_json::Value) -> String {
    let field = |name: &str| item[name].as_str().unwrap_or("?").to_owned();
    let mut line = format!("{} {}: {}", field("what"), field("id"), field("reason"));
    if let Some(hold) = item["hold"].as_str() {
        let _ = write!(line, " (hold {hold}");
        if let Some(case) = item["case_ref"].as_str() {
            let _ = write!(line, ", case {case}");
        }
        line.push(')');
    }
    line
}

/// `sexton erase status`: the open requests (every one with `all`), or request `id`.
///
/// # Errors
/// [`Error::NoRequest`]; a database error.
pub async fn status(pool: &PgPool, id: Option<Uuid>, all: bool) -> anyhow::Result<Vec<Request>> {
    let mut conn = pool.acquire().await?;
    match id {
        Some(id) => Ok(vec![
            request::get(&mut conn, id)
                .await?
                .ok_or(Error::NoRequest(id))?,
        ]),
        None => Ok(request::list(&mut conn, all, 1000).await?),
    }
}

/// Requests for people, one block each.
pub fn status_text(requests: &[Request], all: bool) -> String {
    if requests.is_empty() {
        return if all {
            "no erasure request\n".to_owned()
        } else {
            "no open erasure request\n".to_owned()
        };
    }
    let mut out = String::new();
    for r in requests {
        let _ = writeln!(
            out,
            "{} {} ({}, ref {}, by {}): {}, due {}{}",
            r.id,
            r.scope,
            r.scope_id
                .map_or_else(|| "subject cleared".to_owned(), |id| id.to_string()),
            r.reference,
            r.requested_by,
            r.state.as_str(),
            r.due_at.to_rfc3339(),
            r.completed_at
                .map(|at| format!(", completed {}", at.to_rfc3339()))
                .unwrap_or_default()
        );
        let removed: BTreeMap<&String, &serde_json::Value> = r.removed.0.iter().collect();
        if !removed.is_empty() {
            let shown: Vec<String> = removed.iter().map(|(t, n)| format!("{t} {n}")).collect();
            let _ = writeln!(out, "  removed: {}", shown.join(", "));
        }
        if !r.kept.0.is_empty() {
            let shown: Vec<String> = r.kept.0.iter().map(|(t, n)| format!("{t} {n}")).collect();
            let _ = writeln!(out, "  kept by law: {}", shown.join(", "));
        }
        if !r.withheld.0.is_empty() {
            let shown: Vec<String> = r
                .withheld
                .0
                .iter()
                .map(|(t, n)| format!("{t} {n}"))
                .collect();
            let _ = writeln!(out, "  withheld: {}", shown.join(", "));
            for item in &r.withheld_items.0 {
                let _ = writeln!(out, "    {}", withheld_value(item));
            }
        }
        if let Some(error) = &r.last_error {
            let _ = writeln!(out, "  last error: {error}");
        }
    }
    out
}

/// What `sexton erase` asks to erase.
#[derive(Debug, clap::Args)]
pub struct EraseRequest {
    /// Everything of this account (its row kept as the usage records' anchor when they are kept).
    #[arg(long, value_name = "ID", group = "scope")]
    account: Option<uuid::Uuid>,
    /// This conversation, its forks and its runs with their delegated children.
    #[arg(long, value_name = "ID", group = "scope")]
    conversation: Option<uuid::Uuid>,
    /// This agent with all its sessions, records, memories and traces.
    #[arg(long, value_name = "ID", group = "scope")]
    agent: Option<uuid::Uuid>,
    /// This session with its history, archives, directory and traces.
    #[arg(long, value_name = "ID", group = "scope")]
    session: Option<uuid::Uuid>,
    /// The request's ticket (a data-subject request's number).
    #[arg(long = "ref", value_name = "REF")]
    reference: Option<String>,
    /// Who asks for it.
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
    /// When it must be done by (RFC 3339); `[erasure] deadline_days` from now if omitted.
    #[arg(long, value_name = "RFC3339")]
    due: Option<DateTime<Utc>>,
    /// Print what would go, per table and root, and what would be withheld and why; record
    /// nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object: {"id", "state", "due_at", "existing"}.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
pub enum EraseCommand {
    /// The open requests (every one with --all), or one, with state, due date, counts and what
    /// is withheld.
    Status {
        /// Only this request.
        id: Option<uuid::Uuid>,
        /// Completed requests too.
        #[arg(long)]
        all: bool,
        /// Print a JSON array of the requests.
        #[arg(long)]
        json: bool,
    },
    /// Run a failed or waiting request again now.
    Retry {
        id: uuid::Uuid,
        /// Print the request as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `sexton erase`, `erase status` and `erase retry`.
///
/// # Errors
/// [`Error`] for bad usage; a database or queue error.
pub async fn run(
    settings: &Settings,
    command: Option<EraseCommand>,
    given: EraseRequest,
) -> anyhow::Result<()> {
    let read_only = matches!(command, Some(EraseCommand::Status { .. })) || given.dry_run;
    let pool = crate::db::connect(
        &settings.database,
        if read_only {
            crate::db::Access::Read
        } else {
            crate::db::Access::Write
        },
    )
    .await?;
    match command {
        Some(EraseCommand::Status { id, all, json }) => {
            let requests = status(&pool, id, all).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&requests)?);
            } else {
                print!("{}", status_text(&requests, all));
            }
        }
        Some(EraseCommand::Retry { id, json }) => {
            let request = retry(&pool, settings, id).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&request)?);
            } else {
                println!("{}: {}", request.id, request.state.as_str());
            }
        }
        None => {
            let scope = [
                (Subject::Account, given.account),
                (Subject::Conversation, given.conversation),
                (Subject::Agent, given.agent),
                (Subject::Session, given.session),
            ]
            .into_iter()
            .find_map(|(subject, id)| Some((subject, id?)));
            let asked = Asked {
                scope,
                reference: given.reference,
                by: given.by,
                due: given.due,
            };
            if given.dry_run {
                let dry = dry_run(&pool, settings, asked).await?;
                if given.json {
                    println!("{}", serde_json::to_string_pretty(&dry)?);
                } else {
                    print!("{}", dry_run_text(&dry));
                }
            } else {
                let answer = request(&pool, settings, asked).await?;
                if given.json {
                    println!("{}", serde_json::to_string(&answer)?);
                } else if answer.existing {
                    println!(
                        "{} (already open for this scope: {}, due {})",
                        answer.id,
                        answer.state,
                        answer.due_at.to_rfc3339()
                    );
                } else {
                    println!("{}", answer.id);
                }
            }
        }
    }
    Ok(())
}
