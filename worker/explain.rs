//! `sexton explain <subject> <id> [--json]`: the verdict of the job that owns a row
//! or file — eligible, retained with every reason and its rule id, or removed — from the job's
//! own code, through the registry. Read-only.
//!
//! An erasure comes first (RQ-7): of an account, a conversation, an agent, a session or a run
//! that an open erasure request covers, `explain` says which request removes it next or which
//! hold it waits on; of one a completed request removed, which request and when (found by the
//! subject's keyed hash under `[erasure] receipt_key`). Anything no erasure touched gets its own
//! kind's verdict, as before.

use chrono::{DateTime, Utc};
use sexton_jobs::erasure::{self, Erase, ErasureSettings};
use sexton_jobs::explain::Explanation;
use sexton_jobs::job::Job as _;
use sqlx::PgConnection;

use crate::config::Settings;
use crate::db;
use crate::registry::{KINDS, Kind};

/// A subject or id that cannot be explained: bad usage, exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Every subject `explain` knows, in the registry's order.
pub fn subjects() -> Vec<&'static str> {
    KINDS
        .iter()
        .flat_map(|k| k.subjects().iter().copied())
        .collect()
}

/// The help of `explain`'s SUBJECT: every subject, in the registry's order.
pub fn subjects_help() -> String {
    format!("What to explain: {}", subjects().join(", "))
}

/// The help of `explain`'s ID: the form of id each subject takes (the usual form first, then
/// each exception).
pub fn ids_help() -> String {
    let (usual, exceptions) = id_forms();
    let mut help = format!("The subject's id: {usual}");
    for (subject, form) in exceptions {
        help.push_str(&format!("; for {subject}, {form}"));
    }
    help
}

/// The form of id the subjects take, as each job's own check of an id says it: the form most
/// take, then every subject whose id takes another, with its own, in the registry's order.
pub fn id_forms() -> (String, Vec<(&'static str, String)>) {
    let forms: Vec<(&str, String)> = KINDS
        .iter()
        .flat_map(|kind| {
            kind.subjects()
                .iter()
                .map(move |subject| (*subject, id_form(*kind, subject)))
        })
        .collect();
    let usual = forms
        .iter()
        .max_by_key(|(_, form)| forms.iter().filter(|(_, f)| f == form).count())
        .map(|(_, form)| form.clone())
        .unwrap_or_default();
    let exceptions = forms
        .into_iter()
        .filter(|(_, form)| *form != usual)
        .collect();
    (usual, exceptions)
}

/// The form of `subject`'s id, from what its job says of an empty one ("expected a UUID, got
/// \"\"" gives "a UUID").
fn id_form(kind: &dyn Kind, subject: &str) -> String {
    let why = kind.parse_id(subject, "").err().unwrap_or_default();
    let form = why.strip_prefix("expected ").unwrap_or(&why);
    match form.split(", got ").next() {
        Some(form) if !form.is_empty() => form.to_owned(),
        _ => "an id".to_owned(),
    }
}

fn owner(subject: &str) -> Option<(&'static dyn Kind, &'static str)> {
    KINDS.iter().find_map(|kind| {
        kind.subjects()
            .iter()
            .find(|s| **s == subject)
            .map(|s| (*kind, *s))
    })
}

/// Explains one subject, printing text or JSON.
///
/// # Errors
/// [`UsageError`] for an unknown subject, a malformed id, or an id that names nothing of that
/// subject (saying what it names instead, if anything); a database error.
pub async fn explain(
    settings: &Settings,
    subject: &str,
    id: &str,
    json: bool,
) -> anyhow::Result<()> {
    let Some((kind, subject)) = owner(subject) else {
        return Err(UsageError(format!(
            "unknown subject {subject:?}; expected one of: {}",
            subjects().join(", ")
        ))
        .into());
    };
    kind.parse_id(subject, id)
        .map_err(|why| UsageError(format!("{subject} id: {why}")))?;
    let pool = db::connect(&settings.database, db::Access::Read).await?;
    let mut conn = pool.acquire().await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *conn)
        .await?;
    let explanation = match erased(&mut conn, settings, kind, subject, id).await? {
        Some(erased) => Some(erased),
        None => kind.explain(&mut conn, settings, now, subject, id).await?,
    };
    let Some(explanation) = explanation else {
        // Say what the id names instead, if it names anything.
        for other in KINDS {
            for s in other.subjects() {
                if *s == subject || other.parse_id(s, id).is_err() {
                    continue;
                }
                if other
                    .explain(&mut conn, settings, now, s, id)
                    .await?
                    .is_some()
                {
                    return Err(UsageError(format!("{id} is a {s}, not a {subject}")).into());
                }
            }
        }
        return Err(UsageError(format!("no {subject} {id}")).into());
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&explanation)?);
    } else {
        print!("{explanation}");
    }
    Ok(())
}

/// What an erasure says of `subject` `id` when another kind owns the subject (a session, a run):
/// the erasure kind answers for its own subjects itself.
async fn erased(
    conn: &mut PgConnection,
    settings: &Settings,
    kind: &dyn Kind,
    subject: &'static str,
    id: &str,
) -> anyhow::Result<Option<Explanation>> {
    if kind.name() == Erase::NAME || !erasure::explain::SUBJECTS.contains(&subject) {
        return Ok(None);
    }
    let Ok(id) = uuid::Uuid::parse_str(id) else {
        return Ok(None);
    };
    let key = settings
        .jobs
        .get::<ErasureSettings>(Erase::NAME)
        .receipt_key
        .as_ref();
    Ok(erasure::explain::explain(conn, key, subject, id).await?)
}
