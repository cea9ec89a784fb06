//! SessionRetention (SPEC §3): SS-1 … SS-6 against a real PostgreSQL, and a SIGKILL audit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::SeedableRng;
use serde_json::{Value, json};
use sexton_jobs::files;
use sexton_jobs::health::Health;
use sexton_jobs::session_retention::{self as job, Args, HopSettings, Policy, SessionRetention};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, days_before_pass, pass_start};

/// What one hop of SessionRetention did, and where its pass goes on.
type Hopped = common::run::Hopped<SessionRetention>;

struct Env {
    pool: PgPool,
    dir: tempfile::TempDir,
    /// Where the sessions' directories are on disk (on the object backend, the server's files).
    frames_root: PathBuf,
    /// The file roots the hops are given.
    paths: sexton_jobs::files::PathSettings,
    settings: HopSettings,
}

impl Env {
    async fn new(pool: PgPool) -> Self {
        common::migrate(&pool).await;
        let dir = common::backend::tempdir();
        let frames_root = dir.path().join("sessions");
        let settings = HopSettings {
            window_size: 4,
            sessions_per_transaction: 2,
            transaction_target: Duration::from_millis(50),
            budget: Duration::from_secs(600),
            lock_timeout: Duration::from_millis(200),
            policy: Policy::Persisted,
        };
        std::fs::create_dir_all(&frames_root).unwrap();
        Self {
            pool,
            paths: common::backend::paths(dir.path()),
            dir,
            frames_root,
            settings,
        }
    }

    /// The preview of `accounts` (every account when `None`) at `now`.
    async fn preview(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        accounts: Option<&[Uuid]>,
    ) -> Vec<job::Preview> {
        common::run::preview::<job::SessionRetention>(
            &self.pool,
            &self.settings,
            self.dir.path(),
            now,
            accounts,
        )
        .await
    }

    fn frames(&self, session: Uuid) -> PathBuf {
        self.frames_root.join(session.to_string())
    }

    /// A whole pass for one account under `policy`; every hop's report.
    async fn pass(&self, account: Uuid, policy: Policy) -> Vec<Hopped> {
        let settings = HopSettings {
            policy,
            ..self.settings.clone()
        };
        let args = Args::first(Some(account), pass_start());
        common::run::pass_with::<SessionRetention>(
            &self.pool,
            &self.paths,
            &Health::off(),
            &settings,
            args,
        )
        .await
    }

    async fn nightly(&self, account: Uuid) -> Vec<Hopped> {
        self.pass(account, Policy::Persisted).await
    }

    async fn agent(&self, account: Uuid) -> Uuid {
        sqlx::query_scalar("INSERT INTO agents (account_id, name) VALUES ($1, 'a') RETURNING id")
            .bind(account)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// A session idle for `days` before the pass, with three entries, an archive of two
    /// entries and a frame file on disk.
    async fn session(&self, spec: Session) -> Uuid {
        insert_session(&self.pool, &self.frames_root, spec).await
    }

    async fn policy(&self, account: Uuid, enabled: bool, ages: [Option<i32>; 3]) {
        sqlx::query(
            "INSERT INTO session_retention_policies (account_id, enabled, main_days, task_days, subagent_days)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(account)
        .bind(enabled)
        .bind(ages[0])
        .bind(ages[1])
        .bind(ages[2])
        .execute(&self.pool)
        .await
        .unwrap();
    }

    async fn board_task(&self, account: Uuid, status: &str, terminal: bool) -> Uuid {
        sqlx::query_scalar(
            "INSERT INTO board_tasks (account_id, status, terminal_at)
             VALUES ($1, $2, CASE WHEN $3 THEN now() END) RETURNING id",
        )
        .bind(account)
        .bind(status)
        .bind(terminal)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Points `agent`'s `pointer` (current_session_id, main_session_id, default_session_id) at
    /// `session`, committed.
    async fn point(&self, agent: Uuid, pointer: &str, session: Uuid) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE agents SET {pointer} = $1 WHERE id = $2"
        )))
        .bind(session)
        .bind(agent)
        .execute(&self.pool)
        .await
        .unwrap();
    }

    async fn exists(&self, session: Uuid) -> bool {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $1)")
            .bind(session)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

#[derive(Debug, Clone)]
struct Session {
    account: Uuid,
    agent: Uuid,
    kind: &'static str,
    state: &'static str,
    metadata: Value,
    days: f64,
}

fn session(account: Uuid, agent: Uuid, kind: &'static str, days: f64) -> Session {
    let metadata = match kind {
        "subagent" => json!({"completed_at": "2026-01-01T00:00:00Z"}),
        _ => json!({}),
    };
    Session {
        account,
        agent,
        kind,
        state: "idle",
        metadata,
        days,
    }
}

