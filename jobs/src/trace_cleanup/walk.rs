//! The walk of a traces root: directories read one component at a time from the root's
//! descriptor, each trace's first line read for its signature (TR-2).

use std::ffi::{CStr, OsStr};
use std::io::{self, Read as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{FileType, Mode, OFlags};
use serde::Deserialize;
use uuid::Uuid;

use crate::files::object::ObjectRoot;
pub(super) use crate::files::object::{time_ns, to_time};
use crate::files::tree::{self, Look, Looked};

use super::{Error, FIRST_LINE_LIMIT, FORMAT, LEASE_FILE, MAX_DEPTH};

/// Bytes of a path as a [`Path`], whatever they are.
pub(super) fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// What a file looked like when it was planned: for an object, its ETag too (no inode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) ino: u64,
    pub(super) size: i64,
    pub(super) mtime_ns: i128,
    pub(super) etag: Option<String>,
}

/// One entry the walk met, as the cleaner classifies it.
pub(super) enum Entry {
    Candidate(Candidate),
    /// A trace younger than the age limit, when no quota is set, and its allocated bytes: it
    /// cannot go (TR-2), so neither its signature nor its session is read — a run costs what
    /// is old, not what the root holds.
    Young(u64),
    /// Not a candidate, and why; its path's bytes.
    Kept(&'static str, Vec<u8>),
}

pub(super) struct Candidate {
    /// Relative to the root, its exact bytes.
    pub(super) path: Vec<u8>,
    pub(super) blocks_bytes: u64,
    pub(super) seen: Seen,
    /// Its signature's agent (any string) and session.
    pub(super) agent_id: String,
    pub(super) session_id: Uuid,
}

/// Allocated bytes: blocks × 512, not length (a sparse file counts by its blocks, TR-2).
pub(super) fn allocated(stat: &rustix::fs::Stat) -> u64 {
    u64::try_from(stat.st_blocks).unwrap_or(0) * 512
}

pub(super) fn mtime_ns(stat: &rustix::fs::Stat) -> i128 {
    i128::from(stat.st_mtime) * 1_000_000_000 + i128::from(stat.st_mtime_nsec)
}

pub(super) fn seen(stat: &rustix::fs::Stat) -> Seen {
    Seen {
        ino: stat.st_ino,
        size: stat.st_size,
        mtime_ns: mtime_ns(stat),
        etag: None,
    }
}

/// The agent and session a trace belongs to, if its first line is a valid signature. A
/// `session_id` that is not a UUID names no session an agent can point at, so nothing could
/// prove it is not live: such a file is not a candidate.
pub(crate) fn signature(first_line: &[u8]) -> Option<(String, Uuid)> {
    #[derive(Deserialize)]
    struct Signature {
        format: String,
        agent_id: String,
        session_id: String,
    }
    let sig: Signature = serde_json::from_slice(first_line).ok()?;
    let session = Uuid::parse_str(&sig.session_id).ok()?;
    (sig.format == FORMAT).then_some((sig.agent_id, session))
}

/// Reads the first line of `name` in `dir` (opened without following a symlink).
pub(crate) fn first_line(dir: &OwnedFd, name: &CStr) -> io::Result<Vec<u8>> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    let mut file = std::fs::File::from(fd);
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    while buf.len() < FIRST_LINE_LIMIT {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.contains(&b'\n') {
            break;
        }
    }
    Ok(line_of(buf))
}

/// What comes before the first newline of `bytes` (all of them without one).
pub(crate) fn line_of(mut bytes: Vec<u8>) -> Vec<u8> {
    if let Some(end) = bytes.iter().position(|b| *b == b'\n') {
        bytes.truncate(end);
    }
    bytes
}

/// Whether a symlink at `relative` resolves outside the canonical root.
pub(super) fn escapes(root: &Path, relative: &[u8]) -> bool {
    match root.join(as_path(relative)).canonicalize() {
        Ok(target) => !target.starts_with(root),
        Err(_) => true,
    }
}

