//! Which pooler sits between sexton and the database, asked only once a session pooler's pool
//! has given sexton no connection in time (ER-5): a PostgreSQL over its connection limit
//! refuses at once ("too many clients"), a pooler makes the client wait, so a start that times
//! out waiting for a pooled connection names the pooler, the size its pool needs and the
//! setting that sets it, where sqlx would only say "pool timed out".

use std::fmt;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection, Row as _};

/// PgBouncer's admin console: a database of that name on PgBouncer's own port.
const PGBOUNCER_CONSOLE: &str = "pgbouncer";

/// The pooler found in front of the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pooler {
    /// PgBouncer, with its version when the console told it (it answers only its admin and
    /// stats users; every other user is told "not allowed", which only PgBouncer says).
    PgBouncer { version: Option<String> },
    /// Something else that forwards connections: the server answers on another port than the
    /// one sexton connected to.
    Other { connected: u16, server: u16 },
}

impl Pooler {
    /// The settings that size the pool, for a process that needs `needed` server connections.
    pub fn fix(&self, needed: u32) -> String {
        match self {
            Pooler::PgBouncer { .. } => format!(
                "raise PgBouncer's default_pool_size (or pool_size on the database's line) to at \
                 least {needed} per sexton process beside what the platform's clients of the \
                 same database and user take, and max_client_conn to cover every process's \
                 {needed} client connections"
            ),
            Pooler::Other { .. } => format!(
                "raise its pool for sexton's database and user to at least {needed} server \
                 connections per sexton process"
            ),
        }
    }
}

impl fmt::Display for Pooler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pooler::PgBouncer {
                version: Some(version),
            } => f.write_str(version),
            Pooler::PgBouncer { version: None } => f.write_str("PgBouncer"),
            Pooler::Other { connected, server } => write!(
                f,
                "a pooler or proxy (sexton connects to port {connected}, the database answers \
                 on port {server})"
            ),
        }
    }
}

/// The pooler `options` reach the database through, if one can be told within `limit`.
pub async fn find(options: &PgConnectOptions, limit: Duration) -> Option<Pooler> {
    if let Some(pgbouncer) = pgbouncer(options, limit).await {
        return Some(pgbouncer);
    }
    let server: Option<i32> = tokio::time::timeout(limit, async {
        let mut conn = PgConnection::connect_with(options).await.ok()?;
        let row = sqlx::raw_sql("SELECT inet_server_port()")
            .fetch_one(&mut conn)
            .await
            .ok();
        let _ = conn.close().await;
        row?.try_get(0).ok()?
    })
    .await
    .ok()
    .flatten();
    let connected = options.get_port();
    match server.and_then(|port| u16::try_from(port).ok()) {
        Some(server) if server != connected => Some(Pooler::Other { connected, server }),
        _ => None,
    }
}

/// PgBouncer, if its admin console answers at `options`' address.
async fn pgbouncer(options: &PgConnectOptions, limit: Duration) -> Option<Pooler> {
    let console = options.clone().database(PGBOUNCER_CONSOLE);
    let answer = tokio::time::timeout(limit, async {
        let mut conn = PgConnection::connect_with(&console).await?;
        let version = sqlx::raw_sql("SHOW VERSION")
            .fetch_one(&mut conn)
            .await
            .and_then(|row| row.try_get::<String, _>(0));
        let _ = conn.close().await;
        version
    })
    .await
    .ok()?;
    match answer {
        Ok(version) if version.contains("PgBouncer") => Some(Pooler::PgBouncer {
            version: Some(version),
        }),
        Err(sqlx::Error::Database(err)) if err.message() == "not allowed" => {
            Some(Pooler::PgBouncer { version: None })
        }
        _ => None,
    }
}
