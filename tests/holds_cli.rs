//! Holds from the operator's side (SPEC §9): `sexton holds place`, `release` and `list` on the
//! real binary (HD-1), the table that refuses to lose a hold, and the active holds in
//! `sexton status` and the `sexton_holds_active` gauge (HD-5).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sexton::event;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec};
use crate::common::process::{Proc, metric, poll_until, scrape, serving_fleet_worker};
use crate::common::{self};

/// The test's database, file roots, and the binary pointed at both.
struct Cli {
    url: String,
    dir: tempfile::TempDir,
}

/// What one `sexton` command did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Cli {
    async fn new(pool: &PgPool) -> Self {
        common::migrate(pool).await;
        Self {
            url: common::database_url(pool).await,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    async fn run(&self, args: &[&str]) -> Ran {
        let output = common::sexton(&self.url, self.dir.path())
            .args(args)
            .output()
            .await
            .unwrap();
        Ran {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    /// `holds place` on `--<scope> id`, which must succeed: the id it prints.
    async fn place(&self, scope: &str, id: Uuid, case: &str) -> Uuid {
        let ran = self
            .run(&[
                "holds",
                "place",
                &format!("--{scope}"),
                &id.to_string(),
                "--case",
                case,
                "--reason",
                "litigation: preserve every record",
                "--by",
                "legal",
            ])
            .await;
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        ran.stdout
            .trim()
            .parse()
            .expect("place prints the hold's id")
    }

    async fn release(&self, hold: Uuid, by: &str) -> Ran {
        self.run(&["holds", "release", &hold.to_string(), "--by", by])
            .await
    }

    /// `holds list --json` (with `--all` if asked), parsed.
    async fn list(&self, all: bool) -> Vec<Value> {
        let mut args = vec!["holds", "list", "--json"];
        if all {
            args.push("--all");
        }
        let ran = self.run(&args).await;
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        serde_json::from_str::<Value>(&ran.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }
}

/// The ids listed, in their order.
fn ids(listed: &[Value]) -> Vec<Uuid> {
    listed
        .iter()
        .map(|h| h["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

async fn rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sexton.holds")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// One row of each scope's table: an account, its conversation, agent, session and run.
async fn one_of_each(pool: &PgPool, dir: &std::path::Path) -> [(&'static str, Uuid); 5] {
    let account = fixture::account(pool, Some(30)).await;
    let conversation = fixture::conversation(pool, account).await;
    let agent = fixture::agent(pool, account).await;
    let session = fixture::session(pool, account, agent, "task", 1, None).await;
    let run = fixture::run(
        pool,
        &dir.join("outputs"),
        RunSpec::conversation(account, conversation, 40.0),
    )
    .await;
    [
        ("account", account),
        ("conversation", conversation),
        ("agent", agent),
        ("session", session),
        ("run", run.id),
    ]
}

#[sqlx::test]
async fn hd1_a_hold_is_placed_on_each_kind_of_scope_and_listed_with_it(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let scopes = one_of_each(&pool, cli.dir.path()).await;
    let mut placed = Vec::new();
    for (scope, id) in scopes {
        placed.push(cli.place(scope, id, &format!("CASE-{scope}")).await);
    }
    let listed = cli.list(false).await;
    assert_eq!(listed.len(), 5, "{listed:?}");
    for ((scope, id), hold) in scopes.iter().zip(&placed) {
        let row = listed
            .iter()
            .find(|h| h["id"] == hold.to_string())
            .unwrap_or_else(|| panic!("hold {hold} on {scope} not listed: {listed:?}"));
        assert_eq!(row["scope"], *scope);
        assert_eq!(row["scope_id"], id.to_string());
        assert_eq!(row["case_ref"], format!("CASE-{scope}"));
        assert_eq!(row["reason"], "litigation: preserve every record");
        assert_eq!(row["placed_by"], "legal");
        assert!(row["placed_at"].is_string(), "{row}");
        assert!(row["released_by"].is_null() && row["released_at"].is_null());
    }
    // Newest first: the run's hold was placed last.
    assert_eq!(ids(&listed).first(), placed.last());
    let stored: Vec<(String, Uuid)> =
        sqlx::query_as("SELECT scope, scope_id FROM sexton.holds WHERE released_at IS NULL")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(stored.len(), 5);
    for (scope, id) in scopes {
        assert!(stored.contains(&(scope.to_owned(), id)), "{scope} {id}");
    }
    let table = cli.run(&["holds", "list"]).await;
    assert_eq!(table.code, Some(0));
    assert!(table.stdout.starts_with("id "), "{}", table.stdout);
    assert_eq!(table.stdout.lines().count(), 6, "{}", table.stdout);
}

#[sqlx::test]
async fn hd1_a_scope_that_does_not_exist_is_refused_naming_it(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), ..] = one_of_each(&pool, cli.dir.path()).await;
    // A missing id for every scope, and an account's id given as a run's.
    let mut cases: Vec<(&str, Uuid)> = ["account", "conversation", "agent", "session", "run"]
        .into_iter()
        .map(|scope| (scope, Uuid::new_v4()))
        .collect();
    cases.push(("run", account));
    for (scope, id) in cases {
        let id = id.to_string();
        let ran = cli
            .run(&[
                "holds",
                "place",
                &format!("--{scope}"),
                &id,
                "--case",
                "C-1",
                "--reason",
                "r",
                "--by",
                "legal",
            ])
            .await;
        assert_eq!(ran.code, Some(2), "--{scope} {id}: {}", ran.stderr);
        assert!(
            ran.stderr.contains(&format!("--{scope} {id}"))
                && ran.stderr.contains(&format!("no such {scope}")),
            "{}",
            ran.stderr
        );
        assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    }
    assert_eq!(rows(&pool).await, 0, "nothing was held");
    // The control: the account itself can be held.
    cli.place("account", account, "C-1").await;
    assert_eq!(rows(&pool).await, 1);
}

#[sqlx::test]
async fn hd1_a_hold_without_its_placer_case_reason_or_one_scope_is_bad_usage(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), (_, conversation), ..] = one_of_each(&pool, cli.dir.path()).await;
    let (account, conversation) = (account.to_string(), conversation.to_string());
    let full = [
        "holds",
        "place",
        "--account",
        &account,
        "--case",
        "C-1",
        "--reason",
        "r",
        "--by",
        "legal",
    ];
    let without = |flag: &str| -> Vec<&str> {
        let at = full.iter().position(|a| *a == flag).unwrap();
        [&full[..at], &full[at + 2..]].concat()
    };
    let blank = |flag: &str| -> Vec<&str> {
        let at = full.iter().position(|a| *a == flag).unwrap();
        let mut args = full.to_vec();
        args[at + 1] = "  ";
        args
    };
    let both = [&full[..], &["--conversation", &conversation]].concat();
    let refused = [
        (without("--by"), "--by"),
        (without("--case"), "--case"),
        (without("--reason"), "--reason"),
        (without("--account"), "--account"),
        (blank("--by"), "--by"),
        (blank("--case"), "--case"),
        (both, "--conversation"),
    ];
    for (args, named) in refused {
        let ran = cli.run(&args).await;
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(named), "{args:?}: {}", ran.stderr);
    }
    assert_eq!(rows(&pool).await, 0, "nothing was held");
    let ran = cli.run(&full).await;
    assert_eq!(ran.code, Some(0), "the control is placed: {}", ran.stderr);
    assert_eq!(rows(&pool).await, 1);
}

#[sqlx::test]
async fn hd1_a_released_hold_stays_with_who_released_it_and_when(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), (_, conversation), ..] = one_of_each(&pool, cli.dir.path()).await;
    let released = cli.place("account", account, "LIT-1").await;
    let kept = cli.place("conversation", conversation, "LIT-2").await;
    let ran = cli.release(released, "j.doe").await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(ran.stdout.contains(&released.to_string()), "{}", ran.stdout);
    assert!(
        ran.stdout
            .contains(&format!("account {account} is held by no other hold")),
        "{}",
        ran.stdout
    );

    let (by, at, placed_at): (Option<String>, Option<DateTime<Utc>>, DateTime<Utc>) =
        sqlx::query_as(
            "SELECT released_by, released_at, placed_at FROM sexton.holds WHERE id = $1",
        )
        .bind(released)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(by.as_deref(), Some("j.doe"));
    let at = at.expect("released_at is set");
    assert!(at >= placed_at, "released {at} after placed {placed_at}");
    let still: Option<Option<String>> =
        sqlx::query_scalar("SELECT released_by FROM sexton.holds WHERE id = $1")
            .bind(kept)
            .fetch_optional(&pool)
            .await
            .unwrap();
    assert_eq!(still, Some(None), "the other hold is still active");

    assert_eq!(ids(&cli.list(false).await), vec![kept]);
    let all = cli.list(true).await;
    assert_eq!(ids(&all), vec![kept, released]);
    assert_eq!(all[1]["released_by"], "j.doe");
    assert!(all[1]["released_at"].is_string(), "{}", all[1]);
    assert!(all[0]["released_at"].is_null(), "{}", all[0]);
    assert_eq!(rows(&pool).await, 2, "release deletes nothing");
}

#[sqlx::test]
async fn hd1_a_hold_is_released_once_and_an_unknown_one_not_at_all(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), ..] = one_of_each(&pool, cli.dir.path()).await;
    let hold = cli.place("account", account, "LIT-1").await;
    assert_eq!(cli.release(hold, "first").await.code, Some(0));
    let again = cli.release(hold, "second").await;
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(
        again.stderr.contains(&hold.to_string()) && again.stderr.contains("already released"),
        "{}",
        again.stderr
    );
    let by: Option<String> =
        sqlx::query_scalar("SELECT released_by FROM sexton.holds WHERE id = $1")
            .bind(hold)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(by.as_deref(), Some("first"), "the first release stands");

    let unknown = Uuid::new_v4();
    let ran = cli.release(unknown, "first").await;
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr.contains(&format!("no hold {unknown}")),
        "{}",
        ran.stderr
    );
    assert_eq!(rows(&pool).await, 1);
}

