//! `sexton explain`: for each job kind and verdict, what `explain` says is what the
//! next pass then does to the same row or file — eligible → removed, each reason → kept.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sexton_jobs::attachment_expiry::{AttachmentExpiry, AttachmentSettings};
use sexton_jobs::record_expiry::{Args as ExpiryArgs, Expire, ExpirySettings, WorkingRecords};
use sexton_jobs::session_retention::{self as sessions, Args as SessionArgs};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::{self, RunSpec};
use crate::common::hops::Env;
use crate::common::run;

/// `sexton explain <subject> <id> --json` on the test's database, with roots under `dir`.
async fn explain(pool: &PgPool, dir: &Path, subject: &str, id: &str) -> Value {
    let url = common::database_url(pool).await;
    let output = common::sexton(&url, dir)
        .args(["explain", subject, id, "--json"])
        .env("SEXTON_TRACES__MAX_AGE_DAYS", "30")
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "explain {subject} {id}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn codes(explanation: &Value) -> Vec<String> {
    explanation["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["rule"].as_str().unwrap(),
                r["code"].as_str().unwrap()
            )
        })
        .collect()
}

#[sqlx::test]
async fn explain_runs_agree_with_the_next_pass(pool: PgPool) {
    let env = Env::new(pool).await;
    // The CLI measures from the database's now: a month after the fixtures' pass start.
    let account = fixture::account(&env.pool, Some(30)).await;
    let conversation = fixture::conversation(&env.pool, account).await;
    let eligible = env
        .run(RunSpec::conversation(account, conversation, 120.0))
        .await;
    let settling = env
        .run(RunSpec::conversation(account, conversation, 120.0))
        .await;
    sqlx::query("INSERT INTO settlement_receipts (run_id, status) VALUES ($1, 'pending')")
        .bind(settling.id)
        .execute(&env.pool)
        .await
        .unwrap();
    let young = env
        .run(RunSpec::conversation(account, conversation, -25.0))
        .await;
    let dir = env.dir.path();

    let said = [
        (
            eligible.id,
            explain(&env.pool, dir, "run", &eligible.id.to_string()).await,
        ),
        (
            settling.id,
            explain(&env.pool, dir, "run", &settling.id.to_string()).await,
        ),
        (
            young.id,
            explain(&env.pool, dir, "run", &young.id.to_string()).await,
        ),
    ];
    assert_eq!(said[0].1["verdict"], "eligible");
    assert_eq!(said[1].1["verdict"], "retained");
    assert!(codes(&said[1].1).contains(&"EX-5 pending_settlement".to_owned()));
    assert!(
        said[1].1["reasons"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("settlement_receipts")
    );
    assert_eq!(said[2].1["verdict"], "retained");
    assert_eq!(codes(&said[2].1), ["EX-1 not_eligible"]);

    // The next pass, measured from the same now.
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    env.pass_from(sexton_jobs::prune_execution_details::Args::first(
        Some(account),
        now,
    ))
    .await;
    for (run, explanation) in &said {
        let pruned = fixture::is_pruned(&env.pool, *run).await;
        assert_eq!(pruned, explanation["verdict"] == "eligible", "run {run}");
    }
    let after = explain(&env.pool, dir, "run", &eligible.id.to_string()).await;
    assert_eq!(after["verdict"], "removed");
    assert!(after["removed_at"].is_string());
}

#[sqlx::test]
async fn explain_sessions_agree_with_the_next_pass(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let paths = run::roots(dir.path());
    let account = fixture::account(&pool, Some(30)).await;
    sqlx::query("INSERT INTO session_retention_policies (account_id, enabled) VALUES ($1, true)")
        .bind(account)
        .execute(&pool)
        .await
        .unwrap();
    let agent = fixture::agent(&pool, account).await;
    // The current session is protected; the other, as old, is not.
    let ids = [
        fixture::session(
            &pool,
            account,
            agent,
            "main",
            100,
            Some("current_session_id"),
        )
        .await,
        fixture::session(&pool, account, agent, "main", 100, None).await,
    ];

    let protected = explain(&pool, dir.path(), "session", &ids[0].to_string()).await;
    let old = explain(&pool, dir.path(), "session", &ids[1].to_string()).await;
    assert_eq!(protected["verdict"], "retained");
    assert_eq!(codes(&protected), ["SS-3 protected_pointer"]);
    assert_eq!(old["verdict"], "eligible");

    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let settings = sessions::HopSettings {
        window_size: 10,
        sessions_per_transaction: 5,
        transaction_target: Duration::from_millis(50),
        budget: Duration::from_secs(60),
        lock_timeout: Duration::from_millis(200),
        policy: sessions::Policy::Persisted,
    };
    let args = SessionArgs::first(Some(account), now);
    run::pass::<sessions::SessionRetention>(&pool, &paths, &settings, args).await;
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM sessions ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        left,
        [ids[0]],
        "kept what explain said is kept, deleted what it said goes"
    );
}