/// What the trace walk makes of one entry ([`Look`]): `*.trace.jsonl` entries and symlinks
/// leading out are handed out, directories walked into.
pub(super) struct Traces {
    root: PathBuf,
    /// Traces modified at or after this time (ns) are handed out unread ([`Entry::Young`]).
    unread_from: Option<i128>,
}

impl Look for Traces {
    type Found = Entry;

    fn look(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        relative: &[u8],
        stat: Result<rustix::fs::Stat, rustix::io::Errno>,
    ) -> Looked<Entry> {
        let is_trace = name.to_bytes().ends_with(b".trace.jsonl");
        let kept = |reason| Looked::Found(Entry::Kept(reason, relative.to_vec()));
        if relative == LEASE_FILE.as_bytes() {
            return Looked::Skip;
        }
        let stat = match stat {
            Ok(stat) => stat,
            Err(_) if is_trace => return kept("unreadable"),
            Err(_) => return Looked::Skip,
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => Looked::Descend,
            FileType::Symlink if escapes(&self.root, relative) => kept("outside_root"),
            FileType::RegularFile
                if is_trace && self.unread_from.is_some_and(|from| mtime_ns(&stat) >= from) =>
            {
                Looked::Found(Entry::Young(allocated(&stat)))
            }
            FileType::RegularFile if is_trace => match first_line(dir, name) {
                Ok(line) => match signature(&line) {
                    Some((agent_id, session_id)) => Looked::Found(Entry::Candidate(Candidate {
                        path: relative.to_vec(),
                        blocks_bytes: allocated(&stat),
                        seen: seen(&stat),
                        agent_id,
                        session_id,
                    })),
                    None => kept("bad_signature"),
                },
                Err(_) => kept("unreadable"),
            },
            _ if is_trace => kept("not_regular"),
            _ => Looked::Skip,
        }
    }
}

/// Where an entry was found, to find it again when it is deleted.
#[derive(Clone)]
pub(super) enum Listing {
    /// The directory it was listed in.
    Local(Arc<OwnedFd>),
    /// The object root.
    Object(Arc<ObjectRoot>),
}

/// One step of a walk.
pub(super) enum Step {
    /// An entry of the directory (or the object root) given.
    Entry(Listing, Entry),
    /// Every entry of the directory has been seen (for an object root: every object, or the
    /// last of a batch): act on what is pending for it.
    DirDone(Listing),
}

/// A walk of a traces root: a directory tree, or the objects under a prefix.
pub(super) enum Walk {
    Tree(Box<Tree>),
    Objects(super::objects::Objects),
}

impl Walk {
    /// The next step; `None` when the walk is done.
    ///
    /// # Errors
    /// [`Error::Store`] when an object root's listing fails.
    pub(super) async fn next_step(&mut self) -> Result<Option<Step>, Error> {
        match self {
            Walk::Tree(tree) => Ok(tree.next_step()),
            Walk::Objects(objects) => objects.next_step().await,
        }
    }
}

/// A streaming walk of the tree below a local traces root ([`crate::files::tree`]).
pub(super) struct Tree(tree::Tree<Traces>);

impl Tree {
    /// The walk of `root` (open as `fd`), the traces modified at or after `unread_from` handed
    /// out unread.
    pub(super) fn new(root: &Path, fd: OwnedFd, unread_from: Option<i128>) -> io::Result<Tree> {
        let traces = Traces {
            root: root.to_owned(),
            unread_from,
        };
        Ok(Tree(tree::Tree::new(fd, Vec::new(), MAX_DEPTH, traces)?))
    }

    pub(super) fn next_step(&mut self) -> Option<Step> {
        Some(match self.0.next_step()? {
            tree::Step::Entry(dir, entry) => Step::Entry(Listing::Local(dir), entry),
            tree::Step::DirDone(dir) => Step::DirDone(Listing::Local(dir)),
        })
    }
}
