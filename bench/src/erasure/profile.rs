//! Where an erasure's time goes: sexton's statements sampled while its hops run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;

/// Samples sexton's backends on the database of `pool` every 50 ms while an erasure hop runs,
/// until `stop`: what each active one runs, named by the erasure's step it belongs to; the share
/// of the samples of each (a sample with no backend active counts as `no statement running`:
/// the worker's own work, file unlinks and listings, and the queue's hand-over between hops).
pub(super) async fn profile(
    pool: PgPool,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<(String, f64)>> {
    let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
    let mut samples = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let (hop, active): (bool, Vec<String>) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM apalis.jobs
                            WHERE job_type = 'sexton.erasure' AND status = 'Running'),
                    ARRAY(SELECT query FROM pg_stat_activity
                          WHERE datname = current_database() AND application_name = 'sexton'
                            AND state = 'active')",
        )
        .fetch_one(&pool)
        .await?;
        if hop {
            samples += 1;
            if active.is_empty() {
                *counts.entry("no statement running".into()).or_default() += 1;
            }
            for query in active {
                *counts.entry(step_of(&query)).or_default() += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.close().await;
    let mut shares: Vec<(String, f64)> = counts
        .into_iter()
        .map(|(step, n)| (step, n as f64 / samples.max(1) as f64))
        .collect();
    shares.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(shares)
}

/// The erasure's step a statement belongs to, by its first words (pg_stat_activity keeps a
/// statement's first kilobyte; jobs/src/erasure/steps.rs, pass.rs, verify.rs); another
/// statement by its first words.
fn step_of(query: &str) -> String {
    const STEPS: &[(&str, &str)] = &[
        ("WITH RECURSIVE seed", "plan (the scope's ids)"),
        (
            "SELECT m.kind, m.id, COALESCE(s.agent_id",
            "derivatives (members read)",
        ),
        ("WITH found (root, path", "derivatives (traces recorded)"),
        (
            "SELECT t.id FROM sexton.erasure_members m JOIN",
            "lock a batch",
        ),
        (
            "SELECT r.id FROM runs r WHERE r.id = ANY($2)",
            "runs (take)",
        ),
        (
            "SELECT c.id FROM conversations c WHERE c.id = ANY($2)",
            "conversations (take)",
        ),
        (
            "SELECT s.id FROM sessions s WHERE s.id = ANY($2)",
            "sessions (take)",
        ),
        ("WITH agent AS (", "agent records (sweep)"),
        ("DELETE FROM agents a", "agents (take)"),
        ("WITH account AS (", "account records (sweep)"),
        (
            "SELECT 1 FROM usage_records u WHERE u.account_id = a.id",
            "account (take)",
        ),
        (
            "WITH m AS (SELECT kind, id FROM sexton.erasure_members",
            "verify (read every table)",
        ),
        ("SELECT t, n FROM (VALUES", "verify (read every table)"),
        ("UPDATE sexton.erasures SET removed", "request's counts"),
        ("pending_file_deletions", "drain (file records)"),
        ("apalis.", "queue"),
        ("pg_type", "client's type lookups"),
    ];
    let query = query.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some((_, step)) = STEPS.iter().find(|(needle, _)| query.contains(needle)) {
        return (*step).to_owned();
    }
    let words: Vec<&str> = query.split_whitespace().take(6).collect();
    format!("other: {}", words.join(" "))
}
