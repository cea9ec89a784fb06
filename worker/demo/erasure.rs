//! The demo's erasure on request (SPEC §11): after the nightly pass, one conversation and one
//! session of the demo data — ones whose dry run withholds nothing, so that both complete — are
//! erased as `sexton erase` erases them, through the queue to completion; then the receipts are
//! printed as `sexton receipts export` prints them and the chain checked as `sexton receipts
//! verify` checks it.

use std::time::Instant;

use anyhow::bail;
use sexton_jobs::erasure::{Erase, ErasureSettings, State, Subject};
use sexton_jobs::job::Job as _;
use sexton_jobs::receipts::ReceiptKey;
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::Settings;
use crate::erase::{self, Asked, DryRun};
use crate::{receipts, worker};

/// The key the demo hashes its subjects under when `[erasure] receipt_key` is not set: the
/// demo's own, no secret, never for real requests — and never printed (its id is).
pub const DEMO_RECEIPT_KEY: &str = "sexton demo receipt key: no secret, never for real requests";

/// Who the demo's requests are by.
const BY: &str = "demo";

/// Conversations of the demo data with runs, none of them in flight, those with the most output
/// files first: the candidates a dry run then confirms.
const CONVERSATIONS: &str = "
SELECT c.id FROM conversations c
JOIN runs r ON r.conversation_id = c.id
LEFT JOIN output_files o ON o.run_id = r.id
GROUP BY c.id
HAVING bool_and(r.status NOT IN ('pending', 'running'))
ORDER BY count(o.id) DESC, c.id
LIMIT 20";

/// Sessions neither running, finalizing nor pointed at by an agent (SS-3), those with the most
/// history first.
const SESSIONS: &str = "
SELECT s.id FROM sessions s
LEFT JOIN conversation_entries e ON e.session_id = s.id
WHERE s.state NOT IN ('running', 'finalizing')
  AND NOT EXISTS (SELECT 1 FROM agents a
                  WHERE s.id IN (a.current_session_id, a.main_session_id, a.default_session_id))
GROUP BY s.id
ORDER BY count(e.session_id) DESC, s.id
LIMIT 20";

/// Erases one conversation and one session of the demo data and prints their requests, the
/// receipts and the chain's check.
///
/// # Errors
/// A request that does not complete, a broken receipt chain, or any step that fails.
pub(super) async fn run(pool: &PgPool, settings: &Settings) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    println!(
        "\nerasure on request (SPEC §11): one conversation and one session, whatever their age"
    );
    let erasure: &ErasureSettings = settings.jobs.get(Erase::NAME);
    if erasure.receipt_key.is_none() {
        let key = ReceiptKey::new(DEMO_RECEIPT_KEY);
        println!(
            "no [erasure] receipt_key is set (SEXTON_ERASURE__RECEIPT_KEY): the demo hashes its \
             subjects under a demo-only key (key id {}; the key is not shown), never for real \
             requests",
            key.key_id()
        );
        let with_key = ErasureSettings {
            receipt_key: Some(key),
            ..erasure.clone()
        };
        settings.jobs.set(Erase::NAME, with_key);
    }

    let mut requested = Vec::new();
    for (subject, candidates) in [
        (Subject::Conversation, CONVERSATIONS),
        (Subject::Session, SESSIONS),
    ] {
        let Some((id, dry)) = pick(pool, &settings, subject, candidates).await? else {
            println!("no {subject} of the demo data can be erased whole now: none is erased");
            continue;
        };
        let rows: i64 = dry.left.rows.values().sum();
        let files: u64 = dry.left.files.values().sum();
        let reference = format!("DEMO-ERASE-{}", requested.len() + 1);
        let answer = erase::request(pool, &settings, asked(subject, id, &reference)).await?;
        println!(
            "erasing {subject} {id} (ref {reference}, by {BY}): request {}, {}, due {}; its dry \
             run counted {rows} rows in {} tables{}, nothing withheld",
            answer.id,
            answer.state,
            answer.due_at.to_rfc3339(),
            dry.left.rows.len(),
            if files > 0 {
                format!(
                    " and {files} more on disk that no row leads to (a session's directory, traces)"
                )
            } else {
                String::new()
            }
        );
        requested.push(answer.id);
    }
    if requested.is_empty() {
        return Ok(());
    }

    let started = Instant::now();
    worker::run(&settings, worker::Mode::UntilIdle).await?;
    println!(
        "erasures worked through the queue in {:.1}s (sexton erase status --all):",
        started.elapsed().as_secs_f64()
    );
    let ours: Vec<_> = erase::status(pool, None, true)
        .await?
        .into_iter()
        .filter(|r| requested.contains(&r.id))
        .collect();
    print!("{}", erase::status_text(&ours, true));
    if let Some(open) = ours.iter().find(|r| r.state != State::Completed) {
        bail!(
            "the demo's erasure request {} ended {}, not completed (sexton erase status {})",
            open.id,
            open.state.as_str(),
            open.id
        );
    }

    println!("\nthe receipts (sexton receipts export):");
    receipts::export(&settings, None).await?;
    println!("\nthe receipt chain (sexton receipts verify):");
    receipts::verify(&settings, false).await?;
    Ok(())
}

/// A request of `subject` `id` by the demo.
fn asked(subject: Subject, id: Uuid, reference: &str) -> Asked {
    Asked {
        scope: Some((subject, id)),
        reference: Some(reference.to_owned()),
        by: Some(BY.to_owned()),
        due: None,
    }
}

/// The first of `candidates`' ids whose dry run finds rows to remove and withholds nothing (a
/// hold, something in flight, a pointer), with that dry run: the first that also has files no
/// row leads to (a session's directory), when one has.
async fn pick(
    pool: &PgPool,
    settings: &Settings,
    subject: Subject,
    candidates: &str,
) -> anyhow::Result<Option<(Uuid, DryRun)>> {
    let ids: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(candidates))
        .fetch_all(pool)
        .await?;
    let mut first = None;
    for id in ids {
        let dry = erase::dry_run(pool, settings, asked(subject, id, "dry run")).await?;
        if dry.left.withheld.is_empty() && !dry.left.rows.is_empty() {
            if !dry.left.files.is_empty() {
                return Ok(Some((id, dry)));
            }
            first.get_or_insert((id, dry));
        }
    }
    Ok(first)
}
