//! The drain: the removals recorded in `sexton.pending_file_deletions`, made durable, unlinked
//! under their root and written down, after the transactions that recorded them; and the
//! drain beside a hop ([`Beside`]).
//!
//! Every statement here on `sexton.pending_file_deletions` is planned with its own call's
//! values (`persistent(false)`), not from a plan the connection keeps: the table starts a pass
//! nearly empty and can hold hundreds of thousands of records within it, and after five calls
//! PostgreSQL may keep the plan it made while the table was small — a sequential scan — until
//! something (an `ANALYZE`) invalidates it: at 300 k records, 578 ms for a batch's
//! `id = ANY($1)` against 0.4 ms planned anew.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::{Connection as _, PgConnection};
use tracing::Instrument as _;
use uuid::Uuid;

use super::{
    BATCH, BESIDE_AFTER, DrainError, FileCounts, MAX_ATTEMPTS, Root, Store, each_at_once,
    open_root, remove_under,
};

/// Removes the paths recorded under `root` (found at `root_path`) for `scope` (an account, or
/// `None` for a global job). Before anything is unlinked, a synchronous commit that writes
/// (counting the attempt) makes durable every commit that recorded these paths; a path a
/// surviving row still references (under any spelling of it) stays. A record is forgotten once
/// its path is gone, refused (outside the root, not of the root's kind) or still referenced; a
/// removal that failed otherwise is tried again by later drains, [`MAX_ATTEMPTS`] times in all,
/// and then quarantined — as is a record claimed that often whose removal never reported back
/// (its process died during it), without trying it again. A store that cannot be reached is
/// an outage, not a failed removal (OS-2): the claim's attempt is handed back, nothing is
/// quarantined, and the drain ends with [`DrainError::Store`]; the records wait for a drain
/// that finds the store answering. The
/// caller guarantees that no other drain of the same root and scope runs at the same time
/// (the scope lock). Dropped midway (its hop failed or was cancelled), a drain also stops its
/// removals, which run on threads of their own, after those in progress: up to [`AT_ONCE`],
/// each a file or (sessions) a whole directory.
///
/// # Errors
/// [`DrainError`] when the database fails or the root cannot be opened; what was not yet
/// removed stays recorded.
pub async fn drain(
    conn: &mut PgConnection,
    root: Root,
    store: &Store,
    scope: Option<Uuid>,
) -> Result<FileCounts, DrainError> {
    Ok(drain_from(conn, root, store, scope, 0).await?.0)
}

/// [`drain`] of the records after id `after` only, for a hop that drains more than once: with
/// it, each of its drains takes up where the last left off, and a removal that keeps failing is
/// tried once per hop, not once per drain. Returns the last id claimed (`after` if none).
///
/// # Errors
/// As [`drain`].
pub async fn drain_from(
    conn: &mut PgConnection,
    root: Root,
    store: &Store,
    scope: Option<Uuid>,
    after: i64,
) -> Result<(FileCounts, i64), DrainError> {
    drain_until(conn, root, store, scope, after, &Arc::default()).await
}