async fn insert_session(pool: &PgPool, sessions_root: &Path, spec: Session) -> Uuid {
    let id: Uuid = sqlx::query_scalar(
        "INSERT INTO sessions (account_id, agent_id, kind, state, metadata, last_activity_at, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $6 - interval '1 day') RETURNING id",
    )
    .bind(spec.account)
    .bind(spec.agent)
    .bind(spec.kind)
    .bind(spec.state)
    .bind(&spec.metadata)
    .bind(days_before_pass(spec.days))
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO conversation_entries (session_id, entry_id, seq, payload)
         SELECT $1, 'e' || g, g, '{\"text\":\"hi\"}'::json FROM generate_series(1, 3) g",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "WITH a AS (INSERT INTO conversation_archives (session_id, kind, generation)
                    VALUES ($1, 'compaction', 1) RETURNING id)
         INSERT INTO conversation_archive_entries (archive_id, entry_id, seq, payload)
         SELECT a.id, 'e' || g, g, '{\"text\":\"old\"}'::json FROM a, generate_series(1, 2) g",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    let archive = sessions_root.join(format!("{id}/archive"));
    std::fs::create_dir_all(&archive).unwrap();
    std::fs::write(archive.join("compaction-op1.frame"), b"frame").unwrap();
    id
}

/// Rows of the session's history: live entries, archives, archive entries.
async fn history(pool: &PgPool, session: Uuid) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM conversation_entries WHERE session_id = $1),
                (SELECT count(*) FROM conversation_archives WHERE session_id = $1),
                (SELECT count(*) FROM conversation_archive_entries e
                 JOIN conversation_archives a ON a.id = e.archive_id WHERE a.session_id = $1)",
    )
    .bind(session)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn retained(reports: &[Hopped], reason: &str) -> u64 {
    reports
        .iter()
        .flat_map(|r| r.retained_by_label())
        .filter(|(r, _)| *r == reason)
        .map(|(_, n)| n)
        .sum()
}

fn deleted(reports: &[Hopped]) -> u64 {
    reports.iter().map(|r| r.pruned).sum()
}

#[sqlx::test]
async fn ss1_a_missing_or_disabled_policy_prunes_nothing(pool: PgPool) {
    let env = Env::new(pool).await;
    let mut kept = Vec::new();
    for policy in [None, Some(false)] {
        let account = fixture::account(&env.pool, Some(30)).await;
        if let Some(enabled) = policy {
            env.policy(account, enabled, [Some(1), Some(1), Some(1)])
                .await;
        }
        let agent = env.agent(account).await;
        let old = env.session(session(account, agent, "main", 400.0)).await;
        let reports = env.nightly(account).await;
        assert_eq!(reports[0].outcome, job::HopOutcome::Disabled);
        kept.push(old);
    }
    let control = fixture::account(&env.pool, Some(30)).await;
    env.policy(control, true, [None, None, None]).await;
    let agent = env.agent(control).await;
    let goes = env.session(session(control, agent, "main", 400.0)).await;
    env.nightly(control).await;
    for session in kept {
        assert!(env.exists(session).await);
        assert_eq!(history(&env.pool, session).await, (3, 1, 2));
        assert!(env.frames(session).exists());
    }
    assert!(
        !env.exists(goes).await,
        "the enabled account's old session goes"
    );
}

#[sqlx::test]
async fn ss1_an_enabled_policy_falls_back_to_60_30_7_days_and_its_own_ages_win(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [None, None, None]).await;
    let agent = env.agent(account).await;
    let done = env.board_task(account, "done", true).await;
    let task = |days| Session {
        metadata: json!({"board_task_id": done}),
        ..session(account, agent, "task", days)
    };
    let mut goes = Vec::new();
    let mut stays = Vec::new();
    for (kind, age) in [("main", 60.0), ("subagent", 7.0)] {
        goes.push(env.session(session(account, agent, kind, age + 0.5)).await);
        stays.push(env.session(session(account, agent, kind, age - 0.5)).await);
    }
    goes.push(env.session(task(30.5)).await);
    stays.push(env.session(task(29.5)).await);
    env.nightly(account).await;
    for s in &goes {
        assert!(!env.exists(*s).await);
    }
    for s in &stays {
        assert!(env.exists(*s).await);
    }

    let own = fixture::account(&env.pool, Some(30)).await;
    env.policy(own, true, [Some(10), None, None]).await;
    let agent = env.agent(own).await;
    let eleven = env.session(session(own, agent, "main", 11.0)).await;
    let nine = env.session(session(own, agent, "main", 9.0)).await;
    env.nightly(own).await;
    assert!(
        !env.exists(eleven).await,
        "the policy's 10 days, not the fallback's 60"
    );
    assert!(env.exists(nine).await);
}

#[sqlx::test]
async fn ss2_age_is_measured_from_last_activity(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(30), None, None]).await;
    let agent = env.agent(account).await;
    let recent = env.session(session(account, agent, "main", 10.0)).await;
    sqlx::query("UPDATE sessions SET created_at = now() - interval '3 years' WHERE id = $1")
        .bind(recent)
        .execute(&env.pool)
        .await
        .unwrap();
    let old = env.session(session(account, agent, "main", 31.0)).await;
    env.nightly(account).await;
    assert!(env.exists(recent).await, "created long ago, active lately");
    assert!(!env.exists(old).await);
}

