//! Receipts from the operator's side (RQ-6): `sexton receipts verify` (is the chain whole?),
//! `export` (every receipt, a JSON line each) and `find` (a subject's receipts, by its hash
//! recomputed under `[erasure] receipt_key`). The chain and its reading are
//! `sexton_jobs::receipts`'; this module connects, asks and prints.

use anyhow::Context as _;
use clap::{ArgGroup, Subcommand};
use std::fmt::Write as _;
use std::io::Write as _;

use chrono::{DateTime, Utc};
use futures::TryStreamExt as _;
use serde_json::Value;
use sexton_jobs::erasure::{Erase, ErasureSettings};
use sexton_jobs::job::Job as _;
use sexton_jobs::receipts::{self, Broken, Found, Receipt, Verified};
use sqlx::{Connection as _, Postgres};
use uuid::Uuid;

use crate::config::Settings;
use crate::{db, text};

/// A command that cannot run as asked (exit 2), a broken chain or a database that could not be
/// read (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "erasure.receipt_key is not set: receipts find recomputes a subject's hash under the key \
         the receipts were written with (set SEXTON_ERASURE__RECEIPT_KEY)"
    )]
    NoKey,
    #[error("receipt chain broken at seq {}: {}", .0.seq, .0.what)]
    Broken(Broken),
    #[error("could not read sexton.receipts (run `sexton migrate` first?)")]
    Database(#[from] sqlx::Error),
}

impl Error {
    /// Whether the command was asked for something that cannot be (bad usage, exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::NoKey)
    }
}

/// A connection to read the receipts on.
async fn connect(settings: &Settings) -> anyhow::Result<sqlx::pool::PoolConnection<Postgres>> {
    let pool = db::connect(&settings.database, db::Access::Read).await?;
    Ok(pool.acquire().await.map_err(Error::from)?)
}

/// The one snapshot `verify` and `export` read the chain in, their batches included.
const SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// `sexton receipts verify`: walks the chain in one snapshot; prints how many receipts are
/// whole and the head to record, or (as an error, exit 1) the first receipt removed, altered
/// or reordered.
///
/// # Errors
/// [`Error::Broken`] naming the first bad seq; a database error.
pub async fn verify(settings: &Settings, json: bool) -> anyhow::Result<()> {
    let mut conn = connect(settings).await?;
    let mut tx = conn.begin_with(SNAPSHOT).await.map_err(Error::from)?;
    let verified = receipts::verify(&mut tx).await.map_err(Error::from)?;
    tx.commit().await.map_err(Error::from)?;
    let Verified {
        receipts,
        first_bad,
        head,
    } = &verified;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "whole": first_bad.is_none(),
                "receipts": receipts,
                "first_bad": first_bad,
                "head": head,
            })
        );
    } else if first_bad.is_none() {
        match head {
            None => println!("the receipt chain is empty: no receipt was written yet"),
            Some(head) => println!(
                "the receipt chain is whole: {receipts} receipts, the last seq {} with hash {} \
                 (record it: receipts removed from the end leave no link to break)",
                head.seq, head.hash
            ),
        }
    } else {
        println!("{receipts} receipts whole before the break");
    }
    match first_bad {
        Some(broken) => Err(Error::Broken(*broken).into()),
        None => Ok(()),
    }
}

/// `sexton receipts export [--since]`: the receipts written at or after `since` (all without
/// it), one JSON object a line, in seq order, streamed from one snapshot.
///
/// # Errors
/// A database error, or stdout closed.
pub async fn export(settings: &Settings, since: Option<DateTime<Utc>>) -> anyhow::Result<()> {
    let mut conn = connect(settings).await?;
    let mut tx = conn.begin_with(SNAPSHOT).await.map_err(Error::from)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    {
        let mut batches = std::pin::pin!(receipts::export(&mut tx, since));
        while let Some(batch) = batches.try_next().await.map_err(Error::from)? {
            for receipt in batch {
                serde_json::to_writer(&mut out, &receipt)?;
                out.write_all(b"\n")?;
            }
        }
    }
    out.flush()?;
    tx.commit().await.map_err(Error::from)?;
    Ok(())
}

/// `sexton receipts find --<scope> ID`: the receipts of that subject under the receipt key, and
/// which key eras it cannot check.
///
/// # Errors
/// [`Error::NoKey`] (exit 2) without the key; a database error.
pub async fn find(settings: &Settings, scope: &str, id: Uuid, json: bool) -> anyhow::Result<()> {
    let erasure: &ErasureSettings = settings.jobs.get(Erase::NAME);
    let key = erasure.receipt_key.clone().ok_or(Error::NoKey)?;
    let mut conn = connect(settings).await?;
    let found = receipts::find(&mut conn, &key, id)
        .await
        .map_err(Error::from)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&found)?);
    } else {
        print!("{}", render(&found, scope));
    }
    Ok(())
}