/// [`drain_from`] that also ends, after the removals in progress, once `stop` is raised; it
/// raises `stop` itself when dropped or done.
pub(super) async fn drain_until(
    conn: &mut PgConnection,
    root: Root,
    store: &Store,
    scope: Option<Uuid>,
    mut after: i64,
    stop: &Arc<AtomicBool>,
) -> Result<(FileCounts, i64), DrainError> {
    let _stop = RaiseOnDrop(stop.clone());
    let mut counts = FileCounts::default();
    loop {
        let batch: Vec<Claimed> = {
            let mut tx = conn
                .begin_with("BEGIN; SET LOCAL synchronous_commit = on")
                .await?;
            let batch = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "UPDATE sexton.pending_file_deletions SET attempts = attempts + 1
                 WHERE id IN (SELECT p.id FROM sexton.pending_file_deletions p
                              WHERE p.root = $1 AND p.account_id = $2 AND p.id > $3
                                AND p.quarantined_at IS NULL AND NOT EXISTS ({HELD})
                              ORDER BY p.id LIMIT $4)
                 RETURNING id, relative_path, attempts, created_at, etag"
            )))
            .persistent(false)
            .bind(root.as_str())
            .bind(scope.unwrap_or_default())
            .bind(after)
            .bind(BATCH as i64)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            batch
        };
        let Some(last) = batch.iter().map(|claimed| claimed.id).max() else {
            return Ok((counts, after));
        };
        after = last;
        // Fewer than asked for: nothing more was waiting when this claim looked, and asking
        // again would find only what was committed since (the next drain's).
        let caught_up = batch.len() < BATCH as usize;
        if let Store::Object(objects) = store
            && let Err(why) = objects.answers().await
        {
            // An outage, not a failed removal (OS-2): the claim's attempt is handed back, and
            // the records wait, none quarantined, for a drain that finds the store answering.
            let ids: Vec<i64> = batch.iter().map(|claimed| claimed.id).collect();
            unclaim(conn, &ids).await?;
            return Err(DrainError::Store {
                root: objects.to_string(),
                why,
            });
        }
        // The last hold check and the removals in one transaction through the hold gate
        // (HD-3): a hold placed since the claim keeps its files, unclaimed, and one placed
        // after this check waits for the removals to end.
        let mut gated = crate::gate::begin(conn, "").await?;
        let batch = unheld(&mut gated, batch).await?;
        let paths: Vec<String> = batch.iter().map(|claimed| claimed.path.clone()).collect();
        let referenced = root.referenced(&mut gated, &paths).await?;
        let removed = match store {
            Store::Local(root_path) => {
                let dir = open_root(root_path).map_err(|source| DrainError::Root {
                    path: root_path.to_owned(),
                    source,
                })?;
                // The unlinks block: on a thread of their own, so that the runtime's threads go
                // on serving the hops and drains beside this one.
                let unlinks = tokio::task::spawn_blocking({
                    let (stop, span) = (stop.clone(), tracing::Span::current());
                    move || span.in_scope(|| remove_batch(root, &dir, &batch, &referenced, &stop))
                });
                joined(unlinks.await)?
            }
            Store::Object(objects) => objects.remove_batch(root, &batch, &referenced, stop).await,
        };
        gated.commit().await?;
        counts.add(removed.counts);
        conclude(conn, root, &removed).await?;
        if let (Some(why), Store::Object(objects)) = (removed.unreachable, store) {
            return Err(DrainError::Store {
                root: objects.to_string(),
                why,
            });
        }
        if caught_up || stop.load(Ordering::Relaxed) {
            return Ok((counts, after));
        }
    }
}

/// Whether a hold covers the owners a pending record `p` kept (HD-2, HD-3): its account, its
/// conversations, its runs, its agent, its session — from the record, whatever rows are gone.
const HELD: &str = "SELECT 1 FROM sexton.file_holds(p.account_id, p.conversation_ids, p.run_ids, \
                                               p.agent_id, p.session_id)";

/// The records of a claimed `batch` no hold covers, asked just before their unlinks; the others
/// are handed back as they were, their claim undone, to wait for the hold's release.
async fn unheld(conn: &mut PgConnection, batch: Vec<Claimed>) -> Result<Vec<Claimed>, sqlx::Error> {
    let ids: Vec<i64> = batch.iter().map(|claimed| claimed.id).collect();
    let held: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "UPDATE sexton.pending_file_deletions p SET attempts = attempts - 1
         WHERE p.id = ANY($1) AND EXISTS ({HELD})
         RETURNING p.id"
    )))
    .persistent(false)
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    Ok(batch
        .into_iter()
        .filter(|claimed| !held.contains(&claimed.id))
        .collect())
}

