//! The scales' application writers, run at a fixed rate by [`at_rate`] beside each method: one
//! materializing into runs (the execution-details methods), one appending to sessions
//! (SessionRetention's), and the targets each writes to, old owners and young rows alike.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, LazyLock};

use sqlx::{PgPool, Row as _};
use uuid::Uuid;

use crate::writer::{TimedLock, Writes, at_rate};

/// The writers' locks, each wait timed by the server ([`TimedLock`]).
static LOCK_CONVERSATION: LazyLock<TimedLock> =
    LazyLock::new(|| TimedLock::new("SELECT 1 FROM conversations WHERE id = $1"));
static LOCK_RUN: LazyLock<TimedLock> =
    LazyLock::new(|| TimedLock::new("SELECT 1 FROM runs WHERE id = $1"));
static LOCK_SESSION: LazyLock<TimedLock> =
    LazyLock::new(|| TimedLock::new("SELECT 1 FROM sessions WHERE id = $1"));

/// (conversation, run) pairs the writer materializes into: old owners and recent runs alike,
/// taken by a hash of their ids, so that they lie spread over every method's order (the floors
/// go through owners in id order: the lowest ids would all fall in their first batch).
pub async fn writer_targets(pool: &PgPool) -> anyhow::Result<Vec<(Uuid, Uuid)>> {
    let rows = sqlx::query(
        "(SELECT r.conversation_id, r.id FROM runs r JOIN bench_owners o ON o.id = r.id ORDER BY md5(r.id::text) LIMIT 100)
         UNION ALL
         (SELECT conversation_id, id FROM runs r WHERE conversation_id IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM bench_owners o WHERE o.id = r.id)
          ORDER BY md5(id::text) LIMIT 100)",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The application writer (materialization and convergence) at a fixed rate: lock the
/// conversation, then a run, update it, insert detail, commit.
pub async fn write_at_rate(
    pool: PgPool,
    targets: Vec<(Uuid, Uuid)>,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Writes> {
    at_rate(rate, stop, targets, move |(conversation, run)| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            let mut lock_wait = 0.0;
            for (lock, id) in [(&*LOCK_CONVERSATION, conversation), (&*LOCK_RUN, run)] {
                let (_, waited) = lock.take(&mut tx, id).await?;
                lock_wait += waited;
            }
            sqlx::query("UPDATE runs SET requested_model = requested_model WHERE id = $1")
                .bind(run)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO conversation_events (conversation_id, run_id, kind) VALUES ($1, $2, 'materialized')",
            )
            .bind(conversation)
            .bind(run)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(lock_wait)
        }
    })
    .await
}

/// The sessions the appending writer appends to: old ones a pass deletes and young ones alike,
/// taken by a hash of their ids as the runs above.
pub async fn session_targets(pool: &PgPool) -> anyhow::Result<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "(SELECT id FROM bench_sessions ORDER BY md5(id::text) LIMIT 100)
         UNION ALL
         (SELECT id FROM sessions s WHERE NOT EXISTS (SELECT 1 FROM bench_sessions b WHERE b.id = s.id)
          ORDER BY md5(id::text) LIMIT 100)",
    )
    .fetch_all(pool)
    .await?)
}

/// An application appending to sessions at `rate` per second, old and young alike: lock the
/// session row (as the platform's append does), add an entry if the session is still there.
pub async fn append_at_rate(
    pool: PgPool,
    targets: Vec<Uuid>,
    rate: u32,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Writes> {
    at_rate(rate, stop, targets, move |session| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await?;
            let (found, lock_wait) = LOCK_SESSION.take(&mut tx, session).await?;
            if found > 0 {
                sqlx::query(
                    "INSERT INTO conversation_entries (session_id, entry_id, seq, payload)
                     VALUES ($1, gen_random_uuid()::text, 0, '{}')",
                )
                .bind(session)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(lock_wait)
        }
    })
    .await
}