#[sqlx::test]
async fn explain_attachments_agree_with_the_next_pass(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = common::backend::tempdir();
    let paths = run::roots(dir.path());
    let account = fixture::account(&pool, Some(30)).await;
    let old_file = paths.attachments_root.join("a/old.bin");
    std::fs::create_dir_all(old_file.parent().unwrap()).unwrap();
    std::fs::write(&old_file, b"bytes").unwrap();
    common::fixture::set_mtime(
        &old_file,
        std::time::SystemTime::now() - Duration::from_secs(90 * 86_400),
    );
    let mut ids = Vec::new();
    for path in ["a/old.bin", "../escape.bin"] {
        let id: Uuid = sqlx::query_scalar(
            "INSERT INTO attachments (account_id, relative_path) VALUES ($1, $2) RETURNING id",
        )
        .bind(account)
        .bind(path)
        .fetch_one(&pool)
        .await
        .unwrap();
        ids.push(id);
    }

    let old = explain(&pool, dir.path(), "attachment", &ids[0].to_string()).await;
    let escaping = explain(&pool, dir.path(), "attachment", &ids[1].to_string()).await;
    assert_eq!(old["verdict"], "eligible");
    assert_eq!(escaping["verdict"], "retained");
    assert_eq!(codes(&escaping), ["AT-1 outside_root"]);

    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let settings = AttachmentSettings {
        max_age_days: 30,
        window_size: 100,
        budget: Duration::from_secs(60),
    };
    run::pass::<AttachmentExpiry>(
        &pool,
        &paths,
        &settings,
        sexton_jobs::attachment_expiry::Args::first(Some(account), now),
    )
    .await;
    assert!(!old_file.exists());
    let after = explain(&pool, dir.path(), "attachment", &ids[0].to_string()).await;
    assert_eq!(after["verdict"], "removed");
    let still = explain(&pool, dir.path(), "attachment", &ids[1].to_string()).await;
    assert_eq!(still["verdict"], "retained");
}

#[sqlx::test]
async fn explain_traces_agree_with_the_cleaner(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = common::backend::tempdir();
    let paths = run::roots(dir.path());
    let agent = Uuid::new_v4();
    let write = |name: &str, content: String| {
        let path = paths.traces_root.join(agent.to_string()).join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        common::fixture::set_mtime(
            &path,
            std::time::SystemTime::now() - Duration::from_secs(90 * 86_400),
        );
        format!("{agent}/{name}")
    };
    let good = write(
        "good.trace.jsonl",
        format!(
            "{{\"format\":\"run-trace/1\",\"agent_id\":\"{agent}\",\"session_id\":\"{}\"}}\n",
            Uuid::new_v4()
        ),
    );
    let bad = write("bad.trace.jsonl", "not json\n".to_owned());

    let eligible = explain(&pool, dir.path(), "trace", &good).await;
    let kept = explain(&pool, dir.path(), "trace", &bad).await;
    assert_eq!(eligible["verdict"], "eligible");
    assert_eq!(codes(&kept), ["TR-3 bad_signature"]);

    let url = common::database_url(&pool).await;
    let cleaned = common::sexton(&url, dir.path())
        .args(["traces", "clean", "--confirm"])
        .env("SEXTON_TRACES__MAX_AGE_DAYS", "30")
        .output()
        .await
        .unwrap();
    assert!(cleaned.status.success());
    assert!(!paths.traces_root.join(&good).exists());
    assert!(paths.traces_root.join(&bad).exists());
}

