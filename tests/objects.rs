//! Rules of object storage alone (SPEC §10: OS-2, OS-3, OS-4), against the real S3-compatible server
//! of the test script's object pass (`SEXTON_TEST_S3`, tests/common/backend.rs): the deletes
//! counted by a wrapper around the client, per-key failures made by it. Every file rule that
//! holds on both backends is proven by its own test, run in both passes; these need the server,
//! so they are ignored in the local pass and run with `--include-ignored` in the object pass.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use futures::stream::BoxStream;
use object_store::RetryConfig;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use sexton::event;
use sexton_jobs::attachment_expiry::{AttachmentExpiry, AttachmentSettings};
use sexton_jobs::files::object::{MAX_BATCH, ObjectRoot};
use sexton_jobs::files::{self, Root, Store};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::fixture::{self, RunSpec, days_before_pass};
use crate::common::process::{Proc, fleet_worker, poll_until};
use crate::common::proxy::{Action, Proxy};
use crate::common::{self, backend, run};

/// The S3 client, with each delete call's keys counted and the keys containing `refuse`
/// failed (the others passed on, the answers in the keys' order, as the S3 client gives them),
/// and its listings counted.
#[derive(Debug)]
struct Wrapped {
    inner: Arc<dyn ObjectStore>,
    calls: Arc<Mutex<Vec<usize>>>,
    refuse: Arc<Mutex<Option<String>>>,
    listings: Arc<AtomicUsize>,
}