/// Hands back the attempt the claim counted against each of `ids`: the store could not be
/// reached, so no removal was attempted (OS-2).
async fn unclaim(conn: &mut PgConnection, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sexton.pending_file_deletions SET attempts = greatest(attempts - 1, 0)
         WHERE id = ANY($1)",
    )
    .persistent(false)
    .bind(ids)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Raises its flag when dropped.
pub(super) struct RaiseOnDrop(Arc<AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A task's result; its panic goes on in the caller.
pub(super) fn joined<T>(result: Result<T, tokio::task::JoinError>) -> Result<T, DrainError> {
    match result {
        Ok(value) => Ok(value),
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(_) => Err(DrainError::Cancelled),
    }
}

/// A [`drain`] beside the hop that records the paths, so that its unlinks and its synchronous
/// commits overlap the hop's own transactions: one drain at a time, on a connection of its own
/// from `pool` (a job using it declares a second connection, `Job::CONNECTIONS`). The hop
/// tells it how many paths each of its transactions may have recorded
/// ([`recorded`](Self::recorded)); once [`BESIDE_AFTER`] may be waiting and no drain is running,
/// it starts one, which drains what is committed by then and stops when it has caught up. Each
/// drain takes up after the last record the one before claimed. Whatever they have not reached,
/// the hop's own last drain takes, from where [`finish`](Self::finish) says they stopped.
/// Dropped before that (the hop failed or was cancelled), it stops the running drain's removals
/// after those in progress and aborts the drain.
pub struct Beside {
    pool: sqlx::PgPool,
    root: Root,
    store: Store,
    scope: Option<Uuid>,
    running: Option<Running>,
    /// The last record id a drain of this hop claimed.
    after: i64,
    /// Paths recorded since the running drain started, at most.
    waiting: u64,
    counts: FileCounts,
}

pub(super) struct Running {
    task: tokio::task::JoinHandle<Result<(FileCounts, i64), DrainError>>,
    stop: Arc<AtomicBool>,
}

impl Beside {
    /// For the hop's drains after the one that claimed up to id `after`.
    pub fn new(
        pool: &sqlx::PgPool,
        root: Root,
        store: &Store,
        scope: Option<Uuid>,
        after: i64,
    ) -> Self {
        Self {
            pool: pool.clone(),
            root,
            store: store.clone(),
            scope,
            running: None,
            after,
            waiting: 0,
            counts: FileCounts::default(),
        }
    }

    /// Counts up to `paths` more recorded by a committed transaction (each output row it
    /// deleted records at most its path); starts a drain when [`BESIDE_AFTER`] may be waiting
    /// and none is running.
    ///
    /// # Errors
    /// The [`DrainError`] of a drain that finished since.
    pub async fn recorded(&mut self, paths: u64) -> Result<(), DrainError> {
        self.waiting += paths;
        let busy = self
            .running
            .as_ref()
            .is_some_and(|running| !running.task.is_finished());
        if self.waiting < BESIDE_AFTER || busy {
            return Ok(());
        }
        self.collect().await?;
        self.waiting = 0;
        let (pool, root, store, scope, after) = (
            self.pool.clone(),
            self.root,
            self.store.clone(),
            self.scope,
            self.after,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let drain = {
            let stop = stop.clone();
            async move {
                let mut conn = pool.acquire().await?;
                drain_until(&mut conn, root, &store, scope, after, &stop).await
            }
        };
        self.running = Some(Running {
            task: tokio::spawn(drain.in_current_span()),
            stop,
        });
        Ok(())
    }

    /// Waits for the running drain; what every drain of this hop removed, and the last record
    /// id they claimed, after which the hop's last drain goes on.
    ///
    /// # Errors
    /// The first [`DrainError`] of a drain not yet collected.
    pub async fn finish(mut self) -> Result<(FileCounts, i64), DrainError> {
        self.collect().await?;
        Ok((self.counts, self.after))
    }

    async fn collect(&mut self) -> Result<(), DrainError> {
        if let Some(running) = self.running.as_mut() {
            // Awaited in place: cancelled meanwhile, the drain is still there for `drop`.
            let result = (&mut running.task).await;
            self.running = None;
            let (counts, after) = joined(result)??;
            self.counts.add(counts);
            self.after = self.after.max(after);
        }
        Ok(())
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.stop.store(true, Ordering::Relaxed);
            running.task.abort();
        }
    }
}

/// A record a drain claimed.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Claimed {
    pub id: i64,
    #[sqlx(rename = "relative_path")]
    pub path: String,
    /// Counting this one.
    pub attempts: i32,
    /// When the transaction that removed its owners recorded it.
    #[sqlx(rename = "created_at")]
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    /// The ETag of the object as it was judged (OS-2); `None` when nothing was judged yet.
    pub etag: Option<String>,
}