#[sqlx::test]
async fn ss3_every_pointer_and_a_running_or_finalizing_state_protect(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(1), Some(1), Some(1)]).await;
    let agent = env.agent(account).await;
    let mut protected = Vec::new();
    for pointer in [
        "current_session_id",
        "main_session_id",
        "default_session_id",
    ] {
        let s = env.session(session(account, agent, "main", 100.0)).await;
        // Another agent's pointer protects too.
        let other = env.agent(account).await;
        env.point(other, pointer, s).await;
        protected.push(s);
    }
    for state in ["running", "finalizing"] {
        let s = env
            .session(Session {
                state,
                ..session(account, agent, "subagent", 100.0)
            })
            .await;
        protected.push(s);
    }
    let control = env.session(session(account, agent, "main", 100.0)).await;
    let reports = env.nightly(account).await;
    for s in &protected {
        assert!(env.exists(*s).await);
        assert_eq!(history(&env.pool, *s).await, (3, 1, 2));
        assert!(env.frames(*s).exists());
    }
    assert!(!env.exists(control).await);
    assert_eq!(retained(&reports, "protected_pointer"), 3);
    assert_eq!(retained(&reports, "protected_state"), 2);
}

#[sqlx::test]
async fn ss4_evidence_flattened_or_nested_and_anything_malformed_is_not_eligible(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(1), Some(1), Some(1)]).await;
    let agent = env.agent(account).await;
    let done = env.board_task(account, "done", true).await;
    let cancelled = env.board_task(account, "cancelled", true).await;
    let open = env.board_task(account, "in_progress", false).await;
    let done_untimed = env.board_task(account, "done", false).await;
    let elsewhere = fixture::account(&env.pool, Some(30)).await;
    let foreign = env.board_task(elsewhere, "done", true).await;
    let cases: Vec<(&'static str, Value, Option<&str>)> = vec![
        ("task", json!({"board_task_id": done}), None),
        (
            "task",
            json!({"board_task": {"id": cancelled, "title": "t"}}),
            None,
        ),
        (
            "task",
            json!({"board_task_id": open}),
            Some("task_not_terminal"),
        ),
        (
            "task",
            json!({"board_task_id": done_untimed}),
            Some("task_not_terminal"),
        ),
        (
            "task",
            json!({"board_task_id": foreign}),
            Some("task_not_terminal"),
        ),
        ("task", json!({}), Some("missing_evidence")),
        ("task", json!([done]), Some("missing_evidence")),
        (
            "task",
            json!({"board_task_id": 42}),
            Some("malformed_evidence"),
        ),
        (
            "task",
            json!({"board_task_id": "not-a-uuid"}),
            Some("malformed_evidence"),
        ),
        (
            "task",
            json!({"board_task": {"id": [done]}}),
            Some("malformed_evidence"),
        ),
        (
            "subagent",
            json!({"completed_at": "2026-10-01T12:00:00Z"}),
            None,
        ),
        (
            "subagent",
            json!({"completion": {"completed_at": "2026-10-01T12:00:00+02:00"}}),
            None,
        ),
        ("subagent", json!({}), Some("missing_evidence")),
        (
            "subagent",
            json!({"completed_at": "yesterday"}),
            Some("malformed_evidence"),
        ),
        (
            "subagent",
            json!({"completed_at": "2026-13-45T99:00:00Z"}),
            Some("malformed_evidence"),
        ),
        (
            "subagent",
            json!({"completed_at": 1_700_000_000}),
            Some("malformed_evidence"),
        ),
        (
            "subagent",
            json!({"completion": "yes"}),
            Some("missing_evidence"),
        ),
        ("subagent", json!("a string"), Some("missing_evidence")),
        ("main", json!({"anything": [1, 2]}), None),
        // Both spellings present: both must be well formed, and both tasks terminal.
        (
            "task",
            json!({"board_task_id": "garbage", "board_task": {"id": done}}),
            Some("malformed_evidence"),
        ),
        (
            "task",
            json!({"board_task_id": done, "board_task": {"id": open}}),
            Some("task_not_terminal"),
        ),
        (
            "subagent",
            json!({"completed_at": "not a date", "completion": {"completed_at": "2026-01-01T00:00:00Z"}}),
            Some("malformed_evidence"),
        ),
        (
            "subagent",
            json!({"completed_at": "2999-01-01T00:00:00Z"}),
            Some("malformed_evidence"),
        ),
    ];
    let mut made = Vec::new();
    for (kind, metadata, verdict) in &cases {
        let s = env
            .session(Session {
                metadata: metadata.clone(),
                ..session(account, agent, kind, 100.0)
            })
            .await;
        made.push((s, *verdict, metadata.clone()));
    }
    let reports = env.nightly(account).await;
    for (s, verdict, metadata) in &made {
        assert_eq!(
            env.exists(*s).await,
            verdict.is_some(),
            "{metadata} ({verdict:?})"
        );
    }
    for reason in [
        "task_not_terminal",
        "missing_evidence",
        "malformed_evidence",
    ] {
        let expected = cases.iter().filter(|(_, _, v)| *v == Some(reason)).count() as u64;
        assert_eq!(retained(&reports, reason), expected, "{reason}");
    }
    assert_eq!(deleted(&reports), 5);
}

