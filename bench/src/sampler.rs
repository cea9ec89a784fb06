//! The sampler of the deleter's longest write transaction, which runs beside every method.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// The longest write transaction of the deleter, sampled every 10 ms from pg_stat_activity:
/// every open transaction of its backends that holds a transaction id (one that has written or
/// locked a row: sexton's owner transactions, the floors' batches — not a plain read such as a
/// hop's window, which blocks no writer) is followed at each sample. The longest one's length,
/// the statement it was running when last seen, and what its backend was waiting on in each
/// sample of it (`type:event`, or `cpu` when it waited on nothing), most seen first: a stall
/// on data files or WAL told from a long batch.
pub async fn longest_transaction(pool: PgPool, stop: Arc<AtomicBool>) -> anyhow::Result<Longest> {
    let mut longest = Longest::default();
    // The transactions open at the last sample, by (backend, start), and their waits so far.
    let mut open: HashMap<Sampled, BTreeMap<String, u32>> = HashMap::new();
    // The longest one's, as of its last sample; written out once at the end.
    let mut longest_waits = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let sampled: Vec<(i32, DateTime<Utc>, f64, String, String)> = sqlx::query_as(
            "SELECT pid, xact_start,
                    (EXTRACT(EPOCH FROM clock_timestamp() - xact_start) * 1000)::float8,
                    left(regexp_replace(query, '\\s+', ' ', 'g'), 160),
                    COALESCE(wait_event_type || ':' || wait_event, 'cpu')
             FROM pg_stat_activity
             WHERE datname = current_database() AND xact_start IS NOT NULL
               AND backend_xid IS NOT NULL
               AND application_name IN ('sexton', 'bench-raw', 'bench-naive')",
        )
        .fetch_all(&pool)
        .await?;
        let mut still = HashMap::with_capacity(sampled.len());
        for (pid, started, ms, query, wait) in sampled {
            let mut waits = open.remove(&(pid, started)).unwrap_or_default();
            *waits.entry(wait).or_default() += 1;
            if ms > longest.ms {
                (longest.ms, longest.query) = (ms, query);
                longest_waits.clone_from(&waits);
            }
            still.insert((pid, started), waits);
        }
        open = still;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.close().await;
    let mut seen: Vec<(String, u32)> = longest_waits.into_iter().collect();
    seen.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    longest.waits = seen
        .iter()
        .map(|(wait, n)| format!("{wait} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(longest)
}

/// A transaction the sampler of [`longest_transaction`] sees: its backend and its start.
type Sampled = (i32, DateTime<Utc>);

/// What the sampler of [`longest_transaction`] saw.
#[derive(Debug, Default)]
pub struct Longest {
    pub ms: f64,
    pub query: String,
    pub waits: String,
}
