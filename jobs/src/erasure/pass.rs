//! A pass over the open requests, one step at a time on the owner loop: which request is in
//! hand and which of its steps is next is the cursor; what each step did is committed with it,
//! into the request's row, in the same transaction.

use std::time::Instant;

use serde_json::{Map, Value};
use sqlx::pool::PoolConnection;
use sqlx::types::Json;
use sqlx::{Connection as _, PgConnection, Postgres};
use uuid::Uuid;

use super::steps::{self, Shape};
use super::{Cursor, ErasureSettings, Subject, Withheld, derivatives, plan};
use crate::files::{self, DrainError, FileCounts, Root};
use crate::job::{Report, Rest, refused};
use crate::owner_loop::{self, Chunks, Error, Owners, Then, Took};
use lanes::{Next, OwnerTx, Yield};

mod conclude;
mod lanes;

/// A request found more than this many times with something left after its steps ended is
/// failed, naming what is left: a residue the steps cannot remove needs a person.
const MAX_RESIDUES: i32 = 5;

/// Step numbers around [`steps::STEPS`]: its scope's ids first, its files without rows, the
/// deleting steps, the drains, then what is left.
const PLAN: u32 = 0;
const DERIVATIVES: u32 = 1;
const FIRST_DELETE: u32 = 2;
const DRAIN: u32 = FIRST_DELETE + steps::STEPS.len() as u32;
const CONCLUDE: u32 = DRAIN + 1;

/// What a pass's first transaction takes, before one is timed.
const FIRST_CHUNK: usize = 20;

/// Adds `$2`, files removed by root, to request `$1`'s counts.
const ADD_REMOVED: &str =
    "UPDATE sexton.erasures SET removed = sexton.add_counts(removed, $2), updated_at = now()
     WHERE id = $1";

/// Folds request `$1`'s counts, appended by each deleting statement (`steps`), into its row.
const FOLD_REMOVED: &str = "SELECT sexton.fold_erasure_removed($1)";

/// What a step needs of its request.
#[derive(Debug, sqlx::FromRow)]
struct InHand {
    id: Uuid,
    scope: Subject,
    scope_id: Option<Uuid>,
    account_id: Option<Uuid>,
    residues: i32,
}

/// The open requests as the owner loop works them.
pub(super) struct Requests<'a> {
    settings: &'a ErasureSettings,
    env: Rest<'a>,
    failed: u64,
    /// Rows (or owners) the next transaction takes: sized so that one lasts about
    /// `[erasure] transaction_target_ms` (PF-2), from 1 to `batch_size`.
    chunk: usize,
    /// The second lane's connection, once a step has used it.
    second: Option<PoolConnection<Postgres>>,
    /// The lanes crossed: the next transaction is one lane's.
    alone: bool,
    /// The request whose appended counts this hop has folded into its row.
    folded: Option<Uuid>,
    give_way: Yield,
}

impl<'a> Requests<'a> {
    pub(super) fn new(settings: &'a ErasureSettings, env: Rest<'a>) -> Self {
        Self {
            settings,
            env,
            failed: 0,
            chunk: FIRST_CHUNK.min(settings.batch_size as usize),
            second: None,
            alone: false,
            folded: None,
            give_way: Yield::default(),
        }
    }

    pub(super) fn failed(&self) -> u64 {
        self.failed
    }

    /// The request to work now: `at`'s while it is still open and not waiting, else the open
    /// one due first (a waiting one once its retry is due).
    async fn in_hand(
        &self,
        conn: &mut PgConnection,
        at: Option<&Cursor>,
    ) -> Result<Option<(InHand, Cursor)>, sqlx::Error> {
        if let Some(at) = at {
            let same: Option<InHand> = sqlx::query_as(
                "SELECT id, scope, scope_id, account_id, residues FROM sexton.erasures
                 WHERE id = $1 AND state IN ('received', 'running', 'verifying')",
            )
            .bind(at.request)
            .fetch_optional(&mut *conn)
            .await?;
            if let Some(same) = same {
                return Ok(Some((same, at.clone())));
            }
        }
        let next: Option<InHand> = sqlx::query_as(
            "SELECT id, scope, scope_id, account_id, residues FROM sexton.erasures
             WHERE state IN ('received', 'running', 'verifying')
                OR (state = 'waiting' AND next_attempt_at <= now())
             ORDER BY due_at, received_at LIMIT 1",
        )
        .fetch_optional(&mut *conn)
        .await?;
        Ok(next.map(|request| {
            let at = Cursor {
                request: request.id,
                step: PLAN,
                after: None,
                alone: false,
            };
            (request, at)
        }))
    }

