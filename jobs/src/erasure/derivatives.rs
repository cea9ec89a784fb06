//! The files of a request's scope that no row leads to (RQ-2): the run traces of its agents
//! (everything under `<traces_root>/<agent_id>/`) and of its sessions (the traces whose
//! signature names one, TR-3), and the directory of a session whose row is already gone. Each
//! is recorded in `sexton.pending_file_deletions` with every scope that could hold it, and the
//! drain removes it (holds asked just before each unlink, HD-3). The same listing tells the
//! verification whether any is left (RQ-5).
//!
//! Local roots are read one entry at a time without following a symlink (TR-3: nothing outside
//! the root); object-store roots by listing their keys.

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::path::Path;

use futures::TryStreamExt as _;
use rustix::fs::FileType;
use uuid::Uuid;

use crate::files::tree::{Look, Looked, Step, Tree, is_not_a_directory, open_dir_at};
use crate::files::{PathSettings, Root, Store, open_root};
use crate::trace_cleanup::{FIRST_LINE_LIMIT, first_line, line_of, signature};

/// A directory tree deeper than this is not followed further.
const MAX_DEPTH: usize = 32;

/// One trace file of the scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Relative to the traces root.
    pub path: String,
    pub agent: Option<Uuid>,
    pub session: Option<Uuid>,
}

/// The trace files under `<agent>/` of the traces root (under every directory of it when the
/// agent is not known): all of them when the agent is erased (`whole`), else those whose
/// signature names one of `sessions`; each with the session its signature names.
///
/// # Errors
/// The root's or the store's, for people.
pub async fn traces(
    paths: &PathSettings,
    agent: Option<Uuid>,
    whole: bool,
    sessions: &[Uuid],
) -> Result<Vec<Trace>, String> {
    let prefix = agent.map(|a| a.hyphenated().to_string());
    let mut found = Vec::new();
    match paths.store(Root::Traces) {
        Store::Local(root) => {
            let tops = match &prefix {
                Some(prefix) => vec![prefix.clone()],
                None => local_directories(&root)?,
            };
            for top in tops {
                for (path, first) in local_files(&root, &top)? {
                    let named = first.and_then(|line| signature(&line).map(|(_, s)| s));
                    push(&mut found, path, agent, whole, named, sessions);
                }
            }
        }
        Store::Object(objects) => {
            // An agent's directory listed alone, every directory in key ranges side by side,
            // and each trace's signature read as many at once as the root's window lets through.
            let listed = match &prefix {
                Some(prefix) => objects.list_under(prefix)?,
                None => objects.list_unordered(),
            };
            let at_once = objects.at_once();
            let mut read = listed
                .map_err(|err| err.to_string())
                .map_ok(|meta| {
                    let objects = objects.clone();
                    async move {
                        let Some(path) = objects.relative(&meta.location) else {
                            return Ok(None);
                        };
                        let limit = FIRST_LINE_LIMIT as u64;
                        let first = objects
                            .first_bytes(&meta.location, meta.size, limit)
                            .await?;
                        Ok(Some((path, signature(&line_of(first)).map(|(_, s)| s))))
                    }
                })
                .try_buffer_unordered(at_once);
            while let Some(trace) = read.try_next().await? {
                if let Some((path, named)) = trace {
                    push(&mut found, path, agent, whole, named, sessions);
                }
            }
        }
    }
    Ok(found)
}

fn push(
    found: &mut Vec<Trace>,
    path: String,
    agent: Option<Uuid>,
    whole: bool,
    named: Option<Uuid>,
    sessions: &[Uuid],
) {
    if whole || named.is_some_and(|s| sessions.contains(&s)) {
        found.push(Trace {
            path,
            agent,
            session: named,
        });
    }
}

/// Whether anything is left under `<sessions_root>/<session>/`.
///
/// # Errors
/// The root's or the store's, for people.
pub async fn session_directory(paths: &PathSettings, session: Uuid) -> Result<bool, String> {
    let name = session.hyphenated().to_string();
    match paths.store(Root::Sessions) {
        Store::Local(root) => match std::fs::symlink_metadata(root.join(&name)) {
            Ok(_) => Ok(true),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(format!("{}: {err}", root.join(&name).display())),
        },
        Store::Object(objects) => {
            let mut listed = objects.list_under(&name)?;
            while let Some(meta) = listed.try_next().await.map_err(|err| err.to_string())? {
                if objects.relative(&meta.location).is_some() {
                    return Ok(true);
                }
            }
            Ok(false)
        }
    }
}

/// The local traces root opened; `None` when it does not exist.
fn open_local(root: &Path) -> Result<Option<OwnedFd>, String> {
    match open_root(root) {
        Ok(fd) => Ok(Some(fd)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(format!("{}: {err}", root.display())),
    }
}

/// What the walks below hand out: a directory's name, or a regular file's path and first line.
type Walked = (String, Option<Vec<u8>>);

/// What the walks below look for.
struct Derivatives {
    /// Directories are handed out (the root's top), not walked into.
    directories: bool,
}

impl Look for Derivatives {
    type Found = Walked;

    fn look(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        relative: &[u8],
        stat: Result<rustix::fs::Stat, rustix::io::Errno>,
    ) -> Looked<Self::Found> {
        // A name that is not UTF-8 names no scope of a request's.
        let (Ok(stat), Ok(relative)) = (stat, std::str::from_utf8(relative)) else {
            return Looked::Skip;
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory if self.directories => Looked::Found((relative.to_owned(), None)),
            FileType::Directory => Looked::Descend,
            FileType::RegularFile if !self.directories => {
                Looked::Found((relative.to_owned(), first_line(dir, name).ok()))
            }
            _ => Looked::Skip,
        }
    }
}

/// Everything a walk hands out.
fn walked(mut tree: Tree<Derivatives>) -> Vec<Walked> {
    let mut found = Vec::new();
    while let Some(step) = tree.next_step() {
        if let Step::Entry(_, entry) = step {
            found.push(entry);
        }
    }
    found
}

/// The directories at the top of a local root (read without following a symlink).
fn local_directories(root: &Path) -> Result<Vec<String>, String> {
    let Some(fd) = open_local(root)? else {
        return Ok(Vec::new());
    };
    let tree = Tree::new(fd, Vec::new(), 1, Derivatives { directories: true })
        .map_err(|err| format!("{}: {err}", root.display()))?;
    Ok(walked(tree).into_iter().map(|(name, _)| name).collect())
}

/// The regular files below `root/<top>/`, as (path relative to the root, first line): entries
/// read without following a symlink (a symlink is not a file of the root's), at most
/// [`MAX_DEPTH`] deep. A `top` that does not exist has none.
fn local_files(root: &Path, top: &str) -> Result<Vec<Walked>, String> {
    let Some(fd) = open_local(root)? else {
        return Ok(Vec::new());
    };
    let Ok(name) = CString::new(top) else {
        return Ok(Vec::new());
    };
    let dir = match open_dir_at(&fd, &name) {
        Ok(dir) => dir,
        // Gone, or a symlink or a file where the directory would be: nothing of the root's.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound || is_not_a_directory(&err) => {
            return Ok(Vec::new());
        }
        Err(err) => return Err(format!("{}: {err}", root.join(top).display())),
    };
    let prefix = format!("{top}/").into_bytes();
    let tree = Tree::new(
        dir,
        prefix,
        MAX_DEPTH + 1,
        Derivatives { directories: false },
    )
    .map_err(|err| format!("{}: {err}", root.join(top).display()))?;
    Ok(walked(tree))
}
