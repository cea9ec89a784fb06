//! Erasure receipts (RQ-6) on the real binary: receipts appended in their requests'
//! transactions chain to each other; `sexton receipts verify` finds the chain whole, and names
//! the first receipt removed, altered or reordered by hand; `export` prints every receipt as a
//! JSON line and no subject id; `find` recomputes a subject's hash under the key and says which
//! receipts it cannot check; no statement removes or rewrites a receipt.

use std::time::Duration;

use serde_json::{Value, json};
use sexton_jobs::receipts::{self, GENESIS, ReceiptKey};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::process::poll_until;
use crate::common::{self};

/// The secrets the tests write and find receipts under: two eras.
const KEY: &str = "the receipt key of this era";
const OLD_KEY: &str = "the receipt key of the era before";

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

    /// `sexton args…`, with `key` as the receipt key (none when `None`).
    async fn run_with(&self, key: Option<&str>, args: &[&str]) -> Ran {
        let mut command = common::sexton(&self.url, self.dir.path());
        command.env_remove("SEXTON_ERASURE__RECEIPT_KEY");
        if let Some(key) = key {
            command.env("SEXTON_ERASURE__RECEIPT_KEY", key);
        }
        let output = command.args(args).output().await.unwrap();
        Ran {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    async fn run(&self, args: &[&str]) -> Ran {
        self.run_with(Some(KEY), args).await
    }

    /// `receipts verify --json`, parsed, with its exit code.
    async fn verify(&self) -> (Option<i32>, Value) {
        let ran = self.run(&["receipts", "verify", "--json"]).await;
        let verified = serde_json::from_str(&ran.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", ran.stdout, ran.stderr));
        (ran.code, verified)
    }

    /// `receipts verify` must exit 1 naming `seq` and `what`, in text and in JSON.
    async fn broken_at(&self, seq: i64, what: &str) {
        let ran = self.run(&["receipts", "verify"]).await;
        assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
        assert!(
            ran.stderr
                .contains(&format!("receipt chain broken at seq {seq}: {what}")),
            "{}",
            ran.stderr
        );
        let (code, verified) = self.verify().await;
        assert_eq!(code, Some(1));
        assert_eq!(verified["whole"], json!(false));
        assert_eq!(verified["first_bad"], json!({"seq": seq, "what": what}));
        // Control: the receipts before it were read whole.
        assert_eq!(verified["receipts"], json!(seq - 1));
    }

    /// `receipts verify` must exit 0 with `receipts` whole.
    async fn whole(&self, receipts: u64) -> Value {
        let (code, verified) = self.verify().await;
        assert_eq!(code, Some(0), "{verified}");
        assert_eq!(verified["whole"], json!(true));
        assert_eq!(verified["receipts"], json!(receipts));
        verified
    }
}

/// A receipt's body as the erasure job writes it: the subject only as its hash under `key`.
fn body(key: &ReceiptKey, request: Uuid, scope: &str, subject: Uuid, n: i64) -> Value {
    json!({
        "request_id": request,
        "ref": format!("DSR-{n} «ticket»"),
        "scope": scope,
        "requested_by": "privacy desk",
        "received_at": "2026-12-01T09:00:00Z",
        "completed_at": "2026-12-02T09:30:00Z",
        "verified_at": "2026-12-02T09:31:00Z",
        "subject_hash": key.subject_hash(subject),
        "key_id": key.key_id(),
        "rows": {"runs": 10 * n, "conversations": 1, "turns": 0},
        "files": {"outputs": {"files": n, "bytes": 1024 * n}},
        "kept_by_law": {"usage_records": 3},
        "withheld": {},
    })
}

/// Appends one receipt per subject under `key`, each in its own committed transaction, as the
/// erasure job does; the requests' ids, in seq order.
async fn write(pool: &PgPool, key: &str, subjects: &[(&str, Uuid)]) -> Vec<Uuid> {
    let key = ReceiptKey::new(key);
    let mut requests = Vec::new();
    for (n, (scope, subject)) in subjects.iter().enumerate() {
        let request = Uuid::new_v4();
        let mut tx = pool.begin().await.unwrap();
        receipts::append(
            &mut tx,
            request,
            &body(&key, request, scope, *subject, n as i64),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        requests.push(request);
    }
    requests
}

/// `n` receipts of accounts, each its own.
async fn write_accounts(pool: &PgPool, n: usize) -> Vec<Uuid> {
    let subjects: Vec<(&str, Uuid)> = (0..n).map(|_| ("account", Uuid::new_v4())).collect();
    write(pool, KEY, &subjects).await
}

/// Runs `statements` past the trigger that keeps receipts, as someone with the table's owner
/// role could, leaving the trigger on again.
async fn tamper(pool: &PgPool, statements: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN;
         ALTER TABLE sexton.receipts DISABLE TRIGGER sexton_keep_receipts;
         {statements};
         ALTER TABLE sexton.receipts ENABLE TRIGGER sexton_keep_receipts;
         COMMIT;"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// The stored chain: (seq, request_id, body, prev_hash, hash), in seq order.
async fn stored(pool: &PgPool) -> Vec<(i64, Uuid, Value, String, String)> {
    sqlx::query_as(
        "SELECT seq, request_id, body, prev_hash, hash FROM sexton.receipts ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn rq6_each_receipt_chains_to_the_one_before_and_verify_finds_the_chain_whole(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    // Control: an empty chain is whole.
    cli.whole(0).await;

    let requests = write_accounts(&pool, 4).await;
    let chain = stored(&pool).await;
    assert_eq!(
        chain.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        (1..=4).zip(requests.iter().copied()).collect::<Vec<_>>()
    );
    let mut prev = GENESIS.to_owned();
    for (seq, _, body, prev_hash, hash) in &chain {
        assert_eq!(
            prev_hash, &prev,
            "seq {seq} chains to the receipt before it"
        );
        assert_eq!(hash, &receipts::link(prev_hash, body), "seq {seq}");
        prev.clone_from(hash);
    }

    // A request's receipt is written once: a second append returns it and writes nothing.
    let key = ReceiptKey::new(KEY);
    let mut tx = pool.begin().await.unwrap();
    let again = body(&key, requests[1], "account", Uuid::new_v4(), 99);
    assert_eq!(
        receipts::append(&mut tx, requests[1], &again)
            .await
            .unwrap(),
        2
    );
    tx.commit().await.unwrap();
    assert_eq!(stored(&pool).await, chain);
    // Outside a transaction the appender's lock would end with its statement: refused.
    let mut conn = pool.acquire().await.unwrap();
    let request = Uuid::new_v4();
    let refused = receipts::append(&mut conn, request, &again).await;
    assert!(
        matches!(refused, Err(sqlx::Error::InvalidArgument(_))),
        "{refused:?}"
    );
    assert_eq!(stored(&pool).await, chain);

    let verified = cli.whole(4).await;
    assert_eq!(verified["head"], json!({"seq": 4, "hash": chain[3].4}));
    let ran = cli.run(&["receipts", "verify"]).await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(
        ran.stdout
            .contains("the receipt chain is whole: 4 receipts"),
        "{}",
        ran.stdout
    );
}

#[sqlx::test]
async fn rq6_verify_names_an_altered_receipt(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    write_accounts(&pool, 5).await;
    cli.whole(5).await;
    let original: Value = sqlx::query_scalar("SELECT body FROM sexton.receipts WHERE seq = 3")
        .fetch_one(&pool)
        .await
        .unwrap();

    tamper(
        &pool,
        "UPDATE sexton.receipts SET body = jsonb_set(body, '{rows,runs}', '0') WHERE seq = 3",
    )
    .await;
    cli.broken_at(3, "altered").await;

    // Control: the same body back, its keys written in another order, is whole again — the
    // hash is recomputed from what jsonb holds, not from the text that was written.
    let fields: Vec<String> = original
        .as_object()
        .unwrap()
        .iter()
        .rev()
        .map(|(name, value)| format!("{}: {value}", json!(name)))
        .collect();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("ALTER TABLE sexton.receipts DISABLE TRIGGER sexton_keep_receipts")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE sexton.receipts SET body = $1::text::jsonb WHERE seq = 3")
        .bind(format!("{{{}}}", fields.join(", ")))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE sexton.receipts ENABLE TRIGGER sexton_keep_receipts")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    cli.whole(5).await;
}

#[sqlx::test]
async fn rq6_verify_names_a_removed_receipt_renumbered_or_not(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    write_accounts(&pool, 6).await;
    let head = cli.whole(6).await["head"].clone();

    // The last receipt removed breaks no link: the chain reads whole, and only the head
    // recorded before tells (what `verify` prints it for).
    tamper(&pool, "DELETE FROM sexton.receipts WHERE seq = 6").await;
    let shortened = cli.whole(5).await["head"].clone();
    assert_ne!(shortened, head);
    assert_eq!(shortened["seq"], json!(5));

    tamper(&pool, "DELETE FROM sexton.receipts WHERE seq = 3").await;
    cli.broken_at(3, "removed").await;
    // Renumbered to close the gap, it is still named.
    tamper(
        &pool,
        "UPDATE sexton.receipts SET seq = seq - 1 WHERE seq > 3",
    )
    .await;
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT max(seq) FROM sexton.receipts")
            .fetch_one(&pool)
            .await
            .unwrap(),
        4
    );
    cli.broken_at(3, "removed").await;
}

#[sqlx::test]
async fn rq6_verify_names_two_reordered_receipts_at_the_first(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    write_accounts(&pool, 5).await;
    cli.whole(5).await;
    let swap = "UPDATE sexton.receipts SET seq = -2 WHERE seq = 2;
                UPDATE sexton.receipts SET seq = 2 WHERE seq = 4;
                UPDATE sexton.receipts SET seq = 4 WHERE seq = -2";

    tamper(&pool, swap).await;
    cli.broken_at(2, "reordered").await;
    // Control: swapped back, the chain is whole.
    tamper(&pool, swap).await;
    cli.whole(5).await;
}

#[sqlx::test]
async fn rq6_export_prints_every_receipt_as_one_json_line_and_no_subject_id(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let subjects = [
        ("account", Uuid::new_v4()),
        ("conversation", Uuid::new_v4()),
        ("session", Uuid::new_v4()),
    ];
    let requests = write(&pool, KEY, &subjects).await;
    let ran = cli.run(&["receipts", "export"]).await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let lines: Vec<Value> = ran
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    let mut prev = GENESIS.to_owned();
    for (line, (seq, request, body, prev_hash, hash)) in lines.iter().zip(stored(&pool).await) {
        assert_eq!(line["seq"], json!(seq));
        assert_eq!(line["request_id"], json!(request));
        assert_eq!(
            (&line["body"], &line["prev_hash"], &line["hash"]),
            (&body, &json!(prev_hash), &json!(hash))
        );
        // An auditor recomputes the chain from the export alone.
        assert_eq!(line["prev_hash"], json!(prev));
        assert_eq!(receipts::link(&prev, &line["body"]), hash);
        prev = hash;
    }
    let key = ReceiptKey::new(KEY);
    for (_, subject) in subjects {
        for spelling in [
            subject.hyphenated().to_string(),
            subject.simple().to_string(),
            subject.hyphenated().to_string().to_uppercase(),
        ] {
            assert!(
                !ran.stdout.contains(&spelling),
                "subject id {spelling} exported"
            );
        }
        // Control: the subject is there, as its hash.
        assert!(ran.stdout.contains(&key.subject_hash(subject)));
    }
    assert!(requests.iter().all(|r| ran.stdout.contains(&r.to_string())));

    // --since: the receipts written at or after a date or moment.
    tamper(
        &pool,
        "UPDATE sexton.receipts SET written_at = '2020-06-01T00:00:00Z' WHERE seq = 1",
    )
    .await;
    for since in ["2021-01-01", "2021-01-01T00:00:00Z"] {
        let ran = cli.run(&["receipts", "export", "--since", since]).await;
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        let seqs: Vec<Value> = ran
            .stdout
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap()["seq"].clone())
            .collect();
        assert_eq!(seqs, [json!(2), json!(3)], "--since {since}");
    }
    let ran = cli
        .run(&["receipts", "export", "--since", "2020-05-01"])
        .await;
    assert_eq!(ran.stdout.lines().count(), 3);
    let ran = cli
        .run(&["receipts", "export", "--since", "last tuesday"])
        .await;
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
}

#[sqlx::test]
async fn rq6_find_recomputes_the_subjects_hash_and_names_the_key_eras_it_cannot_check(
    pool: PgPool,
) {
    let cli = Cli::new(&pool).await;
    let (account, conversation, old_account) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    write(&pool, OLD_KEY, &[("account", old_account)]).await;
    let requests = write(
        &pool,
        KEY,
        &[
            ("account", account),
            ("conversation", conversation),
            ("account", account),
        ],
    )
    .await;
    let (key, old_key) = (ReceiptKey::new(KEY), ReceiptKey::new(OLD_KEY));

    let find = |key: Option<&'static str>, flag: &'static str, id: Uuid| {
        let cli = &cli;
        async move {
            let id = id.to_string();
            cli.run_with(key, &["receipts", "find", flag, &id, "--json"])
                .await
        }
    };
    let ran = find(Some(KEY), "--account", account).await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let found: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(found["key_id"], json!(key.key_id()));
    let seqs: Vec<&Value> = found["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["seq"])
        .collect();
    assert_eq!(seqs, [&json!(2), &json!(4)]);
    assert_eq!(found["receipts"][0]["request_id"], json!(requests[0]));
    assert_eq!(
        found["other_keys"],
        json!([{"key_id": old_key.key_id(), "receipts": 1}])
    );
    // Control: another subject's receipts are its own.
    let ran = find(Some(KEY), "--conversation", conversation).await;
    let found: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(found["receipts"].as_array().unwrap().len(), 1);
    assert_eq!(found["receipts"][0]["seq"], json!(3));

    // In text: the receipts, and the era this key cannot check.
    let ran = cli
        .run(&["receipts", "find", "--account", &account.to_string()])
        .await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(
        ran.stdout.starts_with("2 receipts for this account"),
        "{}",
        ran.stdout
    );
    assert!(ran.stdout.contains("ref DSR-0 «ticket»"), "{}", ran.stdout);
    assert!(
        ran.stdout.contains(&format!(
            "this key checks only receipts written under key id {}: 1 receipt written under \
             other keys cannot be checked with it (key ids: {} (1))",
            key.key_id(),
            old_key.key_id()
        )),
        "{}",
        ran.stdout
    );

    // The old era's key finds the old receipt, and cannot check this era's three.
    let ran = find(Some(OLD_KEY), "--account", old_account).await;
    let found: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(found["receipts"][0]["seq"], json!(1));
    assert_eq!(
        found["other_keys"],
        json!([{"key_id": key.key_id(), "receipts": 3}])
    );
    let ran = cli
        .run_with(
            Some(OLD_KEY),
            &["receipts", "find", "--account", &account.to_string()],
        )
        .await;
    assert!(
        ran.stdout.starts_with("no receipt for this account"),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains("3 receipts written under other keys"),
        "{}",
        ran.stdout
    );

    // Without the key, or with two subjects, it cannot ask: exit 2, naming the setting.
    let ran = find(None, "--account", account).await;
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("erasure.receipt_key"), "{}", ran.stderr);
    let ran = cli
        .run(&[
            "receipts",
            "find",
            "--account",
            &account.to_string(),
            "--session",
            &account.to_string(),
        ])
        .await;
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    // The key itself is never shown.
    for ran in [
        find(Some(KEY), "--account", account).await,
        find(None, "--agent", account).await,
    ] {
        assert!(!ran.stdout.contains(KEY) && !ran.stderr.contains(KEY));
    }
}

#[sqlx::test]
async fn rq6_no_statement_removes_or_rewrites_a_receipt(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    write_accounts(&pool, 2).await;
    let before = stored(&pool).await;
    for statement in [
        "DELETE FROM sexton.receipts",
        "DELETE FROM sexton.receipts WHERE seq = 2",
        "TRUNCATE sexton.receipts",
        "UPDATE sexton.receipts SET body = '{}'",
        "UPDATE sexton.receipts SET seq = seq + 10",
    ] {
        let err = sqlx::query(statement)
            .execute(&pool)
            .await
            .expect_err(statement);
        assert!(
            err.to_string()
                .contains("receipts are never deleted or rewritten"),
            "{statement}: {err}"
        );
        let hint = err
            .as_database_error()
            .and_then(|e| e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
            .and_then(|e| e.hint().map(str::to_owned));
        assert!(hint.is_some_and(|h| h.starts_with("RQ-6")), "{statement}");
    }
    assert_eq!(stored(&pool).await, before);
    // Control: receipts are still appended, and the chain is whole.
    write_accounts(&pool, 1).await;
    cli.whole(3).await;
}

#[sqlx::test]
async fn rq6_appenders_wait_for_each_other_and_a_rolled_back_one_leaves_no_gap(pool: PgPool) {
    let cli = Cli::new(&pool).await;
    let key = ReceiptKey::new(KEY);
    let receipt = |n: i64| {
        let request = Uuid::new_v4();
        (request, body(&key, request, "agent", Uuid::new_v4(), n))
    };

    // A holds the appenders' lock until it commits; B, begun meanwhile, waits for it.
    let (first, first_body) = receipt(1);
    let mut a = pool.begin().await.unwrap();
    assert_eq!(
        receipts::append(&mut a, first, &first_body).await.unwrap(),
        1
    );
    let (second, second_body) = receipt(2);
    let b = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut b = pool.begin().await.unwrap();
            let seq = receipts::append(&mut b, second, &second_body)
                .await
                .unwrap();
            b.commit().await.unwrap();
            seq
        }
    });
    let waiting = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks
             WHERE locktype = 'advisory' AND NOT granted AND classid::bigint = $1 AND objid = 0",
        )
        .bind(0x5e77_0003_i64)
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    };
    poll_until(Duration::from_secs(60), waiting).await;
    assert!(!b.is_finished());
    a.commit().await.unwrap();
    assert_eq!(
        b.await.unwrap(),
        2,
        "B appended after A's receipt, not beside it"
    );

    // A rolled-back append takes no seq for good.
    let (third, third_body) = receipt(3);
    let mut c = pool.begin().await.unwrap();
    assert_eq!(
        receipts::append(&mut c, third, &third_body).await.unwrap(),
        3
    );
    c.rollback().await.unwrap();
    let (fourth, fourth_body) = receipt(4);
    let mut d = pool.begin().await.unwrap();
    assert_eq!(
        receipts::append(&mut d, fourth, &fourth_body)
            .await
            .unwrap(),
        3
    );
    d.commit().await.unwrap();
    cli.whole(3).await;
}
