//! The raw floors, batched deletes with no checks of exactly what a pass removes: the owners'
//! detail rows alone (`raw`), with the markers sexton's end state has (`raw+markers`), and with
//! the owners' output files unlinked too ([`SAME_END`]), and that under the platform's lock
//! order ([`SAME_END_LOCKED`]); and the sessions' floors, likewise.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use sexton_jobs::cutoff::EARLIEST;
use sexton_jobs::owner_loop::Chunks;
use sexton_jobs::prune_execution_details::{
    DETAIL_TABLES, FIRST_TOGETHER, owner_statement, pruned_runner_effects,
};
use sexton_jobs::session_retention::{PolicyRow, SessionKind, delete_statement, window_statement};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::cluster::{connect, wal_position};
use crate::method::{Method, method};
use crate::sexton::pass_start;

/// The batched floor that reaches sexton's end state, disk included: `raw+markers` that also
/// unlinks the output files of each batch's owners once the batch has committed, on a thread
/// beside the next batch's statements (one batch's unlinks at a time), as sexton's hops do.
pub const SAME_END: &str = "raw+markers+files";

/// [`SAME_END`] taking, first in each batch, the locks EX-6 asks of every writer: the batch's
/// conversations, then its runs, `FOR UPDATE` in id order. What those locks cost the
/// application's writer, timed alone: the rest is [`SAME_END`].
pub const SAME_END_LOCKED: &str = "raw+markers+files+locks";

/// [`SAME_END_LOCKED`] keeping every rule sexton's owner transaction keeps: each batch (one
/// account's owners) runs sexton's own owner statement once their conversations are locked —
/// the runs locked in id order, eligibility and what holds an owner back re-checked under the
/// locks, the variant's account checked, the files recorded in `sexton.pending_file_deletions`
/// — and commits durably before its files are unlinked and their records forgotten (beside the
/// next batch). Handed the owners, in one plain loop on one connection: what the rules cost,
/// timed alone, against [`SAME_END_LOCKED`]; what the hops, the queue and the drains cost or
/// gain, against sexton.
pub const SAME_END_RULES: &str = "raw+markers+files+locks+rules";

/// [`SAME_END_RULES`] with its transactions held to sexton's transaction target, as sexton's
/// are (PF-2): each batch sized by the time the last one took (its durable commit included)
/// with the rule sexton's owner loop sizes its chunks by ([`Chunks::Timed`]: a first 8, then at
/// most doubled or halved, at most 500), restarting at the first size with each account as a
/// hop does. What bounded transactions cost, timed alone, against [`SAME_END_RULES`].
pub const SAME_END_BOUNDED: &str = "raw+markers+files+locks+rules+bounded";