#[sqlx::test]
async fn hd1_a_held_scope_may_be_held_again_and_is_free_after_its_last_release(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [_, (_, conversation), ..] = one_of_each(&pool, cli.dir.path()).await;
    let first = cli.place("conversation", conversation, "LIT-1").await;
    let second = cli.place("conversation", conversation, "SEC-9").await;
    assert_ne!(first, second);
    let listed = cli.list(false).await;
    assert_eq!(ids(&listed), vec![second, first]);
    assert!(
        listed
            .iter()
            .all(|h| h["scope"] == "conversation" && h["scope_id"] == conversation.to_string())
    );

    let ran = cli.release(first, "legal").await;
    assert!(
        ran.stdout.contains(&format!(
            "conversation {conversation} is still held by 1 other hold"
        )),
        "{}",
        ran.stdout
    );
    assert_eq!(ids(&cli.list(false).await), vec![second]);
    let ran = cli.release(second, "security").await;
    assert!(
        ran.stdout.contains(&format!(
            "conversation {conversation} is held by no other hold"
        )),
        "{}",
        ran.stdout
    );
    assert!(cli.list(false).await.is_empty());
    assert_eq!(ids(&cli.list(true).await), vec![second, first]);
}

#[sqlx::test]
async fn hd1_the_database_refuses_to_delete_truncate_or_rewrite_a_hold(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), ..] = one_of_each(&pool, cli.dir.path()).await;
    let hold = cli.place("account", account, "LIT-1").await;
    for statement in [
        "DELETE FROM sexton.holds",
        "TRUNCATE sexton.holds",
        "UPDATE sexton.holds SET case_ref = 'other'",
        "UPDATE sexton.holds SET scope_id = gen_random_uuid()",
    ] {
        let err = sqlx::query(statement)
            .execute(&pool)
            .await
            .expect_err(statement);
        assert!(
            err.to_string()
                .contains("holds are never deleted or rewritten"),
            "{statement}: {err}"
        );
    }
    assert_eq!(cli.release(hold, "legal").await.code, Some(0));
    let err = sqlx::query("DELETE FROM sexton.holds")
        .execute(&pool)
        .await
        .expect_err("a released hold is not deleted either");
    assert!(err.to_string().contains("never deleted"), "{err}");
    let (case, by): (String, Option<String>) =
        sqlx::query_as("SELECT case_ref, released_by FROM sexton.holds WHERE id = $1")
            .bind(hold)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((case.as_str(), by.as_deref()), ("LIT-1", Some("legal")));
    assert_eq!(rows(&pool).await, 1);
}

