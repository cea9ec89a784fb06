//! The backend the file tests run against (OS-5): local directories, or — when the test script
//! starts a real S3-compatible server (`s3s-fs`, which keeps each object as a file) and sets
//! `SEXTON_TEST_S3` to its endpoint and `SEXTON_TEST_S3_ROOT` to its data directory — buckets on
//! that server. A test's directory from [`tempdir`] is then a bucket of its own, each file root a
//! prefix in it, and the files a test writes, ages and looks for under `dir/<root>` are the
//! objects the jobs see: the same test proves the rule on both backends.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sexton::config::PathSettings;
use sexton_jobs::files::Root;
use sexton_jobs::files::object::{ObjectRoot, StorageSettings};

/// The credentials the test script starts the server with.
pub const ACCESS_KEY: &str = "sexton-test";
pub const SECRET_KEY: &str = "sexton-test-secret";

/// The server's endpoint and data directory, when the file tests run against object storage.
pub fn server() -> Option<(String, PathBuf)> {
    let endpoint = std::env::var("SEXTON_TEST_S3").ok()?;
    let root = std::env::var("SEXTON_TEST_S3_ROOT").ok()?;
    Some((endpoint, PathBuf::from(root)))
}

/// A directory for one test's file roots: a bucket of the server's when there is one.
pub fn tempdir() -> tempfile::TempDir {
    match server() {
        Some((_, root)) => tempfile::Builder::new()
            .prefix(&format!("t{}", uuid::Uuid::new_v4().simple()))
            .rand_bytes(0)
            .tempdir_in(root)
            .expect("a bucket directory"),
        None => tempfile::tempdir().expect("a temp dir"),
    }
}

/// How the jobs reach the server.
pub fn storage(endpoint: &str) -> StorageSettings {
    StorageSettings {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".to_owned()),
        path_style: true,
        allow_http: true,
        access_key_id: Some(ACCESS_KEY.to_owned()),
        secret_access_key: Some(SECRET_KEY.to_owned()),
        batch_delete: true,
        max_in_flight: sexton_jobs::files::object::DEFAULT_MAX_IN_FLIGHT,
    }
}

/// The bucket `dir` is, when it is one of the server's.
fn bucket(dir: &Path) -> Option<(String, String)> {
    let (endpoint, root) = server()?;
    let name = dir.strip_prefix(&root).ok()?.to_str()?.to_owned();
    Some((endpoint, name))
}

/// The file roots under `dir`: directories, and on the object backend also prefixes of the
/// bucket `dir` is (outputs, attachments, sessions, traces).
pub fn paths(dir: &Path) -> PathSettings {
    let mut paths = PathSettings {
        output_root: dir.join("outputs"),
        attachments_root: dir.join("attachments"),
        artifacts_root: dir.join("artifacts"),
        sessions_root: dir.join("sessions"),
        traces_root: dir.join("traces"),
        objects: Vec::new(),
    };
    if let Some((endpoint, bucket)) = bucket(dir) {
        let storage = storage(&endpoint);
        for (root, prefix) in [
            (Root::Outputs, "outputs"),
            (Root::Attachments, "attachments"),
            (Root::Sessions, "sessions"),
            (Root::Traces, "traces"),
        ] {
            let objects = ObjectRoot::new(&bucket, prefix, &storage).expect("an object root");
            paths.objects.push((root, Arc::new(objects)));
        }
    }
    paths
}

/// The environment that points the `sexton` binary at the roots of [`paths`].
pub fn env(dir: &Path) -> Vec<(&'static str, String)> {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut env = vec![
        ("SEXTON_PATHS__OUTPUT_ROOT", path("outputs")),
        ("SEXTON_PATHS__ATTACHMENTS_ROOT", path("attachments")),
        ("SEXTON_PATHS__ARTIFACTS_ROOT", path("artifacts")),
        ("SEXTON_PATHS__SESSIONS_ROOT", path("sessions")),
        ("SEXTON_PATHS__TRACES_ROOT", path("traces")),
    ];
    if let Some((endpoint, bucket)) = bucket(dir) {
        for (setting, prefix) in [
            ("SEXTON_PATHS__OUTPUT_ROOT", "outputs"),
            ("SEXTON_PATHS__ATTACHMENTS_ROOT", "attachments"),
            ("SEXTON_PATHS__SESSIONS_ROOT", "sessions"),
            ("SEXTON_PATHS__TRACES_ROOT", "traces"),
        ] {
            if let Some(entry) = env.iter_mut().find(|(name, _)| *name == setting) {
                entry.1 = format!("s3://{bucket}/{prefix}");
            }
        }
        env.extend([
            ("SEXTON_STORAGE__ENDPOINT", endpoint),
            ("SEXTON_STORAGE__REGION", "us-east-1".to_owned()),
            ("SEXTON_STORAGE__PATH_STYLE", "true".to_owned()),
            ("SEXTON_STORAGE__ALLOW_HTTP", "true".to_owned()),
            ("SEXTON_STORAGE__ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("SEXTON_STORAGE__SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
        ]);
    }
    env
}

/// The bytes a file counts for against a quota: allocated blocks × 512 on disk (TR-2), the
/// object's size on the object backend (OS-2).
pub fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).expect("the file");
    if server().is_some() {
        meta.len()
    } else {
        meta.blocks() * 512
    }
}

/// Whether nothing of `path` is left: on disk, it does not exist; on the object backend, no
/// object is under it (a store has no directories: the server may keep the empty ones).
pub fn gone(path: &Path) -> bool {
    if server().is_none() {
        return !path.exists();
    }
    let mut dirs = vec![path.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            if dir.symlink_metadata().is_ok() {
                return false;
            }
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => dirs.push(entry.path()),
                _ => return false,
            }
        }
    }
    true
}

/// A proxy in front of the object pass's S3 server, and a bucket of that server for one test's
/// roots.
pub async fn before_the_server() -> (super::proxy::Proxy, tempfile::TempDir) {
    let (endpoint, _) = server().expect("the S3 server of the object pass");
    (super::proxy::Proxy::start(&endpoint).await, tempdir())
}
