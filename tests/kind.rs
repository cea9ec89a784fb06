//! Adding a job kind touches its module and nothing shared (README, "Adding a job kind"): the
//! smallest kind, written in the tests alone, runs through the worker's own hop path
//! (`sexton::hop::run_with`: scope lock, the pass's envelope, next hop, ledger) and owner loop.

use chrono::{DateTime, Utc};
use sexton_jobs::{cutoff::days_before, files::PathSettings, job::*, owner_loop::*, pass::*};
use sexton_jobs::{rows::*, settings::Check};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::{self, fixture};

/// Notes older than `[probe] max_age_days` go, two per hop.
struct Probe;

impl Table for Probe {
    const READ: &'static str = "SELECT id, created_at FROM probe_notes WHERE account_id = $1
        AND created_at < $2 AND (created_at, id) > ($3, $4) ORDER BY created_at, id LIMIT $5";
    const TAKE: &'static str =
        "DELETE FROM probe_notes WHERE account_id = $1 AND created_at < $2 AND id = ANY($3)";
    const LOCKS: &'static [Lock] = &[Lock::Scope("accounts", Mode::Share)];
}

impl Job for Probe {
    const NAME: &'static str = "probe";
    const SECTION: &'static str = "probe";
    const TABLES: &'static [&'static str] = &["probe_notes"];
    type Reason = NoReason;
    type Cutoff = DateTime<Utc>;
    type Cursor = Cursor;
    type Raw = i32;
    type Settings = i32;
    type Error = Error;

    fn settings(max_age_days: i32, _: &PathSettings, _: &mut Check<'_>) -> Option<i32> {
        Some(max_age_days)
    }

    fn bounds(_: &i32) -> Bounds {
        Bounds::new(Some(2), std::time::Duration::from_secs(60))
    }

    async fn policy(now: Now<'_, Self>) -> Result<Policy<DateTime<Utc>>, Error> {
        Ok(Policy::up_to(days_before(now.reference, *now.settings)))
    }

    async fn run(step: Step<'_, Self>, r: &mut Report<NoReason>) -> Result<End<Cursor>, Error> {
        Rows::run(step, 1, r).await
    }
}

/// The notes left, each with its age in days; the probe's pass in the ledger.
const LEFT: &str = "SELECT account_id, extract(day FROM $1 - created_at)::float8 FROM probe_notes
    ORDER BY created_at DESC";
const LEDGER: &str = "SELECT finished_at IS NOT NULL, hops FROM sexton.passes WHERE job = 'probe'";

#[sqlx::test]
async fn a_kind_written_in_its_own_module_runs_through_the_worker_and_the_owner_loop(pool: PgPool) {
    common::migrate(&pool).await;
    let account = fixture::account(&pool, None).await;
    let other = fixture::account(&pool, None).await;
    let start = fixture::pass_start();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE probe_notes (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
             account_id uuid NOT NULL REFERENCES accounts, created_at timestamptz NOT NULL);
         INSERT INTO probe_notes (account_id, created_at)
         SELECT a::uuid, '{start}'::timestamptz - make_interval(days => d) FROM (VALUES
             ('{account}', 90), ('{account}', 60), ('{account}', 40), ('{account}', 1),
             ('{other}', 90)) v (a, d)"
    )))
    .execute(&pool)
    .await
    .unwrap();

    // A window of two: the first hop's is full and hands over, the second's is short.
    let hops = common::run::through_queue::<Probe>(&pool, &30, Some(account)).await;
    assert_eq!(hops, 2, "the pass went on while its window was full");
    let left: Vec<(Uuid, f64)> = sqlx::query_as(LEFT)
        .bind(start)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        left,
        [(account, 1.0), (other, 90.0)],
        "the young one, the other account's"
    );
    let ledger: (bool, i32) = sqlx::query_as(LEDGER).fetch_one(&pool).await.unwrap();
    assert_eq!(ledger, (true, 2), "the pass ledger saw the pass end");
}
