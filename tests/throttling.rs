//! OS-2 and OS-4 behind a store that throttles (SPEC §8 PF-7): the real S3-compatible server of
//! the test script's object pass, reached through the loopback proxy of tests/common/proxy.rs
//! set to a request rate above which it answers `503 SlowDown` itself. Each root's window of
//! requests in flight shrinks at the throttling and grows back once the store keeps up, and no
//! key is lost on the way: what must go is gone, what must stay stays, and no record is left.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sexton_jobs::attachment_expiry::{AttachmentExpiry, AttachmentSettings};
use sexton_jobs::files::object::{ObjectRoot, StorageSettings};
use sexton_jobs::files::{Root, Store};
use sexton_jobs::trace_cleanup::{self as job, Limits, Quiet};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::common::fixture::{self, days_before_pass, pass_start};
use crate::common::proxy::{Action, Proxy};
use crate::common::{self, backend, run};

/// Requests a second the proxy lets through: far fewer than a window of [`MAX_IN_FLIGHT`] on
/// loopback sends.
const RATE: u32 = 200;

/// The roots' window at its widest.
const MAX_IN_FLIGHT: usize = 16;

/// The root `prefix` of the bucket `dir` is, reached through `proxy` as sexton reaches a store
/// (its own S3 client, its window of at most [`MAX_IN_FLIGHT`]).
fn through(proxy: &Proxy, dir: &Path, prefix: &str) -> Arc<ObjectRoot> {
    let bucket = dir.file_name().unwrap().to_str().unwrap();
    let storage = StorageSettings {
        max_in_flight: MAX_IN_FLIGHT,
        ..backend::storage(&proxy.endpoint())
    };
    Arc::new(ObjectRoot::new(bucket, prefix, &storage).unwrap())
}

/// Writes `bytes` at `path`, last modified `days` before the pass start.
fn write_aged(path: &Path, bytes: &[u8], days: f64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    common::fixture::set_mtime(path, days_before_pass(days));
}

/// A trace of a session no agent is in, last modified `days` before the pass start.
fn trace(root: &Path, agent: Uuid, name: &str, days: f64) -> PathBuf {
    let signature = serde_json::json!({
        "format": "run-trace/1", "agent_id": agent.to_string(),
        "session_id": Uuid::new_v4().to_string()
    });
    let path = root.join(agent.to_string()).join(name);
    write_aged(&path, format!("{signature}\nstep\n").as_bytes(), days);
    path
}

