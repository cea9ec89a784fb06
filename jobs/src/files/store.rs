//! Where a root's files are — a directory or a prefix in an object store (OS-1) — and what a
//! job reads of one file there: every job that judges or removes files goes through it (the
//! drain, attachment expiry, session removal, `explain`).

use super::*;

/// Where a root's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    Local(PathBuf),
    Object(Arc<ObjectRoot>),
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Local(path) => write!(f, "{}", path.display()),
            Store::Object(objects) => write!(f, "{objects}"),
        }
    }
}

/// A root opened to look at its files: a directory's descriptor, or the object store.
pub enum Opened {
    Local(OwnedFd),
    Object(Arc<ObjectRoot>),
}

/// What is at a path under a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A regular file or an object, last modified then.
    File { modified: DateTime<Utc> },
    /// A symlink (never followed).
    Symlink,
    /// Anything else: a directory, a device, a socket.
    Other,
}

/// Why a path could not be looked at.
#[derive(Debug)]
pub enum Unseen {
    /// It names nothing under the root of its own (`..`, absolute, a symlink on the way, OS-3).
    OutsideRoot,
    /// The file system or the store failed.
    Unreadable,
}

impl Opened {
    /// Opens `store`.
    ///
    /// # Errors
    /// [`DrainError::Root`] when a directory root cannot be opened.
    pub fn open(store: &Store) -> Result<Self, DrainError> {
        match store {
            Store::Local(path) => {
                let fd = open_root(path).map_err(|source| DrainError::Root {
                    path: path.clone(),
                    source,
                })?;
                Ok(Opened::Local(fd))
            }
            Store::Object(objects) => Ok(Opened::Object(objects.clone())),
        }
    }

    /// What is at `relative`; `None` when nothing is.
    ///
    /// # Errors
    /// [`Unseen`].
    pub async fn entry(&self, relative: &str) -> Result<Option<Entry>, Unseen> {
        match self {
            Opened::Local(fd) => match stat_under(fd, relative) {
                Ok(Some(stat)) => Ok(Some(match FileType::from_raw_mode(stat.st_mode) {
                    FileType::RegularFile => Entry::File {
                        modified: DateTime::from_timestamp(stat.st_mtime, 0)
                            .unwrap_or(DateTime::<Utc>::MAX_UTC),
                    },
                    FileType::Symlink => Entry::Symlink,
                    _ => Entry::Other,
                })),
                Ok(None) => Ok(None),
                Err(err) if err.kind() == io::ErrorKind::InvalidInput => Err(Unseen::OutsideRoot),
                Err(_) => Err(Unseen::Unreadable),
            },
            Opened::Object(objects) => match objects.head(relative).await {
                Ok(found) => Ok(found.map(|object| Entry::File {
                    modified: object.last_modified,
                })),
                Err(object::Refusal::Refused(_)) => Err(Unseen::OutsideRoot),
                Err(object::Refusal::Store(_)) => Err(Unseen::Unreadable),
            },
        }
    }
}
