//! Erasure on request (SPEC §11, RQ-1 … RQ-8) on real PostgreSQL and real files: what goes is
//! exactly the scope's, judged against a snapshot of every row of every table; the rest of the
//! account, and the other account, stay as they were.

mod world;

use std::collections::BTreeSet;

use sexton_jobs::erasure::request::{self, Opened};
use sexton_jobs::erasure::{Erase, Erasure, ErasureSettings, Request, State, Subject};
use sexton_jobs::files::PathSettings;
use sexton_jobs::job::Job as _;
use sexton_jobs::pass::ArgsOf;
use sexton_jobs::receipts::{self, ReceiptKey};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::{self, fixture::pass_start, run};
use world::{Tenant, assert_exactly, snapshot};

const KEY: &str = "a receipt key for the tests";

fn settings(keep_usage_records: bool) -> ErasureSettings {
    let defaults = sexton::registry::load_settings(None).unwrap();
    let mut settings = defaults.jobs.get::<ErasureSettings>(Erase::NAME).clone();
    settings.receipt_key = Some(ReceiptKey::new(KEY));
    settings.keep_usage_records = keep_usage_records;
    settings.batch_size = 2;
    settings
}

/// A world of two tenants under `dir`.
async fn two_tenants(pool: &PgPool, dir: &std::path::Path) -> (PathSettings, Tenant, Tenant) {
    common::migrate(pool).await;
    let paths = run::roots(dir);
    let one = world::tenant(pool, &paths).await;
    let other = world::tenant(pool, &paths).await;
    (paths, one, other)
}

/// Records a request for `subject` `id` as `sexton erase` does.
async fn request(pool: &PgPool, subject: Subject, id: Uuid) -> Request {
    let mut conn = pool.acquire().await.unwrap();
    let erasure = Erasure {
        subject,
        id,
        reference: "DSR-1".to_owned(),
        requested_by: "privacy@example.com".to_owned(),
        due_at: None,
    };
    match request::open(
        &mut conn,
        &erasure,
        &ReceiptKey::new(KEY),
        chrono::Duration::days(30),
    )
    .await
    .unwrap()
    {
        Opened::New(request) | Opened::Open(request) => request,
    }
}

/// A whole pass of the erasure kind, hop after hop; the request's row after it.
async fn erase(
    pool: &PgPool,
    paths: &PathSettings,
    settings: &ErasureSettings,
    id: Uuid,
) -> Request {
    run::pass::<Erase>(
        pool,
        paths,
        settings,
        ArgsOf::<Erase>::first(None, pass_start()),
    )
    .await;
    let mut conn = pool.acquire().await.unwrap();
    request::get(&mut conn, id).await.unwrap().unwrap()
}

fn exists(root: &std::path::Path, relative: impl AsRef<std::path::Path>) -> bool {
    root.join(relative).exists()
}

#[sqlx::test]
async fn rq2_a_conversation_goes_with_its_forks_runs_and_delegated_children_and_nothing_else(
    pool: PgPool,
) {
    let dir = tempfile::tempdir().unwrap();
    let (paths, one, other) = two_tenants(&pool, dir.path()).await;
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Conversation, one.conversation).await;
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    assert!(done.verified_at.is_some() && done.scope_id.is_none() && done.account_id.is_none());
    let after = snapshot(&pool).await;
    assert_exactly(
        &before,
        &after,
        &one.conversation_scope(),
        &["usage_records"],
    );
    // The usage record of the erased run stays, its links to the content cleared (RQ-2).
    let (links, kept): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE run_id = ANY($1) OR conversation_id = $2),
                count(*) FILTER (WHERE run_id IS NULL AND conversation_id IS NULL)
         FROM usage_records WHERE account_id = $3",
    )
    .bind(&one.runs)
    .bind(one.conversation)
    .bind(one.account)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((links, kept), (0, 1));
    // The shared fragment stays; the conversation's own goes; the other account is whole.
    let fragments: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM fragments WHERE account_id = $1")
        .bind(one.account)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(fragments, [one.shared_fragment]);
    for run in one.runs.iter().chain([&one.child_run]) {
        assert!(!exists(
            &paths.output_root,
            format!("{}/{run}/out.bin", one.account)
        ));
    }
    assert!(exists(
        &paths.output_root,
        format!("{}/{}/out.bin", one.account, one.other_run)
    ));
    assert!(exists(
        &paths.output_root,
        format!("{}/{}/out.bin", other.account, other.runs[0])
    ));
    // The request's receipt is chained and names the subject only by its keyed hash.
    let verified = receipts::verify(&mut pool.acquire().await.unwrap())
        .await
        .unwrap();
    assert_eq!((verified.receipts, verified.first_bad.is_none()), (1, true));
    let body: String = sqlx::query_scalar("SELECT body::text FROM sexton.receipts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!body.contains(&one.conversation.to_string()), "{body}");
    assert!(body.contains(&ReceiptKey::new(KEY).subject_hash(one.conversation)));
    let members: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.erasure_members")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(members, 0, "nothing of the subject outlives the request");
}

