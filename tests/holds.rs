//! Holds (SPEC §9): whatever a hold covers stays whatever a window says, in every job kind and
//! for its files (HD-2, HD-3), with what lies beside it going as before; a hold placed while a
//! hop waits on the owner's lock wins; a file whose rows went before the hold stays until its
//! release; the store refuses a hand-written DELETE (HD-4); an unreadable hold table removes
//! nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sexton_jobs::attachment_expiry::{AttachmentExpiry, AttachmentSettings};
use sexton_jobs::files::Store;
use sexton_jobs::job::{Job, Reason, Report};
use sexton_jobs::prune_execution_details::{Args, PruneExecutionDetails, RetainReason};
use sexton_jobs::record_expiry::{
    self as expiry, ConversationEvents, DreamPreloads, Expire, ExpirySettings, Handoffs,
    WorkingRecords,
};
use sexton_jobs::session_retention::{self as sessions, Policy, SessionRetention};
use sexton_jobs::trace_cleanup::{self as traces, Limits, Quiet};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, days_before_pass, pass_start};
use crate::common::hops::{Env, retained};
use crate::common::{self, run};

/// A hold on `scope` `id`, as `sexton holds place` writes it.
async fn hold(pool: &PgPool, scope: &str, id: Uuid) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO sexton.holds (scope, scope_id, case_ref, reason, placed_by)
         VALUES ($1, $2, 'CASE-7', 'litigation', 'legal@example') RETURNING id",
    )
    .bind(scope)
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn release(pool: &PgPool, hold: Uuid) {
    sqlx::query(
        "UPDATE sexton.holds SET released_by = 'legal@example', released_at = now() WHERE id = $1",
    )
    .bind(hold)
    .execute(pool)
    .await
    .unwrap();
}

pub(crate) fn set_mtime(path: &Path, days: f64) {
    let at = pass_start() - chrono::Duration::seconds((days * 86_400.0) as i64);
    common::fixture::set_mtime(path, at);
}

#[sqlx::test]
async fn hd2_a_run_conversation_or_account_hold_keeps_its_runs_and_files_the_others_go(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let (c1, c2) = (
        fixture::conversation(&env.pool, account).await,
        fixture::conversation(&env.pool, account).await,
    );
    let held_run = env.run(RunSpec::conversation(account, c1, 50.0)).await;
    let beside = env.run(RunSpec::conversation(account, c1, 51.0)).await;
    let of_held_conversation = env.run(RunSpec::conversation(account, c2, 52.0)).await;
    let other = fixture::account(&env.pool, Some(30)).await;
    let other_conversation = fixture::conversation(&env.pool, other).await;
    let of_held_account = env
        .run(RunSpec::conversation(other, other_conversation, 50.0))
        .await;
    hold(&env.pool, "run", held_run.id).await;
    hold(&env.pool, "conversation", c2).await;
    hold(&env.pool, "account", other).await;

    let reports = env.pass(account).await;
    let others = env.pass(other).await;

    for (owner, of) in [
        (held_run.id, account),
        (of_held_conversation.id, account),
        (of_held_account.id, other),
    ] {
        assert!(fixture::has_detail(&env.pool, owner).await, "{owner} kept");
        assert!(!fixture::is_pruned(&env.pool, owner).await);
        assert!(env.output_file(of, owner).exists(), "its output file stays");
    }
    assert!(
        fixture::is_pruned(&env.pool, beside.id).await,
        "the run beside goes"
    );
    assert!(!env.output_file(account, beside.id).exists());
    assert_eq!(retained(&reports, RetainReason::LegalHold), 2);
    assert_eq!(retained(&others, RetainReason::LegalHold), 1);
    // explain and preview say why (HD-5).
    let explained = run::explain::<PruneExecutionDetails>(
        &env.pool,
        &env.settings,
        env.dir.path(),
        pass_start(),
        "run",
        &held_run.id.to_string(),
    )
    .await
    .unwrap();
    let hold_reason = explained.reasons.iter().find(|r| r.code == "legal_hold");
    assert!(
        hold_reason.is_some_and(|r| r.detail.contains("CASE-7") && r.detail.contains("legal@")),
        "{explained:?}"
    );
    let preview = env.preview(pass_start(), Some(&[account])).await;
    assert_eq!(preview[0].retained.get(&RetainReason::LegalHold), Some(&2));
}

