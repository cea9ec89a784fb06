//! An owner step's transactions, one or two at a time. Two lanes lock from the same place with
//! `SKIP LOCKED`, so each takes owners the other has not: together they take the first owners
//! after the cursor that nobody else holds, as one lane taking twice as many would, each in a
//! transaction as short as one lane's. An erasure gives way to the other kinds' passes (PF-8):
//! while one is under way it works one lane and rests three times as long as each transaction
//! took, so that the night keeps the database's cores.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use crate::owner_loop::{Chunks, busy_or};

/// How often an erasure asks whether another kind's pass is under way.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Lanes side by side work this many transactions' target time before the step reports back
/// (and the hop looks at its budget and at the other kinds' passes).
pub(super) const SIDE_BY_SIDE: u32 = 20;

/// While another kind's pass is under way, an erasure rests this many times as long as each of
/// its transactions took: it then holds at most a quarter of one core.
pub(super) const GIVE_WAY: u32 = 3;

/// What one lane's transaction did.
#[derive(Debug)]
pub(super) enum Lane {
    /// Nothing left to lock after the cursor.
    Empty,
    /// Committed: the owners it took and the rows it removed per table.
    Took {
        ids: Vec<Uuid>,
        counts: Map<String, Value>,
    },
    /// A row under the owners it locked stayed busy past the lock timeout (FL-6): rolled back.
    Busy { ids: Vec<Uuid> },
    /// It and the other lane each waited on a row the other had deleted — a row under owners
    /// of both, such as a delegation between their runs — and the database chose it to roll
    /// back (a deadlock, SQLSTATE 40P01).
    Crossed,
}

/// An owner step's transaction, as every lane runs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct OwnerTx {
    pub request: Uuid,
    pub lock: &'static str,
    pub take: &'static str,
    /// The cursor: the last owner taken, the nil UUID first.
    pub after: Uuid,
    pub batch: usize,
    pub keep_usage_records: bool,
}

impl OwnerTx {
    /// Locks a batch after the cursor, then judges and deletes it in the take statement, which
    /// also appends what it removed to the request's counts (`sexton.erasure_removed`): one
    /// transaction (asynchronous commit: the drain's synchronous commit makes it durable
    /// before any file goes).
    pub(super) async fn run(&self, conn: &mut PgConnection) -> Result<Lane, sqlx::Error> {
        self.run_telling(conn, |_| {}).await
    }

    /// [`run`](Self::run), telling `locked` the batch it locked before it judges it.
    async fn run_telling(
        &self,
        conn: &mut PgConnection,
        locked: impl FnOnce(&[Uuid]),
    ) -> Result<Lane, sqlx::Error> {
        let mut tx = crate::owner_loop::begin(conn, None, false).await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(self.lock)
            .bind(self.request)
            .bind(self.after)
            .bind(self.batch as i64)
            .fetch_all(&mut *tx)
            .await?;
        locked(&ids);
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Lane::Empty);
        }
        let taken = sqlx::query_scalar(self.take)
            .bind(self.request)
            .bind(&ids)
            .bind(self.keep_usage_records)
            .fetch_one(&mut *tx)
            .await;
        let taken = match taken {
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("40P01") => {
                tx.rollback().await?;
                return Ok(Lane::Crossed);
            }
            taken => busy_or::<Json<Map<String, Value>>>(taken)?,
        };
        let Some(Json(counts)) = taken else {
            tx.rollback().await?;
            return Ok(Lane::Busy { ids });
        };
        tx.commit().await?;
        Ok(Lane::Took { ids, counts })
    }
}

/// Where an owner step goes on after a round of lanes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// A lane found fewer than a batch after the cursor: nothing is left to lock.
    Done,
    /// From this owner on.
    From(Uuid),
    /// A batch was busy: again from the same cursor, one owner per transaction, so that only
    /// the owner that waits again stays (for the next pass, `busy`).
    OneByOne,
    /// The lanes crossed: again from the same cursor, one lane for a round.
    Alone,
}