/// The verdict alone on a session, at a cutoff a year after the pass start.
async fn verdict(pool: &PgPool, session: Uuid) -> Option<String> {
    sqlx::query_scalar(
        "SELECT sexton.session_verdict(id, account_id, kind, state, metadata, last_activity_at,
                                       $2::timestamptz + interval '365 days')
         FROM sessions WHERE id = $1",
    )
    .bind(session)
    .bind(pass_start())
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn ss3_the_verdict_itself_protects_and_a_column_the_platform_adds_changes_nothing(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    // Columns named like the rules' parameters, as the contract allows the platform to add.
    for sql in [
        "ALTER TABLE agents ADD COLUMN session_id uuid",
        "ALTER TABLE agents ADD COLUMN state text",
        "ALTER TABLE board_tasks ADD COLUMN metadata jsonb",
        "ALTER TABLE board_tasks ADD COLUMN account uuid",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&env.pool)
            .await
            .unwrap();
    }
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(1), Some(1), Some(1)]).await;
    let agent = env.agent(account).await;
    let current = env.session(session(account, agent, "main", 100.0)).await;
    env.point(agent, "current_session_id", current).await;
    let running = env
        .session(Session {
            state: "running",
            ..session(account, agent, "main", 100.0)
        })
        .await;
    let control = env.session(session(account, agent, "main", 100.0)).await;
    assert_eq!(
        verdict(&env.pool, current).await.as_deref(),
        Some("protected_pointer")
    );
    assert_eq!(
        verdict(&env.pool, running).await.as_deref(),
        Some("protected_state")
    );
    assert_eq!(verdict(&env.pool, control).await, None);
    let mut conn = env.pool.acquire().await.unwrap();
    let targets = job::targets(
        &mut conn,
        job::Ages::FALLBACK,
        sexton_now(&env.pool).await,
        None,
    )
    .await
    .unwrap();
    let targeted: Vec<Uuid> = targets.iter().map(|t| t.session_id).collect();
    assert!(!targeted.contains(&current) && !targeted.contains(&running));
    assert!(targeted.contains(&control));
    let reports = env.nightly(account).await;
    assert!(env.exists(current).await && env.exists(running).await);
    assert!(!env.exists(control).await);
    assert_eq!(retained(&reports, "protected_pointer"), 1);
}

async fn sexton_now(pool: &PgPool) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
async fn ss5_another_agent_pointed_at_a_session_mid_pass_keeps_it_whole(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(1), Some(1), Some(1)]).await;
    let owner = env.agent(account).await;
    let other = env.agent(account).await;
    let adopted = env.session(session(account, owner, "main", 100.0)).await;
    let control = env
        .session(session(account, owner, "subagent", 100.0))
        .await;
    // Another agent is being pointed at the old session; its writer has not committed.
    let mut app = env.pool.begin().await.unwrap();
    sqlx::query("UPDATE agents SET main_session_id = $1 WHERE id = $2")
        .bind(adopted)
        .bind(other)
        .execute(&mut *app)
        .await
        .unwrap();
    let during = env.nightly(account).await;
    assert!(env.exists(adopted).await, "the session being adopted stays");
    assert_eq!(history(&env.pool, adopted).await, (3, 1, 2));
    assert!(
        !env.exists(control).await,
        "its sibling, pointed at by no one, goes"
    );
    assert_eq!(retained(&during, "busy"), 1);
    app.commit().await.unwrap();
    let after = env.nightly(account).await;
    assert!(env.exists(adopted).await);
    assert_eq!(retained(&after, "protected_pointer"), 1);
}

#[sqlx::test]
async fn ss5_a_delete_issued_from_inside_a_trigger_is_refused_too(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let agent = env.agent(account).await;
    let current = env.session(session(account, agent, "main", 1.0)).await;
    env.point(agent, "current_session_id", current).await;
    for sql in [
        "CREATE TABLE purge_requests (session_id uuid)",
        "CREATE FUNCTION purge() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN DELETE FROM sessions WHERE id = NEW.session_id; RETURN NEW; END $$",
        "CREATE TRIGGER purge AFTER INSERT ON purge_requests FOR EACH ROW EXECUTE FUNCTION purge()",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&env.pool)
            .await
            .unwrap();
    }
    let err = sqlx::query("INSERT INTO purge_requests VALUES ($1)")
        .bind(current)
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is protected"), "{err}");
    assert!(env.exists(current).await);
    // The platform deleting the whole agent still takes its sessions.
    sqlx::query("DELETE FROM agents WHERE id = $1")
        .bind(agent)
        .execute(&env.pool)
        .await
        .unwrap();
    assert!(!env.exists(current).await);
}

#[sqlx::test]
async fn ss2_an_infinite_last_activity_breaks_neither_the_cli_nor_the_preview(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [None, None, None]).await;
    let agent = env.agent(account).await;
    let odd = env.session(session(account, agent, "main", 100.0)).await;
    sqlx::query("UPDATE sessions SET last_activity_at = '-infinity' WHERE id = $1")
        .bind(odd)
        .execute(&env.pool)
        .await
        .unwrap();
    let normal = env.session(session(account, agent, "main", 100.0)).await;
    let mut conn = env.pool.acquire().await.unwrap();
    let targets = job::targets(
        &mut conn,
        job::Ages::FALLBACK,
        sexton_now(&env.pool).await,
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        targets.iter().map(|t| t.session_id).collect::<Vec<_>>(),
        [normal]
    );
    let previews = env
        .preview(sexton_now(&env.pool).await, Some(&[account]))
        .await;
    assert_eq!(previews[0].eligible.values().sum::<i64>(), 1);
    env.nightly(account).await;
    assert!(env.exists(odd).await && !env.exists(normal).await);
}