impl fmt::Display for Wrapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Wrapped({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Wrapped {
    async fn put_opts(
        &self,
        location: &Key,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Key,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Key,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Key>>,
    ) -> BoxStream<'static, object_store::Result<Key>> {
        let (inner, calls, refuse) = (self.inner.clone(), self.calls.clone(), self.refuse.clone());
        futures::stream::once(async move {
            let keys: Vec<Key> = locations.map(|key| key.unwrap()).collect().await;
            calls.lock().unwrap().push(keys.len());
            let refuse = refuse.lock().unwrap().clone();
            let refused = |key: &Key| refuse.as_deref().is_some_and(|r| key.as_ref().contains(r));
            let passed: Vec<_> = keys
                .iter()
                .filter(|k| !refused(k))
                .cloned()
                .map(Ok)
                .collect();
            let answers: Vec<_> = inner
                .delete_stream(futures::stream::iter(passed).boxed())
                .collect()
                .await;
            let mut answers = answers.into_iter();
            let merged: Vec<_> = keys
                .iter()
                .map(|key| match refused(key) {
                    true => Err(object_store::Error::Generic {
                        store: "test",
                        source: format!("AccessDenied: {key} may not be deleted").into(),
                    }),
                    false => answers.next().unwrap(),
                })
                .collect();
            futures::stream::iter(merged)
        })
        .flatten()
        .boxed()
    }

    fn list(&self, prefix: Option<&Key>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.listings.fetch_add(1, Ordering::Relaxed);
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Key>) -> object_store::Result<ListResult> {
        self.listings.fetch_add(1, Ordering::Relaxed);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Key,
        to: &Key,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A bucket of the server's for one test, and `root` in it reached through a [`Wrapped`] client.
struct Bucket {
    dir: tempfile::TempDir,
    store: Store,
    calls: Arc<Mutex<Vec<usize>>>,
    refuse: Arc<Mutex<Option<String>>>,
    listings: Arc<AtomicUsize>,
}

impl Bucket {
    fn new(root: Root) -> Self {
        assert!(
            backend::server().is_some(),
            "needs the S3 server of scripts/test.sh's object pass (SEXTON_TEST_S3)"
        );
        let dir = backend::tempdir();
        let Store::Object(objects) = backend::paths(dir.path()).store(root) else {
            panic!("the root is in the bucket");
        };
        let (calls, refuse, listings) = (Arc::default(), Arc::default(), Arc::default());
        let wrapped = objects.wrapped(|inner| {
            Arc::new(Wrapped {
                inner,
                calls: Arc::clone(&calls),
                refuse: Arc::clone(&refuse),
                listings: Arc::clone(&listings),
            })
        });
        Self {
            dir,
            store: Store::Object(Arc::new(wrapped)),
            calls,
            refuse,
            listings,
        }
    }

    /// An object at `relative` under `root`'s prefix, written an hour before now (before any
    /// record a test makes of it).
    fn object(&self, root: &str, relative: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(root).join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"12345").unwrap();
        common::fixture::set_mtime(&path, SystemTime::now() - Duration::from_secs(3600));
        path
    }
}

/// Records `paths` of `root` for `account`, as the transaction that removed their owners would.
async fn record(pool: &PgPool, root: Root, account: Uuid, paths: &[String]) {
    sqlx::query(
        "INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
         SELECT $1, $2, p FROM unnest($3::text[]) p",
    )
    .bind(root.as_str())
    .bind(account)
    .bind(paths)
    .execute(pool)
    .await
    .unwrap();
}

async fn waiting(pool: &PgPool) -> Vec<(String, i32, Option<String>, bool)> {
    sqlx::query_as(
        "SELECT relative_path, attempts, last_error, quarantined_at IS NOT NULL
         FROM sexton.pending_file_deletions ORDER BY relative_path",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os4_a_session_directory_of_2500_objects_goes_in_calls_of_at_most_1000_keys(pool: PgPool) {
    common::migrate(&pool).await;
    let bucket = Bucket::new(Root::Sessions);
    let account = fixture::account(&pool, Some(30)).await;
    let (gone, kept) = (Uuid::new_v4(), Uuid::new_v4());
    let objects: Vec<_> = (0..2_500)
        .map(|n| bucket.object("sessions", &format!("{gone}/archive/{n}.frame")))
        .collect();
    let beside = bucket.object("sessions", &format!("{kept}/archive/0.frame"));
    record(&pool, Root::Sessions, account, &[gone.to_string()]).await;

    let mut conn = pool.acquire().await.unwrap();
    let counts = files::drain(&mut conn, Root::Sessions, &bucket.store, Some(account))
        .await
        .unwrap();

    assert_eq!((counts.deleted, counts.errors), (2_500, 0));
    assert!(objects.iter().all(|object| !object.exists()));
    assert!(
        beside.exists(),
        "the control: another session's object stays"
    );
    let calls = bucket.calls.lock().unwrap().clone();
    assert_eq!(calls.iter().sum::<usize>(), 2_500);
    assert!(calls.iter().all(|keys| *keys <= MAX_BATCH), "{calls:?}");
    assert_eq!(calls.len(), 3, "batched, not one call a key: {calls:?}");
    assert_eq!(waiting(&pool).await, []);
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_pf7_a_drain_asks_whether_the_store_answers_with_a_head_never_a_listing(pool: PgPool) {
    common::migrate(&pool).await;
    let bucket = Bucket::new(Root::Outputs);
    let account = fixture::account(&pool, Some(30)).await;
    // Three claims' worth: the drain asks before each whether the store answers (an outage is
    // not a failed removal), and a listing's page may cost the store a walk of its bucket.
    let paths: Vec<String> = (0..1_200)
        .map(|n| format!("{account}/run/{n}.out"))
        .collect();
    let objects: Vec<_> = paths.iter().map(|p| bucket.object("outputs", p)).collect();
    let beside = bucket.object("outputs", &format!("{account}/kept.out"));
    record(&pool, Root::Outputs, account, &paths).await;

    let mut conn = pool.acquire().await.unwrap();
    let counts = files::drain(&mut conn, Root::Outputs, &bucket.store, Some(account))
        .await
        .unwrap();

    assert_eq!((counts.deleted, counts.errors), (1_200, 0));
    assert!(objects.iter().all(|object| !object.exists()));
    assert!(beside.exists(), "the control: an unrecorded object stays");
    assert_eq!(waiting(&pool).await, []);
    assert_eq!(
        bucket.listings.load(Ordering::Relaxed),
        0,
        "the drain listed the root"
    );
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os4_a_key_the_store_refuses_to_delete_is_counted_kept_and_retried_by_the_next_drain(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let bucket = Bucket::new(Root::Outputs);
    let account = fixture::account(&pool, Some(30)).await;
    let paths: Vec<String> = ["a.out", "refused.out", "c.out"]
        .iter()
        .map(|name| format!("{account}/run/{name}"))
        .collect();
    let objects: Vec<_> = paths.iter().map(|p| bucket.object("outputs", p)).collect();
    record(&pool, Root::Outputs, account, &paths).await;
    *bucket.refuse.lock().unwrap() = Some("refused".to_owned());

    let mut conn = pool.acquire().await.unwrap();
    let first = files::drain(&mut conn, Root::Outputs, &bucket.store, Some(account))
        .await
        .unwrap();

    assert_eq!((first.deleted, first.errors), (2, 1));
    assert!(!objects[0].exists() && !objects[2].exists());
    assert!(objects[1].exists(), "the refused key's object is there");
    let left = waiting(&pool).await;
    assert_eq!(
        left.len(),
        1,
        "only the refused key's record is kept: {left:?}"
    );
    let (path, attempts, error, quarantined) = &left[0];
    assert_eq!((path, *attempts, *quarantined), (&paths[1], 1, false));
    assert!(
        error.as_deref().unwrap().contains("AccessDenied"),
        "{error:?}"
    );
    let failing = files::failing(&pool).await.unwrap();
    assert_eq!(failing.retrying.get("outputs"), Some(&1), "{failing:?}");

    // The store takes deletes again: the next drain removes it and forgets the record.
    *bucket.refuse.lock().unwrap() = None;
    let second = files::drain(&mut conn, Root::Outputs, &bucket.store, Some(account))
        .await
        .unwrap();
    assert_eq!((second.deleted, second.errors), (1, 0));
    assert!(!objects[1].exists());
    assert_eq!(waiting(&pool).await, []);
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os3_each_spelling_that_could_name_another_key_is_refused_and_counted_a_plain_key_goes(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let bucket = Bucket::new(Root::Outputs);
    let account = fixture::account(&pool, Some(30)).await;
    // Objects that a normalised spelling would reach.
    let aliased = [
        bucket.object("outputs", &format!("{account}/x.out")),
        bucket.object("outputs", &format!("{account}/a/x.out")),
        bucket.object("outputs", "x.out"),
    ];
    let plain = bucket.object("outputs", &format!("{account}/plain.out"));
    let spellings = [
        format!("{account}/a/../x.out"),
        format!("{account}//x.out"),
        format!("{account}/./x.out"),
        format!("./{account}/x.out"),
        format!("/{account}/x.out"),
        format!("{account}/a/x.out/"),
        format!("{account}\\x.out"),
        format!("{account}%2Fx.out"),
        format!("{account}%5cx.out"),
        format!("{account}/x.out\u{1b}"),
        format!("{account}/a/x\n.out"),
        "../x.out".to_owned(),
        String::new(),
    ];
    let mut paths = spellings.to_vec();
    paths.push(format!("{account}/plain.out"));
    record(&pool, Root::Outputs, account, &paths).await;

    let mut conn = pool.acquire().await.unwrap();
    let counts = files::drain(&mut conn, Root::Outputs, &bucket.store, Some(account))
        .await
        .unwrap();

    assert!(
        aliased.iter().all(|object| object.exists()),
        "an aliased key was deleted"
    );
    assert!(!plain.exists(), "the control: the plain key goes");
    assert_eq!(
        (counts.deleted, counts.errors),
        (1, spellings.len() as u64),
        "each refused spelling counted"
    );
    assert_eq!(waiting(&pool).await, [], "refused records are not retried");
    let calls = bucket.calls.lock().unwrap().clone();
    assert_eq!(calls, [1], "only the plain key reached the store");
}

/// An s3s-fs server of the test's own (the object pass names the binary), which the test can
/// stop (SIGSTOP) so that a drain waits on it mid-request, and resume; killed when dropped.
struct OwnServer {
    child: std::process::Child,
    data: tempfile::TempDir,
    endpoint: String,
}

impl OwnServer {
    async fn start() -> Self {
        let binary = std::env::var("SEXTON_TEST_S3S_FS")
            .expect("the object pass names the s3s-fs binary (SEXTON_TEST_S3S_FS)");
        let data = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", backend::ACCESS_KEY])
            .args(["--secret-key", backend::SECRET_KEY])
            .arg(data.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        poll_until(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Self {
            child,
            data,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }

    /// `cmd` with every file root in bucket `bucket` of this server.
    fn roots(&self, cmd: &mut tokio::process::Command, bucket: &str) {
        for (setting, prefix) in [
            ("OUTPUT_ROOT", "outputs"),
            ("ATTACHMENTS_ROOT", "attachments"),
            ("SESSIONS_ROOT", "sessions"),
            ("TRACES_ROOT", "traces"),
        ] {
            cmd.env(
                format!("SEXTON_PATHS__{setting}"),
                format!("s3://{bucket}/{prefix}"),
            );
        }
        cmd.env("SEXTON_STORAGE__ENDPOINT", &self.endpoint)
            .env("SEXTON_STORAGE__REGION", "us-east-1")
            .env("SEXTON_STORAGE__PATH_STYLE", "true")
            .env("SEXTON_STORAGE__ALLOW_HTTP", "true")
            .env("SEXTON_STORAGE__ACCESS_KEY_ID", backend::ACCESS_KEY)
            .env("SEXTON_STORAGE__SECRET_ACCESS_KEY", backend::SECRET_KEY);
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os4_ex8_a_worker_killed_mid_drain_forgets_no_record_and_deletes_nothing_referenced(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let server = OwnServer::start().await;
    let dir = server.data.path().join("platform");
    let url = common::database_url(&pool).await;
    let worker = || {
        let mut cmd = fleet_worker(&url, &dir);
        server.roots(&mut cmd, "platform");
        cmd
    };
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    // Kept: a surviving run's output file, which the records name too.
    let young = RunSpec::conversation(account, conversation, 5.0);
    let young = fixture::run(&pool, &dir.join("outputs"), young).await;
    let referenced = format!("{account}/{}/out.bin", young.id);
    // What a hop recorded before it died: 600 files of runs it pruned, and the referenced one.
    let mut paths: Vec<String> = (0..600)
        .map(|n| format!("{account}/gone/{n}.out"))
        .collect();
    let objects: Vec<_> = paths
        .iter()
        .map(|path| {
            let file = dir.join("outputs").join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            // Written an hour before their runs were pruned (OS-2: an object written in its
            // record's own instant may be a new one, and stays).
            rewrite(
                &file,
                b"12345",
                SystemTime::now() - Duration::from_secs(3600),
            );
            file
        })
        .collect();
    paths.push(referenced.clone());
    record(&pool, Root::Outputs, account, &paths).await;

    // A worker mid-drain: its claim committed, its requests waiting on the stopped store.
    let killed = Proc::spawn(worker());
    killed.wait_for(event::WORKER_STARTED).await;
    server.signal("-STOP");
    let settings = common::settings(&dir);
    sexton::tick::tick(&pool, &settings, fixture::pass_start())
        .await
        .unwrap();
    poll_until(Duration::from_secs(60), || async {
        let left = waiting(&pool).await;
        left.len() < paths.len() || left.iter().any(|(_, attempts, _, _)| *attempts > 0)
    })
    .await;
    killed.kill().await;
    server.signal("-CONT");

    let left = waiting(&pool).await;
    assert_eq!(left.len(), paths.len(), "a record was forgotten");
    // The kill came mid-drain: after the claim committed, before any delete.
    let claimed = left
        .iter()
        .filter(|(_, attempts, _, _)| *attempts > 0)
        .count();
    assert!(
        claimed > 0,
        "the worker was killed before its drain claimed a record"
    );
    assert!(objects.iter().all(|object| object.exists()));

    // The next worker takes the records up again.
    let mut last = worker().arg("--exit-when-idle").spawn().unwrap();
    let status = common::wait(&mut last, Duration::from_secs(120)).await;
    assert!(status.success(), "the last worker exited with {status}");
    assert!(objects.iter().all(|object| !object.exists()));
    assert!(
        dir.join("outputs").join(&referenced).exists(),
        "a file a surviving run references was deleted"
    );
    assert_eq!(waiting(&pool).await, []);
}

/// The root `prefix` of the bucket `dir` is, reached through `proxy` by a client that does not
/// retry (a request the proxy drops or cuts fails at once, as the last of a client's retries
/// would).
fn through(proxy: &Proxy, dir: &std::path::Path, prefix: &str) -> ObjectRoot {
    let bucket = dir.file_name().unwrap().to_str().unwrap();
    let store = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_endpoint(proxy.endpoint())
        .with_region("us-east-1")
        .with_virtual_hosted_style_request(false)
        .with_allow_http(true)
        .with_access_key_id(backend::ACCESS_KEY)
        .with_secret_access_key(backend::SECRET_KEY)
        .with_retry(RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        })
        .build()
        .unwrap();
    ObjectRoot::with_store(bucket, prefix, Arc::new(store))
}

/// Writes `bytes` to `path` (a rewrite of its object), last modified at `at`.
fn rewrite(path: &std::path::Path, bytes: &[u8], at: SystemTime) {
    std::fs::write(path, bytes).unwrap();
    common::fixture::set_mtime(path, at);
}

/// Records `path` of the outputs root for `account` as recorded at `at`.
async fn record_at(pool: &PgPool, account: Uuid, path: &str, at: chrono::DateTime<chrono::Utc>) {
    sqlx::query(
        "INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path, created_at)
         VALUES ('outputs', $1, $2, $3)",
    )
    .bind(account)
    .bind(path)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_an_output_object_rewritten_in_the_second_of_its_record_is_never_deleted(pool: PgPool) {
    common::migrate(&pool).await;
    let bucket = Bucket::new(Root::Outputs);
    let account = fixture::account(&pool, Some(30)).await;
    let (rewritten, old, just_before) = (
        format!("{account}/run/rewritten.out"),
        format!("{account}/run/old.out"),
        format!("{account}/run/just-before.out"),
    );
    let rewritten_object = bucket.object("outputs", &rewritten);
    let old_object = bucket.object("outputs", &old);
    let just_before_object = bucket.object("outputs", &just_before);
    // The rows were removed at .300 of a second; the platform put a new object under the same
    // key at .800 of that second. Its `LastModified` (a whole second) reads earlier than the
    // record, and says nothing about which came first.
    let second = chrono::Utc::now().timestamp() - 60;
    let at = |millis: u32| chrono::DateTime::from_timestamp(second, millis * 1_000_000).unwrap();
    for path in [&rewritten, &old, &just_before] {
        record_at(&pool, account, path, at(300)).await;
    }
    rewrite(&rewritten_object, b"new bytes", SystemTime::from(at(800)));
    // Written in the same second, before the record: a store whose listing gives milliseconds
    // (s3s-fs) tells it apart.
    rewrite(&just_before_object, b"12345", SystemTime::from(at(100)));

    let mut conn = pool.acquire().await.unwrap();
    let counts = files::drain(&mut conn, Root::Outputs, &bucket.store, Some(account))
        .await
        .unwrap();

    assert_eq!(
        std::fs::read(&rewritten_object).unwrap(),
        b"new bytes",
        "an object written in its record's second was deleted"
    );
    assert!(!old_object.exists(), "the control: an hour-old object goes");
    assert!(
        !just_before_object.exists(),
        "an object listed as written before its record goes"
    );
    assert_eq!((counts.deleted, counts.errors), (2, 0));
    assert_eq!(
        waiting(&pool).await,
        [],
        "the new object's record is forgotten"
    );
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_an_output_object_rewritten_after_its_failed_delete_is_judged_by_its_etag(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let bucket = Bucket::new(Root::Outputs);
    let account = fixture::account(&pool, Some(30)).await;
    let paths = [
        format!("{account}/run/refused-rewritten.out"),
        format!("{account}/run/refused-same.out"),
    ];
    let objects: Vec<_> = paths.iter().map(|p| bucket.object("outputs", p)).collect();
    record(&pool, Root::Outputs, account, &paths).await;
    *bucket.refuse.lock().unwrap() = Some("refused".to_owned());
    let mut conn = pool.acquire().await.unwrap();
    let first = files::drain(&mut conn, Root::Outputs, &bucket.store, Some(account))
        .await
        .unwrap();
    assert_eq!((first.deleted, first.errors), (0, 2));
    let judged: Vec<Option<String>> =
        sqlx::query_scalar("SELECT etag FROM sexton.pending_file_deletions ORDER BY relative_path")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        judged.iter().all(Option::is_some),
        "the ETag each delete was judged by is kept: {judged:?}"
    );

    // Rewritten before the next drain, its `LastModified` an hour back (a store's clock behind
    // the database's): only the ETag tells.
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    rewrite(&objects[0], b"new bytes", hour_ago);
    *bucket.refuse.lock().unwrap() = None;
    let second = files::drain(&mut conn, Root::Outputs, &bucket.store, Some(account))
        .await
        .unwrap();

    assert_eq!(
        std::fs::read(&objects[0]).unwrap(),
        b"new bytes",
        "an object rewritten since it was judged was deleted"
    );
    assert!(
        !objects[1].exists(),
        "the control: the unchanged object goes"
    );
    assert_eq!((second.deleted, second.errors), (1, 0));
    assert_eq!(waiting(&pool).await, []);
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_at1_an_attachment_rewritten_between_its_judgement_and_its_record_keeps_its_new_bytes(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let (proxy, dir) = common::backend::before_the_server().await;
    let mut paths = run::roots(dir.path());
    run::object_root(
        &mut paths,
        Root::Attachments,
        Arc::new(through(&proxy, dir.path(), "attachments")),
    );
    let account = fixture::account(&pool, Some(90)).await;
    let mut rows = Vec::new();
    let mut objects = Vec::new();
    for name in ["a/rewritten.bin", "a/old.bin"] {
        let object = paths.attachments_root.join(name);
        std::fs::create_dir_all(object.parent().unwrap()).unwrap();
        rewrite(
            &object,
            b"attachment bytes",
            SystemTime::from(days_before_pass(400.0)),
        );
        objects.push(object);
        let id: Uuid = sqlx::query_scalar(
            "INSERT INTO attachments (account_id, relative_path, bytes, created_at)
             VALUES ($1, $2, 16, $3) RETURNING id",
        )
        .bind(account)
        .bind(name)
        .bind(days_before_pass(400.0))
        .fetch_one(&pool)
        .await
        .unwrap();
        rows.push(id);
    }

    // The judgement's HEADs answered (old bytes: expired) and held on their way back; the
    // platform rewrites one attachment meanwhile, before the record is written.
    proxy.rule(Some("HEAD"), Action::Hold, 2);
    let pass = tokio::spawn({
        let (pool, paths) = (pool.clone(), paths.clone());
        async move {
            let settings = AttachmentSettings {
                max_age_days: 30,
                window_size: 100,
                budget: Duration::from_secs(600),
            };
            let first =
                sexton_jobs::attachment_expiry::Args::first(Some(account), fixture::pass_start());
            run::pass::<AttachmentExpiry>(&pool, &paths, &settings, first).await
        }
    });
    proxy.hit_at_least(2).await;
    rewrite(
        &objects[0],
        b"new attachment bytes",
        SystemTime::now() - Duration::from_secs(5),
    );
    proxy.release();
    let reports = pass.await.unwrap();

    assert_eq!(proxy.hit(), 2, "both judgements were held");
    assert_eq!(
        std::fs::read(&objects[0]).unwrap(),
        b"new attachment bytes",
        "bytes written after the judgement were deleted"
    );
    assert!(!objects[1].exists(), "the control: the judged bytes go");
    let expired: Vec<(Uuid, bool)> = sqlx::query_as(
        "SELECT id, bytes_expired_at IS NOT NULL FROM attachments WHERE id = ANY($1)",
    )
    .bind(&rows)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        expired.contains(&(rows[0], false)),
        "the rewritten attachment names live bytes again: {expired:?}"
    );
    assert!(expired.contains(&(rows[1], true)), "{expired:?}");
    assert_eq!(reports.iter().map(|r| r.files.deleted).sum::<u64>(), 1);
    assert_eq!(waiting(&pool).await, []);
}

/// Outputs of `account` recorded for removal, each with its hour-old object in `dir`'s bucket.
async fn recorded_outputs(
    pool: &PgPool,
    dir: &std::path::Path,
    account: Uuid,
    n: usize,
) -> Vec<std::path::PathBuf> {
    let paths: Vec<String> = (0..n).map(|n| format!("{account}/run/{n}.out")).collect();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let objects = paths
        .iter()
        .map(|path| {
            let object = dir.join("outputs").join(path);
            std::fs::create_dir_all(object.parent().unwrap()).unwrap();
            rewrite(&object, b"12345", hour_ago);
            object
        })
        .collect();
    record(pool, Root::Outputs, account, &paths).await;
    objects
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_a_store_unreachable_for_more_drains_than_attempts_quarantines_nothing_and_its_objects_go_after(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let (proxy, dir) = common::backend::before_the_server().await;
    let store = Store::Object(Arc::new(through(&proxy, dir.path(), "outputs")));
    let account = fixture::account(&pool, Some(30)).await;
    let objects = recorded_outputs(&pool, dir.path(), account, 3).await;

    // Two nights down: every request dropped with its connection.
    proxy.rule(None, Action::Drop, usize::MAX);
    let mut conn = pool.acquire().await.unwrap();
    let drains = files::MAX_ATTEMPTS as usize + 2;
    for _ in 0..drains {
        let outcome = files::drain(&mut conn, Root::Outputs, &store, Some(account)).await;
        assert!(
            matches!(outcome, Err(files::DrainError::Store { .. })),
            "{outcome:?}"
        );
    }
    assert!(proxy.hit() >= drains, "each drain asked the store");
    let left = waiting(&pool).await;
    assert_eq!(left.len(), 3);
    assert!(
        left.iter()
            .all(|(_, attempts, _, quarantined)| *attempts == 0 && !quarantined),
        "an outage counted against a record: {left:?}"
    );
    assert!(objects.iter().all(|object| object.exists()));

    // The store answers again: everything goes.
    proxy.release();
    let counts = files::drain(&mut conn, Root::Outputs, &store, Some(account))
        .await
        .unwrap();
    assert_eq!((counts.deleted, counts.errors), (3, 0));
    assert!(objects.iter().all(|object| !object.exists()));
    assert_eq!(waiting(&pool).await, []);
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os2_a_store_lost_in_the_middle_of_each_drain_quarantines_nothing_and_its_objects_go_after(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let (proxy, dir) = common::backend::before_the_server().await;
    let store = Store::Object(Arc::new(through(&proxy, dir.path(), "outputs")));
    let account = fixture::account(&pool, Some(30)).await;
    let objects = recorded_outputs(&pool, dir.path(), account, 3).await;

    let mut conn = pool.acquire().await.unwrap();
    let drains = files::MAX_ATTEMPTS as usize + 2;
    for n in 1..=drains {
        // The store answers the drain's first request (whether it can be reached), then is
        // gone: its HEADs, and the second look at whether it answers, are dropped.
        proxy.rule_after(1, None, Action::Drop, usize::MAX);
        let outcome = files::drain(&mut conn, Root::Outputs, &store, Some(account)).await;
        assert!(
            matches!(outcome, Err(files::DrainError::Store { .. })),
            "{outcome:?}"
        );
        assert!(proxy.hit() >= 2 * n, "the store went away mid-drain");
    }
    let left = waiting(&pool).await;
    assert!(
        left.iter()
            .all(|(_, attempts, _, quarantined)| *attempts == 0 && !quarantined),
        "an outage counted against a record: {left:?}"
    );
    assert!(objects.iter().all(|object| object.exists()));

    proxy.release();
    let counts = files::drain(&mut conn, Root::Outputs, &store, Some(account))
        .await
        .unwrap();
    assert_eq!((counts.deleted, counts.errors), (3, 0));
    assert!(objects.iter().all(|object| !object.exists()));
    assert_eq!(waiting(&pool).await, []);
}

#[sqlx::test]
#[ignore = "needs the S3 server of scripts/test.sh's object pass"]
async fn os4_a_delete_call_whose_answer_is_lost_counts_each_key_it_removed(pool: PgPool) {
    common::migrate(&pool).await;
    let (proxy, dir) = common::backend::before_the_server().await;
    let store = Store::Object(Arc::new(through(&proxy, dir.path(), "outputs")));
    let account = fixture::account(&pool, Some(30)).await;
    let objects = recorded_outputs(&pool, dir.path(), account, 3).await;

    // The DeleteObjects call reaches the store, which removes every key; its answer is lost.
    proxy.rule(Some("POST"), Action::Cut, 1);
    let mut conn = pool.acquire().await.unwrap();
    let counts = files::drain(&mut conn, Root::Outputs, &store, Some(account))
        .await
        .unwrap();

    proxy.hit_at_least(1).await;
    assert_eq!(proxy.hit(), 1, "the delete call's answer was cut");
    assert!(objects.iter().all(|object| !object.exists()));
    assert_eq!(
        (counts.deleted, counts.bytes, counts.errors),
        (3, 15, 0),
        "what the call removed counts"
    );
    assert_eq!(waiting(&pool).await, []);
    // The control: with every answer forwarded, the next drain finds nothing left to count.
    proxy.release();
    let again = files::drain(&mut conn, Root::Outputs, &store, Some(account))
        .await
        .unwrap();
    assert_eq!(again, files::FileCounts::default());
}