/// How much of sexton's end state a floor reaches.
#[derive(Clone, Copy)]
pub enum Floor<'a> {
    /// The detail rows gone.
    Rows,
    /// And the run and variant markers set.
    Markers,
    /// And the output files, under this root, unlinked.
    Files(&'a Path),
    /// And the conversations and runs locked first (EX-6).
    Locked(&'a Path),
}

/// The floor: batched deletes of the same owners, 500 per transaction, no checks; with the
/// markers and the files as `floor` says — the floor of the same end state, to tell their cost
/// from sexton's own. Its WAL is read on `admin`.
pub async fn run_raw(
    admin: &PgPool,
    base: &PgConnectOptions,
    db: &str,
    floor: Floor<'_>,
) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-raw").await?;
    let owners: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT o.id, r.conversation_id FROM bench_owners o JOIN runs r ON r.id = o.id ORDER BY o.id",
    )
    .fetch_all(&pool)
    .await?;
    let mut unlinking: Option<tokio::task::JoinHandle<anyhow::Result<()>>> = None;
    for owners in owners.chunks(500) {
        let (batch, conversations): (Vec<Uuid>, Vec<Uuid>) = owners.iter().copied().unzip();
        let mut tx = pool.begin().await?;
        if matches!(floor, Floor::Locked(_)) {
            lock_in_order(&mut tx, "conversations", "UPDATE", &conversations).await?;
            lock_in_order(&mut tx, "runs", "UPDATE", &batch).await?;
        }
        let mut files: Vec<String> = Vec::new();
        for table in DETAIL_TABLES {
            let delete = format!("DELETE FROM {table} WHERE run_id = ANY($1)");
            if table == "output_files" && matches!(floor, Floor::Files(_) | Floor::Locked(_)) {
                files = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "{delete} RETURNING relative_path"
                )))
                .bind(&batch)
                .fetch_all(&mut *tx)
                .await?;
            } else {
                sqlx::query(sqlx::AssertSqlSafe(delete))
                    .bind(&batch)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        if !matches!(floor, Floor::Rows) {
            sqlx::query(
                "WITH r AS (UPDATE runs SET details_pruned_at = now(), runner_effects = $2
                            WHERE id = ANY($1) RETURNING variant_id)
                 UPDATE variants SET details_pruned_at = now(), runner_effects = $2
                 WHERE id IN (SELECT variant_id FROM r)",
            )
            .bind(&batch)
            .bind(pruned_runner_effects())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if let Floor::Files(root) | Floor::Locked(root) = floor {
            // One batch's unlinks at a time, beside the next batch's statements.
            if let Some(previous) = unlinking.take() {
                previous.await??;
            }
            unlinking = Some(tokio::task::spawn_blocking({
                let root = root.to_owned();
                move || unlink_all(&root, &files)
            }));
        }
    }
    if let Some(last) = unlinking {
        last.await??;
    }
    pool.close().await;
    let mut m = method(match floor {
        Floor::Rows => "raw",
        Floor::Markers => "raw+markers",
        Floor::Files(_) => SAME_END,
        Floor::Locked(_) => SAME_END_LOCKED,
    });
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}

/// [`SAME_END_RULES`] on `db`, the owners' output files under `outputs`, 500 owners a
/// transaction, or with `target`, [`SAME_END_BOUNDED`]; its WAL is read on `admin`.
pub async fn run_rules(
    admin: &PgPool,
    base: &PgConnectOptions,
    db: &str,
    outputs: &Path,
    target: Option<Duration>,
) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-raw").await?;
    let owners: Vec<(Uuid, Uuid, Uuid)> = sqlx::query_as(
        "SELECT o.id, r.conversation_id, r.account_id
         FROM bench_owners o JOIN runs r ON r.id = o.id ORDER BY r.account_id, o.id",
    )
    .fetch_all(&pool)
    .await?;
    let (now, effects) = (pass_start(), pruned_runner_effects());
    let mut unlinking: Option<tokio::task::JoinHandle<anyhow::Result<Vec<i64>>>> = None;
    let chunks = match target {
        Some(target) => Chunks::Timed {
            first: FIRST_TOGETHER,
            most: 500,
            target,
        },
        None => Chunks::Fixed(500),
    };
    for mut account_owners in owners.chunk_by(|a, b| a.2 == b.2) {
        let mut size = chunks.first();
        while !account_owners.is_empty() {
            let owners;
            (owners, account_owners) = account_owners.split_at(size.min(account_owners.len()));
            let account = owners[0].2;
            let (batch, conversations): (Vec<Uuid>, Vec<Uuid>) = owners
                .iter()
                .map(|(run, conversation, _)| (*run, *conversation))
                .unzip();
            let began = Instant::now();
            let mut tx = pool.begin().await?;
            lock_in_order(&mut tx, "conversations", "UPDATE", &conversations).await?;
            // The bound and what the window is measured back from: the pass's start, as
            // sexton's first hop has them; the statement locks the runs itself.
            sqlx::query(sqlx::AssertSqlSafe(owner_statement()))
                .bind(&batch)
                .bind(&conversations)
                .bind(now)
                .bind(now)
                .bind(account)
                .bind(now)
                .bind(&effects)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            size = chunks.next(size, began.elapsed());
            let recorded = recorded(&pool, "outputs", account).await?;
            // One batch's unlinks at a time, beside the next batch's statement; a record is
            // forgotten once its file is gone.
            if let Some(previous) = unlinking.take() {
                forget(&pool, &previous.await??).await?;
            }
            unlinking = Some(tokio::task::spawn_blocking({
                let root = outputs.to_owned();
                move || {
                    let (ids, files): (Vec<i64>, Vec<String>) = recorded.into_iter().unzip();
                    unlink_all(&root, &files).map(|()| ids)
                }
            }));
        }
    }
    if let Some(last) = unlinking {
        forget(&pool, &last.await??).await?;
    }
    pool.close().await;
    let mut m = method(if target.is_some() {
        SAME_END_BOUNDED
    } else {
        SAME_END_RULES
    });
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}