#[sqlx::test]
async fn explain_records_agree_with_the_next_pass_and_bad_ids_exit_2(pool: PgPool) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let paths = run::roots(dir.path());
    let account = fixture::account(&pool, Some(30)).await;
    let agent = fixture::agent(&pool, account).await;
    let mut ids = Vec::new();
    for pinned in [true, false] {
        let id: Uuid = sqlx::query_scalar(
            "INSERT INTO working_records (account_id, agent_id, pinned, updated_at)
             VALUES ($1, $2, $3, now() - interval '200 days') RETURNING id",
        )
        .bind(account)
        .bind(agent)
        .bind(pinned)
        .fetch_one(&pool)
        .await
        .unwrap();
        ids.push(id);
    }
    let pinned = explain(&pool, dir.path(), "working_record", &ids[0].to_string()).await;
    let old = explain(&pool, dir.path(), "working_record", &ids[1].to_string()).await;
    assert_eq!(codes(&pinned), ["TTL-3 pinned"]);
    assert_eq!(old["verdict"], "eligible");

    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let settings = ExpirySettings {
        handoffs_days: 14,
        dream_preloads_days: 7,
        working_records_days: 90,
        conversation_events_days: 30,
        batch_size: 100,
        budget: Duration::from_secs(60),
    };
    run::pass::<Expire<WorkingRecords>>(&pool, &paths, &settings, ExpiryArgs::first(None, now))
        .await;
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM working_records")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [ids[0]]);

    // Bad usage: exit 2, saying what is wrong.
    let url = common::database_url(&pool).await;
    for (args, says) in [
        (["explain", "run", "not-a-uuid"], "expected a UUID"),
        (["explain", "sessionx", "1"], "unknown subject"),
        (["explain", "conversation_event", "x1"], "whole number"),
    ] {
        let output = common::sexton(&url, dir.path())
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(says),
            "{args:?}"
        );
    }
    let other_kind = common::sexton(&url, dir.path())
        .args(["explain", "run", &ids[0].to_string()])
        .output()
        .await
        .unwrap();
    assert_eq!(other_kind.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&other_kind.stderr).contains("is a working_record, not a run"),
        "{}",
        String::from_utf8_lossy(&other_kind.stderr)
    );
    let missing = common::sexton(&url, dir.path())
        .args(["explain", "run", &Uuid::new_v4().to_string()])
        .output()
        .await
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
}

/// OP-1: `sexton explain --help` names every subject of every registered kind and the id each
/// takes, from the registry: a kind registered with a subject of its own shows up unasked.
#[test]
fn op1_explain_help_lists_every_registered_subject_and_its_id() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sexton"))
        .args(["explain", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let line = |arg: &str| -> String {
        help.lines()
            .find_map(|l| l.trim_start().strip_prefix(arg))
            .unwrap_or_else(|| panic!("no {arg} in:\n{help}"))
            .trim()
            .to_owned()
    };
    let listed: Vec<String> = line("<SUBJECT>")
        .strip_prefix("What to explain: ")
        .unwrap_or_else(|| panic!("SUBJECT's help:\n{help}"))
        .split(", ")
        .map(str::to_owned)
        .collect();
    let registered: Vec<&str> = sexton::registry::KINDS
        .iter()
        .flat_map(|kind| kind.subjects().iter().copied())
        .collect();
    assert!(!registered.is_empty());
    assert_eq!(listed, registered, "{help}");
    // Each id form as the subject's own job states it; UUIDs for the rest.
    let ids = line("<ID>");
    assert!(ids.starts_with("The subject's id: a UUID"), "{ids}");
    assert!(
        ids.contains("for trace, a path under the traces root"),
        "{ids}"
    );
    assert!(
        ids.contains("for conversation_event, a whole number"),
        "{ids}"
    );
    assert!(!ids.contains("for run,"), "a run's id is a UUID: {ids}");
}