/// A round of lanes, settled: the rows removed per table, the owners taken, what comes next.
#[derive(Debug)]
pub(super) struct Settled {
    pub counts: Map<String, Value>,
    pub taken: u64,
    pub next: Next,
}

/// Settles `lanes`, which each locked at most `batch` owners after the same cursor. A lane that
/// crossed the other, or found a row busy beside it, sends the round again from the same
/// cursor on one lane.
pub(super) fn settle(lanes: Vec<Lane>, batch: usize) -> Settled {
    let together = lanes.len() > 1;
    let mut counts = Map::new();
    let mut taken = 0;
    let mut short = false;
    let mut busy_batch = false;
    let mut crossed = false;
    let mut last: Option<Uuid> = None;
    for lane in lanes {
        let ids = match lane {
            Lane::Empty => {
                short = true;
                continue;
            }
            Lane::Crossed => {
                crossed = true;
                continue;
            }
            Lane::Took { ids, counts: more } => {
                for (table, n) in more {
                    let sum = counts.get(&table).and_then(Value::as_u64).unwrap_or(0)
                        + n.as_u64().unwrap_or(0);
                    counts.insert(table, sum.into());
                }
                ids
            }
            // Beside another lane, the row may have waited on that lane's transaction: the
            // batch goes again alone, and only the platform's locks can then make it busy.
            Lane::Busy { .. } if together => {
                crossed = true;
                continue;
            }
            Lane::Busy { ids } if ids.len() > 1 => {
                busy_batch = true;
                continue;
            }
            // One owner that waited again stays: it is passed over.
            Lane::Busy { ids } => ids,
        };
        taken += ids.len() as u64;
        short |= ids.len() < batch;
        last = last.max(ids.last().copied());
    }
    let next = match (crossed, busy_batch, short, last) {
        (true, ..) => Next::Alone,
        (false, true, ..) => Next::OneByOne,
        (false, false, false, Some(last)) => Next::From(last),
        _ => Next::Done,
    };
    Settled {
        counts,
        taken,
        next,
    }
}

/// Two lanes side by side for a while: each takes batch after batch on its own connection, the
/// next as soon as its last committed — not in rounds, so that neither waits for the other's
/// batch to end. Each locks after the furthest owner up to which every owner was judged by a
/// committed batch (`SKIP LOCKED` passes the other lane's batch). A lane that finds fewer owners
/// than a batch found the end; after one that met a busy row or crossed the other, the step goes
/// on alone from where this began. Both end with their transactions; neither starts one after
/// `until`. What they did, with the batch size each came to, the larger.
pub(super) async fn side_by_side(
    owners: &OwnerTx,
    chunks: Chunks,
    lanes: [&mut PgConnection; 2],
    until: Instant,
) -> Result<(Settled, usize), sqlx::Error> {
    let shared = Mutex::new(Shared {
        after: owners.after,
        locked: [None, None],
        above: Vec::new(),
        end: None,
        counts: Map::new(),
        taken: 0,
    });
    let [one, other] = lanes;
    let (one, other) = tokio::join!(
        lane(0, owners, chunks, one, &shared, until),
        lane(1, owners, chunks, other, &shared, until)
    );
    let batch = one?.max(other?);
    let shared = shared.into_inner().unwrap_or_else(PoisonError::into_inner);
    let next = match shared.end {
        Some(Next::Done) => Next::Done,
        // Gone on alone from where the lanes began: a failed batch may lie below what the
        // other lane took.
        Some(_) => Next::Alone,
        None => Next::From(shared.after),
    };
    let settled = Settled {
        counts: shared.counts,
        taken: shared.taken,
        next,
    };
    Ok((settled, batch))
}