    /// Runs `request`'s step where `now` stands.
    async fn work(
        &mut self,
        conn: &mut PgConnection,
        request: &InHand,
        now: Cursor,
        report: &mut Report<Withheld>,
    ) -> Result<Took<Cursor>, Error> {
        let Cursor {
            step, after, alone, ..
        } = now;
        let at = |step: u32, after: Option<Uuid>, alone: bool| Cursor {
            request: request.id,
            step,
            after,
            alone,
        };
        let next = |step: u32| more(at(step, None, false));
        match step {
            PLAN => {
                self.plan(conn, request).await?;
                Ok(next(DERIVATIVES))
            }
            DERIVATIVES => {
                let recorded = self.derivatives(conn, request).await?;
                Ok(Took {
                    recorded,
                    ..next(FIRST_DELETE)
                })
            }
            DRAIN => {
                sqlx::query(FOLD_REMOVED)
                    .bind(request.id)
                    .execute(&mut *conn)
                    .await?;
                self.drain(conn, request, report).await?;
                Ok(next(CONCLUDE))
            }
            CONCLUDE => {
                self.conclude(conn, request, report).await?;
                // The request has left the running states (or runs again from its plan).
                Ok(next(PLAN))
            }
            _ => {
                let delete = steps::STEPS[(step - FIRST_DELETE) as usize];
                if delete.after_residue && request.residues == 0 {
                    return Ok(next(step + 1));
                }
                if after.is_none() {
                    // A step's owners cost what they cost (a conversation ten runs' worth): its
                    // first transaction is sized afresh.
                    self.chunk = FIRST_CHUNK.min(self.settings.batch_size as usize);
                }
                let started = Instant::now();
                let (taken, last) = self
                    .delete(conn, request, delete, after, alone, report)
                    .await?;
                let seconds = started.elapsed().as_secs_f64();
                let owners = matches!(delete.shape, Shape::Owners { .. });
                let went_on = match last {
                    Some(last) => at(step, Some(last), alone),
                    None if owners && !alone => at(step, None, true),
                    None => at(step + 1, None, false),
                };
                Ok(Took {
                    read: taken,
                    seconds,
                    ..more(went_on)
                })
            }
        }
    }

