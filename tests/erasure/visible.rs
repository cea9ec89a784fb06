//! RQ-7, erasure visible and on time: the gauges of a real worker after requests in several
//! states, `sexton status` (and the status page) listing the open requests by id and never a
//! subject, and `sexton explain` naming the request that removed a subject — by its keyed hash,
//! once the request completed — or the hold an open one waits on.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sexton::event;
use sexton_jobs::erasure::request::{self, Opened};
use sexton_jobs::erasure::{Erase, Erasure, Request, State, Subject};
use sexton_jobs::files::PathSettings;
use sexton_jobs::pass::ArgsOf;
use sexton_jobs::receipts::ReceiptKey;
use sqlx::PgPool;
use uuid::Uuid;

use super::world::Tenant;
use super::{KEY, settings, two_tenants};
use crate::common::fixture::pass_start;
use crate::common::process::{Proc, metric, poll_until, scrape, serving_fleet_worker};
use crate::common::{self, run};

/// The hold on the other tenant's conversation: its case is named, its reason never shown.
const CASE: &str = "LIT-RQ7";

/// Two tenants and four requests: `completed` (the first tenant's conversation, due two days
/// ago, done), `pointed` (the first tenant's main session, which its agent points at: waiting,
/// due a day ago, so overdue), `held` (the other tenant's conversation, under a hold: waiting,
/// due in 30 days) and `failed` (the other tenant's task session, failed with two residues).
struct World {
    dir: tempfile::TempDir,
    paths: PathSettings,
    one: Tenant,
    other: Tenant,
    completed: Request,
    pointed: Request,
    held: Request,
    failed: Request,
    hold: Uuid,
}

async fn now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Records a request as `sexton erase` does, due at `due_at`.
async fn open(pool: &PgPool, subject: Subject, id: Uuid, due_at: DateTime<Utc>) -> Request {
    let erasure = Erasure {
        subject,
        id,
        reference: "DSR-7".to_owned(),
        requested_by: "privacy@example.com".to_owned(),
        due_at: Some(due_at),
    };
    let mut conn = pool.acquire().await.unwrap();
    match request::open(
        &mut conn,
        &erasure,
        &ReceiptKey::new(KEY),
        chrono::Duration::days(30),
    )
    .await
    .unwrap()
    {
        Opened::New(request) => request,
        Opened::Open(request) => panic!("{id} is covered by {}", request.id),
    }
}

async fn get(pool: &PgPool, id: Uuid) -> Request {
    request::get(&mut pool.acquire().await.unwrap(), id)
        .await
        .unwrap()
        .unwrap()
}

/// A whole pass of the erasure kind.
async fn pass(pool: &PgPool, paths: &PathSettings) {
    run::pass::<Erase>(
        pool,
        paths,
        &settings(true),
        ArgsOf::<Erase>::first(None, pass_start()),
    )
    .await;
}

async fn world(pool: &PgPool) -> World {
    let dir = common::backend::tempdir();
    let (paths, one, other) = two_tenants(pool, dir.path()).await;
    let hold: Uuid = sqlx::query_scalar(
        "INSERT INTO sexton.holds (scope, scope_id, case_ref, reason, placed_by)
         VALUES ('conversation', $1, $2, 'litigation', 'legal') RETURNING id",
    )
    .bind(other.conversation)
    .bind(CASE)
    .fetch_one(pool)
    .await
    .unwrap();
    let at = now(pool).await;
    let day = chrono::Duration::days(1);
    let completed = open(pool, Subject::Conversation, one.conversation, at - day * 2).await;
    let pointed = open(pool, Subject::Session, one.other_session, at - day).await;
    let held = open(
        pool,
        Subject::Conversation,
        other.conversation,
        at + day * 30,
    )
    .await;
    pass(pool, &paths).await;
    let failed = open(pool, Subject::Session, other.session, at + day * 40).await;
    sqlx::query(
        "UPDATE sexton.erasures SET state = 'failed', residues = 2,
                last_error = 'verification found what the steps cannot remove'
         WHERE id = $1",
    )
    .bind(failed.id)
    .execute(pool)
    .await
    .unwrap();
    let world = World {
        completed: get(pool, completed.id).await,
        pointed: get(pool, pointed.id).await,
        held: get(pool, held.id).await,
        failed: get(pool, failed.id).await,
        dir,
        paths,
        one,
        other,
        hold,
    };
    assert_eq!(world.completed.state, State::Completed);
    assert_eq!(world.pointed.state, State::Waiting);
    assert_eq!(world.held.state, State::Waiting);
    assert!(world.held.withheld.0["legal_hold"].as_i64().unwrap() > 0);
    world
}