#[sqlx::test]
async fn hd3_overlapping_holds_keep_a_run_until_the_last_is_released(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    let first = hold(&env.pool, "run", run.id).await;
    let second = hold(&env.pool, "conversation", conversation).await;

    release(&env.pool, first).await;
    env.pass(account).await;
    assert!(
        fixture::has_detail(&env.pool, run.id).await,
        "still held by the second"
    );

    release(&env.pool, second).await;
    env.pass(account).await;
    assert!(
        fixture::is_pruned(&env.pool, run.id).await,
        "free on the next pass"
    );
    assert!(!env.output_file(account, run.id).exists());
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.holds")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(kept, 2, "released holds stay as the record (HD-1)");
}

#[sqlx::test]
async fn hd3_a_hold_placed_while_the_hop_waits_on_the_owners_lock_wins(pool: PgPool) {
    let mut env = Env::new(pool).await;
    env.settings.owner_lock_timeout = Duration::from_secs(30);
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    let beside = env
        .run(RunSpec::conversation(account, conversation, 51.0))
        .await;
    // The platform's writer holds the conversation; the hop queues behind it; the hold is
    // committed meanwhile, then the writer lets go.
    let mut writer = env.pool.begin().await.unwrap();
    fixture::lock_conversation(&mut writer, conversation).await;
    let hop = env.spawn_hop(Args::first(Some(account), pass_start()));
    common::wait_for_lock_waiter(&env.pool, "conversations").await;
    hold(&env.pool, "run", run.id).await;
    writer.commit().await.unwrap();

    let report = hop.await.unwrap();
    assert_eq!(report.retained(RetainReason::LegalHold), 1);
    assert!(fixture::has_detail(&env.pool, run.id).await);
    assert!(env.output_file(account, run.id).exists());
    assert!(
        fixture::is_pruned(&env.pool, beside.id).await,
        "the run beside it, waited for behind the same lock, goes"
    );
}

#[sqlx::test]
async fn hd3_a_file_whose_rows_went_before_the_hold_stays_with_its_record_until_release(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let young = env
        .run(RunSpec::conversation(account, conversation, 5.0))
        .await;
    let gone = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    // The rows went and the file was recorded, as by a hop that died before its drain.
    let file = env.output_file(account, gone.id);
    sqlx::query(
        "INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path, run_ids)
         VALUES ('outputs', $1, $2, ARRAY[$3]::uuid[])",
    )
    .bind(account)
    .bind(format!("{account}/{}/out.bin", gone.id))
    .bind(gone.id)
    .execute(&env.pool)
    .await
    .unwrap();
    let held = hold(&env.pool, "run", gone.id).await;
    let pending = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sexton.pending_file_deletions")
            .fetch_one(&env.pool)
            .await
            .unwrap()
    };

    env.pass(account).await;
    assert!(file.exists(), "a held owner's file stays");
    assert_eq!(pending().await, 1, "with its record");
    assert!(env.output_file(account, young.id).exists());

    release(&env.pool, held).await;
    env.pass(account).await;
    assert!(!file.exists(), "released: the next drain removes it");
    assert_eq!(pending().await, 0);
}

/// An account with an enabled session policy (main sessions go after 60 days).
pub(crate) async fn with_policy(pool: &PgPool) -> Uuid {
    let account = fixture::account(pool, Some(90)).await;
    sqlx::query(
        "INSERT INTO session_retention_policies (account_id, enabled, main_days, task_days,
                                                 subagent_days) VALUES ($1, true, 60, 30, 7)",
    )
    .bind(account)
    .execute(pool)
    .await
    .unwrap();
    account
}

/// An idle main session of `agent`, 100 days old, with a frame under `root`.
async fn old_session(pool: &PgPool, root: &Path, account: Uuid, agent: Uuid) -> (Uuid, PathBuf) {
    let session = fixture::session(pool, account, agent, "main", 100, None).await;
    let dir = root.join(session.to_string());
    std::fs::create_dir_all(dir.join("archive")).unwrap();
    std::fs::write(dir.join("archive/frame-1.json"), b"{}").unwrap();
    (session, dir)
}