#[sqlx::test]
async fn ss5_an_agent_pointed_at_a_session_during_the_pass_keeps_it_whole(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(1), Some(1), Some(1)]).await;
    let agent = env.agent(account).await;
    let resumed = env.session(session(account, agent, "main", 100.0)).await;
    let control = env
        .session(session(account, agent, "subagent", 100.0))
        .await;
    let other_agent = env.agent(account).await;
    let other = env
        .session(session(account, other_agent, "main", 100.0))
        .await;
    // The application points the agent at the old session; its transaction is still open when
    // the pass comes by.
    let mut app = env.pool.begin().await.unwrap();
    sqlx::query("UPDATE agents SET current_session_id = $1 WHERE id = $2")
        .bind(resumed)
        .bind(agent)
        .execute(&mut *app)
        .await
        .unwrap();
    let during = env.nightly(account).await;
    assert!(
        env.exists(control).await,
        "its agent was busy during the pass"
    );
    app.commit().await.unwrap();
    let after = env.nightly(account).await;
    assert!(env.exists(resumed).await);
    assert_eq!(history(&env.pool, resumed).await, (3, 1, 2));
    assert!(env.frames(resumed).exists());
    assert!(
        !env.exists(other).await,
        "another agent's session went meanwhile"
    );
    assert_eq!(retained(&during, "busy"), 2);
    assert_eq!(retained(&after, "protected_pointer"), 1);
    assert!(!env.exists(control).await, "taken by the next pass");
}

#[sqlx::test]
async fn ss5_the_store_refuses_a_hand_written_delete_of_a_protected_session(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    let agent = env.agent(account).await;
    let current = env.session(session(account, agent, "main", 1.0)).await;
    env.point(agent, "current_session_id", current).await;
    let running = env
        .session(Session {
            state: "running",
            ..session(account, agent, "task", 1.0)
        })
        .await;
    let plain = env.session(session(account, agent, "subagent", 1.0)).await;
    for (protected, why) in [
        (current, "current session of agent"),
        (running, "state is running"),
    ] {
        let err = sqlx::query("DELETE FROM sessions WHERE id = $1")
            .bind(protected)
            .execute(&env.pool)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&protected.to_string()) && err.contains(why),
            "{err}"
        );
        assert!(env.exists(protected).await);
        assert_eq!(history(&env.pool, protected).await, (3, 1, 2));
    }
    sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(plain)
        .execute(&env.pool)
        .await
        .expect("an unprotected session can be deleted by hand");
    assert!(!env.exists(plain).await);
}

#[sqlx::test]
async fn ss6_history_goes_with_the_session_handoffs_keep_their_rows_frames_follow(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(30), None, None]).await;
    let agent = env.agent(account).await;
    let old = env.session(session(account, agent, "main", 40.0)).await;
    let young = env.session(session(account, agent, "main", 5.0)).await;
    let handoff: Uuid = sqlx::query_scalar(
        "INSERT INTO handoffs (account_id, agent_id, from_session_id, to_session_id)
         VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(account)
    .bind(agent)
    .bind(old)
    .bind(young)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let reports = env.nightly(account).await;
    assert!(!env.exists(old).await);
    assert_eq!(history(&env.pool, old).await, (0, 0, 0));
    assert!(
        common::backend::gone(&env.frames(old)),
        "the deleted session's frames are gone"
    );
    assert!(env.exists(young).await);
    assert_eq!(history(&env.pool, young).await, (3, 1, 2));
    assert!(
        env.frames(young)
            .join("archive/compaction-op1.frame")
            .exists()
    );
    let (from, to): (Option<Uuid>, Option<Uuid>) =
        sqlx::query_as("SELECT from_session_id, to_session_id FROM handoffs WHERE id = $1")
            .bind(handoff)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!((from, to), (None, Some(young)));
    let rows = |table: &str| reports.iter().map(|r| r.rows_of(table)).sum::<u64>();
    assert_eq!(
        (
            rows("sessions"),
            rows("conversation_entries"),
            rows("conversation_archives"),
            rows("conversation_archive_entries")
        ),
        (1, 3, 1, 2)
    );
    assert_eq!(reports.iter().map(|r| r.files.deleted).sum::<u64>(), 1);
}