#[sqlx::test]
async fn hd5_status_lists_the_active_holds(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), _, (_, agent), ..] = one_of_each(&pool, cli.dir.path()).await;
    let active = cli.place("agent", agent, "LIT-7").await;
    let released = cli.place("account", account, "LIT-8").await;
    assert_eq!(cli.release(released, "legal").await.code, Some(0));

    let ran = cli.run(&["status", "--json"]).await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let status: Value = serde_json::from_str(&ran.stdout).unwrap();
    let holds = status["holds"].as_array().expect("status lists holds");
    assert_eq!(holds.len(), 1, "only the active hold: {holds:?}");
    let hold = holds[0].as_object().unwrap();
    let mut keys: Vec<&str> = hold.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "case_ref",
            "id",
            "placed_at",
            "placed_by",
            "reason",
            "scope",
            "scope_id"
        ]
    );
    assert_eq!(hold["id"], active.to_string());
    assert_eq!(hold["scope"], "agent");
    assert_eq!(hold["scope_id"], agent.to_string());
    assert_eq!(hold["case_ref"], "LIT-7");
    assert_eq!(hold["placed_by"], "legal");

    let text = cli.run(&["status"]).await.stdout;
    assert!(text.contains("1 active hold, newest first"), "{text}");
    assert!(
        text.contains(&format!(
            "{active} on agent {agent}: case LIT-7, placed by legal"
        )),
        "{text}"
    );
    assert!(!text.contains(&released.to_string()), "{text}");
}

