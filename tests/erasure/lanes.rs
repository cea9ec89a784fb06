//! RQ-8 and PF-8: an erasure works its owner steps on two lanes while no other kind's pass is
//! under way, and gives way to one that is — one lane, resting between its transactions.

use sexton_jobs::erasure::{State, Subject};
use sqlx::PgPool;
use uuid::Uuid;

use super::{erase, request, settings};
use crate::common::{self, fixture, run};

/// An account with `runs` finished runs over one conversation.
async fn account_with_runs(pool: &PgPool, runs: i32) -> Uuid {
    let account = fixture::account(pool, Some(90)).await;
    let conversation = fixture::conversation(pool, account).await;
    sqlx::query(
        "INSERT INTO runs (account_id, conversation_id, status, completed_at)
         SELECT $1, $2, 'completed', now() - interval '1 day' FROM generate_series(1, $3)",
    )
    .bind(account)
    .bind(conversation)
    .bind(runs)
    .execute(pool)
    .await
    .unwrap();
    account
}

/// The backends that deleted the account's runs, as a trigger saw them.
async fn lanes_of(pool: &PgPool, account: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT backend) FROM lane_log WHERE account_id = $1")
        .bind(account)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
async fn rq8_an_erasure_takes_one_lane_while_another_kinds_pass_is_under_way_and_two_otherwise(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = common::backend::tempdir();
    let paths = run::roots(dir.path());
    sqlx::raw_sql(
        "CREATE TABLE lane_log (account_id uuid, backend int);
         CREATE FUNCTION log_lane() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO lane_log VALUES (OLD.account_id, pg_backend_pid());
             RETURN OLD;
         END $$;
         CREATE TRIGGER log_lane AFTER DELETE ON runs FOR EACH ROW EXECUTE FUNCTION log_lane();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut settings = settings(true);
    settings.batch_size = 20;
    // Nothing else under way: two lanes share the runs.
    let alone = account_with_runs(&pool, 400).await;
    let asked = request(&pool, Subject::Account, alone).await;
    assert_eq!(
        erase(&pool, &paths, &settings, asked.id).await.state,
        State::Completed
    );
    assert_eq!(lanes_of(&pool, alone).await, 2);
    // Another kind's pass under way: one lane.
    sqlx::query(
        "INSERT INTO sexton.passes (job, scope, slot, started_at, updated_at)
         VALUES ('prune_execution_details', gen_random_uuid(), now(), now(), now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let beside = account_with_runs(&pool, 400).await;
    let asked = request(&pool, Subject::Account, beside).await;
    assert_eq!(
        erase(&pool, &paths, &settings, asked.id).await.state,
        State::Completed
    );
    assert_eq!(lanes_of(&pool, beside).await, 1);
    // Its runs all went, as the first account's did.
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE account_id IN ($1, $2)")
        .bind(alone)
        .bind(beside)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}