#[sqlx::test]
async fn ss1_the_cli_prunes_with_its_own_ages_where_the_policy_is_disabled(pool: PgPool) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, false, [None, None, None]).await;
    let agent = env.agent(account).await;
    let old = env.session(session(account, agent, "main", 400.0)).await;
    let young = env.session(session(account, agent, "main", 3.0)).await;
    let dir = env.dir.path();
    let url = common::database_url(&env.pool).await;
    let cli = |confirm: bool| {
        let mut cmd = common::sexton(&url, dir);
        cmd.args(["sessions", "prune", "--json"])
            .env("SEXTON_SESSION_MAIN_DAYS", "300");
        if confirm {
            cmd.arg("--confirm");
        }
        cmd
    };
    let listed = cli(false).output().await.unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["targets"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["targets"][0]["session_id"], old.to_string());
    assert!(listed["deleted"].is_null());
    assert!(
        env.exists(old).await,
        "without --confirm nothing is deleted"
    );

    let done = cli(true).output().await.unwrap();
    assert!(done.status.success(), "{done:?}");
    let done: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(done["deleted"]["sessions"], 1, "{done}");
    assert!(!env.exists(old).await);
    assert!(!env.frames(old).exists());
    assert!(env.exists(young).await);

    let bad = cli(false)
        .env("SEXTON_SESSION_TASK_DAYS", "thirty")
        .output()
        .await
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("SEXTON_SESSION_TASK_DAYS"));
}

/// Thousands of old sessions over a few accounts, each with history and frames, plus protected
/// controls; returns every session with whether it must survive.
async fn many_sessions(
    pool: &PgPool,
    root: &Path,
    accounts: usize,
    per: usize,
) -> Vec<(Uuid, bool)> {
    let mut made = Vec::new();
    for _ in 0..accounts {
        let account = fixture::account(pool, Some(30)).await;
        sqlx::query(
            "INSERT INTO session_retention_policies (account_id, enabled) VALUES ($1, true)",
        )
        .bind(account)
        .execute(pool)
        .await
        .unwrap();
        let agent: Uuid = sqlx::query_scalar(
            "INSERT INTO agents (account_id, name) VALUES ($1, 'a') RETURNING id",
        )
        .bind(account)
        .fetch_one(pool)
        .await
        .unwrap();
        let ids: Vec<(Uuid, String)> = sqlx::query_as(
            "INSERT INTO sessions (account_id, agent_id, kind, state, metadata, last_activity_at)
             SELECT $1, $2, 'subagent',
                    CASE WHEN g % 10 = 0 THEN 'running' ELSE 'completed' END,
                    '{\"completed_at\": \"2026-01-01T00:00:00Z\"}', now() - interval '100 days'
             FROM generate_series(1, $3) g
             RETURNING id, state",
        )
        .bind(account)
        .bind(agent)
        .bind(per as i32)
        .fetch_all(pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO conversation_entries (session_id, entry_id, seq, payload)
             SELECT s.id, 'e' || g, g, '{}'::json
             FROM sessions s, generate_series(1, 3) g WHERE s.account_id = $1",
        )
        .bind(account)
        .execute(pool)
        .await
        .unwrap();
        for (id, state) in ids {
            let archive = root.join(format!("{id}/archive"));
            std::fs::create_dir_all(&archive).unwrap();
            std::fs::write(archive.join("reset-op.frame"), b"f").unwrap();
            made.push((id, state == "running"));
        }
    }
    made
}