#[sqlx::test]
async fn hd5_the_holds_active_gauge_counts_the_active_holds(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), (_, conversation), ..] = one_of_each(&pool, cli.dir.path()).await;
    let first = cli.place("account", account, "LIT-1").await;
    cli.place("conversation", conversation, "LIT-2").await;
    let released = cli.place("conversation", conversation, "LIT-3").await;
    assert_eq!(cli.release(released, "legal").await.code, Some(0));

    let (mut cmd, address) = serving_fleet_worker(&cli.url, cli.dir.path());
    cmd.env("SEXTON_HTTP__REFRESH_INTERVAL_MS", "200");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    let gauge = || async { metric(&scrape(&address).await, "sexton_holds_active") };
    poll_until(Duration::from_secs(60), || async {
        gauge().await == Some(2.0)
    })
    .await;
    assert_eq!(cli.release(first, "legal").await.code, Some(0));
    poll_until(Duration::from_secs(60), || async {
        gauge().await == Some(1.0)
    })
    .await;
    worker.stop().await;
}

/// Releasing a hold says what still covers its scope through the scopes above it (HD-1, HD-2):
/// a session's agent and account holds, a run's conversation and account holds; the scope is
/// "held by no other hold" only once none does. The control: holds on another account's scopes
/// are not named.
#[sqlx::test]
async fn hd1_a_release_names_the_holds_that_still_cover_the_scope_through_its_agent_or_account(
    pool: PgPool,
) {
    let cli = Cli::new(&pool).await;
    let [
        (_, account),
        (_, conversation),
        (_, agent),
        (_, session),
        (_, run),
    ] = one_of_each(&pool, cli.dir.path()).await;
    let [(_, elsewhere), _, (_, other_agent), ..] = one_of_each(&pool, cli.dir.path()).await;
    cli.place("account", elsewhere, "OTHER-1").await;
    cli.place("agent", other_agent, "OTHER-2").await;
    let on_account = cli.place("account", account, "LIT-1").await;
    let on_agent = cli.place("agent", agent, "LIT-2").await;
    let on_conversation = cli.place("conversation", conversation, "LIT-3").await;
    let on_session = cli.place("session", session, "LIT-4").await;
    let on_run = cli.place("run", run, "LIT-5").await;

    let said = cli.release(on_session, "legal").await;
    assert_eq!(said.code, Some(0), "{}", said.stderr);
    assert!(
        said.stdout.contains(&format!(
            "session {session} is still held by 2 other holds: 1 on its agent {agent}, 1 on its \
             account {account}"
        )),
        "{}",
        said.stdout
    );
    let said = cli.release(on_run, "legal").await.stdout;
    assert!(
        said.contains(&format!(
            "run {run} is still held by 2 other holds: 1 on its conversation {conversation}, 1 \
             on its account {account}"
        )),
        "{said}"
    );
    let said = cli.release(on_agent, "legal").await.stdout;
    assert!(
        said.contains(&format!(
            "agent {agent} is still held by 1 other hold: 1 on its account {account}"
        )),
        "{said}"
    );
    let said = cli.release(on_account, "legal").await.stdout;
    assert!(
        said.contains(&format!("account {account} is held by no other hold")),
        "{said}"
    );
    let said = cli.release(on_conversation, "legal").await.stdout;
    assert!(
        said.contains(&format!(
            "conversation {conversation} is held by no other hold"
        )),
        "{said}"
    );
}

