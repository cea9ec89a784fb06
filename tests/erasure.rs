//! Erasure on request (SPEC §11, RQ-1 … RQ-8) on real PostgreSQL and real files: what goes is
//! exactly the scope's, judged against a snapshot of every row of every table; the rest of the
//! account, and the other account, stay as they were.

mod lanes;
mod process;
mod scale;
mod verification;
mod visible;
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
use world::{Tenant, assert_exactly, drop_foreign_keys, orphans, snapshot};

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

/// Whether a file is at `relative` under `root`, or under it when it is a directory (on an
/// object store's server a removed prefix may leave its empty directories behind).
fn exists(root: &std::path::Path, relative: impl AsRef<std::path::Path>) -> bool {
    fn any_file(path: &std::path::Path) -> bool {
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => std::fs::read_dir(path)
                .unwrap()
                .any(|entry| any_file(&entry.unwrap().path())),
            Ok(_) => true,
            Err(_) => false,
        }
    }
    any_file(&root.join(relative))
}

#[sqlx::test]
async fn rq2_a_conversation_goes_with_its_forks_runs_and_delegated_children_and_nothing_else(
    pool: PgPool,
) {
    let dir = common::backend::tempdir();
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
    let dir = common::backend::tempdir();
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
async fn rq3_a_session_its_agent_points_at_is_withheld_until_it_points_elsewhere_and_a_retry(
    pool: PgPool,
) {
    let dir = common::backend::tempdir();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Session, one.other_session).await;
    let waiting = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(waiting.state, State::Waiting, "{waiting:?}");
    assert_eq!(waiting.withheld.0["pointed_at"], 1);
    // A withheld session keeps everything under it: its history, its directory, its trace.
    assert_eq!(before, snapshot(&pool).await);
    assert!(exists(&paths.sessions_root, one.other_session.to_string()));
    assert!(exists(&paths.traces_root, &one.other_trace));
    // The agent moves on to another session; retried, the request completes.
    sqlx::query("UPDATE agents SET main_session_id = $2 WHERE id = $1")
        .bind(one.agent)
        .bind(one.session)
        .execute(&pool)
        .await
        .unwrap();
    request::retry(&mut pool.acquire().await.unwrap(), asked.id)
        .await
        .unwrap()
        .unwrap();
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    assert!(!exists(&paths.sessions_root, one.other_session.to_string()));
    assert!(!exists(&paths.traces_root, &one.other_trace));
    assert!(exists(&paths.sessions_root, one.session.to_string()));
}

#[sqlx::test]
async fn rq2_a_file_another_row_still_names_under_another_spelling_stays(pool: PgPool) {
    let dir = common::backend::tempdir();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    // The other conversation's run names the erased run's output file too, spelled otherwise.
    let shared = format!("{}/{}/out.bin", one.account, one.runs[0]);
    sqlx::query("INSERT INTO output_files (run_id, relative_path) VALUES ($1, $2)")
        .bind(one.other_run)
        .bind(format!("./{}//{}/out.bin", one.account, one.runs[0]))
        .execute(&pool)
        .await
        .unwrap();
    let asked = request(&pool, Subject::Conversation, one.conversation).await;
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    assert!(
        exists(&paths.output_root, &shared),
        "a file another row names stays"
    );
    // The control: the erased runs' own files went.
    assert!(!exists(
        &paths.output_root,
        format!("{}/{}/out.bin", one.account, one.runs[1])
    ));
}