/// The file records waiting under `root` for `account`: (id, path).
async fn recorded(pool: &PgPool, root: &str, account: Uuid) -> sqlx::Result<Vec<(i64, String)>> {
    sqlx::query_as(
        "SELECT id, relative_path FROM sexton.pending_file_deletions
         WHERE root = $1 AND account_id = $2",
    )
    .bind(root)
    .bind(account)
    .fetch_all(pool)
    .await
}

/// Removes the directories `names` under `root`, each with what it holds; one already gone
/// is no error.
fn remove_dirs<S: AsRef<Path>>(root: &Path, names: impl Iterator<Item = S>) -> anyhow::Result<()> {
    for name in names {
        let dir = root.join(name);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", dir.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Forgets the file records `ids`, their files gone.
async fn forget(pool: &PgPool, ids: &[i64]) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM sexton.pending_file_deletions WHERE id = ANY($1)")
        .bind(ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// Locks `ids` in `table` `FOR {mode}` in id order, waiting for each: the platform's lock order,
/// as a floor that keeps it takes it (sexton's own, `owner_loop::lock`, skips what is held).
async fn lock_in_order(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    table: &str,
    mode: &str,
    ids: &[Uuid],
) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {table} WHERE id = ANY($1) ORDER BY id FOR {mode}"
    )))
    .bind(ids)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Unlinks `files` under `root`; one already gone is no error.