async fn records_left(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_os4_a_trace_cleanup_behind_a_store_that_throttles_deletes_every_old_trace_and_keeps_the_young(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let (proxy, dir) = common::backend::before_the_server().await;
    let traces = dir.path().join("traces");
    let agent = Uuid::new_v4();
    // More old traces than two of the cleaner's batches (256): batches are deleted while the
    // walk's signature reads of the next ones are in flight, read ahead (an answered one keeps
    // no place the batch's HEADs and delete call need: see window.rs's
    // pf7_an_answered_request_gives_its_place_back_before_its_caller_looks_at_it).
    let old: Vec<PathBuf> = (0..600)
        .map(|n| trace(&traces, agent, &format!("old-{n:03}.trace.jsonl"), 40.0))
        .collect();
    let young: Vec<PathBuf> = (0..50)
        .map(|n| trace(&traces, agent, &format!("young-{n:03}.trace.jsonl"), 10.0))
        .collect();
    let root = through(&proxy, dir.path(), "traces");
    let store = Store::Object(root.clone());

    proxy.limit_rate(Some(RATE));
    let report = crate::holds::clean_traces_in(&pool, &store)
        .await
        .expect("a throttled pass is not aborted");

    let throttled = proxy.throttled();
    let seen = root.window().seen();
    assert!(throttled > 0, "the store throttled the pass");
    assert!(
        seen.throttled > 0 && seen.lowest < MAX_IN_FLIGHT,
        "the window shrank: {seen:?} ({throttled} answered 503)"
    );
    // A window of one on loopback sends far more than the rate: it spaced its requests out.
    assert!(seen.longest_gap > Duration::ZERO, "paced: {seen:?}");
    assert_eq!(
        (report.candidates, report.deleted),
        (650, 600),
        "{report:?}"
    );
    assert!(!report.kept.contains_key("error"), "{report:?}");
    assert!(!report.kept.contains_key("unreadable"), "{report:?}");
    // Each old trace's signature read (600 GETs: with no quota the young are not read) and
    // each read again before its delete (600 HEADs) got through, besides the listing and the
    // delete calls.
    assert!(proxy.forwarded() >= 1202, "{} forwarded", proxy.forwarded());
    let left: Vec<_> = old.iter().filter(|path| path.exists()).collect();
    assert!(left.is_empty(), "old traces left: {left:?}");
    assert!(young.iter().all(|path| path.exists()), "the control stays");

    // The store keeps up again: the next pass's answers grow the window back, or its pace (a
    // quota, so that the young traces' signatures are read too).
    proxy.limit_rate(None);
    let mut conn = pool.acquire().await.unwrap();
    let limits = Limits {
        max_age_days: 30,
        max_bytes: 1 << 40,
    };
    let dry = job::clean(
        &mut conn,
        &store,
        limits,
        pass_start(),
        None,
        &mut Quiet,
        &AtomicBool::new(false),
    )
    .await
    .unwrap();
    assert_eq!(dry.candidates, 50);
    let after = root.window().seen();
    assert!(
        after.size > seen.lowest || after.gap < seen.gap,
        "the window grew back, or its pace did: {after:?} after {seen:?}"
    );
    assert_eq!(proxy.throttled(), throttled, "no 503 without a rate");
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_os4_an_attachment_pass_behind_a_store_that_throttles_removes_every_expired_file_and_forgets_no_record(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let (proxy, dir) = common::backend::before_the_server().await;
    let mut paths = run::roots(dir.path());
    let root = through(&proxy, dir.path(), "attachments");
    run::object_root(&mut paths, Root::Attachments, root.clone());
    let account = fixture::account(&pool, Some(90)).await;
    let mut rows = Vec::new();
    let mut files = Vec::new();
    for (n, days) in (0..150)
        .map(|n| (n, 400.0))
        .chain((150..180).map(|n| (n, 10.0)))
    {
        let name = format!("a/{n:03}.bin");
        let file = paths.attachments_root.join(&name);
        write_aged(&file, b"attachment bytes", days);
        files.push(file);
        let id: Uuid = sqlx::query_scalar(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             VALUES ($1, $2, 16, $3) RETURNING id",
        )
        .bind(account)
        .bind(&name)
        .bind(days_before_pass(days))
        .fetch_one(&pool)
        .await
        .unwrap();
        rows.push(id);
    }

    proxy.limit_rate(Some(RATE));
    let settings = AttachmentSettings {
        max_age_days: 30,
        window_size: 100,
        budget: Duration::from_secs(600),
    };
    let first = sexton_jobs::attachment_expiry::Args::first(Some(account), fixture::pass_start());
    let reports = run::pass::<AttachmentExpiry>(&pool, &paths, &settings, first).await;

    let throttled = proxy.throttled();
    let seen = root.window().seen();
    assert!(throttled > 0, "the store throttled the pass");
    assert!(
        seen.throttled > 0 && seen.lowest < MAX_IN_FLIGHT,
        "the window shrank: {seen:?} ({throttled} answered 503)"
    );
    let expired: Vec<bool> = sqlx::query_scalar(
        "SELECT bytes_expired_at IS NOT NULL FROM attachments
         JOIN unnest($1::uuid[]) WITH ORDINALITY AS t (id, n) USING (id) ORDER BY t.n",
    )
    .bind(&rows)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(expired[..150].iter().all(|e| *e), "every old row expired");
    assert!(expired[150..].iter().all(|e| !*e), "the control stays");
    let left: Vec<_> = files[..150].iter().filter(|f| f.exists()).collect();
    assert!(left.is_empty(), "expired files left: {left:?}");
    assert!(files[150..].iter().all(|f| f.exists()), "the control stays");
    assert_eq!(reports.iter().map(|r| r.files.deleted).sum::<u64>(), 150);
    assert_eq!(records_left(&pool).await, 0, "no record left behind");

    // The store keeps up again: the next pass's answers (a HEAD of each young file) grow the
    // window back, or its pace (see window.rs: a request a second more for each answer).
    proxy.limit_rate(None);
    let again = sexton_jobs::attachment_expiry::Args::first(Some(account), fixture::pass_start());
    run::pass::<AttachmentExpiry>(&pool, &paths, &settings, again).await;
    let after = root.window().seen();
    assert!(
        after.size > seen.lowest || after.gap < seen.gap,
        "the window grew back, or its pace did: {after:?} after {seen:?}"
    );
    assert!(files[150..].iter().all(|f| f.exists()), "the control stays");
}

/// One answer read off `stream`: its status line (its body, by its `Content-Length`, read too).
async fn status_line(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.unwrap());
    }
    let head = String::from_utf8(head).unwrap();
    let length = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, value)| value.trim().parse().unwrap());
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.unwrap();
    head.lines().next().unwrap().to_owned()
}

#[tokio::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn pf7_the_throttling_store_answers_each_request_whole_however_its_bytes_arrive() {
    let (endpoint, _) = backend::server().expect("the S3 server of the object pass");
    let proxy = Proxy::start(&endpoint).await;
    let address = proxy.endpoint().replace("http://", "");
    let mut client = TcpStream::connect(&address).await.unwrap();
    client.set_nodelay(true).unwrap();
    // Each piece on its own: the proxy, on this test's thread, reads it before the next comes.
    let send = async |client: &mut TcpStream, pieces: &[&str]| {
        for piece in pieces {
            client.write_all(piece.as_bytes()).await.unwrap();
            tokio::task::yield_now().await;
        }
    };
    proxy.rule(None, Action::SlowDown, 2);

    // A delete call whose head comes in two pieces and whose body, in a third, reads like a
    // request of its own: answered 503 as one request, nothing of it forwarded.
    let body = "GET /other HTTP/1.1\r\nHost: a\r\n\r\n";
    let length = format!("Content-Length: {}\r\n\r\n", body.len());
    send(
        &mut client,
        &["POST /bucket?delete HTTP/1.1\r\nHost: a\r\n", &length, body],
    )
    .await;
    assert_eq!(status_line(&mut client).await, "HTTP/1.1 503 Slow Down");
    // A chunked body, its chunks and their sizes split anywhere.
    send(
        &mut client,
        &[
            "PUT /bucket/key HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "1",
            "3\r\nHEAD / HTTP/1.1\r\n",
            "\r\n\r\n4\r\n\r\n\r\n\r\n0\r\n",
            "\r\n",
        ],
    )
    .await;
    assert_eq!(status_line(&mut client).await, "HTTP/1.1 503 Slow Down");
    assert_eq!(proxy.forwarded(), 0, "nothing of them reached the server");

    // The control: the next request on the same connection reaches the server whole, and its
    // answer is the server's.
    send(&mut client, &["GET / HTTP/1.1\r\nHost: a\r\n\r\n"]).await;
    let answer = status_line(&mut client).await;
    assert!(
        answer.starts_with("HTTP/1.1 ") && !answer.contains("503"),
        "{answer}"
    );
    assert_eq!(proxy.forwarded(), 1);
}
