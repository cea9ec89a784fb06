//! Erasure visible and on time (RQ-7): what the worker's gauges read of the requests, and the
//! open requests `sexton status` lists. Every read is bounded whatever the number of requests
//! that completed: the open ones through `erasures_workable`, the completed ones counted by their
//! receipts (one per completed request, RQ-6), the residues through `erasures_residues`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::{State, Subject};
use crate::report::Reason as _;

/// What the gauges show of the requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Tally {
    /// Requests in each state, every state listed (0 for none), in [`State`]'s order.
    pub states: Vec<(State, i64)>,
    /// Seconds from now until the earliest due date of an open request, negative once it has
    /// passed; `None` when no request is open.
    pub due_seconds: Option<f64>,
    /// Residues verification found, summed over every request (RQ-5): requests are never
    /// deleted and a request's count only grows, so the sum never goes down.
    pub residues: i64,
}

impl Tally {
    /// Requests in `state`.
    pub fn of(&self, state: State) -> i64 {
        self.states
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }
}

/// Reads the [`Tally`], the due date by the database's clock.
///
/// # Errors
/// A database error.
pub async fn tally(conn: &mut PgConnection) -> Result<Tally, sqlx::Error> {
    let open: Vec<(State, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM sexton.erasures WHERE state <> 'completed' GROUP BY state",
    )
    .fetch_all(&mut *conn)
    .await?;
    let (completed, due_seconds, residues): (i64, Option<f64>, i64) = sqlx::query_as(
        "SELECT COALESCE((SELECT seq FROM sexton.receipts ORDER BY seq DESC LIMIT 1), 0),
                (SELECT extract(epoch FROM e.due_at - now())::float8 FROM sexton.erasures e
                 WHERE e.state <> 'completed' ORDER BY e.due_at LIMIT 1),
                (SELECT COALESCE(sum(e.residues), 0)::bigint FROM sexton.erasures e
                 WHERE e.residues > 0)",
    )
    .fetch_one(&mut *conn)
    .await?;
    let states = State::ALL
        .iter()
        .map(|state| {
            let n = if *state == State::Completed {
                completed
            } else {
                open.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n)
            };
            (*state, n)
        })
        .collect();
    Ok(Tally {
        states,
        due_seconds,
        residues,
    })
}

/// An open request as `sexton status` lists it: counts and ids, never its subject's id, its
/// ticket, who asked, or what it withholds by id.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Open {
    pub id: Uuid,
    /// What it erases: account, conversation, agent or session.
    pub scope: Subject,
    pub state: State,
    pub received_at: DateTime<Utc>,
    pub due_at: DateTime<Utc>,
    /// Its due date has passed.
    pub overdue: bool,
    pub passes: i32,
    pub residues: i32,
    /// What its last pass withheld, by reason (RQ-3, RQ-4).
    pub withheld: Json<BTreeMap<String, i64>>,
    /// The holds that withhold any of it (RQ-4), by id.
    pub holds: Vec<Uuid>,
}

/// The open requests: how many, and the first `limit` of them, the earliest due first.
///
/// # Errors
/// A database error.
pub async fn open(
    conn: &mut PgConnection,
    at: DateTime<Utc>,
    limit: i64,
) -> Result<(i64, Vec<Open>), sqlx::Error> {
    let total: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sexton.erasures WHERE state <> 'completed'")
            .fetch_one(&mut *conn)
            .await?;
    let open = sqlx::query_as(
        "SELECT e.id, e.scope, e.state, e.received_at, e.due_at, e.due_at < $1 AS overdue,
                e.passes, e.residues, e.withheld,
                ARRAY(SELECT DISTINCT (i->>'hold')::uuid
                      FROM jsonb_array_elements(e.withheld_items) i
                      WHERE i->>'hold' IS NOT NULL) AS holds
         FROM sexton.erasures e WHERE e.state <> 'completed'
         ORDER BY e.due_at, e.received_at LIMIT $2",
    )
    .bind(at)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    Ok((total, open))
}
