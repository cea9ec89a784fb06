//! The files rows point at, on disk under the configured roots: filler bodies and text with a
//! chosen modification time (so that age-based jobs see them as old), and symlinks.

use std::path::Path;

use chrono::{DateTime, Utc};

use super::SeedError;
use crate::config::PathSettings;

/// Writes files under the roots and counts what it wrote.
pub(super) struct Disk<'a> {
    pub(super) paths: &'a PathSettings,
    files: u64,
    bytes: u64,
}

impl<'a> Disk<'a> {
    pub(super) fn new(paths: &'a PathSettings) -> Self {
        Self {
            paths,
            files: 0,
            bytes: 0,
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
    /// [`SeedError::File`] naming the path.
    pub(super) fn filler(
        &mut self,
        path: &Path,
        bytes: usize,
        mtime: DateTime<Utc>,
    ) -> Result<(), SeedError> {
        let body: Vec<u8> = (0..bytes).map(|i| b"sexton-seed\n"[i % 12]).collect();
        self.write(path, &body, mtime)
    }

    /// A file holding `text`, modified at `mtime`.
    ///
    /// # Errors
    /// [`SeedError::File`] naming the path.
    pub(super) fn text(
        &mut self,
        path: &Path,
        text: &str,
        mtime: DateTime<Utc>,
    ) -> Result<(), SeedError> {
        self.write(path, text.as_bytes(), mtime)
    }

    /// A symlink at `link` to `target`, replacing whatever was at `link`.
    ///
    /// # Errors
    /// [`SeedError::File`] naming the link.
    pub(super) fn symlink(&mut self, target: &Path, link: &Path) -> Result<(), SeedError> {
        let fail = |source| SeedError::File {
            path: link.to_owned(),
            source,
        };
        match std::fs::remove_file(link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
            _ => {}
        }
        std::os::unix::fs::symlink(target, link).map_err(fail)
    }

    fn write(&mut self, path: &Path, body: &[u8], mtime: DateTime<Utc>) -> Result<(), SeedError> {
        let fail = |source| SeedError::File {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        std::fs::write(path, body).map_err(fail)?;
        set_mtime(path, mtime).map_err(fail)?;
        self.files += 1;
        self.bytes += body.len() as u64;
        Ok(())
    }
}

/// Sets a file's modification time.
fn set_mtime(path: &Path, at: DateTime<Utc>) -> std::io::Result<()> {
    let file = std::fs::File::options().write(true).open(path)?;
    file.set_modified(at.into())
}