#[sqlx::test]
async fn rq2_a_session_goes_with_its_history_archives_frames_and_traces(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Session, one.session).await;
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    assert_exactly(&before, &snapshot(&pool).await, &one.session_scope(), &[]);
    assert!(!exists(&paths.sessions_root, one.session.to_string()));
    assert!(!exists(&paths.traces_root, &one.session_trace));
    assert!(exists(&paths.sessions_root, one.other_session.to_string()));
    assert!(exists(&paths.traces_root, &one.other_trace));
}

#[sqlx::test]
async fn rq3_a_session_its_agent_points_at_is_withheld_and_the_request_waits(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Session, one.other_session).await;
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Waiting, "{done:?}");
    assert_eq!(done.withheld.0["pointed_at"], 1);
    // Its history goes all the same? No: a withheld session keeps everything under it.
    assert_eq!(before, snapshot(&pool).await);
    assert!(exists(&paths.sessions_root, one.other_session.to_string()));
}

#[sqlx::test]
async fn rq2_an_account_goes_whole_and_its_row_stays_as_the_anchor_of_kept_usage_records(
    pool: PgPool,
) {
    let dir = tempfile::tempdir().unwrap();
    let (paths, one, other) = two_tenants(&pool, dir.path()).await;
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Account, one.account).await;
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    let after = snapshot(&pool).await;
    let mut scope: BTreeSet<Uuid> = [one.account].into_iter().collect();
    scope.extend(one.conversation_scope());
    assert_exactly(&before, &after, &scope, &["usage_records", "accounts"]);
    let name: String = sqlx::query_scalar("SELECT name FROM accounts WHERE id = $1")
        .bind(one.account)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(name, asked.id.to_string());
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM usage_records WHERE account_id = $1
           AND (run_id IS NOT NULL OR conversation_id IS NOT NULL)",
    )
    .bind(one.account)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0);
    for (root, relative) in [
        (&paths.sessions_root, one.session.to_string().into()),
        (&paths.sessions_root, one.other_session.to_string().into()),
        (&paths.traces_root, one.session_trace.clone()),
        (&paths.traces_root, one.other_trace.clone()),
        (&paths.attachments_root, one.attachment_file.clone()),
    ] {
        assert!(!exists(root, &relative), "{} is left", relative.display());
    }
    assert!(exists(&paths.attachments_root, &other.attachment_file));
    assert!(exists(&paths.traces_root, &other.session_trace));
    assert_eq!(done.removed.0["files:attachments"], 1);
}

#[sqlx::test]
async fn rq2_an_agent_goes_with_its_sessions_pinned_records_memories_of_every_revision_and_traces(
    pool: PgPool,
) {
    let dir = tempfile::tempdir().unwrap();
    let (paths, one, other) = two_tenants(&pool, dir.path()).await;
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Agent, one.agent).await;
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    // Its main session goes with it: the agent that points at it is erased too (RQ-3).
    let scope: BTreeSet<Uuid> = [one.agent].into_iter().collect();
    assert_exactly(&before, &snapshot(&pool).await, &scope, &[]);
    for (root, relative) in [
        (&paths.sessions_root, one.session.to_string().into()),
        (&paths.sessions_root, one.other_session.to_string().into()),
        (&paths.traces_root, one.session_trace.clone()),
        (&paths.traces_root, one.other_trace.clone()),
    ] {
        assert!(!exists(root, &relative), "{} is left", relative.display());
    }
    assert!(exists(&paths.traces_root, &other.other_trace));
    assert!(exists(
        &paths.sessions_root,
        other.other_session.to_string()
    ));
}
