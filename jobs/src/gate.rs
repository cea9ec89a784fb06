//! The hold gate (HD-3): a hold is in force from the moment `sexton holds place` returns. Every
//! transaction that removes what a hold could cover — rows or files — begins here, through
//! `sexton.enter_deletion()` (a shared advisory lock, transaction-scoped), before it asks the
//! holds; placing a hold closes the gate (`sexton.close_for_hold()`, exclusive) and writes the
//! hold only once every such transaction begun before it has ended. The gate is its own
//! statement, so the holds the transaction then reads are those committed before it passed.

use sqlx::{Connection as _, PgConnection, Postgres, Transaction};

/// Begins a transaction through the gate, then runs `then` (`; SET LOCAL …` statements, or
/// nothing), in one round trip.
///
/// # Errors
/// A database error; the gate is waited for under `statement_timeout`.
pub async fn begin<'c>(
    conn: &'c mut PgConnection,
    then: &str,
) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
    conn.begin_with(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT sexton.enter_deletion(){then}"
    )))
    .await
}
