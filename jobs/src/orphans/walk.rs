//! The walk of a files root (outputs, attachments; DC-4): [`WALKERS`] threads side by side,
//! each taking the root's next top-level entry (a file, or a directory it walks whole), handing
//! batches of files to the judging as they fill. On a cold cache each directory read waits on
//! the disk, and several waiting at once is what the disk can give; a batch ahead of the judging,
//! the walk and the database's answers overlap. Nothing is followed through a symlink, nothing
//! outside the root is reached ([`crate::files::tree`]).

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use rustix::fs::{FileType, Stat};
use tokio::sync::mpsc::Sender;

use crate::files::tree::{Look, Looked, Step, Tree, open_dir_at};

use super::{BATCH, MAX_DEPTH};

/// Directories whose files one batch holds at most: each is held open until the batch is done.
const OPEN_DIRECTORIES: usize = 64;

/// What a file looked like when it was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    pub ino: u64,
    pub size: i64,
    pub mtime_ns: i128,
}

pub(super) fn seen(stat: &Stat) -> Seen {
    Seen {
        ino: stat.st_ino,
        size: stat.st_size,
        mtime_ns: mtime_ns(stat),
    }
}

pub(super) fn mtime_ns(stat: &Stat) -> i128 {
    i128::from(stat.st_mtime) * 1_000_000_000 + i128::from(stat.st_mtime_nsec)
}

/// A file of a batch: where it was listed, its name there, its path, how it looked.
pub(super) struct File {
    pub dir: Arc<OwnedFd>,
    pub name: CString,
    pub path: Vec<u8>,
    pub seen: Seen,
}

/// A file of a files root (outputs, attachments): regular files are handed out, directories
/// walked into, anything else (a symlink, a device) neither followed nor touched.
pub(super) struct Files;

impl Look for Files {
    type Found = (CString, Vec<u8>, Seen);

    fn look(
        &self,
        _dir: &OwnedFd,
        name: &CStr,
        relative: &[u8],
        stat: Result<Stat, rustix::io::Errno>,
    ) -> Looked<Self::Found> {
        let Ok(stat) = stat else {
            return Looked::Skip;
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => Looked::Descend,
            FileType::RegularFile => {
                Looked::Found((name.to_owned(), relative.to_vec(), seen(&stat)))
            }
            _ => Looked::Skip,
        }
    }
}

/// Threads that walk a files root side by side.
const WALKERS: usize = 3;

/// What a files root holds at its top: a file, or a directory walked whole by one walker.
pub(super) enum TopEntry {
    File((CString, Vec<u8>, Seen)),
    Dir(CString, Vec<u8>),
}

/// The top of a files root: its regular files and its directories (no symlink followed).
pub(super) struct Top;

impl Look for Top {
    type Found = TopEntry;

    fn look(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        relative: &[u8],
        stat: Result<Stat, rustix::io::Errno>,
    ) -> Looked<TopEntry> {
        match Files.look(dir, name, relative, stat) {
            Looked::Descend => {
                Looked::Found(TopEntry::Dir(name.to_owned(), [relative, b"/"].concat()))
            }
            Looked::Found(found) => Looked::Found(TopEntry::File(found)),
            Looked::Skip => Looked::Skip,
        }
    }
}

/// Walks the root whose top is `top` with [`WALKERS`] threads, handing each batch of files to
/// `batches`, until the walk ends or nothing takes them.
pub(super) fn walk(top: Tree<Top>, batches: &Sender<Vec<File>>) {
    let top = Mutex::new(top);
    std::thread::scope(|scope| {
        for _ in 0..WALKERS {
            scope.spawn(|| walk_files(&top, batches));
        }
    });
}

/// One walker: takes the root's next top-level entry until none is left, a file into its batch,
/// a directory walked whole ([`MAX_DEPTH`] levels from the root); returns early once nothing
/// takes its batches.
fn walk_files(top: &Mutex<Tree<Top>>, batches: &Sender<Vec<File>>) {
    let mut batch = Batch::default();
    loop {
        let step = match top.lock() {
            Ok(mut top) => top.next_step(),
            Err(_) => return,
        };
        let Some(step) = step else {
            break;
        };
        let Step::Entry(dir, entry) = step else {
            continue;
        };
        let (name, path) = match entry {
            TopEntry::File(found) => {
                if !batch.push(dir, found, batches) {
                    return;
                }
                continue;
            }
            TopEntry::Dir(name, path) => (name, path),
        };
        let Some(mut tree) = open_dir_at(&dir, &name)
            .ok()
            .and_then(|fd| Tree::new(fd, path, MAX_DEPTH - 1, Files).ok())
        else {
            continue;
        };
        while let Some(step) = tree.next_step() {
            if let Step::Entry(dir, found) = step
                && !batch.push(dir, found, batches)
            {
                return;
            }
        }
    }
    if !batch.files.is_empty() {
        let _ = batches.blocking_send(batch.files);
    }
}

/// A walker's batch in the making: at most [`BATCH`] files from at most [`OPEN_DIRECTORIES`]
/// directories, each held open until the batch is done.
#[derive(Default)]
struct Batch {
    files: Vec<File>,
    open: usize,
}

impl Batch {
    /// Adds the file found in `dir`, handing the batch over once it is full; false when nothing
    /// takes it.
    fn push(
        &mut self,
        dir: Arc<OwnedFd>,
        (name, path, seen): (CString, Vec<u8>, Seen),
        batches: &Sender<Vec<File>>,
    ) -> bool {
        if self
            .files
            .last()
            .is_none_or(|last| !Arc::ptr_eq(&last.dir, &dir))
        {
            self.open += 1;
        }
        self.files.push(File {
            dir,
            name,
            path,
            seen,
        });
        if self.files.len() < BATCH && self.open < OPEN_DIRECTORIES {
            return true;
        }
        self.open = 0;
        batches
            .blocking_send(std::mem::take(&mut self.files))
            .is_ok()
    }
}