/// `sexton status` at many holds shows their count and the newest ten, then points to
/// `holds list` for the rest (HD-5); `--json` has the count and the same ten. The control: at
/// a few holds every one is listed (hd5_status_lists_the_active_holds).
#[sqlx::test]
async fn hd5_status_at_many_holds_shows_their_count_and_the_newest_ten(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), ..] = one_of_each(&pool, cli.dir.path()).await;
    let placed: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO sexton.holds (scope, scope_id, case_ref, reason, placed_by, placed_at)
         SELECT 'account', $1, 'CASE-' || i, 'kept', 'legal', now() - i * interval '1 minute'
         FROM generate_series(1, 25) AS i
         RETURNING id",
    )
    .bind(account)
    .fetch_all(&pool)
    .await
    .unwrap();
    // Newest first: the first ten placed (1 to 10 minutes ago).
    let (newest, older) = placed.split_at(10);

    let text = cli.run(&["status"]).await;
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    let text = text.stdout;
    assert!(
        text.contains("25 active holds, the newest 10 first"),
        "{text}"
    );
    assert!(
        text.contains("… and 15 more: sexton holds list shows every one"),
        "{text}"
    );
    for id in newest {
        assert!(text.contains(&id.to_string()), "{id} listed: {text}");
    }
    for id in older {
        assert!(!text.contains(&id.to_string()), "{id} not listed: {text}");
    }
    let listed = text.lines().filter(|l| l.contains(" on account ")).count();
    assert_eq!(listed, 10, "{text}");

    let ran = cli.run(&["status", "--json"]).await;
    let status: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(status["holds_active"], 25);
    assert_eq!(status["holds_error"], Value::Null);
    let shown: Vec<String> = status["holds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = newest.iter().map(Uuid::to_string).collect();
    assert_eq!(shown, expected);
    assert_eq!(
        cli.list(false).await.len(),
        25,
        "holds list shows every one"
    );
}