/// No session half-deleted; a surviving session keeps its frames; with `complete`, every
/// session that had to go is gone, frames included.
async fn audit(pool: &PgPool, root: &Path, sessions: &[(Uuid, bool)], complete: bool) {
    let ids: Vec<Uuid> = sessions.iter().map(|(id, _)| *id).collect();
    let rows: Vec<(Uuid, bool, i64)> = sqlx::query_as(
        "SELECT i.id, EXISTS (SELECT 1 FROM sessions s WHERE s.id = i.id),
                (SELECT count(*) FROM conversation_entries e WHERE e.session_id = i.id)
         FROM unnest($1::uuid[]) AS i (id)",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await
    .unwrap();
    let protected: std::collections::HashSet<Uuid> = sessions
        .iter()
        .filter(|(_, p)| *p)
        .map(|(id, _)| *id)
        .collect();
    for (id, exists, entries) in rows {
        if exists {
            assert_eq!(entries, 3, "session {id} survives with part of its history");
            assert!(
                root.join(id.to_string()).exists(),
                "frames of surviving {id} gone"
            );
        } else {
            assert_eq!(entries, 0, "session {id} gone but its entries left");
            assert!(!protected.contains(&id), "protected session {id} deleted");
            if complete {
                assert!(
                    !root.join(id.to_string()).exists(),
                    "frames of deleted {id} left"
                );
            }
        }
        if complete && !protected.contains(&id) {
            assert!(!exists, "session {id} should have gone");
        }
    }
}

#[sqlx::test]
async fn ss6_workers_killed_with_sigkill_mid_pass_leave_no_session_half_deleted(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sessions");
    let sessions = many_sessions(&pool, &root, 3, 1500).await;
    let mut settings = common::settings(dir.path());
    // As many attempts as the workers' hops have: the slot job may die with them too (FL-4).
    settings.queue.max_attempts = 100;
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();
    let url = common::database_url(&pool).await;
    let worker = |exit_when_idle: bool| {
        let mut cmd = crate::crash::worker(&url, dir.path(), exit_when_idle);
        cmd.env("SEXTON_SESSIONS__WINDOW_SIZE", "20")
            .env("SEXTON_SESSIONS__SESSIONS_PER_TRANSACTION", "3");
        cmd
    };
    let remaining = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sessions WHERE state <> 'running'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    let mut kills_mid_hop = 0;
    for _ in 0..10 {
        let job_type = "sexton.session_retention";
        let Some(caught) =
            crate::crash::kill_while_working(&pool, worker(false), job_type, &mut rng, 0..50).await
        else {
            break;
        };
        kills_mid_hop += usize::from(caught);
        audit(&pool, &root, &sessions, false).await;
    }
    assert!(
        kills_mid_hop >= 3,
        "only {kills_mid_hop} kills caught a worker in a hop"
    );
    assert!(remaining().await > 0, "the pass ended before the kills did");
    let mut child = worker(true).spawn().unwrap();
    let status = common::wait(&mut child, Duration::from_secs(180)).await;
    assert!(status.success(), "the last worker exited with {status}");
    audit(&pool, &root, &sessions, true).await;
}

#[sqlx::test]
async fn ss1_a_policy_age_of_zero_or_less_means_nothing_of_that_kind_is_old(pool: PgPool) {
    let env = Env::new(pool).await;
    for column in ["main_days", "task_days", "subagent_days"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE session_retention_policies DROP CONSTRAINT session_retention_policies_{column}_check"
        )))
        .execute(&env.pool)
        .await
        .unwrap();
    }
    let mut kept = Vec::new();
    let mut absurd = Vec::new();
    for days in [-3, 0] {
        let account = fixture::account(&env.pool, Some(30)).await;
        env.policy(account, true, [Some(days), Some(days), Some(days)])
            .await;
        let agent = env.agent(account).await;
        let done = env.board_task(account, "done", true).await;
        for age in [1.0 / 24.0, 2.0, 400.0] {
            kept.push(env.session(session(account, agent, "main", age)).await);
            kept.push(env.session(session(account, agent, "subagent", age)).await);
            let task = Session {
                metadata: json!({"board_task_id": done}),
                ..session(account, agent, "task", age)
            };
            kept.push(env.session(task).await);
        }
        absurd.push(account);
    }
    // Only one kind invalid: the others still follow their ages.
    let mixed = fixture::account(&env.pool, Some(30)).await;
    env.policy(mixed, true, [Some(-3), None, Some(7)]).await;
    let agent = env.agent(mixed).await;
    kept.push(env.session(session(mixed, agent, "main", 400.0)).await);
    let goes = env.session(session(mixed, agent, "subagent", 8.0)).await;

    let previews = env.preview(pass_start(), None).await;
    for account in &absurd {
        let p = previews.iter().find(|p| p.account_id == *account).unwrap();
        assert_eq!(p.eligible.values().sum::<i64>(), 0, "{p:?}");
        assert_eq!(p.retained.get("invalid_policy"), Some(&3), "{p:?}");
    }
    let p = previews.iter().find(|p| p.account_id == mixed).unwrap();
    assert_eq!(p.retained.get("invalid_policy"), Some(&1), "{p:?}");
    assert_eq!(p.eligible.get("subagent"), Some(&1), "{p:?}");
    for account in &absurd {
        let reports = env.nightly(*account).await;
        assert_eq!(deleted(&reports), 0);
        assert_eq!(retained(&reports, "invalid_policy"), 3);
    }
    let reports = env.nightly(mixed).await;
    assert_eq!(retained(&reports, "invalid_policy"), 1);
    for session in &kept {
        assert!(env.exists(*session).await, "{session}");
        assert_eq!(history(&env.pool, *session).await, (3, 1, 2));
        assert!(env.frames(*session).exists());
    }
    assert!(!env.exists(goes).await, "the valid kind's old session goes");
    assert!(!env.frames(goes).exists());
}

/// Nests `depth` directories named `d` in the session's frame directory, with a frame file at
/// every thousandth level; made relative to open directories, as no path that long can be
/// spelled.
fn nest(frames: &Path, depth: usize) {
    use rustix::fs::{Mode, OFlags};
    let directory = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(frames, directory, Mode::empty()).unwrap();
    for level in 0..depth {
        if level % 1_000 == 0 {
            let file = OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC;
            rustix::fs::openat(&dir, c"x.frame", file, Mode::from_raw_mode(0o644)).unwrap();
        }
        rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, c"d", directory, Mode::empty()).unwrap();
    }
}

#[sqlx::test]
async fn ss6_a_session_directory_of_any_depth_goes_and_never_stops_the_pass(pool: PgPool) {
    let mut env = Env::new(pool).await;
    // In memory where the machine has it: a disk file system takes about ten times as long
    // to make and remove such trees.
    let shm = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    env.frames_root = shm.path().to_owned();
    // On disk whatever the backend: the depth is the file system's question.
    env.paths.sessions_root = shm.path().to_owned();
    env.paths
        .objects
        .retain(|(root, _)| *root != files::Root::Sessions);
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(30), None, None]).await;
    let agent = env.agent(account).await;
    let mut deep = Vec::new();
    for depth in [8_000, 100_000] {
        let session = env.session(session(account, agent, "main", 40.0)).await;
        nest(&env.frames(session), depth);
        deep.push(session);
    }
    let control = env.session(session(account, agent, "main", 41.0)).await;
    let young = env.session(session(account, agent, "main", 5.0)).await;

    let reports = env.nightly(account).await;
    for session in deep.iter().chain([&control]) {
        assert!(!env.exists(*session).await);
        assert!(
            !env.frames(*session).exists(),
            "{session}'s directory is gone"
        );
    }
    assert!(env.exists(young).await);
    assert!(env.frames(young).exists());
    let files: u64 = reports.iter().map(|r| r.files.deleted).sum();
    assert_eq!(files, 3 + 8 + 100, "every frame file counted");
    assert_eq!(reports.iter().map(|r| r.files.errors).sum::<u64>(), 0);
}

