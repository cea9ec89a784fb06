//! The files rows point at, on disk under the configured roots: filler bodies and text with a
//! chosen modification time (so that age-based jobs see them as old), and symlinks.
//!
//! Creating a file is mostly the file system's metadata work, which would otherwise stall the
//! generator: writes go to background threads, each path always to the same thread (so that
//! two writes of one path keep their order), and [`Disk::finish`] waits for all of them.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use chrono::{DateTime, Utc};

use super::SeedError;
use crate::config::PathSettings;

/// Threads writing files.
const WRITERS: usize = 2;
/// Writes queued per thread before the generator waits for the file system.
const QUEUED: usize = 4096;

/// One file-system change.
enum Write {
    File {
        path: PathBuf,
        body: Vec<u8>,
        mtime: DateTime<Utc>,
    },
    Symlink {
        target: PathBuf,
        link: PathBuf,
    },
}

/// A writer thread: where its writes go, and how it ended.
struct Writer {
    writes: SyncSender<Write>,
    thread: JoinHandle<Result<(), SeedError>>,
}

/// Writes files under the roots and counts what it wrote.
pub(super) struct Disk<'a> {
    pub(super) paths: &'a PathSettings,
    files: u64,
    bytes: u64,
    writers: Vec<Writer>,
}

impl<'a> Disk<'a> {
    pub(super) fn new(paths: &'a PathSettings) -> Self {
        let writers = (0..WRITERS)
            .map(|_| {
                let (writes, receive) = sync_channel(QUEUED);
                Writer {
                    writes,
                    thread: std::thread::spawn(move || write_all(&receive)),
                }
            })
            .collect();
        Self {
            paths,
            files: 0,
            bytes: 0,
            writers,
        }
    }

    /// Regular files written so far (symlinks are not counted).
    pub(super) fn files(&self) -> u64 {
        self.files
    }

    /// Bytes written so far.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A file of `bytes` filler bytes, modified at `mtime`.
    ///
    /// # Errors
    /// [`SeedError::File`] naming a path that could not be written.
    pub(super) fn filler(
        &mut self,
        path: &Path,
        bytes: usize,
        mtime: DateTime<Utc>,
    ) -> Result<(), SeedError> {
        let body: Vec<u8> = (0..bytes).map(|i| b"sexton-seed\n"[i % 12]).collect();
        self.write(path, body, mtime)
    }

    /// A file holding `text`, modified at `mtime`.
    ///
    /// # Errors
    /// [`SeedError::File`] naming a path that could not be written.
    pub(super) fn text(
        &mut self,
        path: &Path,
        text: &str,
        mtime: DateTime<Utc>,
    ) -> Result<(), SeedError> {
        self.write(path, text.as_bytes().to_vec(), mtime)
    }

    /// A symlink at `link` to `target`, replacing whatever was at `link`.
    ///
    /// # Errors
    /// [`SeedError::File`] naming a path that could not be written.
    pub(super) fn symlink(&mut self, target: &Path, link: &Path) -> Result<(), SeedError> {
        self.send(Write::Symlink {
            target: target.to_owned(),
            link: link.to_owned(),
        })
    }

    /// Waits until every file is on disk.
    ///
    /// # Errors
    /// [`SeedError::File`] naming the first path that could not be written.
    pub(super) fn finish(&mut self) -> Result<(), SeedError> {
        let mut result = Ok(());
        for Writer { writes, thread } in std::mem::take(&mut self.writers) {
            drop(writes);
            let written = thread.join().expect("a file writer does not panic");
            result = result.and(written);
        }
        result
    }

    fn write(&mut self, path: &Path, body: Vec<u8>, mtime: DateTime<Utc>) -> Result<(), SeedError> {
        self.files += 1;
        self.bytes += body.len() as u64;
        self.send(Write::File {
            path: path.to_owned(),
            body,
            mtime,
        })
    }

    /// Queues a write on its path's thread. A thread stops early only on an error, which is
    /// returned.
    fn send(&mut self, write: Write) -> Result<(), SeedError> {
        let path = match &write {
            Write::File { path, .. } => path,
            Write::Symlink { link, .. } => link,
        };
        let mut hasher = std::hash::DefaultHasher::new();
        path.hash(&mut hasher);
        let shard = (hasher.finish() % self.writers.len() as u64) as usize;
        if self.writers[shard].writes.send(write).is_err() {
            self.finish()?;
        }
        Ok(())
    }
}

impl Drop for Disk<'_> {
    fn drop(&mut self) {
        // An early return of the seed: let the threads end; their errors were not asked for.
        let _ = self.finish();
    }
}

/// A writer thread: applies writes until the generator hangs up or one fails.
fn write_all(writes: &Receiver<Write>) -> Result<(), SeedError> {
    for write in writes {
        match write {
            Write::File { path, body, mtime } => {
                write_file(&path, &body, mtime)
                    .map_err(|source| SeedError::File { path, source })?;
            }
            Write::Symlink { target, link } => {
                replace_symlink(&target, &link)
                    .map_err(|source| SeedError::File { path: link, source })?;
            }
        }
    }
    Ok(())
}

fn write_file(path: &Path, body: &[u8], mtime: DateTime<Utc>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::File::create(path)?;
    std::io::Write::write_all(&mut file, body)?;
    file.set_modified(mtime.into())
}

fn replace_symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    if let Some(dir) = link.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(target, link)
}