    /// Writes the request's members and marks it running, one more pass.
    async fn plan(&self, conn: &mut PgConnection, request: &InHand) -> Result<(), sqlx::Error> {
        let mut tx = conn.begin().await?;
        if let Some(scope_id) = request.scope_id {
            let again: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM sexton.erasure_members WHERE request_id = $1)",
            )
            .bind(request.id)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query(sqlx::AssertSqlSafe(plan::members(request.scope, again)))
                .bind(request.id)
                .bind(scope_id)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(
            "UPDATE sexton.erasures SET state = 'running', passes = passes + 1,
                    next_attempt_at = NULL, updated_at = now()
             WHERE id = $1",
        )
        .bind(request.id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Records the scope's files no row leads to; how many.
    async fn derivatives(&self, conn: &mut PgConnection, request: &InHand) -> Result<u64, Error> {
        let members: Vec<(String, Uuid, Option<Uuid>)> = sqlx::query_as(
            "SELECT m.kind, m.id, COALESCE(s.agent_id, g.id)
             FROM sexton.erasure_members m
             LEFT JOIN sessions s ON m.kind = 'session' AND s.id = m.id
             LEFT JOIN agents g ON m.kind = 'agent' AND g.id = m.id
             WHERE m.request_id = $1 AND m.kind IN ('agent', 'session')
             ORDER BY m.kind, m.id",
        )
        .bind(request.id)
        .fetch_all(&mut *conn)
        .await?;
        let erased: Vec<Uuid> = members
            .iter()
            .filter(|(kind, ..)| kind == "agent")
            .map(|(_, id, _)| *id)
            .collect();
        let sessions: Vec<Uuid> = members
            .iter()
            .filter(|(kind, ..)| kind == "session")
            .map(|(_, id, _)| *id)
            .collect();
        let store = |why: String| DrainError::Store {
            root: Root::Traces.as_str().to_owned(),
            why,
        };
        let mut traces = Vec::new();
        for agent in &erased {
            let found = derivatives::traces(self.env.paths, Some(*agent), true, &[]).await;
            traces.extend(found.map_err(store)?);
        }
        // Sessions of agents not erased whole: their agent's traces naming them, or — a
        // session whose row is gone — any trace naming them.
        let mut agents: Vec<Option<Uuid>> = members
            .iter()
            .filter(|(kind, _, agent)| {
                kind == "session" && !agent.is_some_and(|a| erased.contains(&a))
            })
            .map(|(_, _, agent)| *agent)
            .collect();
        agents.sort();
        agents.dedup();
        for agent in agents {
            let found = derivatives::traces(self.env.paths, agent, false, &sessions).await;
            traces.extend(found.map_err(store)?);
        }
        let mut orphaned = Vec::new();
        for (kind, id, agent) in &members {
            if kind == "session"
                && agent.is_none()
                && derivatives::session_directory(self.env.paths, *id)
                    .await
                    .map_err(store)?
            {
                orphaned.push(*id);
            }
        }
        let recorded = sqlx::query(
            "WITH found (root, path, agent, session) AS (
                 SELECT 'traces', * FROM unnest($2::text[], $3::uuid[], $4::uuid[])
                 UNION ALL
                 SELECT 'sessions', s::text, NULL::uuid, s FROM unnest($5::uuid[]) s)
             INSERT INTO sexton.pending_file_deletions
                 (root, account_id, relative_path, agent_id, session_id)
             SELECT f.root, COALESCE($1, '00000000-0000-0000-0000-000000000000'), f.path,
                    f.agent, f.session
             FROM found f
             WHERE NOT EXISTS (SELECT 1 FROM sexton.pending_file_deletions p
                               WHERE p.root = f.root AND p.relative_path = f.path
                                 AND p.quarantined_at IS NULL)
               -- A session that stays keeps its traces (TR-3: a live session's trace stays).
               AND NOT EXISTS (SELECT 1 FROM sessions s,
                                   sexton.erasure_session_withheld($6, s.id, s.account_id,
                                                                   s.agent_id, s.state) w
                               WHERE s.id = f.session)",
        )
        .bind(request.account_id)
        .bind(traces.iter().map(|t| t.path.clone()).collect::<Vec<_>>())
        .bind(traces.iter().map(|t| t.agent).collect::<Vec<_>>())
        .bind(traces.iter().map(|t| t.session).collect::<Vec<_>>())
        .bind(&orphaned)
        .bind(request.id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        Ok(recorded)
    }

    /// A deleting step's next transactions: one, or — while nothing else is under way — two
    /// lanes' side by side for a while ([`lanes::side_by_side`]); the rows each removed added to
    /// the request's counts as it commits. The last id taken, when the step goes on.
    async fn delete(
        &mut self,
        conn: &mut PgConnection,
        request: &InHand,
        delete: steps::Delete,
        after: Option<Uuid>,
        alone: bool,
        report: &mut Report<Withheld>,
    ) -> Result<(u64, Option<Uuid>), Error> {
        let batch = self.chunk;
        let keep = self.settings.keep_usage_records;
        let giving_way = self.give_way.now(conn).await?;
        let started = Instant::now();
        let mut again = None;
        // Lanes side by side size their own batches.
        let mut sized = false;
        let (counts, taken, last) = match delete.shape {
            Shape::Owners { lock, take } => {
                let owners = OwnerTx {
                    request: request.id,
                    lock,
                    take,
                    after: after.unwrap_or_default(),
                    batch,
                    keep_usage_records: keep,
                };
                let settled = if std::mem::take(&mut self.alone) || giving_way || alone {
                    lanes::settle(vec![owners.run(conn).await?], batch)
                } else {
                    let chunks = self.chunks();
                    let until =
                        Instant::now() + self.settings.transaction_target * lanes::SIDE_BY_SIDE;
                    let second = self.second_lane().await?;
                    let (settled, batch) =
                        lanes::side_by_side(&owners, chunks, [&mut *conn, second], until).await?;
                    (self.chunk, sized) = (batch, true);
                    settled
                };
                let last = match settled.next {
                    Next::Done => None,
                    Next::From(last) => Some(last),
                    Next::OneByOne | Next::Alone => Some(after.unwrap_or_default()),
                };
                again = Some(settled.next);
                (settled.counts, settled.taken, last)
            }
            Shape::Sweep(sql) => {
                let mut tx = owner_loop::begin(conn, None, false).await?;
                let Json(counts): Json<Map<String, Value>> = sqlx::query_scalar(sql)
                    .bind(request.id)
                    .bind(batch as i64)
                    .bind(keep)
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                let taken: u64 = counts.values().filter_map(Value::as_u64).sum();
                // Another round while the last one found anything.
                (counts, taken, (taken > 0).then(Uuid::nil))
            }
        };
        let took = started.elapsed();
        if !sized {
            self.chunk = self.chunks().next(self.chunk, took);
        }
        match again {
            Some(Next::OneByOne) => self.chunk = 1,
            Some(Next::Alone) => self.alone = true,
            _ => {}
        }
        if giving_way {
            tokio::time::sleep(took * lanes::GIVE_WAY).await;
        }
        for (table, n) in &counts {
            let n = n.as_u64().unwrap_or(0);
            report.pruned += n;
            if let Some(table) = steps::TABLES.iter().find(|t| **t == table.as_str()) {
                report.deleted(table, n);
            }
        }
        Ok((taken, last))
    }

    /// How a transaction's batch is sized: toward `[erasure] transaction_target_ms`.
    fn chunks(&self) -> Chunks {
        Chunks::Timed {
            first: FIRST_CHUNK,
            most: self.settings.batch_size as usize,
            target: self.settings.transaction_target,
        }
    }

    /// The second lane's connection, taken from the pool once per hop (`Job::CONNECTIONS`).
    pub(super) async fn second_lane(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        if self.second.is_none() {
            self.second = Some(self.env.pool.acquire().await?);
        }
        Ok(self.second.as_deref_mut().expect("acquired above"))
    }

    /// Removes the files the steps recorded, root by root, for the request's account (and
    /// those of a scope whose account is unknown): the sessions root on one of the hop's
    /// connections, the other roots one after another on the other (a root's drains are its
    /// own; no other drain of it runs meanwhile) — or all on one while another kind's pass is
    /// under way. What each removed is counted, whichever of them fails.
    async fn drain(
        &mut self,
        conn: &mut PgConnection,
        request: &InHand,
        report: &mut Report<Withheld>,
    ) -> Result<(), Error> {
        // The request's account, and any other the scope's records are kept under (a run
        // whose conversation's row is gone names its own account).
        let scopes: Vec<Uuid> = sqlx::query_scalar(
            "SELECT COALESCE($2, '00000000-0000-0000-0000-000000000000')
             UNION
             SELECT DISTINCT p.account_id FROM sexton.pending_file_deletions p
             WHERE p.quarantined_at IS NULL AND p.account_id <> COALESCE($2, p.account_id)
               AND (EXISTS (SELECT 1 FROM sexton.erasure_members m
                            WHERE m.request_id = $1 AND m.kind = 'run' AND m.id = ANY (p.run_ids))
                    OR EXISTS (SELECT 1 FROM sexton.erasure_members m
                               WHERE m.request_id = $1 AND m.kind = 'session'
                                 AND m.id = p.session_id)
                    OR EXISTS (SELECT 1 FROM sexton.erasure_members m
                               WHERE m.request_id = $1 AND m.kind = 'agent'
                                 AND m.id = p.agent_id))",
        )
        .bind(request.id)
        .bind(request.account_id)
        .fetch_all(&mut *conn)
        .await?;
        let paths = self.env.paths;
        let all = [
            Root::Outputs,
            Root::Attachments,
            Root::Traces,
            Root::Sessions,
        ];
        let (one, other) = if self.give_way.now(conn).await? {
            // Another kind's pass is under way: one connection, as the steps then work.
            (
                drain_roots(conn, paths, &all, &scopes).await,
                Drained::default(),
            )
        } else {
            // A session's directory costs about twice what another file costs (PF-8: 5,000
            // sessions 0.82 s; 5,000 outputs, 1,500 attachments and 1,000 traces 0.69 s).
            let beside = self.second_lane().await?;
            tokio::join!(
                drain_roots(conn, paths, &all[..3], &scopes),
                drain_roots(beside, paths, &all[3..], &scopes)
            )
        };
        let mut removed = Map::new();
        for (root, counts) in one.roots.iter().chain(&other.roots) {
            report.files.add(*counts);
            if counts.deleted > 0 {
                removed.insert(format!("files:{}", root.as_str()), counts.deleted.into());
                removed.insert(format!("bytes:{}", root.as_str()), counts.bytes.into());
            }
        }
        // What either drain removed is counted before the other's error is: its files are gone.
        sqlx::query(ADD_REMOVED)
            .bind(request.id)
            .bind(Json(&removed))
            .execute(&mut *conn)
            .await?;
        match one.failed.or(other.failed) {
            Some(err) => Err(err.into()),
            None => Ok(()),
        }
    }

    /// Marks the request failed with `error`, which it cannot get past (a statement the
    /// database refuses).
    async fn fail(
        &mut self,
        conn: &mut PgConnection,
        request: Uuid,
        error: &Error,
    ) -> Result<(), sqlx::Error> {
        self.failed += 1;
        sqlx::query(FOLD_REMOVED)
            .bind(request)
            .execute(&mut *conn)
            .await?;
        sqlx::query(
            "UPDATE sexton.erasures SET state = 'failed', last_error = $2, updated_at = now()
             WHERE id = $1",
        )
        .bind(request)
        .bind(error.to_string())
        .execute(conn)
        .await?;
        Ok(())
    }
}

/// What [`drain_roots`] removed, root by root, and the error it stopped at, if any.
#[derive(Default)]
struct Drained {
    roots: Vec<(Root, FileCounts)>,
    failed: Option<DrainError>,
}

/// Drains each of `roots` in turn on `conn`, for each of `scopes`, until one fails.
async fn drain_roots(
    conn: &mut PgConnection,
    paths: &files::PathSettings,
    roots: &[Root],
    scopes: &[Uuid],
) -> Drained {
    let mut drained = Drained::default();
    for &root in roots {
        let store = paths.store(root);
        let mut counts = FileCounts::default();
        for scope in scopes {
            match files::drain_from(conn, root, &store, Some(*scope), 0).await {
                Ok((scope_counts, _)) => counts.add(scope_counts),
                Err(err) => {
                    drained.roots.push((root, counts));
                    drained.failed = Some(err);
                    return drained;
                }
            }
        }
        drained.roots.push((root, counts));
    }
    drained
}

/// A step that moved the pass to `at`, with more to follow.
fn more(at: Cursor) -> Took<Cursor> {
    Took {
        read: 0,
        at: Some(at),
        recorded: 0,
        seconds: 0.0,
        then: Then::More,
    }
}

impl Owners for Requests<'_> {
    type Cursor = Cursor;
    type Report = Report<Withheld>;

    const TABLES: &'static [&'static str] = steps::TABLES;

    async fn step(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Cursor>,
        _room: Option<u32>,
        report: &mut Report<Withheld>,
    ) -> Result<Took<Cursor>, Error> {
        let Some((request, now)) = self.in_hand(conn, at).await? else {
            return Ok(Took::end(None));
        };
        if self.folded != Some(request.id) {
            // What the last hop's transactions appended, in the request's row (its status).
            sqlx::query(FOLD_REMOVED)
                .bind(request.id)
                .execute(&mut *conn)
                .await?;
            self.folded = Some(request.id);
        }
        match self.work(conn, &request, now, report).await {
            Ok(took) => Ok(took),
            Err(err) if refused(&err) => {
                tracing::error!(request = %request.id, error = %err, "erasure request failed");
                self.fail(conn, request.id, &err).await?;
                Ok(Took {
                    then: Then::More,
                    ..Took::end(None)
                })
            }
            Err(err) => Err(err),
        }
    }
}