#[sqlx::test]
async fn ss6_er3_a_removal_that_never_reports_back_is_quarantined_after_its_last_attempt(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let account = fixture::account(&env.pool, Some(30)).await;
    env.policy(account, true, [Some(30), None, None]).await;
    let agent = env.agent(account).await;
    // Two directories whose sessions went earlier; each record was claimed before, and the
    // process making the removal died every time (as an overflowing stack once made it).
    let mut records = Vec::new();
    for attempts in [files::MAX_ATTEMPTS, files::MAX_ATTEMPTS - 1] {
        let gone = Uuid::new_v4();
        std::fs::create_dir_all(env.frames(gone).join("archive")).unwrap();
        // A frame in it, so that the directory is something on an object store too; written
        // before its session went (OS-2: an object of its record's own instant may be new).
        let frame = env.frames(gone).join("archive/0.frame");
        std::fs::write(&frame, b"x").unwrap();
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        common::fixture::set_mtime(&frame, hour_ago);
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path, attempts)
             VALUES ('sessions', $1, $2, $3) RETURNING id",
        )
        .bind(account)
        .bind(gone.to_string())
        .bind(attempts)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        records.push((id, gone));
    }
    let control = env.session(session(account, agent, "main", 40.0)).await;

    let reports = env.nightly(account).await;
    let (spent, last) = (records[0], records[1]);
    let quarantined: (Option<String>, bool) = sqlx::query_as(
        "SELECT last_error, quarantined_at IS NOT NULL
         FROM sexton.pending_file_deletions WHERE id = $1",
    )
    .bind(spent.0)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(quarantined.1, "quarantined after its last attempt");
    assert!(
        quarantined
            .0
            .unwrap_or_default()
            .contains("without a result"),
        "with why"
    );
    assert!(
        env.frames(spent.1).join("archive/0.frame").exists(),
        "not tried again"
    );
    assert!(
        common::backend::gone(&env.frames(last.1)),
        "the one with an attempt left is tried, and goes"
    );
    assert!(!env.exists(control).await);
    assert!(common::backend::gone(&env.frames(control)));
    assert_eq!(reports.iter().map(|r| r.files.errors).sum::<u64>(), 1);
    assert_eq!(
        files::failing(&env.pool)
            .await
            .unwrap()
            .quarantined
            .get("sessions"),
        Some(&1)
    );
    // Passed by from now on: a later pass neither tries it nor counts it again.
    let again = env.nightly(account).await;
    assert_eq!(again.iter().map(|r| r.files.errors).sum::<u64>(), 0);
    assert!(env.frames(spent.1).exists());
}

#[sqlx::test]
async fn op3_the_session_backlog_is_the_oldest_session_past_its_cutoff_that_would_go(pool: PgPool) {
    common::migrate(&pool).await;
    sqlx::query(
        "ALTER TABLE session_retention_policies DROP CONSTRAINT session_retention_policies_task_days_check",
    )
    .execute(&pool)
    .await
    .unwrap();
    let session = |account: Uuid, agent: Uuid, kind: &'static str, state: &'static str, days| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO sessions (account_id, agent_id, kind, state, last_activity_at)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(account)
            .bind(agent)
            .bind(kind)
            .bind(state)
            .bind(days_before_pass(days))
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let policy = |account: Uuid, enabled: bool, task_days: Option<i32>| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO session_retention_policies (account_id, enabled, task_days)
                 VALUES ($1, $2, $3)",
            )
            .bind(account)
            .bind(enabled)
            .bind(task_days)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    // Counted: an idle main session 100 days old against the fallback 60 (40 days past).
    let counted = fixture::account(&pool, Some(30)).await;
    let agent = fixture::agent(&pool, counted).await;
    policy(counted, true, None).await;
    session(counted, agent, "main", "idle", 100.0).await;
    // Not counted: a protected (running) session, older.
    session(counted, agent, "main", "running", 200.0).await;
    // Not counted: a disabled policy's, an age of 0 or less's (SS-1).
    let disabled = fixture::account(&pool, Some(30)).await;
    let agent = fixture::agent(&pool, disabled).await;
    policy(disabled, false, None).await;
    session(disabled, agent, "main", "idle", 300.0).await;
    let absurd = fixture::account(&pool, Some(30)).await;
    let agent = fixture::agent(&pool, absurd).await;
    policy(absurd, true, Some(-3)).await;
    session(absurd, agent, "task", "completed", 400.0).await;

    let backlog = fixture::session_backlog(&pool, pass_start()).await;
    assert!(
        (backlog - 40.0 * 86_400.0).abs() < 1.0,
        "only the session that would go counts: {backlog}"
    );
}