async fn exists(pool: &PgPool, table: &str, id: Uuid) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM {table} WHERE id = $1)"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn hd2_a_session_agent_or_account_hold_keeps_its_sessions_and_frames_the_others_go(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let paths = run::roots(dir.path());
    let settings = sessions::HopSettings {
        window_size: 10,
        sessions_per_transaction: 2,
        transaction_target: Duration::from_millis(50),
        budget: Duration::from_secs(600),
        lock_timeout: Duration::from_millis(200),
        policy: Policy::Persisted,
    };
    let account = with_policy(&pool).await;
    let (agent, held_agent) = (
        fixture::agent(&pool, account).await,
        fixture::agent(&pool, account).await,
    );
    let (held_session, held_frames) =
        old_session(&pool, &paths.sessions_root, account, agent).await;
    let (beside, beside_frames) = old_session(&pool, &paths.sessions_root, account, agent).await;
    let (of_agent, of_agent_frames) =
        old_session(&pool, &paths.sessions_root, account, held_agent).await;
    let other = with_policy(&pool).await;
    let other_agent = fixture::agent(&pool, other).await;
    let (of_account, of_account_frames) =
        old_session(&pool, &paths.sessions_root, other, other_agent).await;
    hold(&pool, "session", held_session).await;
    hold(&pool, "agent", held_agent).await;
    hold(&pool, "account", other).await;

    let mut reports = Vec::new();
    for account in [account, other] {
        let first = sessions::Args::first(Some(account), pass_start());
        reports.extend(run::pass::<SessionRetention>(&pool, &paths, &settings, first).await);
    }

    for (session, frames) in [
        (held_session, &held_frames),
        (of_agent, &of_agent_frames),
        (of_account, &of_account_frames),
    ] {
        assert!(exists(&pool, "sessions", session).await, "{session} kept");
        assert!(
            frames.join("archive/frame-1.json").exists(),
            "its frames stay"
        );
    }
    assert!(
        !exists(&pool, "sessions", beside).await,
        "the session beside goes"
    );
    assert!(!beside_frames.exists());
    let held: u64 = held_in(reports);
    assert_eq!(held, 3);
    let explained = run::explain::<SessionRetention>(
        &pool,
        &settings,
        dir.path(),
        pass_start(),
        "session",
        &of_agent.to_string(),
    )
    .await
    .unwrap();
    assert!(
        explained
            .reasons
            .iter()
            .any(|r| r.code == "legal_hold" && r.detail.contains(&held_agent.to_string())),
        "{explained:?}"
    );
}

/// Owners the hops of a pass retained under a hold.
fn held_in<J: Job>(reports: Vec<run::Hopped<J>>) -> u64 {
    reports
        .iter()
        .map(|hopped| held_count(&hopped.report))
        .sum()
}

fn held_count<R: Reason>(report: &Report<R>) -> u64 {
    report
        .retained_by_label()
        .into_iter()
        .filter(|(reason, _)| *reason == "legal_hold")
        .map(|(_, n)| n)
        .sum()
}

#[sqlx::test]
async fn hd4_a_hand_written_delete_of_a_held_session_is_refused_naming_the_hold(pool: PgPool) {
    common::migrate(&pool).await;
    let account = fixture::account(&pool, Some(90)).await;
    let agent = fixture::agent(&pool, account).await;
    let held = fixture::session(&pool, account, agent, "main", 100, None).await;
    let free = fixture::session(&pool, account, agent, "main", 100, None).await;
    let other_agent = fixture::agent(&pool, account).await;
    let by_agent = fixture::session(&pool, account, other_agent, "main", 100, None).await;
    let on_session = hold(&pool, "session", held).await;
    let on_agent = hold(&pool, "agent", other_agent).await;

    for (session, hold) in [(held, on_session), (by_agent, on_agent)] {
        let err = sqlx::query("DELETE FROM sessions WHERE id = $1")
            .bind(session)
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&hold.to_string()), "{err}");
        assert!(exists(&pool, "sessions", session).await);
    }
    sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(free)
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        !exists(&pool, "sessions", free).await,
        "an unheld session still can be"
    );
}

