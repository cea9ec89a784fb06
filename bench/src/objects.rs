//! The object store the file parts also run on (SPEC §10, OS-5): a real S3-compatible server
//! that `bench/run.sh` starts on loopback (s3s-fs, which keeps each object as a file, so that a
//! part writes and ages its tree as files in a bucket's directory and every method sees the same
//! objects), reached by sexton through its `[storage]` settings and by the plain loops through the
//! same client sexton uses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sexton_jobs::files::object::{ObjectRoot, StorageSettings};

use crate::cli::Cli;

/// The credentials bench/run.sh starts the server with (scripts/lib.sh's `with_s3s_fs`).
const ACCESS_KEY: &str = "sexton-test";
const SECRET_KEY: &str = "sexton-test-secret";

/// The server: its endpoint, and the directory whose subdirectories are its buckets.
pub struct Server {
    endpoint: String,
    dir: PathBuf,
    /// Requests in flight at once, for sexton and the floors.
    pub max_in_flight: usize,
}

impl Server {
    /// The server the command line names, if any.
    pub fn of(cli: &Cli) -> Option<Self> {
        Some(Self {
            endpoint: cli.s3_endpoint.clone()?,
            dir: cli.s3_dir.clone()?,
            max_in_flight: cli.max_in_flight,
        })
    }

    /// The server's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The same server reached at `endpoint` (a proxy in front of it).
    pub fn through(&self, endpoint: String) -> Self {
        Self {
            endpoint,
            dir: self.dir.clone(),
            max_in_flight: self.max_in_flight,
        }
    }

    /// The directory of bucket `bucket`.
    pub fn bucket(&self, bucket: &str) -> PathBuf {
        self.dir.join(bucket)
    }

    fn storage(&self) -> StorageSettings {
        StorageSettings {
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".to_owned()),
            path_style: true,
            allow_http: true,
            access_key_id: Some(ACCESS_KEY.to_owned()),
            secret_access_key: Some(SECRET_KEY.to_owned()),
            batch_delete: true,
            max_in_flight: self.max_in_flight,
        }
    }

    /// The root at `dir` (a directory under a bucket's), as the plain loops reach it.
    pub fn root(&self, dir: &Path) -> anyhow::Result<Arc<ObjectRoot>> {
        let (bucket, prefix) = self.split(dir)?;
        let root = ObjectRoot::new(&bucket, &prefix, &self.storage())
            .map_err(|why| anyhow::anyhow!("the object root {}: {why}", dir.display()))?;
        Ok(Arc::new(root))
    }

    /// The environment that gives sexton the root `SEXTON_PATHS__<setting>` at `dir` (a
    /// directory under a bucket's), reached through this server.
    pub fn env(&self, setting: &str, dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
        let (bucket, prefix) = self.split(dir)?;
        let max_in_flight = self.max_in_flight.to_string();
        let storage = [
            ("MAX_IN_FLIGHT", max_in_flight.as_str()),
            ("ENDPOINT", self.endpoint.as_str()),
            ("REGION", "us-east-1"),
            ("PATH_STYLE", "true"),
            ("ALLOW_HTTP", "true"),
            ("ACCESS_KEY_ID", ACCESS_KEY),
            ("SECRET_ACCESS_KEY", SECRET_KEY),
        ];
        let mut env: Vec<(String, String)> = storage
            .iter()
            .map(|(k, v)| (format!("SEXTON_STORAGE__{k}"), (*v).to_owned()))
            .collect();
        env.push((
            format!("SEXTON_PATHS__{setting}"),
            format!("s3://{bucket}/{prefix}"),
        ));
        Ok(env)
    }

    /// The bucket and prefix of `dir`.
    fn split(&self, dir: &Path) -> anyhow::Result<(String, String)> {
        let relative = dir.strip_prefix(&self.dir)?.to_str().unwrap_or_default();
        let (bucket, prefix) = relative.split_once('/').unwrap_or((relative, ""));
        Ok((bucket.to_owned(), prefix.to_owned()))
    }
}