#[sqlx::test]
async fn rq2_an_account_goes_whole_and_its_row_stays_as_the_anchor_of_kept_usage_records(
    pool: PgPool,
) {
    let dir = common::backend::tempdir();
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
    let dir = common::backend::tempdir();
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

#[sqlx::test]
async fn rq2_an_account_erased_on_a_schema_without_foreign_keys_leaves_nothing_orphaned(
    pool: PgPool,
) {
    let dir = common::backend::tempdir();
    let (paths, one, other) = two_tenants(&pool, dir.path()).await;
    drop_foreign_keys(&pool).await;
    assert_eq!(orphans(&pool).await, []);
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Account, one.account).await;
    let done = erase(&pool, &paths, &settings(false), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    let scope: BTreeSet<Uuid> = [one.account].into_iter().collect();
    assert_exactly(&before, &snapshot(&pool).await, &scope, &[]);
    assert_eq!(orphans(&pool).await, [], "nothing orphaned");
    assert!(exists(&paths.attachments_root, &other.attachment_file));
}

#[sqlx::test]
async fn rq2_usage_records_go_too_and_so_does_the_account_row_when_they_are_not_kept(pool: PgPool) {
    let dir = common::backend::tempdir();
    let (paths, one, other) = two_tenants(&pool, dir.path()).await;
    let before = snapshot(&pool).await;
    let asked = request(&pool, Subject::Account, one.account).await;
    let done = erase(&pool, &paths, &settings(false), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    // Not kept: the account's usage records and its row go like everything else of it.
    let scope: BTreeSet<Uuid> = [one.account].into_iter().collect();
    assert_exactly(&before, &snapshot(&pool).await, &scope, &[]);
    assert!(done.kept.0.is_empty(), "{:?}", done.kept);
    let theirs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM usage_records WHERE account_id = $1")
            .bind(other.account)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(theirs, 2, "the other account's usage records stay");
}

#[sqlx::test]
async fn rq3_a_running_run_is_withheld_and_goes_once_it_ends_and_the_request_is_retried(
    pool: PgPool,
) {
    let dir = common::backend::tempdir();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    sqlx::query("UPDATE runs SET status = 'running' WHERE id = $1")
        .bind(one.runs[1])
        .execute(&pool)
        .await
        .unwrap();
    let asked = request(&pool, Subject::Conversation, one.conversation).await;
    let waiting = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(waiting.state, State::Waiting, "{waiting:?}");
    // The running run and its conversation stay; the other runs went.
    assert_eq!(waiting.withheld.0["in_flight"], 1);
    assert_eq!(waiting.withheld.0["withheld_child"], 1);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM runs WHERE id = ANY($1)")
        .bind(&one.runs)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [one.runs[1]]);
    // Not yet due: a pass now leaves it waiting.
    let still = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!((still.state, still.passes), (State::Waiting, 1));
    sqlx::query("UPDATE runs SET status = 'completed' WHERE id = $1")
        .bind(one.runs[1])
        .execute(&pool)
        .await
        .unwrap();
    request::retry(&mut pool.acquire().await.unwrap(), asked.id)
        .await
        .unwrap()
        .unwrap();
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!((done.state, done.passes), (State::Completed, 2), "{done:?}");
    assert!(done.withheld.0.is_empty());
}

#[sqlx::test]
async fn rq4_a_hold_keeps_what_it_covers_the_rest_goes_and_its_release_resumes_the_request(
    pool: PgPool,
) {
    let dir = common::backend::tempdir();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    let hold = sexton::holds::place(
        &pool,
        sexton::holds::Scope::Conversation,
        one.other_conversation,
        "LIT-7",
        "litigation",
        "legal",
    )
    .await
    .unwrap();
    let kept = snapshot_of_conversation(&pool, one.other_conversation).await;
    let asked = request(&pool, Subject::Account, one.account).await;
    let waiting = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(waiting.state, State::Waiting, "{waiting:?}");
    assert!(
        waiting.withheld.0.contains_key("legal_hold"),
        "{:?}",
        waiting.withheld
    );
    let named = waiting
        .withheld_items
        .0
        .iter()
        .any(|item| item["hold"] == hold.placed.id.to_string() && item["case_ref"] == "LIT-7");
    assert!(
        named,
        "the hold is named with its case: {:?}",
        waiting.withheld_items
    );
    assert_eq!(
        snapshot_of_conversation(&pool, one.other_conversation).await,
        kept
    );
    // Everything the hold does not cover went: the agent, its sessions, the other conversation.
    for (table, id) in [
        ("agents", one.agent),
        ("sessions", one.session),
        ("conversations", one.conversation),
    ] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE id = $1"
        )))
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(n, 0, "{table} {id} is left");
    }
    sexton::holds::release(&pool, hold.placed.id, "legal")
        .await
        .unwrap();
    assert_eq!(request::resume_waiting(&pool).await.unwrap(), 1);
    let done = erase(&pool, &paths, &settings(true), asked.id).await;
    assert_eq!(done.state, State::Completed, "{done:?}");
    assert_eq!(
        snapshot_of_conversation(&pool, one.other_conversation)
            .await
            .len(),
        0
    );
}

/// The rows of a conversation and of its runs.
async fn snapshot_of_conversation(pool: &PgPool, conversation: Uuid) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT to_jsonb(c)::text FROM conversations c WHERE c.id = $1
         UNION ALL SELECT to_jsonb(r)::text FROM runs r WHERE r.conversation_id = $1
         UNION ALL SELECT to_jsonb(t)::text FROM tool_results t
                   JOIN runs r ON r.id = t.run_id WHERE r.conversation_id = $1
         UNION ALL SELECT to_jsonb(t)::text FROM turns t WHERE t.conversation_id = $1
         ORDER BY 1",
    )
    .bind(conversation)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn rq5_a_residue_planted_before_the_verification_sends_the_request_back_and_is_counted(
    pool: PgPool,
) {
    let dir = common::backend::tempdir();
    let (paths, one, _other) = two_tenants(&pool, dir.path()).await;
    let asked = request(&pool, Subject::Session, one.session).await;
    // One step per hop: the test sees the pass between its drains and its verification.
    let settings = ErasureSettings {
        budget: std::time::Duration::ZERO,
        ..settings(true)
    };
    let directory = paths.sessions_root.join(one.session.to_string());
    let mut args = ArgsOf::<Erase>::first(None, pass_start());
    let mut planted = 0;
    loop {
        let hopped = run::hop_with::<Erase>(
            &pool,
            &paths,
            &sexton_jobs::health::Health::off(),
            &settings,
            &args,
        )
        .await;
        let state: State = sqlx::query_scalar("SELECT state FROM sexton.erasures WHERE id = $1")
            .bind(asked.id)
            .fetch_one(&pool)
            .await
            .unwrap();
        if planted == 0
            && state == State::Running
            && !exists(&paths.sessions_root, one.session.to_string())
        {
            // Drained: the next step is the verification. A frame written back by hand.
            std::fs::create_dir_all(directory.join("archive")).unwrap();
            std::fs::write(directory.join("archive/late.frame"), b"late").unwrap();
            planted += 1;
        }
        match hopped.next {
            Some(next) => args = next,
            None => break,
        }
    }
    assert_eq!(
        planted, 1,
        "the window between the drain and the verification was hit"
    );
    let done = request::get(&mut pool.acquire().await.unwrap(), asked.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (done.state, done.residues, done.passes),
        (State::Completed, 1, 2),
        "{done:?}"
    );
    assert!(
        !exists(&paths.sessions_root, one.session.to_string()),
        "the residue went with the request's second pass"
    );
    assert!(exists(&paths.sessions_root, one.other_session.to_string()));
}