/// An old row of `table` (of `agent`, naming `session`), `created_at` 100 days back.
async fn old_record(pool: &PgPool, table: &str, account: Uuid, agent: Uuid) -> Uuid {
    let age = if table == "working_records" {
        "updated_at"
    } else {
        "created_at"
    };
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (account_id, agent_id, {age}) VALUES ($1, $2, $3) RETURNING id"
    )))
    .bind(account)
    .bind(agent)
    .bind(days_before_pass(100.0))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn hd2_agent_session_and_conversation_holds_keep_their_short_lived_records(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let account = fixture::account(&pool, Some(90)).await;
    let (held_agent, agent) = (
        fixture::agent(&pool, account).await,
        fixture::agent(&pool, account).await,
    );
    let held_session = fixture::session(&pool, account, agent, "main", 0, None).await;
    let mut kept = Vec::new();
    let mut gone = Vec::new();
    for table in ["handoffs", "dream_preloads", "working_records"] {
        kept.push((table, old_record(&pool, table, account, held_agent).await));
        gone.push((table, old_record(&pool, table, account, agent).await));
    }
    let naming = old_record(&pool, "handoffs", account, agent).await;
    sqlx::query("UPDATE handoffs SET to_session_id = $1 WHERE id = $2")
        .bind(held_session)
        .bind(naming)
        .execute(&pool)
        .await
        .unwrap();
    kept.push(("handoffs", naming));
    let (held_conversation, conversation) = (
        fixture::conversation(&pool, account).await,
        fixture::conversation(&pool, account).await,
    );
    let event = |conversation: Uuid| {
        sqlx::query_scalar::<_, i64>(
            "INSERT INTO conversation_events (conversation_id, created_at) VALUES ($1, $2)
             RETURNING id",
        )
        .bind(conversation)
        .bind(days_before_pass(100.0))
        .fetch_one(&pool)
    };
    let (kept_event, gone_event) = (
        event(held_conversation).await.unwrap(),
        event(conversation).await.unwrap(),
    );
    hold(&pool, "agent", held_agent).await;
    hold(&pool, "session", held_session).await;
    hold(&pool, "conversation", held_conversation).await;

    let expiry: &ExpirySettings = settings.jobs.get(Expire::<Handoffs>::NAME);
    let first = expiry::Args::first(None, pass_start());
    let paths = &settings.paths;
    let held = [
        held_in(run::pass::<Expire<Handoffs>>(&pool, paths, expiry, first.clone()).await),
        held_in(run::pass::<Expire<DreamPreloads>>(&pool, paths, expiry, first.clone()).await),
        held_in(run::pass::<Expire<WorkingRecords>>(&pool, paths, expiry, first.clone()).await),
        held_in(run::pass::<Expire<ConversationEvents>>(&pool, paths, expiry, first).await),
    ]
    .iter()
    .sum::<u64>();

    for (table, id) in &kept {
        assert!(exists(&pool, table, *id).await, "{table} {id} kept");
    }
    for (table, id) in &gone {
        assert!(!exists(&pool, table, *id).await, "{table} {id} goes");
    }
    let events: Vec<i64> = sqlx::query_scalar("SELECT id FROM conversation_events ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        events,
        [kept_event],
        "the held conversation's event stays, {gone_event} goes"
    );
    assert_eq!(held, 5);
}

#[sqlx::test]
async fn hd2_an_account_hold_keeps_its_attachment_bytes_another_accounts_go(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let paths = run::roots(dir.path());
    let settings = AttachmentSettings {
        max_age_days: 30,
        window_size: 100,
        budget: Duration::from_secs(600),
    };
    let mut files = Vec::new();
    for name in ["held", "free"] {
        let account = fixture::account(&pool, Some(90)).await;
        let relative = format!("{name}/report.pdf");
        let path = paths.attachments_root.join(&relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"bytes").unwrap();
        set_mtime(&path, 100.0);
        sqlx::query(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             VALUES ($1, $2, 5, $3)",
        )
        .bind(account)
        .bind(&relative)
        .bind(days_before_pass(100.0))
        .execute(&pool)
        .await
        .unwrap();
        files.push((account, path));
    }
    hold(&pool, "account", files[0].0).await;

    let mut held = 0;
    for (account, _) in &files {
        let first = sexton_jobs::attachment_expiry::Args::first(Some(*account), pass_start());
        let reports = run::pass::<AttachmentExpiry>(&pool, &paths, &settings, first).await;
        held += held_in(reports);
    }

    assert!(files[0].1.exists(), "the held account's bytes stay");
    assert!(!files[1].1.exists(), "the other account's go");
    assert_eq!(held, 1);
    let live: i64 =
        sqlx::query_scalar("SELECT count(*) FROM attachments WHERE bytes_expired_at IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(live, 1);
}

/// A trace of `agent`'s `session` under `root`, 100 days old.
pub(crate) fn old_trace(root: &Path, agent: Uuid, session: Uuid) -> PathBuf {
    let path = root
        .join(agent.to_string())
        .join(format!("{session}.trace.jsonl"));
    let signature = serde_json::json!({
        "format": "run-trace/1", "agent_id": agent.to_string(), "session_id": session.to_string()
    });
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, format!("{signature}\nbody\n")).unwrap();
    set_mtime(&path, 100.0);
    path
}