/// A worker's gauges after requests in several states: every state exported, each counted
/// (completed ones by their receipts), the earliest due date of an open request — the overdue
/// one, not the completed one due earlier — and the residues found; then, once the overdue
/// request completes, the next open one's due date, and the residue counter as it was though
/// the rows were lowered by hand (it never goes down).
#[sqlx::test]
async fn rq7_the_erasure_gauges_count_requests_by_state_and_read_the_earliest_open_due_date(
    pool: PgPool,
) {
    let w = world(&pool).await;
    let url = common::database_url(&pool).await;
    let (mut cmd, address) = serving_fleet_worker(&url, w.dir.path());
    cmd.env("SEXTON_HTTP__REFRESH_INTERVAL_MS", "200");
    let worker = Proc::spawn(cmd);
    worker.wait_for(event::WORKER_STARTED).await;
    let expected = |completed: f64, waiting: f64| {
        [
            ("received", 0.0),
            ("running", 0.0),
            ("waiting", waiting),
            ("verifying", 0.0),
            ("completed", completed),
            ("failed", 1.0),
        ]
    };
    let reads = |page: &str, states: [(&str, f64); 6]| {
        states.iter().all(|(state, n)| {
            metric(page, &format!("sexton_erasures{{state=\"{state}\"}}")) == Some(*n)
        }) && metric(page, "sexton_erasure_residues_total") == Some(2.0)
    };
    poll_until(Duration::from_secs(60), || async {
        reads(&scrape(&address).await, expected(1.0, 2.0))
    })
    .await;
    let page = scrape(&address).await;
    let due = metric(&page, "sexton_erasure_due_seconds").unwrap();
    // The overdue request's (a day ago), not the completed one's (two days ago).
    assert!(
        (-86_400.0 - 120.0..-86_400.0 + 5.0).contains(&due),
        "due {due}: {page}"
    );

    // The agent lets go of its session, the request runs again and completes.
    sqlx::query("UPDATE agents SET main_session_id = NULL WHERE id = $1")
        .bind(w.one.agent)
        .execute(&pool)
        .await
        .unwrap();
    request::retry(&mut pool.acquire().await.unwrap(), w.pointed.id)
        .await
        .unwrap();
    common::process::wait_until_idle(&pool).await;
    pass(&pool, &w.paths).await;
    assert_eq!(get(&pool, w.pointed.id).await.state, State::Completed);
    sqlx::query("UPDATE sexton.erasures SET residues = 0 WHERE id = $1")
        .bind(w.failed.id)
        .execute(&pool)
        .await
        .unwrap();
    poll_until(Duration::from_secs(60), || async {
        reads(&scrape(&address).await, expected(2.0, 1.0))
    })
    .await;
    let due = metric(&scrape(&address).await, "sexton_erasure_due_seconds").unwrap();
    assert!(
        (29.0 * 86_400.0..30.0 * 86_400.0).contains(&due),
        "the held request's, in 30 days: {due}"
    );
    worker.stop().await;
}