/// What `find` prints for people: a line per receipt, then the receipts this key cannot check.
fn render(found: &Found, scope: &str) -> String {
    let mut out = match found.receipts.len() {
        0 => format!(
            "no receipt for this {scope} under the key with id {}\n",
            found.key_id
        ),
        n => format!(
            "{n} receipt{} for this {scope} under the key with id {}:\n",
            if n == 1 { "" } else { "s" },
            found.key_id
        ),
    };
    for receipt in &found.receipts {
        out.push_str(&line(receipt));
        out.push('\n');
    }
    if !found.other_keys.is_empty() {
        let eras: Vec<String> = found
            .other_keys
            .iter()
            .map(|other| {
                format!(
                    "{} ({})",
                    other
                        .key_id
                        .as_deref()
                        .map_or_else(|| "none".to_owned(), text::one_line),
                    other.receipts
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "this key checks only receipts written under key id {}: {} receipt{} written under \
             other keys cannot be checked with it (key ids: {}); find them with the key of \
             their era",
            found.key_id,
            found.unchecked(),
            if found.unchecked() == 1 { "" } else { "s" },
            eras.join(", ")
        );
    }
    out
}

/// One receipt as `find` lists it: its seq, request, ref, scope kind, when it completed and
/// its hash (the body's subject stays the hash it is).
fn line(receipt: &Receipt) -> String {
    let field = |name: &str| match receipt.body.get(name) {
        Some(Value::String(s)) => text::one_line(s),
        Some(other) => text::one_line(&other.to_string()),
        None => "-".to_owned(),
    };
    format!(
        "seq {}  request {}  ref {}  scope {}  by {}  completed {}  hash {}",
        receipt.seq,
        receipt.request_id,
        field("ref"),
        field("scope"),
        field("requested_by"),
        field("completed_at"),
        receipt.hash
    )
}

#[derive(Debug, Subcommand)]
pub enum ReceiptsCommand {
    /// Walk the chain: exit 0 when it is whole, 1 naming the first receipt removed, altered or
    /// reordered.
    Verify {
        /// Print one JSON object: {"whole", "receipts", "first_bad": {seq, what}, "head"}.
        #[arg(long)]
        json: bool,
    },
    /// Print every receipt as one JSON object a line, in seq order: {seq, request_id, body,
    /// prev_hash, hash, written_at}.
    Export {
        /// Only the receipts written at or after this date or moment (RFC 3339; a date alone is
        /// its midnight, UTC).
        #[arg(long, value_name = "DATE", value_parser = since_moment)]
        since: Option<DateTime<Utc>>,
    },
    /// A subject's receipts, found by its hash under [erasure] receipt_key (the key's era: the
    /// receipts written under another key are counted, not checked).
    #[command(group(ArgGroup::new("scope").required(true)))]
    Find {
        /// The receipts of this account's erasures.
        #[arg(long, value_name = "ID", group = "scope")]
        account: Option<uuid::Uuid>,
        /// The receipts of this conversation's erasures.
        #[arg(long, value_name = "ID", group = "scope")]
        conversation: Option<uuid::Uuid>,
        /// The receipts of this agent's erasures.
        #[arg(long, value_name = "ID", group = "scope")]
        agent: Option<uuid::Uuid>,
        /// The receipts of this session's erasures.
        #[arg(long, value_name = "ID", group = "scope")]
        session: Option<uuid::Uuid>,
        /// Print one JSON object: {key_id, receipts: [...], other_keys: [{key_id, receipts}]}.
        #[arg(long)]
        json: bool,
    },
}

/// A moment `receipts export --since` reads from: RFC 3339, or a date alone (its midnight, UTC).
fn since_moment(value: &str) -> Result<DateTime<Utc>, String> {
    value
        .parse::<DateTime<Utc>>()
        .or_else(|_| {
            chrono::NaiveDate::parse_from_str(value, "%Y-%m-%d")
                .map(|date| date.and_time(chrono::NaiveTime::MIN).and_utc())
        })
        .map_err(|_| {
            "expected an RFC 3339 date or moment such as 2026-12-01 or 2026-12-01T03:00:00Z"
                .to_owned()
        })
}

/// Runs `sexton receipts verify`, `export` and `find`.
///
/// # Errors
/// [`Error`] for bad usage or a broken chain; a database error.
pub async fn run(settings: &Settings, command: ReceiptsCommand) -> anyhow::Result<()> {
    match command {
        ReceiptsCommand::Verify { json } => verify(settings, json).await,
        ReceiptsCommand::Export { since } => export(settings, since).await,
        ReceiptsCommand::Find {
            account,
            conversation,
            agent,
            session,
            json,
        } => {
            // Clap's group gives exactly one.
            let (scope, id) = [
                ("account", account),
                ("conversation", conversation),
                ("agent", agent),
                ("session", session),
            ]
            .into_iter()
            .find_map(|(scope, id)| Some((scope, id?)))
            .context("receipts find: a scope flag is required")?;
            find(settings, scope, id, json).await
        }
    }
}