fn unlink_all(root: &Path, files: &[String]) -> anyhow::Result<()> {
    for file in files {
        match std::fs::remove_file(root.join(file)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("unlinking {file}"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The floors for sessions: batched deletes of exactly the same sessions, 100 per transaction;
/// the foreign keys cascade to their history and null the handoffs, as sexton's end state has
/// it. With `dirs` (the sessions root), each batch's session directories are then removed, one
/// after another — sexton's end state on disk too (PF-6); without, they are left. With
/// `locks`, each batch first takes the locks SessionRetention's lock order asks for: the
/// sessions' agents `FOR SHARE`, then the sessions `FOR UPDATE`, each in id order.
/// Its WAL is read on `admin`.
pub async fn run_raw_sessions(
    admin: &PgPool,
    base: &PgConnectOptions,
    db: &str,
    dirs: Option<&Path>,
    locks: bool,
) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-raw").await?;
    let sessions: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT b.id, s.agent_id FROM bench_sessions b JOIN sessions s ON s.id = b.id ORDER BY b.id",
    )
    .fetch_all(&pool)
    .await?;
    for sessions in sessions.chunks(100) {
        let (batch, agents): (Vec<Uuid>, Vec<Uuid>) = sessions.iter().copied().unzip();
        let mut tx = pool.begin().await?;
        if locks {
            lock_in_order(&mut tx, "agents", "SHARE", &agents).await?;
            lock_in_order(&mut tx, "sessions", "UPDATE", &batch).await?;
        }
        sqlx::query("DELETE FROM sessions WHERE id = ANY($1)")
            .bind(&batch)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        if let Some(root) = dirs {
            remove_dirs(root, batch.iter().map(Uuid::to_string))?;
        }
    }
    pool.close().await;
    let mut m = method(match (dirs, locks) {
        (Some(_), true) => SESSIONS_SAME_END_LOCKED,
        (Some(_), false) => SESSIONS_SAME_END,
        (None, _) => "sessions raw",
    });
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}

/// The sessions floor that reaches sexton's end state, rows and directories (PF-6).
pub const SESSIONS_SAME_END: &str = "sessions raw+dirs";

/// [`SESSIONS_SAME_END_LOCKED`] keeping every rule SessionRetention's deletion keeps. It finds
/// what goes itself, as sexton must, where the other floors are handed the list: each account's
/// sessions of each kind past the kind's age, judged (SS-2 … SS-4, holds) by sexton's own window
/// statement before anything is locked, so that only sessions that go are locked. Then each
/// batch (one account's sessions of one kind) runs its own deletion statement once the agents
/// are share-locked — the sessions locked, each only if free at once, the verdict re-taken under
/// the locks (SS-5), the directories recorded — and commits durably before the directories are
/// removed and their records forgotten. In one plain loop on one connection: what the rules
/// cost, timed alone. A session the writer holds is skipped, as sexton skips it.
pub const SESSIONS_SAME_END_RULES: &str = "sessions raw+dirs+locks+rules";

/// [`SESSIONS_SAME_END_RULES`] on `db`, the session directories under `root`, 100 sessions a
/// transaction; its WAL is read on `admin`.
pub async fn run_session_rules(
    admin: &PgPool,
    base: &PgConnectOptions,
    db: &str,
    root: &Path,
) -> anyhow::Result<Method> {
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let pool = connect(base, db, "bench-raw").await?;
    // Each kind's cutoff as a pass from the pass's start has it (the job's own reading of the
    // policy: the fallback where it names no age, none for an invalid age), kind after kind in
    // the hop's order.
    #[derive(sqlx::FromRow)]
    struct Row {
        account_id: Uuid,
        #[sqlx(flatten)]
        policy: PolicyRow,
    }
    let policies: Vec<Row> = sqlx::query_as(
        "SELECT account_id, enabled, main_days, task_days, subagent_days
         FROM session_retention_policies ORDER BY account_id",
    )
    .fetch_all(&pool)
    .await?;
    let kinds = policies.into_iter().flat_map(|Row { account_id, policy }| {
        let cutoffs = policy.ages().map(|ages| ages.cutoffs(pass_start()));
        SessionKind::ALL
            .into_iter()
            .filter_map(move |kind| Some((account_id, kind.as_str(), cutoffs?.of(kind)?)))
    });
    for (account, kind, cutoff) in kinds {
        let window: Vec<(Uuid, Uuid, DateTime<Utc>, Option<String>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(window_statement()))
                .bind(account)
                .bind(kind)
                .bind(cutoff)
                .bind(EARLIEST)
                .bind(Uuid::nil())
                .bind(i64::MAX)
                .fetch_all(&pool)
                .await?;
        let going: Vec<(Uuid, Uuid)> = window
            .into_iter()
            .filter(|(.., verdict)| verdict.is_none())
            .map(|(session, agent, ..)| (session, agent))
            .collect();
        for sessions in going.chunks(100) {
            let batch: Vec<Uuid> = sessions.iter().map(|s| s.0).collect();
            let mut agents: Vec<Uuid> = sessions.iter().map(|s| s.1).collect();
            agents.sort();
            agents.dedup();
            let mut tx = pool.begin().await?;
            lock_in_order(&mut tx, "agents", "SHARE", &agents).await?;
            sqlx::query(sqlx::AssertSqlSafe(delete_statement()))
                .bind(&batch)
                .bind(account)
                .bind(kind)
                .bind(cutoff)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            let recorded = recorded(&pool, "sessions", account).await?;
            remove_dirs(root, recorded.iter().map(|(_, dir)| dir))?;
            let ids: Vec<i64> = recorded.iter().map(|(id, _)| *id).collect();
            forget(&pool, &ids).await?;
        }
    }
    pool.close().await;
    let mut m = method(SESSIONS_SAME_END_RULES);
    m.seconds = started.elapsed().as_secs_f64();
    m.wal_bytes = Some(wal_position(admin).await? - wal);
    Ok(m)
}

/// [`SESSIONS_SAME_END`] under SessionRetention's lock order: what its locks cost the
/// appending writer, timed alone.
pub const SESSIONS_SAME_END_LOCKED: &str = "sessions raw+dirs+locks";
