//! `sexton explain <subject> <id> [--json]`: the verdict of the job that owns a row
//! or file — eligible, retained with every reason and its rule id, or removed — from the job's
//! own code, through the registry. Read-only.

use chrono::{DateTime, Utc};

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
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *conn)
        .await?;
    let Some(explanation) = kind.explain(&mut conn, settings, now, subject, id).await? else {
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