/// With the hold table unreadable (renamed away), `sexton status` and `sexton preview` still
/// show what they can — the passes, the failed jobs, the jobs whose preview needs no hold —
/// and say the holds could not be read, exit 0; the jobs still remove nothing (HD-3). The
/// control: with the table back, both show the holds again and no such line.
#[sqlx::test]
async fn hd3_status_and_preview_show_what_they_can_when_the_holds_cannot_be_read(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let [(_, account), ..] = one_of_each(&pool, cli.dir.path()).await;
    cli.place("account", account, "LIT-1").await;
    // A pass in the ledger, and a job failed for good.
    let settings = common::settings(cli.dir.path());
    sexton::tick::tick(&pool, &settings, fixture::pass_start())
        .await
        .unwrap();
    // A payload the handler rejects: failed for good, kept.
    sqlx::query(
        "INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts)
         VALUES ('{}'::bytea, '01J00000000000000000000000', 'sexton.prune_execution_details',
                 'Pending', 0, 2)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut worker = common::sexton(&cli.url, cli.dir.path());
    worker.args(["worker", "--exit-when-idle"]);
    let status = common::wait(&mut worker.spawn().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(
        status.code(),
        Some(1),
        "the rejected payload failed for good"
    );

    sqlx::query("ALTER TABLE sexton.holds RENAME TO holds_away")
        .execute(&pool)
        .await
        .unwrap();
    let text = cli.run(&["status"]).await;
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        text.stdout.contains("the holds could not be read"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("latest passes"), "{}", text.stdout);
    assert!(
        text.stdout.contains("failed for good, kept for inspection"),
        "{}",
        text.stdout
    );
    let json = cli.run(&["status", "--json"]).await;
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    let status: Value = serde_json::from_str(&json.stdout).unwrap();
    assert!(status["holds_error"].is_string(), "{status}");
    assert_eq!(status["holds_active"], Value::Null);
    assert!(!status["failed_jobs"].as_array().unwrap().is_empty());
    let preview = cli.run(&["preview"]).await;
    assert_eq!(preview.code, Some(0), "{}", preview.stderr);
    assert!(
        preview.stdout.contains("the holds could not be read"),
        "{}",
        preview.stdout
    );
    let preview = cli.run(&["preview", "--json"]).await;
    assert_eq!(preview.code, Some(0), "{}", preview.stderr);
    let lines: Vec<Value> = serde_json::from_str(&preview.stdout).unwrap();
    assert!(lines.iter().any(|l| l["error"].is_string()), "{lines:?}");
    assert!(
        lines.iter().any(|l| l["error"].is_null()),
        "the jobs that read no hold are shown: {lines:?}"
    );

    sqlx::query("ALTER TABLE sexton.holds_away RENAME TO holds")
        .execute(&pool)
        .await
        .unwrap();
    let text = cli.run(&["status"]).await.stdout;
    assert!(!text.contains("could not be read"), "{text}");
    assert!(text.contains("1 active hold"), "{text}");
    let preview = cli.run(&["preview"]).await;
    assert_eq!(preview.code, Some(0), "{}", preview.stderr);
    assert!(!preview.stdout.contains("could not be read"));
}

#[sqlx::test]
async fn op1_bidi_controls_and_line_breaks_in_a_hold_are_escaped_in_holds_list_and_status(
    pool: PgPool,
) {
    let cli = Cli::new(&pool).await;
    let [(_, account), _, (_, agent), ..] = one_of_each(&pool, cli.dir.path()).await;
    let case = "LIT-\u{202e}7-\u{2066}TIL\u{2069}\nFORGED case";
    let reason = "keep\u{200f} it\nFORGED reason \u{61c}\u{202a}";
    let ran = cli
        .run(&[
            "holds",
            "place",
            "--agent",
            &agent.to_string(),
            "--case",
            case,
            "--reason",
            reason,
            "--by",
            "legal\u{202d}\nFORGED by",
        ])
        .await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    // Control: a plain hold beside it, shown as it was given.
    cli.place("account", account, "LIT-8").await;

    for command in [&["holds", "list"][..], &["status"]] {
        let ran = cli.run(command).await;
        assert_eq!(ran.code, Some(0), "{command:?}: {}", ran.stderr);
        let out = &ran.stdout;
        assert!(
            !out.chars().any(sexton_jobs::shown::is_bidi_control),
            "{command:?} wrote a bidi control: {out:?}"
        );
        assert!(
            out.lines().all(|line| !line.starts_with("FORGED")),
            "{command:?} let a stored line break start a line: {out}"
        );
        for shown in [
            r"LIT-\u{202e}7-\u{2066}TIL\u{2069}\u{a}FORGED case",
            r"keep\u{200f} it\u{a}FORGED reason \u{61c}\u{202a}",
            r"legal\u{202d}\u{a}FORGED by",
            "LIT-8",
        ] {
            assert!(
                out.contains(shown),
                "{command:?} does not show {shown}: {out}"
            );
        }
    }
}
