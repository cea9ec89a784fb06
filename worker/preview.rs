//! `sexton preview` (OP-1): what every registered job would remove now, deleting nothing.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::config::Settings;
use crate::{registry, text};

/// Every job's preview lines: the job, and per line its JSON (with `"job"`) and its text.
pub type Previews = Vec<(&'static str, Vec<(serde_json::Value, String)>)>;

/// Asks every registered job what a pass would do now.
///
/// # Errors
/// A database error of any job's preview.
pub async fn read(
    conn: &mut sqlx::PgConnection,
    settings: &Settings,
    now: DateTime<Utc>,
    account: Option<Uuid>,
) -> anyhow::Result<Previews> {
    let mut previews = Vec::new();
    for kind in registry::KINDS {
        let lines = kind
            .preview(conn, settings, now, account)
            .await
            .with_context(|| format!("the preview of {} failed", kind.name()))?;
        previews.push((kind.name(), lines));
    }
    Ok(previews)
}

/// `--json`: one array of objects, each naming its `job`.
pub fn json(previews: &Previews) -> Vec<&serde_json::Value> {
    previews
        .iter()
        .flat_map(|(_, lines)| lines)
        .map(|(json, _)| json)
        .collect()
}

/// For people: each job, then its lines indented; control characters escaped.
pub fn render(previews: &Previews) -> String {
    let mut out = String::new();
    for (job, lines) in previews {
        out.push_str(job);
        out.push('\n');
        for (_, line) in lines {
            for row in line.lines() {
                out.push_str("  ");
                out.push_str(row);
                out.push('\n');
            }
        }
    }
    text::printable(&out)
}