/// `sexton status` (JSON and text) and the status page list the open requests — id, scope kind,
/// state, due date, overdue or not, withheld counts, the hold by id — and not the completed one;
/// none of them shows a subject's id, the ticket, who asked, or the receipt key.
#[sqlx::test]
async fn rq7_status_lists_the_open_requests_by_id_and_never_a_subject(pool: PgPool) {
    let w = world(&pool).await;
    let settings = common::settings(w.dir.path());
    let at = now(&pool).await;
    let status = sexton::status::read(&pool, &settings, at, &Default::default(), None)
        .await
        .unwrap();
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["erasures_open"], 3);
    let listed: Vec<&Value> = json["erasures"].as_array().unwrap().iter().collect();
    let ids: Vec<&str> = listed.iter().map(|r| r["id"].as_str().unwrap()).collect();
    // The earliest due first; the completed request is not listed.
    assert_eq!(
        ids,
        [w.pointed.id, w.held.id, w.failed.id].map(|id| id.to_string())
    );
    assert_eq!(listed[0]["scope"], "session");
    assert_eq!(listed[0]["state"], "waiting");
    assert_eq!(listed[0]["overdue"], true);
    assert_eq!(listed[0]["withheld"]["pointed_at"], 1);
    assert_eq!(listed[1]["scope"], "conversation");
    assert_eq!(listed[1]["overdue"], false);
    assert!(listed[1]["withheld"]["legal_hold"].as_i64().unwrap() > 0);
    assert_eq!(listed[1]["holds"], serde_json::json!([w.hold.to_string()]));
    assert_eq!(listed[2]["state"], "failed");
    assert_eq!(listed[2]["residues"], 2);

    let text = status.render();
    let page = sexton::status_page::render(&status);
    assert!(text.contains("3 open erasure requests"), "{text}");
    assert!(
        text.contains(&format!("{} session: waiting", w.pointed.id)) && text.contains("OVERDUE"),
        "{text}"
    );
    assert!(
        page.contains(&format!("id=\"erasure-{}\"", w.held.id)),
        "{page}"
    );
    assert!(page.contains(&w.hold.to_string()) && page.contains("1 overdue"));
    // Nowhere: what the requests name or keep of their subjects, the completed request.
    for (what, never) in [
        ("the completed request", w.completed.id.to_string()),
        ("an erased subject", w.one.conversation.to_string()),
        ("a subject", w.one.other_session.to_string()),
        ("a subject", w.other.session.to_string()),
        ("the ticket", "DSR-7".to_owned()),
        ("who asked", "privacy@example.com".to_owned()),
        ("the receipt key", KEY.to_owned()),
        ("a subject's hash", w.pointed.subject_hash.clone()),
    ] {
        for out in [&json.to_string(), &text, &page] {
            assert!(!out.contains(&never), "{what} shown: {out}");
        }
    }
    // Not in the erasures' own lines either: the held subject (its hold's section names the
    // scope it holds), its account, what it withholds by id.
    let sections = [
        json["erasures"].to_string(),
        text[text.find("open erasure requests").unwrap()..].to_owned(),
        page[page.find("<section id=\"erasures\">").unwrap()..].to_owned(),
    ];
    for section in &sections {
        for never in [
            w.other.conversation,
            w.other.account,
            w.other.runs[0],
            w.one.account,
        ] {
            assert!(!section.contains(&never.to_string()), "{never}: {section}");
        }
    }
}

/// `sexton explain --json` with the receipt key set (or `wrong` when given).
async fn explain(w: &World, pool: &PgPool, subject: &str, id: Uuid, key: &str) -> (i32, Value) {
    let url = common::database_url(pool).await;
    let output = common::sexton(&url, w.dir.path())
        .args(["explain", subject, &id.to_string(), "--json"])
        .env("SEXTON_ERASURE__RECEIPT_KEY", key)
        .output()
        .await
        .unwrap();
    let code = output.status.code().unwrap();
    if code != 0 {
        return (
            code,
            Value::String(String::from_utf8_lossy(&output.stderr).into()),
        );
    }
    (code, serde_json::from_slice(&output.stdout).unwrap())
}