/// What the lanes of [`side_by_side`] share.
struct Shared {
    /// Every owner up to this one was judged by a committed batch.
    after: Uuid,
    /// Each lane's locked batch until it commits: its first and last owner.
    locked: [Option<(Uuid, Uuid)>; 2],
    /// The last owners of committed batches beyond `after`, above a batch still locked.
    above: Vec<Uuid>,
    /// Why the lanes stop, once one has a reason to.
    end: Option<Next>,
    counts: Map<String, Value>,
    taken: u64,
}

impl Shared {
    /// Lane `lane`'s batch committed, its last owner `last`: `after` goes as far as no batch
    /// still locked lies below.
    fn committed(&mut self, lane: usize, last: Uuid) {
        self.locked[lane] = None;
        self.above.push(last);
        let below = self.locked.iter().flatten().map(|(first, _)| *first).min();
        let reached = self
            .above
            .iter()
            .copied()
            .filter(|last| below.is_none_or(|first| *last < first))
            .max();
        if let Some(reached) = reached {
            self.after = self.after.max(reached);
        }
        let after = self.after;
        self.above.retain(|last| *last > after);
    }
}

/// What the lanes share, for one of them to read or change (never across an await).
fn held(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One lane of [`side_by_side`], `index` its place: the batch size it came to.
async fn lane(
    index: usize,
    owners: &OwnerTx,
    chunks: Chunks,
    conn: &mut PgConnection,
    shared: &Mutex<Shared>,
    until: Instant,
) -> Result<usize, sqlx::Error> {
    let mut batch = owners.batch;
    while held(shared).end.is_none() && Instant::now() < until {
        let tx = OwnerTx {
            after: held(shared).after,
            batch,
            ..*owners
        };
        let started = Instant::now();
        let lane = tx
            .run_telling(conn, |ids| {
                if let (Some(first), Some(last)) = (ids.first(), ids.last()) {
                    held(shared).locked[index] = Some((*first, *last));
                }
            })
            .await;
        let lane = match lane {
            Ok(lane) => lane,
            Err(err) => {
                // The other lane stops after its transaction, and the hop ends with this error.
                held(shared).end = Some(Next::Alone);
                return Err(err);
            }
        };
        let mut shared = held(shared);
        match lane {
            Lane::Took { ids, counts } => {
                shared.taken += ids.len() as u64;
                for (table, n) in counts {
                    let sum = shared
                        .counts
                        .get(&table)
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                        + n.as_u64().unwrap_or(0);
                    shared.counts.insert(table, sum.into());
                }
                if let Some(last) = ids.last() {
                    shared.committed(index, *last);
                }
                if ids.len() < batch {
                    shared.end.get_or_insert(Next::Done);
                }
            }
            Lane::Empty => {
                shared.end.get_or_insert(Next::Done);
            }
            Lane::Busy { .. } | Lane::Crossed => {
                shared.locked[index] = None;
                shared.end = Some(Next::Alone);
            }
        }
        batch = chunks.next(batch, started.elapsed());
    }
    Ok(batch)
}

/// Whether an erasure gives way now: another kind's pass was under way when last looked at
/// (at most [`LOOK_EVERY`] ago).
#[derive(Debug, Default)]
pub(super) struct Yield {
    looked: Option<(Instant, bool)>,
}

impl Yield {
    /// Whether another kind's pass is under way: one that is unfinished and moved in the last
    /// minute (a pass abandoned long ago does not count).
    pub(super) async fn now(&mut self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        if let Some((at, busy)) = self.looked
            && at.elapsed() < LOOK_EVERY
        {
            return Ok(busy);
        }
        let busy: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sexton.passes
                            WHERE finished_at IS NULL AND job <> 'erasure'
                              AND updated_at > now() - interval '1 minute')",
        )
        .fetch_one(&mut *conn)
        .await?;
        self.looked = Some((Instant::now(), busy));
        Ok(busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u128, from: u128) -> Vec<Uuid> {
        (from..from + n).map(Uuid::from_u128).collect()
    }

    fn took(n: u128, from: u128) -> Lane {
        let mut counts = Map::new();
        counts.insert("runs".into(), (n as u64).into());
        Lane::Took {
            ids: ids(n, from),
            counts,
        }
    }

    #[test]
    fn rq3_two_lanes_go_on_from_the_furthest_owner_and_end_when_either_finds_the_end() {
        // Two full lanes: on from the furthest, the rows of both counted.
        let both = settle(vec![took(3, 1), took(3, 4)], 3);
        assert_eq!(both.next, Next::From(Uuid::from_u128(6)));
        assert_eq!(both.taken, 6);
        assert_eq!(both.counts["runs"], 6);
        // A short or empty lane scanned to the end: the step is done.
        assert_eq!(settle(vec![took(3, 1), took(1, 4)], 3).next, Next::Done);
        assert_eq!(settle(vec![took(3, 1), Lane::Empty], 3).next, Next::Done);
        assert_eq!(settle(vec![Lane::Empty], 3).next, Next::Done);
        // One lane alone is what the step always was.
        assert_eq!(
            settle(vec![took(3, 1)], 3).next,
            Next::From(Uuid::from_u128(3))
        );
    }

    #[test]
    fn rq3_a_batch_busy_alone_goes_one_by_one_and_one_busy_beside_a_lane_goes_again_alone() {
        // Alone, a busy batch goes again one owner at a time; a busy owner is passed over.
        let busy = settle(vec![Lane::Busy { ids: ids(3, 1) }], 3);
        assert_eq!(busy.next, Next::OneByOne);
        assert_eq!(busy.taken, 0);
        let one = settle(vec![Lane::Busy { ids: ids(1, 7) }], 1);
        assert_eq!(one.next, Next::From(Uuid::from_u128(7)));
        assert_eq!(one.taken, 1);
        // Beside another lane it may have waited on that lane: the round goes again alone, the
        // other lane's rows counted.
        let beside = settle(vec![took(3, 4), Lane::Busy { ids: ids(3, 1) }], 3);
        assert_eq!(beside.next, Next::Alone);
        assert_eq!(beside.taken, 3);
        assert_eq!(beside.counts["runs"], 3);
    }

    fn shared(after: u128) -> Shared {
        Shared {
            after: Uuid::from_u128(after),
            locked: [None, None],
            above: Vec::new(),
            end: None,
            counts: Map::new(),
            taken: 0,
        }
    }

    #[test]
    fn rq3_lanes_side_by_side_go_on_only_past_owners_every_committed_batch_judged() {
        let id = Uuid::from_u128;
        let mut lanes = shared(0);
        // Lane 0 locked 1..=3, then lane 1 the next unlocked ones, 4..=6.
        lanes.locked = [Some((id(1), id(3))), Some((id(4), id(6)))];
        // Lane 1 commits first: lane 0's batch, below it, may still fail.
        lanes.committed(1, id(6));
        assert_eq!(lanes.after, id(0));
        // Lane 0 commits: everything up to 6 was judged.
        lanes.committed(0, id(3));
        assert_eq!(lanes.after, id(6));
        assert!(lanes.above.is_empty());
        // Lane 0 locks 7..=9 while lane 1 locked 10..=12: lane 0 commits first and the
        // watermark follows it; lane 1's commit takes it further.
        lanes.locked = [Some((id(7), id(9))), Some((id(10), id(12)))];
        lanes.committed(0, id(9));
        assert_eq!(lanes.after, id(9));
        lanes.committed(1, id(12));
        assert_eq!(lanes.after, id(12));
    }

    #[test]
    fn rq3_lanes_that_crossed_go_again_from_the_same_owner_alone() {
        let crossed = settle(vec![took(3, 4), Lane::Crossed], 3);
        assert_eq!(crossed.next, Next::Alone);
        assert_eq!(crossed.taken, 3);
        assert_eq!(crossed.counts["runs"], 3);
    }
}
