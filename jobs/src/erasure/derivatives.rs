//! The files of a request's scope that no row leads to (RQ-2): the run traces of its agents
//! (everything under `<traces_root>/<agent_id>/`) and of its sessions (the traces whose
//! signature names one, TR-3), and the directory of a session whose row is already gone. Each
//! is recorded in `sexton.pending_file_deletions` with every scope that could hold it, and the
//! drain removes it (holds asked just before each unlink, HD-3). The same listing tells the
//! verification whether any is left (RQ-5).
//!
//! Local roots are read one entry at a time without following a symlink (TR-3: nothing outside
//! the root); object-store roots by listing their keys.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use futures::TryStreamExt as _;
use uuid::Uuid;

use crate::files::{PathSettings, Root, Store};
use crate::trace_cleanup::{FIRST_LINE_LIMIT, line_of, signature};

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
                for (path, full) in local_files(&root, &top)? {
                    let named =
                        first_line_of(&full).and_then(|line| signature(&line).map(|(_, s)| s));
                    push(&mut found, path, agent, whole, named, sessions);
                }
            }
        }
        Store::Object(objects) => {
            let mut listed = objects.list_all();
            while let Some(meta) = listed.try_next().await.map_err(|err| err.to_string())? {
                let Some(path) = objects.relative(&meta.location) else {
                    continue;
                };
                if prefix
                    .as_ref()
                    .is_some_and(|prefix| !path.starts_with(&format!("{prefix}/")))
                {
                    continue;
                }
                let first = objects
                    .first_bytes(&meta.location, meta.size, FIRST_LINE_LIMIT as u64)
                    .await?;
                let named = signature(&line_of(first)).map(|(_, s)| s);
                push(&mut found, path, agent, whole, named, sessions);
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
            let mut listed = objects.list_all();
            while let Some(meta) = listed.try_next().await.map_err(|err| err.to_string())? {
                if objects
                    .relative(&meta.location)
                    .is_some_and(|path| path.starts_with(&format!("{name}/")))
                {
                    return Ok(true);
                }
            }
            Ok(false)
        }
    }
}

/// The directories at the top of a local root (read without following a symlink).
fn local_directories(root: &Path) -> Result<Vec<String>, String> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(format!("{}: {err}", root.display())),
    };
    let mut tops = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| format!("{}: {err}", root.display()))?;
        if entry.file_type().is_ok_and(|kind| kind.is_dir())
            && let Some(name) = entry.file_name().to_str()
        {
            tops.push(name.to_owned());
        }
    }
    Ok(tops)
}

/// The regular files below `root/<top>/`, as (path relative to the root, full path): entries
/// read without following a symlink (a symlink is not a file of the root's), at most
/// [`MAX_DEPTH`] deep. A `top` that does not exist has none.
fn local_files(root: &Path, top: &str) -> Result<Vec<(String, PathBuf)>, String> {
    let mut files = Vec::new();
    let mut dirs = vec![(top.to_owned(), 0usize)];
    while let Some((dir, depth)) = dirs.pop() {
        let entries = match std::fs::read_dir(root.join(&dir)) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(format!("{}: {err}", root.join(&dir).display())),
        };
        for entry in entries {
            let entry = entry.map_err(|err| format!("{}: {err}", root.join(&dir).display()))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let relative = format!("{dir}/{name}");
            let kind = entry
                .file_type()
                .map_err(|err| format!("{}: {err}", entry.path().display()))?;
            if kind.is_dir() && depth < MAX_DEPTH {
                dirs.push((relative, depth + 1));
            } else if kind.is_file() {
                files.push((relative, entry.path()));
            }
        }
    }
    Ok(files)
}

/// The first line of a local file, read without following a symlink.
fn first_line_of(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .ok()?;
    let mut buf = Vec::new();
    file.take(FIRST_LINE_LIMIT as u64)
        .read_to_end(&mut buf)
        .ok()?;
    Some(line_of(buf))
}
