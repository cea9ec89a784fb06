//! How a hop fails (EX-8): a failure a retry may cure is retried; the database refusing the
//! statement itself (a column missing, a privilege not granted) fails the hop for good, so that
//! the operator sees it at once instead of after every retry.

use std::sync::atomic::AtomicBool;

use sexton_jobs::attachment_expiry::AttachmentExpiry;
use sexton_jobs::clock::ManualClock;
use sexton_jobs::health::Health;
use sexton_jobs::job::{Env, Job, Report};
use sexton_jobs::pass;
use sexton_jobs::pass::ArgsOf;
use sexton_jobs::record_expiry::{Expire, Handoffs};
use sqlx::PgPool;

use crate::common::{self, fixture};

/// `J`'s first hop, its error if it fails.
async fn first_hop<J: Job>(
    pool: &PgPool,
    settings: &sexton::config::Settings,
    account: Option<uuid::Uuid>,
) -> Result<(), J::Error> {
    let mut conn = pool.acquire().await.unwrap();
    let env = Env {
        conn: &mut conn,
        pool,
        clock: &ManualClock::new(fixture::pass_start()),
        stop: &AtomicBool::new(false),
        paths: &settings.paths,
        health: &Health::off(),
    };
    let mut report = Report::new(J::TABLES);
    let args = ArgsOf::<J>::first(account, fixture::pass_start());
    pass::hop::<J>(env, settings.jobs.get(J::NAME), &args, &mut report)
        .await
        .map(|_| ())
}

#[sqlx::test]
async fn ex8_a_statement_the_database_refuses_fails_for_good_others_are_retried(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let account = fixture::account(&pool, Some(30)).await;

    // Transient: the attachments root is not there (yet): a retry may find it mounted.
    let missing_root = first_hop::<AttachmentExpiry>(&pool, &settings, Some(account))
        .await
        .expect_err("the attachments root does not exist");
    assert!(AttachmentExpiry::retryable(&missing_root), "{missing_root}");

    // For good: the platform's table lacks the column the statement names.
    sqlx::query("ALTER TABLE handoffs RENAME COLUMN created_at TO made_at")
        .execute(&pool)
        .await
        .unwrap();
    let refused = first_hop::<Expire<Handoffs>>(&pool, &settings, None)
        .await
        .expect_err("the column is missing");
    assert!(!Expire::<Handoffs>::retryable(&refused), "{refused}");
}

/// `sexton worker --exit-when-idle` whose run left a job failed for good exits 1, saying how
/// many; the control: a second run, whose jobs all succeed, exits 0 although the first run's
/// job is still kept failed in the queue.
#[sqlx::test]
async fn op1_a_run_until_idle_whose_jobs_failed_for_good_exits_1(pool: PgPool) {
    use std::time::Duration;

    use crate::common::fixture::RunSpec;
    use crate::common::process::Proc;

    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let url = common::database_url(&pool).await;
    let root = &settings.paths.output_root;
    let mut due = Vec::new();
    for _ in 0..2 {
        let account = fixture::account(&pool, Some(30)).await;
        let conversation = fixture::conversation(&pool, account).await;
        let spec = RunSpec::conversation(account, conversation, 40.0);
        due.push(fixture::run(&pool, root, spec).await);
    }
    // The first account's owner transaction fails at every attempt; the second's goes through.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION fail_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.run_id = '{}' THEN RAISE EXCEPTION 'injected failure'; END IF;
             RETURN OLD;
         END $$;
         CREATE TRIGGER fail_on_delete BEFORE DELETE ON tool_results
         FOR EACH ROW EXECUTE FUNCTION fail_on_delete()",
        due[0].id
    )))
    .execute(&pool)
    .await
    .unwrap();
    let run = || {
        let mut cmd = common::sexton(&url, dir.path());
        cmd.args(["worker", "--exit-when-idle"])
            .env("SEXTON_QUEUE__MAX_ATTEMPTS", "2")
            .env("SEXTON_QUEUE__RETRY_BACKOFF_MS", "10");
        Proc::spawn(cmd).finish(Duration::from_secs(120))
    };
    sexton::tick::tick(&pool, &settings, fixture::pass_start())
        .await
        .unwrap();
    let (status, lines) = run().await;
    assert_eq!(status.code(), Some(1), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("1 job this worker ran failed for good")),
        "{lines:#?}"
    );
    assert!(!fixture::is_pruned(&pool, due[0].id).await);
    assert!(fixture::is_pruned(&pool, due[1].id).await, "the other went");
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM apalis.jobs WHERE status IN ('Failed', 'Killed')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failed, 1);

    // The control: nothing this run does fails, the earlier failure stays in the queue.
    sqlx::query("DROP TRIGGER fail_on_delete ON tool_results")
        .execute(&pool)
        .await
        .unwrap();
    sexton::tick::tick(
        &pool,
        &settings,
        fixture::pass_start() + chrono::Duration::days(1),
    )
    .await
    .unwrap();
    let (status, lines) = run().await;
    assert!(status.success(), "{lines:#?}");
    assert!(fixture::is_pruned(&pool, due[0].id).await);
}