fn reasons(said: &Value) -> Vec<(String, String)> {
    said["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["code"].as_str().unwrap().to_owned(),
                r["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `sexton explain` names the request that removed a subject once it completed — found by the
/// subject's keyed hash, the request keeping no id of it — and when; of what an open request
/// withholds, the request and why: the hold by id and case, the agent's pointer. The controls:
/// under another key the completed subject is not found; another tenant's session no erasure
/// touched gets session retention's verdict as before, and an account no request covers is
/// retained, no request named.
#[sqlx::test]
async fn rq7_explain_names_the_request_that_removed_it_and_the_hold_that_keeps_it(pool: PgPool) {
    let w = world(&pool).await;
    assert_eq!(w.completed.scope_id, None, "only the hash is left");

    let (code, removed) = explain(&w, &pool, "conversation", w.one.conversation, KEY).await;
    assert_eq!(code, 0, "{removed}");
    assert_eq!(removed["job"], "erasure");
    assert_eq!(removed["verdict"], "removed");
    let completed_at = w.completed.completed_at.unwrap();
    let said_at: DateTime<Utc> = serde_json::from_value(removed["removed_at"].clone()).unwrap();
    assert_eq!(said_at, completed_at);
    assert!(
        removed["removed_by"]
            .as_str()
            .unwrap()
            .contains(&w.completed.id.to_string())
    );
    assert_eq!(reasons(&removed)[0].0, "erased");

    let (_, held) = explain(&w, &pool, "conversation", w.other.conversation, KEY).await;
    assert_eq!(held["verdict"], "retained", "{held}");
    let why = reasons(&held);
    assert!(
        why.iter().any(|(code, detail)| code == "legal_hold"
            && detail.contains(&w.hold.to_string())
            && detail.contains(CASE)
            && detail.contains(&w.held.id.to_string())),
        "{held}"
    );
    // A run of it is withheld by the same hold, and named with the same request.
    let (_, run) = explain(&w, &pool, "run", w.other.runs[0], KEY).await;
    assert_eq!(run["job"], "erasure", "{run}");
    assert_eq!(run["verdict"], "retained");
    assert!(
        reasons(&run)
            .iter()
            .any(|(code, detail)| code == "legal_hold" && detail.contains(&w.held.id.to_string())),
        "{run}"
    );
    let (_, pointed) = explain(&w, &pool, "session", w.one.other_session, KEY).await;
    assert_eq!(pointed["job"], "erasure", "{pointed}");
    assert_eq!(pointed["verdict"], "retained");
    assert!(
        reasons(&pointed).iter().any(
            |(code, detail)| code == "pointed_at" && detail.contains(&w.pointed.id.to_string())
        ),
        "{pointed}"
    );

    // Controls. Under another key the hash is another: nothing names the erased conversation.
    let (code, unknown) = explain(
        &w,
        &pool,
        "conversation",
        w.one.conversation,
        "another key of sixteen characters",
    )
    .await;
    assert_eq!(code, 2, "{unknown}");
    assert!(
        unknown.as_str().unwrap().contains("no conversation"),
        "{unknown}"
    );
    // A session no erasure touched: session retention's verdict, as before.
    let (_, untouched) = explain(&w, &pool, "session", w.other.other_session, KEY).await;
    assert_eq!(untouched["job"], "session_retention", "{untouched}");
    assert!(
        !untouched.to_string().contains("erasure request"),
        "{untouched}"
    );
    // An account no request covers (its conversation's and session's requests do not).
    let (_, account) = explain(&w, &pool, "account", w.one.account, KEY).await;
    assert_eq!(account["verdict"], "retained", "{account}");
    assert_eq!(reasons(&account)[0].0, "not_requested");
    for id in [w.completed.id, w.pointed.id, w.held.id, w.failed.id] {
        assert!(!account.to_string().contains(&id.to_string()), "{account}");
    }
}