/// What became of one claimed batch's records.
#[derive(Debug, Default)]
pub(super) struct Removed {
    pub counts: FileCounts,
    /// Gone, refused or still referenced: the record is deleted.
    pub forget: Vec<i64>,
    /// Failed on its last attempt, or claimed past it: kept aside, with why.
    pub quarantine: Vec<(i64, String)>,
    /// Failed, to be tried again: why, for people.
    pub failed: Vec<(i64, String)>,
    /// The ETag a drain judged a record's object by, kept with the record when its delete
    /// failed: the next drain deletes the object only while it is still that one (OS-2).
    pub judged: Vec<(i64, String)>,
    /// Its object was rewritten since it was judged: forgotten and the new bytes kept; an
    /// attachment row marked expired by the record is live again (OS-2).
    pub rewritten: Vec<i64>,
    /// Not removed because the store could not be reached: the claim's attempt handed back,
    /// nothing counted against the record (OS-2).
    pub outage: Vec<i64>,
    /// Why the store could not be reached, when it could not: the drain stops there.
    pub unreachable: Option<String>,
}

/// Writes down what became of a batch's records of `root` (see [`drain`]).
pub(super) async fn conclude(
    conn: &mut PgConnection,
    root: Root,
    removed: &Removed,
) -> Result<(), sqlx::Error> {
    if root == Root::Attachments && !removed.rewritten.is_empty() {
        // The attachment's bytes were replaced after they were judged: the new bytes stay, and
        // the rows the record marked expired (in the same transaction, so at the same `now()`)
        // name live bytes again, judged by their own time on the next pass.
        sqlx::query(
            "UPDATE attachments a SET bytes_expired_at = NULL
             FROM sexton.pending_file_deletions p
             WHERE p.id = ANY($1) AND a.account_id = p.account_id
               AND a.relative_path = p.relative_path AND a.bytes_expired_at = p.created_at",
        )
        .persistent(false)
        .bind(&removed.rewritten)
        .execute(&mut *conn)
        .await?;
    }
    let forget: Vec<i64> = removed
        .forget
        .iter()
        .chain(&removed.rewritten)
        .copied()
        .collect();
    if !removed.judged.is_empty() {
        let (ids, etags): (Vec<i64>, Vec<&str>) = removed
            .judged
            .iter()
            .map(|(id, etag)| (*id, etag.as_str()))
            .unzip();
        sqlx::query(
            "UPDATE sexton.pending_file_deletions p SET etag = e.etag
             FROM unnest($1::bigint[], $2::text[]) AS e (id, etag)
             WHERE p.id = e.id AND p.etag IS NULL",
        )
        .persistent(false)
        .bind(&ids)
        .bind(&etags)
        .execute(&mut *conn)
        .await?;
    }
    if !removed.outage.is_empty() {
        unclaim(conn, &removed.outage).await?;
    }
    sqlx::query("DELETE FROM sexton.pending_file_deletions WHERE id = ANY($1)")
        .persistent(false)
        .bind(&forget)
        .execute(&mut *conn)
        .await?;
    for (records, quarantine) in [(&removed.quarantine, true), (&removed.failed, false)] {
        if records.is_empty() {
            continue;
        }
        let (ids, errors): (Vec<i64>, Vec<&str>) =
            records.iter().map(|(id, e)| (*id, e.as_str())).unzip();
        sqlx::query(
            "UPDATE sexton.pending_file_deletions p
             SET last_error = e.error,
                 quarantined_at = CASE WHEN $3 THEN now() END
             FROM unnest($1::bigint[], $2::text[]) AS e (id, error)
             WHERE p.id = e.id",
        )
        .persistent(false)
        .bind(&ids)
        .bind(&errors)
        .bind(quarantine)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Removes the paths of one claimed `batch` below the open root `dir`, [`AT_ONCE`] at a
/// time, except those `referenced`, until `stop` is raised (see [`drain`]).
pub(super) fn remove_batch(
    root: Root,
    dir: &OwnedFd,
    batch: &[Claimed],
    referenced: &[String],
    stop: &AtomicBool,
) -> Removed {
    let mut removed = Removed::default();
    let mut to_remove = Vec::with_capacity(batch.len());
    for claimed in batch {
        if referenced.contains(&claimed.path) {
            removed.forget.push(claimed.id);
        } else if !removed.quarantined_unfinished(root, claimed) {
            to_remove.push(claimed);
        }
    }
    let results = each_at_once(&to_remove, |claimed| {
        // Not begun once the drain stops: the record stays for the next drain.
        (!stop.load(Ordering::Relaxed))
            .then(|| remove_under(dir, &claimed.path, root.holds_directories()))
    });
    for (claimed, result) in to_remove.into_iter().zip(results) {
        match result {
            None => {}
            Some(Ok(counts)) => {
                removed.counts.add(counts);
                removed.forget.push(claimed.id);
            }
            Some(Err(err)) if err.kind() == io::ErrorKind::InvalidInput => {
                removed.refused(root, claimed, &err.to_string());
            }
            Some(Err(err)) => removed.failed_attempt(root, claimed, err.to_string()),
        }
    }
    removed
}

impl Removed {
    /// A record claimed past its last attempt without a result: quarantined (see [`drain`]); whether it was.
    pub(super) fn quarantined_unfinished(&mut self, root: Root, claimed: &Claimed) -> bool {
        if claimed.attempts <= MAX_ATTEMPTS {
            return false;
        }
        self.counts.errors += 1;
        let why = format!(
            "claimed {} times without a result: each removal ended its process",
            claimed.attempts - 1
        );
        tracing::error!(root = root.as_str(), path = %crate::shown::Shown(&claimed.path), attempts = claimed.attempts, "file quarantined: {why}");
        self.quarantine.push((claimed.id, why));
        true
    }

    /// A path that names nothing of the root's (outside it, not of its kind, OS-3): counted,
    /// and its record forgotten.
    pub(super) fn refused(&mut self, root: Root, claimed: &Claimed, why: &str) {
        self.counts.errors += 1;
        tracing::warn!(
            root = root.as_str(), path = %crate::shown::Shown(&claimed.path), error = %why, attempts = claimed.attempts,
            refused = true, quarantined = false, "file not deleted"
        );
        self.forget.push(claimed.id);
    }

    /// A removal that failed for a reason that may pass: tried again, or quarantined after its
    /// last attempt.
    pub(super) fn failed_attempt(&mut self, root: Root, claimed: &Claimed, why: String) {
        self.counts.errors += 1;
        let last = claimed.attempts >= MAX_ATTEMPTS;
        tracing::warn!(
            root = root.as_str(), path = %crate::shown::Shown(&claimed.path), error = %why, attempts = claimed.attempts,
            refused = false, quarantined = last, "file not deleted"
        );
        if last {
            self.quarantine.push((claimed.id, why));
        } else {
            self.failed.push((claimed.id, why));
        }
    }
}
