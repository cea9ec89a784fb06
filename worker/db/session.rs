//! Whether the pool's connections are sessions of their own (ER-5): a transaction- or
//! statement-mode pooler (PgBouncer `pool_mode = transaction`) hands a connection a server
//! backend per transaction, so what sexton keeps in a session — the hop's scope lock, the queue's
//! LISTEN, sqlx's prepared statements — is lost between two transactions, or lands in another
//! client's.
//!
//! The probe holds three pooled connections A, B and C and asks, in plain (unprepared) queries:
//! A its backend's pid and sets a session variable to a fresh token; B, inside a transaction it
//! keeps open, its pid; A again its pid and the variable; C, inside a transaction of its own, its
//! pid. On a direct connection, and through a session pooler, each connection is one backend for
//! as long as it lives: A's pid and token stay, and B and C, open beside A, can never share its
//! pid — none of the checks can fail there. A transaction pooler returns A's backend to its pool
//! after each statement: B (LIFO reuse, PgBouncer's default) or C (round-robin reuse, once A
//! took another) gets it, or A comes back on another backend. A statement pooler refuses B's
//! transaction outright. Five round trips on connections the pool keeps.

use std::fmt;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres, Row as _};

/// The custom setting the probe writes in A's session.
const PROBE_SETTING: &str = "sexton.session_probe";

/// The SQLSTATE a PgBouncer in statement mode answers a transaction block with
/// ("transaction blocks not allowed in statement pooling mode").
const PROTOCOL_VIOLATION: &str = "08P01";

/// SQLSTATEs of prepared statements (42P05: already exists, 26000: does not exist): plain queries
/// on a session of their own never meet one, so either means another client's statements
/// reached this connection's backend.
const FOREIGN_STATEMENT: [&str; 2] = ["42P05", "26000"];

/// What the probe saw that a session of its own never shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pooling {
    /// Two connections open at once were served by one backend.
    SharedBackend { pid: i32 },
    /// One connection's backend changed between two statements.
    MovedBackend { before: i32, after: i32 },
    /// A session variable set by one statement was gone at the next.
    LostSetting,
    /// A transaction block was refused (a statement-mode pooler).
    NoTransactions { message: String },
    /// A plain query met another client's prepared statements.
    ForeignStatement { message: String },
}

impl Pooling {
    /// What `err`, from a plain query on a connection just opened, says of pooling, if anything.
    pub fn seen_in(err: &sqlx::Error) -> Option<Pooling> {
        match err {
            sqlx::Error::Database(err)
                if err
                    .code()
                    .is_some_and(|code| FOREIGN_STATEMENT.contains(&code.as_ref())) =>
            {
                Some(Pooling::ForeignStatement {
                    message: err.message().to_owned(),
                })
            }
            _ => None,
        }
    }
}

impl fmt::Display for Pooling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pooling::SharedBackend { pid } => write!(
                f,
                "two connections open at once were served by the same server backend (pid {pid})"
            ),
            Pooling::MovedBackend { before, after } => write!(
                f,
                "one connection moved from server backend {before} to {after} between two \
                 statements"
            ),
            Pooling::LostSetting => f.write_str(
                "a session setting made by one statement was gone at the connection's next",
            ),
            Pooling::NoTransactions { message } => {
                write!(f, "a transaction block was refused: {message}")
            }
            Pooling::ForeignStatement { message } => write!(
                f,
                "a plain query on a new connection met another client's prepared statement: \
                 {message}"
            ),
        }
    }
}

/// Runs the probe on three connections of `pool`: `Ok(None)` when each connection is a session
/// of its own.
///
/// # Errors
/// The database's error when a probe statement fails for any reason [`Pooling::seen_in`] does
/// not recognise.
pub async fn probe(pool: &PgPool) -> Result<Option<Pooling>, sqlx::Error> {
    let mut a = pool.acquire().await?;
    let mut b = pool.acquire().await?;
    let mut c = pool.acquire().await?;
    let mut open = [false; 2];
    let outcome = compare(&mut a, &mut b, &mut c, &mut open).await;
    for (conn, open) in [&mut b, &mut c].into_iter().zip(open) {
        if open {
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut **conn).await;
        }
    }
    match outcome {
        Err(err) => Pooling::seen_in(&err).map(Some).ok_or(err),
        seen => seen,
    }
}

/// The probe's steps; `open` says which of B and C were left in a transaction.
async fn compare(
    a: &mut PoolConnection<Postgres>,
    b: &mut PoolConnection<Postgres>,
    c: &mut PoolConnection<Postgres>,
    open: &mut [bool; 2],
) -> Result<Option<Pooling>, sqlx::Error> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    // Plain queries (the simple protocol): a prepared statement would itself fail on a
    // transaction pooler, with an error that does not say why. The token is a hex string this
    // function made, so it is safe in the statement's text.
    let first = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_backend_pid(), set_config('{PROBE_SETTING}', '{token}', false)"
    )))
    .fetch_one(&mut **a)
    .await?;
    let pid: i32 = first.try_get(0)?;
    let held = match pid_in_transaction(b, &mut open[0]).await? {
        Ok(held) => held,
        Err(refused) => return Ok(Some(refused)),
    };
    if held == pid {
        return Ok(Some(Pooling::SharedBackend { pid }));
    }
    let again = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_backend_pid(), current_setting('{PROBE_SETTING}', true)"
    )))
    .fetch_one(&mut **a)
    .await?;
    let (after, setting): (i32, Option<String>) = (again.try_get(0)?, again.try_get(1)?);
    if after != pid {
        return Ok(Some(Pooling::MovedBackend { before: pid, after }));
    }
    if setting.as_deref() != Some(token.as_str()) {
        return Ok(Some(Pooling::LostSetting));
    }
    match pid_in_transaction(c, &mut open[1]).await? {
        Ok(third) if third == pid => Ok(Some(Pooling::SharedBackend { pid })),
        Ok(_) => Ok(None),
        Err(refused) => Ok(Some(refused)),
    }
}

/// The connection's backend pid, asked inside a transaction that is left open (and `open` set);
/// the inner error when the transaction block is refused as a statement pooler refuses it.
async fn pid_in_transaction(
    conn: &mut PoolConnection<Postgres>,
    open: &mut bool,
) -> Result<Result<i32, Pooling>, sqlx::Error> {
    match sqlx::raw_sql("BEGIN; SELECT pg_backend_pid()")
        .fetch_one(&mut **conn)
        .await
    {
        Ok(row) => {
            *open = true;
            Ok(Ok(row.try_get(0)?))
        }
        Err(sqlx::Error::Database(err)) if err.code().as_deref() == Some(PROTOCOL_VIOLATION) => {
            Ok(Err(Pooling::NoTransactions {
                message: err.message().to_owned(),
            }))
        }
        Err(err) => Err(err),
    }
}