#[sqlx::test]
async fn hd2_agent_and_session_holds_keep_their_traces_the_others_go(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("traces");
    let account = fixture::account(&pool, Some(90)).await;
    let (held_agent, agent) = (
        fixture::agent(&pool, account).await,
        fixture::agent(&pool, account).await,
    );
    let held_session = fixture::session(&pool, account, agent, "main", 100, None).await;
    let of_agent = old_trace(&root, held_agent, Uuid::new_v4());
    let of_session = old_trace(&root, agent, held_session);
    let beside = old_trace(&root, agent, Uuid::new_v4());
    hold(&pool, "agent", held_agent).await;
    hold(&pool, "session", held_session).await;

    let report = clean_traces(&pool, &root).await;

    assert!(of_agent.exists() && of_session.exists(), "held traces stay");
    assert!(!beside.exists(), "the trace beside goes");
    assert_eq!(report.kept.get("legal_hold"), Some(&2));
}

#[sqlx::test]
async fn hd3_an_unreadable_hold_table_removes_nothing_and_fails_the_hop(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let run = env
        .run(RunSpec::conversation(account, conversation, 50.0))
        .await;
    // A role that may do everything the job does but read the holds.
    let role = format!("sexton_noholds_{}", Uuid::new_v4().simple());
    for statement in [
        format!("CREATE ROLE {role}"),
        format!("GRANT USAGE ON SCHEMA public, sexton TO {role}"),
        format!("GRANT ALL ON ALL TABLES IN SCHEMA public, sexton TO {role}"),
        format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA public, sexton TO {role}"),
        format!("REVOKE ALL ON sexton.holds FROM {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&env.pool)
            .await
            .unwrap();
    }
    let options = (*env.pool.connect_options()).clone();
    let set_role = format!("SET ROLE {role}");
    let limited = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let set_role = set_role.clone();
            Box::pin(async move {
                sqlx::query(sqlx::AssertSqlSafe(set_role))
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect_with(options)
        .await
        .unwrap();

    let result = common::hops::try_hop_at(
        &limited,
        &env.clock,
        &env.paths(),
        &env.settings,
        &Args::first(Some(account), pass_start()),
    )
    .await;

    let err = result.expect_err("the hop fails");
    assert!(err.to_string().contains("holds"), "{err}");
    assert!(
        sexton_jobs::job::refused(&err),
        "failed for good, not retried: {err}"
    );
    assert!(
        fixture::has_detail(&env.pool, run.id).await,
        "nothing removed"
    );
    assert!(env.output_file(account, run.id).exists());
    limited.close().await;
    // Control: the same pass, by a role that reads the holds, prunes it.
    env.pass(account).await;
    assert!(fixture::is_pruned(&env.pool, run.id).await);
}

/// One confirmed trace cleaning of `root` by age (30 days) at the pass start.
pub(crate) async fn clean_traces(pool: &PgPool, root: &Path) -> traces::TraceReport {
    clean_traces_in(pool, &Store::Local(root.to_owned()))
        .await
        .unwrap()
}

/// One confirmed trace cleaning of `store` by age (30 days) at the pass start, under a lease
/// taken for it and released after.
pub(crate) async fn clean_traces_in(
    pool: &PgPool,
    store: &Store,
) -> Result<traces::TraceReport, traces::Error> {
    let mut conn = pool.acquire().await.unwrap();
    let mut lease = traces::Lease::take(&mut conn, store, "the test")
        .await
        .unwrap();
    let limits = Limits {
        max_age_days: 30,
        max_bytes: 0,
    };
    let report = traces::clean(
        &mut conn,
        store,
        limits,
        pass_start(),
        Some(&mut lease),
        &mut Quiet,
        &AtomicBool::new(false),
    )
    .await;
    lease.release(&mut conn).await.unwrap();
    report
}
