//! Run traces (SPEC §4, TR-1 … TR-4): files named `*.trace.jsonl` under the traces root go when
//! older than `[traces] max_age_days`, then — oldest first — while the rest exceed
//! `max_bytes` of allocated space. The same cleaner serves `sexton traces clean` (a dry run
//! unless confirmed) and the background job, which runs on its own cadence when enabled.
//!
//! Safety (TR-3): the tree is walked one directory at a time, each opened relative to its
//! parent without following a symlink, so no symlink (file or directory) and no `..` lead out
//! of the root. A candidate is a regular file whose first line is a trace signature; anything
//! else is counted by reason and never deleted. Just before deleting, each batch is checked
//! against the agents' current and main sessions (a live session's trace stays) and every file
//! is looked at again: one that vanished or changed since it was planned is re-evaluated, not
//! deleted blindly (ER-3). One cleaner at a time across processes: an exclusive `flock(2)` on
//! `<traces_root>/.sexton-traces.lease`, whose holder writes who it is into the file.
//!
//! Names are bytes: a file or directory name that is not UTF-8 is walked, checked and deleted
//! like any other, found again only by its bytes (relative to the directory descriptor it was
//! listed in); it is shown to people lossily ([`Planned::path`]), and that rendering is never
//! used to find a file.
//!
//! Memory stays bounded at any number of files: the age rule needs nothing kept; the quota
//! ("oldest first until within") is found from a histogram of allocated bytes by mtime with a
//! bounded number of buckets, then the one bucket where the quota line falls is sorted exactly
//! in a second walk, and a third walk deletes.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use rustix::fs::{AtFlags, Dir, FileType, FlockOperation, Mode, OFlags};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::cutoff::{self, days_before};
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::files::{FileCounts, PathSettings};
use crate::job::{Cadence, Env, HopOutcome, Job, Position, Report, Scope};
use crate::payload::V1;
use crate::settings::{Check, Raw};

/// The lease file's name, directly under the traces root.
pub const LEASE_FILE: &str = ".sexton-traces.lease";

/// The trace signature's format (TR-3).
pub const FORMAT: &str = "run-trace/1";

/// How far into a file its first line is looked for.
const FIRST_LINE_LIMIT: usize = 64 * 1024;

/// Files whose sessions are checked and that are deleted together.
const BATCH: usize = 256;

/// Most buckets the quota histogram holds; past it, neighbouring buckets merge.
const BUCKETS: usize = 16_384;

/// Deepest directory nesting walked below the root.
const MAX_DEPTH: usize = 32;

/// What is kept, and why (TR-3, ER-3): the labels of reports and metrics.
pub const KEPT_REASONS: [&str; 8] = [
    "bad_signature",
    "not_regular",
    "outside_root",
    "unreadable",
    "live_session",
    "changed",
    "vanished",
    "error",
];

/// `[traces]` (TR-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Files whose mtime is older than this many days go; 0: no age limit.
    pub max_age_days: i32,
    /// Allocated bytes the remaining files may hold; 0: no quota.
    pub max_bytes: u64,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.max_age_days > 0 || self.max_bytes > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    pub enabled: bool,
    pub limits: Limits,
    /// How often the background job runs when enabled.
    pub cadence: chrono::Duration,
}

/// Why a file goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Age,
    Quota,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::Quota => "quota",
        }
    }
}

/// A file the cleaner plans to delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Planned {
    /// Relative to the traces root, for people: rendered lossily where a name is not UTF-8, so
    /// never a way to find the file ([`raw_path`](Self::raw_path) is).
    pub path: String,
    /// Relative to the traces root, its exact bytes.
    #[serde(skip)]
    raw: Vec<u8>,
    /// Allocated bytes (blocks × 512).
    pub bytes: u64,
    pub mtime: DateTime<Utc>,
    pub reason: Reason,
    pub session_id: Uuid,
    #[serde(skip)]
    seen: Seen,
}

impl Planned {
    /// The path relative to the traces root, exactly as it is on disk (its names need not be
    /// UTF-8).
    pub fn raw_path(&self) -> &Path {
        as_path(&self.raw)
    }

    /// The file's own name, its exact bytes.
    fn name(&self) -> &OsStr {
        let name = self.raw.rsplit(|b| *b == b'/').next().unwrap_or(&self.raw);
        OsStr::from_bytes(name)
    }
}

/// Bytes of a path as a [`Path`], whatever they are.
fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// What a file looked like when it was planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    ino: u64,
    size: i64,
    mtime_ns: i128,
}

/// What a run found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TraceReport {
    /// Regular files named `*.trace.jsonl` with a valid signature.
    pub candidates: u64,
    /// Their allocated bytes before the run.
    pub candidate_bytes: u64,
    /// Planned (a dry run) or deleted (confirmed), by reason.
    pub planned: BTreeMap<&'static str, u64>,
    pub planned_bytes: u64,
    pub deleted: u64,
    pub deleted_bytes: u64,
    /// Left in place, by reason of [`KEPT_REASONS`].
    pub kept: BTreeMap<&'static str, u64>,
    /// Whether files were deleted (`--confirm`, the background job) or only planned.
    pub confirmed: bool,
}

impl TraceReport {
    fn keep(&mut self, reason: &'static str) {
        *self.kept.entry(reason).or_default() += 1;
    }
}

/// Sees each planned file, and each batch just before it is deleted.
pub trait Observer: Send {
    /// A file planned to go (the dry run's line).
    fn planned(&mut self, _file: &Planned) {}
    /// A batch about to be checked and deleted (confirmed runs only).
    fn before_delete(&mut self, _batch: &[Planned]) {}
    /// A file under the root that stays, and why (the first walk only); its path relative to
    /// the root, exactly as it is on disk.
    fn kept(&mut self, _path: &Path, _reason: &'static str) {}
}

/// An observer that looks at nothing.
pub struct Quiet;

impl Observer for Quiet {}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("traces root {}: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("another trace cleaner holds the lease ({holder})")]
    LeaseHeld { holder: String },
    #[error("lease file {}: {source}", path.display())]
    Lease {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The cleaner's lease: held while the value lives (the lock goes with the file descriptor).
#[derive(Debug)]
pub struct Lease {
    _file: OwnedFd,
}

impl Lease {
    /// Takes the lease on `root` for `holder` (who it is: worker, host, pid), or says who holds
    /// it.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] with the holder's line when another cleaner holds it;
    /// [`Error::Lease`] when the lease file cannot be opened (or is a symlink).
    pub fn acquire(root: &Path, holder: &str) -> Result<Lease, Error> {
        let path = root.join(LEASE_FILE);
        let failed = |source: io::Error| Error::Lease {
            path: path.clone(),
            source,
        };
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| failed(e.into()))?;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let mut file = std::fs::File::from(fd);
                file.read_to_string(&mut text).ok();
                return Err(Error::LeaseHeld {
                    holder: text.trim().to_owned(),
                });
            }
            Err(e) => return Err(failed(e.into())),
        }
        // The lease is a plain file of its own: not a hard link to something else the holder
        // would truncate.
        let stat = rustix::fs::fstat(&fd).map_err(|e| failed(e.into()))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_nlink != 1 {
            return Err(failed(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a plain file with a single link; remove it and let sexton create it",
            )));
        }
        let mut file = std::fs::File::from(fd);
        file.set_len(0).map_err(failed)?;
        writeln!(file, "{holder}").map_err(failed)?;
        Ok(Lease {
            _file: OwnedFd::from(file),
        })
    }
}

/// Who a cleaner is, for the lease file: name, host, pid and since when.
pub fn holder(name: &str, now: DateTime<Utc>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    format!(
        "{name} host={host} pid={} since={}",
        std::process::id(),
        now.format("%Y-%m-%dT%H:%M:%SZ")
    )
}

/// One entry the walk met, as the cleaner classifies it.
enum Entry {
    Candidate(Candidate),
    /// Not a candidate, and why; its path's bytes.
    Kept(&'static str, Vec<u8>),
}

struct Candidate {
    /// Relative to the root, its exact bytes.
    path: Vec<u8>,
    blocks_bytes: u64,
    seen: Seen,
    session_id: Uuid,
}

/// Allocated bytes: blocks × 512, not length (a sparse file counts by its blocks, TR-2).
fn allocated(stat: &rustix::fs::Stat) -> u64 {
    u64::try_from(stat.st_blocks).unwrap_or(0) * 512
}

fn mtime_ns(stat: &rustix::fs::Stat) -> i128 {
    i128::from(stat.st_mtime) * 1_000_000_000 + i128::from(stat.st_mtime_nsec)
}

fn to_time(ns: i128) -> DateTime<Utc> {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let nanos = ns.rem_euclid(1_000_000_000) as u32;
    DateTime::from_timestamp(secs, nanos).unwrap_or(DateTime::UNIX_EPOCH)
}

fn seen(stat: &rustix::fs::Stat) -> Seen {
    Seen {
        ino: stat.st_ino,
        size: stat.st_size,
        mtime_ns: mtime_ns(stat),
    }
}

/// The session a trace belongs to, if its first line is a valid signature. A `session_id` that
/// is not a UUID names no session an agent can point at, so nothing could prove it is not live:
/// such a file is not a candidate.
fn signature(first_line: &[u8]) -> Option<Uuid> {
    #[derive(Deserialize)]
    struct Signature {
        format: String,
        #[serde(rename = "agent_id")]
        _agent_id: String,
        session_id: String,
    }
    let sig: Signature = serde_json::from_slice(first_line).ok()?;
    (sig.format == FORMAT)
        .then(|| Uuid::parse_str(&sig.session_id).ok())
        .flatten()
}

/// Reads the first line of `name` in `dir` (opened without following a symlink).
fn first_line(dir: &OwnedFd, name: &CStr) -> io::Result<Vec<u8>> {
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
        if let Some(end) = buf.iter().position(|b| *b == b'\n') {
            buf.truncate(end);
            return Ok(buf);
        }
    }
    Ok(buf)
}

/// Whether a symlink at `relative` resolves outside the canonical root.
fn escapes(root: &Path, relative: &[u8]) -> bool {
    match root.join(as_path(relative)).canonicalize() {
        Ok(target) => !target.starts_with(root),
        Err(_) => true,
    }
}

/// A directory still to be read: opened relative to its parent when its turn comes.
struct Pending {
    parent: Arc<OwnedFd>,
    name: CString,
    /// The directory's path relative to the root and a `/`, its exact bytes (empty: the root).
    prefix: Vec<u8>,
    depth: usize,
}

/// The directory being read.
struct Level {
    fd: Arc<OwnedFd>,
    dir: Dir,
    prefix: Vec<u8>,
    depth: usize,
}

/// One step of a walk.
enum Step {
    /// An entry of the directory `fd`.
    Entry(Arc<OwnedFd>, Entry),
    /// Every entry of `fd` has been seen: act on what is pending for it.
    DirDone(Arc<OwnedFd>),
}

/// A streaming walk of the tree below the root, one directory at a time, each opened relative
/// to its parent without following a symlink. Only `*.trace.jsonl` entries and symlinks are
/// reported; memory holds one directory reader and the directories still to read.
struct Walk {
    root: PathBuf,
    current: Option<Level>,
    todo: Vec<Pending>,
}

impl Walk {
    fn new(root: &Path, fd: OwnedFd) -> io::Result<Walk> {
        let fd = Arc::new(fd);
        let dir = Dir::read_from(&*fd)?;
        Ok(Walk {
            root: root.to_owned(),
            current: Some(Level {
                fd,
                dir,
                prefix: Vec::new(),
                depth: 0,
            }),
            todo: Vec::new(),
        })
    }

    fn next_step(&mut self) -> Option<Step> {
        loop {
            let Some(level) = self.current.as_mut() else {
                let pending = self.todo.pop()?;
                let opened = rustix::fs::openat(
                    &*pending.parent,
                    pending.name.as_c_str(),
                    OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                );
                // A directory swapped for a symlink, or removed, since it was listed: skipped.
                if let Ok(fd) = opened
                    && let Ok(dir) = Dir::read_from(&fd)
                {
                    self.current = Some(Level {
                        fd: Arc::new(fd),
                        dir,
                        prefix: pending.prefix,
                        depth: pending.depth,
                    });
                }
                continue;
            };
            let Some(entry) = level.dir.next() else {
                let done = self.current.take().map(|level| level.fd)?;
                return Some(Step::DirDone(done));
            };
            let Ok(entry) = entry else {
                continue;
            };
            let name = entry.file_name();
            let bytes = name.to_bytes();
            if bytes == b"."
                || bytes == b".."
                || (level.depth == 0 && bytes == LEASE_FILE.as_bytes())
            {
                continue;
            }
            // Names are bytes: one that is not UTF-8 is walked and judged like any other.
            let relative = [level.prefix.as_slice(), bytes].concat();
            let is_trace = bytes.ends_with(b".trace.jsonl");
            let stat = match rustix::fs::statat(&*level.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(_) if is_trace => {
                    return Some(Step::Entry(
                        level.fd.clone(),
                        Entry::Kept("unreadable", relative),
                    ));
                }
                Err(_) => continue,
            };
            let entry = match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => {
                    if level.depth + 1 < MAX_DEPTH {
                        self.todo.push(Pending {
                            parent: level.fd.clone(),
                            name: name.to_owned(),
                            prefix: [relative.as_slice(), b"/"].concat(),
                            depth: level.depth + 1,
                        });
                    }
                    continue;
                }
                FileType::Symlink if escapes(&self.root, &relative) => {
                    Entry::Kept("outside_root", relative)
                }
                FileType::Symlink if is_trace => Entry::Kept("not_regular", relative),
                FileType::RegularFile if is_trace => match first_line(&level.fd, name) {
                    Ok(line) => match signature(&line) {
                        Some(session_id) => Entry::Candidate(Candidate {
                            path: relative,
                            blocks_bytes: allocated(&stat),
                            seen: seen(&stat),
                            session_id,
                        }),
                        None => Entry::Kept("bad_signature", relative),
                    },
                    Err(_) => Entry::Kept("unreadable", relative),
                },
                _ if is_trace && FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile => {
                    Entry::Kept("not_regular", relative)
                }
                _ => continue,
            };
            return Some(Step::Entry(level.fd.clone(), entry));
        }
    }
}

/// Allocated bytes by mtime, in at most [`BUCKETS`] buckets of equal width (a power of two of
/// nanoseconds), merged as the range grows.
#[derive(Debug, Default)]
struct Histogram {
    shift: u32,
    buckets: BTreeMap<i128, u64>,
    total: u64,
}

impl Histogram {
    fn add(&mut self, mtime_ns: i128, bytes: u64) {
        self.total += bytes;
        *self.buckets.entry(mtime_ns >> self.shift).or_default() += bytes;
        while self.buckets.len() > BUCKETS {
            self.shift += 1;
            let old = std::mem::take(&mut self.buckets);
            for (key, b) in old {
                *self.buckets.entry(key >> 1).or_default() += b;
            }
        }
    }

    /// The bucket where deleting oldest first covers `excess` bytes, and the bytes of the
    /// buckets before it.
    fn line(&self, excess: u64) -> Option<(i128, u64)> {
        let mut before = 0u64;
        for (key, bytes) in &self.buckets {
            if before + bytes >= excess {
                return Some((*key, before));
            }
            before += bytes;
        }
        None
    }
}

/// Where the quota line falls.
#[derive(Debug, Clone, PartialEq, Eq)]
enum QuotaLine {
    /// Every candidate ordered at or before `(mtime, path)` goes (the path's bytes: two names
    /// that only show alike are not the same).
    Upto(i128, Vec<u8>),
    /// Every candidate older than this mtime goes, and of those with exactly this mtime (too
    /// many to sort), as many as cover the bytes given, in walk order: all are equally old.
    Ties(i128, u64),
}

/// Most files of the boundary bucket sorted in memory; a fuller bucket is narrowed first.
const BOUNDARY_FILES: usize = 20_000;

/// How many bits a narrowing step divides a bucket's width by.
const NARROW_BITS: u32 = 14;

/// What one walk is for.
enum Pass {
    /// Classify everything; plan by age; the histogram of the rest.
    Age(Histogram),
    /// The candidates in the bucket where the quota line falls (at most [`BOUNDARY_FILES`] of
    /// them), and a finer histogram of the bucket in case there are more.
    Boundary {
        shift: u32,
        bucket: i128,
        files: Vec<(i128, Vec<u8>, u64)>,
        overflow: bool,
        finer: BTreeMap<i128, u64>,
    },
    /// Plan by quota; `taken` counts the bytes taken among ties.
    Quota { line: QuotaLine, taken: u64 },
}

fn finer_shift(shift: u32) -> u32 {
    shift.saturating_sub(NARROW_BITS)
}

/// Planned files of the current directory, acted on in batches.
struct Plan<'a> {
    conn: &'a mut PgConnection,
    report: TraceReport,
    /// Candidates of the current directory awaiting their live-session check.
    candidates: Vec<Candidate>,
    /// Planned files of the current directory awaiting deletion (confirmed runs).
    pending: Vec<Planned>,
    observer: &'a mut dyn Observer,
    confirm: bool,
    age_cutoff_ns: Option<i128>,
    /// Allocated bytes of live sessions' traces: they count toward the quota but never go.
    live_bytes: u64,
    stop: &'a AtomicBool,
    stopped: bool,
}

impl Plan<'_> {
    fn old(&self, mtime_ns: i128) -> bool {
        self.age_cutoff_ns.is_some_and(|cut| mtime_ns < cut)
    }

    fn plan(&mut self, candidate: Candidate, reason: Reason) {
        let planned = Planned {
            path: String::from_utf8_lossy(&candidate.path).into_owned(),
            raw: candidate.path,
            bytes: candidate.blocks_bytes,
            mtime: to_time(candidate.seen.mtime_ns),
            reason,
            session_id: candidate.session_id,
            seen: candidate.seen,
        };
        self.observer.planned(&planned);
        *self.report.planned.entry(reason.as_str()).or_default() += 1;
        self.report.planned_bytes += planned.bytes;
        if self.confirm {
            self.pending.push(planned);
        }
    }

    /// One walk of the tree for `pass`; stops early (and says so) when the worker stops.
    async fn walk(&mut self, walk: &mut Walk, pass: &mut Pass) -> Result<(), Error> {
        let mut steps = 0u64;
        while let Some(step) = walk.next_step() {
            steps += 1;
            // The walk is file-system work on the runtime's thread: let others run, and see a
            // shutdown (FL-5), every so often.
            if steps.is_multiple_of(1024) {
                tokio::task::yield_now().await;
                if self.stop.load(Ordering::Relaxed) {
                    self.stopped = true;
                    return Ok(());
                }
            }
            match step {
                Step::DirDone(dir) => {
                    self.resolve(pass).await?;
                    self.flush(&dir).await?;
                }
                Step::Entry(_, Entry::Kept(reason, path)) => {
                    if matches!(pass, Pass::Age(_)) {
                        self.report.keep(reason);
                        self.observer.kept(as_path(&path), reason);
                    }
                }
                Step::Entry(dir, Entry::Candidate(candidate)) => {
                    self.candidates.push(candidate);
                    if self.candidates.len() >= BATCH {
                        self.resolve(pass).await?;
                        self.flush(&dir).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks the waiting candidates against the live sessions, then gives each to `pass`: a
    /// live session's trace is kept (and counted once, by the first walk).
    async fn resolve(&mut self, pass: &mut Pass) -> Result<(), Error> {
        if self.candidates.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.candidates);
        let sessions: Vec<Uuid> = batch.iter().map(|c| c.session_id).collect();
        let live = live_sessions(self.conn, &sessions).await?;
        for candidate in batch {
            if live.contains(&candidate.session_id) {
                if let Pass::Age(_) = pass {
                    self.report.candidates += 1;
                    self.report.candidate_bytes += candidate.blocks_bytes;
                    self.live_bytes += candidate.blocks_bytes;
                    self.report.keep("live_session");
                    self.observer.kept(as_path(&candidate.path), "live_session");
                }
                continue;
            }
            self.visit(pass, candidate);
        }
        Ok(())
    }

    fn visit(&mut self, pass: &mut Pass, c: Candidate) {
        let mtime = c.seen.mtime_ns;
        match pass {
            Pass::Age(histogram) => {
                self.report.candidates += 1;
                self.report.candidate_bytes += c.blocks_bytes;
                if self.old(mtime) {
                    self.plan(c, Reason::Age);
                } else {
                    histogram.add(mtime, c.blocks_bytes);
                }
            }
            Pass::Boundary {
                shift,
                bucket,
                files,
                overflow,
                finer,
            } => {
                if self.old(mtime) || mtime >> *shift != *bucket {
                    return;
                }
                *finer.entry(mtime >> finer_shift(*shift)).or_default() += c.blocks_bytes;
                if files.len() < BOUNDARY_FILES {
                    files.push((mtime, c.path, c.blocks_bytes));
                } else {
                    *overflow = true;
                }
            }
            Pass::Quota { line, taken } => {
                if self.old(mtime) {
                    return;
                }
                let goes = match line {
                    QuotaLine::Upto(at, path) => {
                        (mtime, c.path.as_slice()) <= (*at, path.as_slice())
                    }
                    QuotaLine::Ties(at, need) => {
                        mtime < *at
                            || (mtime == *at && *taken < *need && {
                                *taken += c.blocks_bytes;
                                true
                            })
                    }
                };
                if goes {
                    self.plan(c, Reason::Quota);
                }
            }
        }
    }

    /// Deletes the pending files of `dir`: a live session's trace kept, and each file looked
    /// at again just before it goes.
    async fn flush(&mut self, dir: &OwnedFd) -> Result<(), Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending);
        self.observer.before_delete(&batch);
        let sessions: Vec<Uuid> = batch.iter().map(|p| p.session_id).collect();
        let live = live_sessions(self.conn, &sessions).await?;
        for file in batch {
            if live.contains(&file.session_id) {
                self.report.keep("live_session");
                continue;
            }
            // Found again by its bytes in the directory it was listed in, never by the lossy
            // rendering.
            let name = file.name();
            let now = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile => stat,
                Ok(_) => {
                    self.report.keep("changed");
                    continue;
                }
                Err(rustix::io::Errno::NOENT) => {
                    self.report.keep("vanished");
                    continue;
                }
                Err(_) => {
                    self.report.keep("error");
                    continue;
                }
            };
            let current = seen(&now);
            // Re-evaluated, not deleted blindly: a file rewritten since it was planned goes only
            // if it is the same file and still past the age limit; a quota decision is not
            // re-made mid-walk.
            if current != file.seen
                && !(file.reason == Reason::Age
                    && current.ino == file.seen.ino
                    && self.old(current.mtime_ns))
            {
                self.report.keep("changed");
                continue;
            }
            match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
                Ok(()) => {
                    self.report.deleted += 1;
                    self.report.deleted_bytes += allocated(&now);
                }
                Err(rustix::io::Errno::NOENT) => self.report.keep("vanished"),
                Err(err) => {
                    tracing::warn!(path = %file.path, error = %err, "trace not deleted");
                    self.report.keep("error");
                }
            }
        }
        Ok(())
    }
}

/// Which of `sessions` are an agent's current or main session (TR-3), through the indexes on
/// both columns.
async fn live_sessions(
    conn: &mut PgConnection,
    sessions: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT s FROM unnest($1::uuid[]) s
         WHERE EXISTS (SELECT 1 FROM agents WHERE current_session_id = s)
            OR EXISTS (SELECT 1 FROM agents WHERE main_session_id = s)",
    )
    .bind(sessions)
    .fetch_all(conn)
    .await
}

/// Cleans the traces root by `limits` at `now`: plans every file (each shown to `observer`) and,
/// with `confirm`, deletes them. The caller holds the [`Lease`] for a confirmed run. When `stop`
/// is raised the run ends after the batch in hand; what is left waits for the next run.
///
/// # Errors
/// [`Error::Root`] when the root cannot be opened or read, [`Error::Database`] when the live
/// sessions cannot be read.
pub async fn clean(
    conn: &mut PgConnection,
    root: &Path,
    limits: Limits,
    now: DateTime<Utc>,
    confirm: bool,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<TraceReport, Error> {
    let root_error = |source: io::Error| Error::Root {
        path: root.to_owned(),
        source,
    };
    let canonical = root.canonicalize().map_err(root_error)?;
    let walk = || -> Result<Walk, Error> {
        let fd = crate::files::open_root(&canonical).map_err(root_error)?;
        Walk::new(&canonical, fd).map_err(root_error)
    };
    let age_cutoff_ns = (limits.max_age_days > 0)
        .then(|| days_before(now, limits.max_age_days))
        .flatten()
        .map(|cut| {
            i128::from(cut.timestamp()) * 1_000_000_000 + i128::from(cut.timestamp_subsec_nanos())
        });
    let mut plan = Plan {
        conn,
        report: TraceReport {
            confirmed: confirm,
            ..TraceReport::default()
        },
        candidates: Vec::new(),
        pending: Vec::new(),
        observer,
        confirm,
        age_cutoff_ns,
        live_bytes: 0,
        stop,
        stopped: false,
    };
    let mut age = Pass::Age(Histogram::default());
    plan.walk(&mut walk()?, &mut age).await?;
    let Pass::Age(histogram) = age else {
        return Ok(plan.report);
    };
    // Live traces count toward the quota; only the others can go to meet it.
    let excess = (histogram.total + plan.live_bytes).saturating_sub(limits.max_bytes);
    if limits.max_bytes == 0 || excess == 0 || plan.stopped {
        return Ok(plan.report);
    }
    let Some((first_bucket, first_before)) = histogram.line(excess) else {
        // Not even every other trace would bring the total within the quota: all of them go.
        let all = QuotaLine::Ties(i128::MAX, 0);
        plan.walk(
            &mut walk()?,
            &mut Pass::Quota {
                line: all,
                taken: 0,
            },
        )
        .await?;
        return Ok(plan.report);
    };
    let (mut shift, mut bucket, mut before) = (histogram.shift, first_bucket, first_before);
    let line = loop {
        let mut boundary = Pass::Boundary {
            shift,
            bucket,
            files: Vec::new(),
            overflow: false,
            finer: BTreeMap::new(),
        };
        plan.walk(&mut walk()?, &mut boundary).await?;
        if plan.stopped {
            return Ok(plan.report);
        }
        let Pass::Boundary {
            mut files,
            overflow,
            finer,
            ..
        } = boundary
        else {
            return Ok(plan.report);
        };
        let bucket_end = (bucket + 1) << shift;
        if !overflow {
            files.sort();
            let mut covered = before;
            let mut line = None;
            for (mtime_ns, path, bytes) in files {
                covered += bytes;
                line = Some(QuotaLine::Upto(mtime_ns, path));
                if covered >= excess {
                    break;
                }
            }
            // The bucket's files changed since they were counted: take all it held.
            break line.unwrap_or(QuotaLine::Ties(bucket_end, 0));
        }
        if shift == 0 {
            // Too many files of one and the same mtime to sort: any of them will do.
            break QuotaLine::Ties(bucket, excess.saturating_sub(before));
        }
        let narrower = Histogram {
            shift: finer_shift(shift),
            buckets: finer,
            total: 0,
        };
        match narrower.line(excess.saturating_sub(before)) {
            Some((finer_bucket, finer_before)) => {
                before += finer_before;
                bucket = finer_bucket;
                shift = narrower.shift;
            }
            None => break QuotaLine::Ties(bucket_end, 0),
        }
    };
    plan.walk(&mut walk()?, &mut Pass::Quota { line, taken: 0 })
        .await?;
    Ok(plan.report)
}

/// One run's payload: the period it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    pub version: V1,
    /// The start of the cadence period (the pass's slot).
    pub pass_started_at: DateTime<Utc>,
}

/// The `[traces]` section as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    enabled: Raw<bool>,
    max_age_days: Raw<i64>,
    max_bytes: Raw<i64>,
    cadence_minutes: Raw<i64>,
}

/// Reads `[traces]`; enabled with no limit is refused, naming both (TR-1).
pub fn settings(section: &serde_json::Value, c: &mut Check<'_>) -> Option<TraceSettings> {
    let s: RawSettings = c.section("traces", section)?;
    let enabled = match &s.enabled {
        Raw::Typed(b) => Some(*b),
        Raw::Other(v) => {
            c.fail("traces.enabled", "true or false", v);
            None
        }
    };
    let max_age_days = c.int(
        "traces.max_age_days",
        &s.max_age_days,
        0..=36_500,
        "a number of days from 0 (no age limit) to 36500",
    );
    let max_bytes = c.int(
        "traces.max_bytes",
        &s.max_bytes,
        0..=i64::MAX,
        "a number of bytes, 0 (no quota) or more",
    );
    let cadence = c
        .int::<i64>(
            "traces.cadence_minutes",
            &s.cadence_minutes,
            1..=525_600,
            "a number of minutes from 1 to 525600 (a year)",
        )
        .map(chrono::Duration::minutes);
    let limits = Limits {
        max_age_days: max_age_days?,
        max_bytes: max_bytes?,
    };
    if enabled == Some(true) && !limits.any() {
        c.fail(
            "traces.enabled",
            "traces.max_age_days or traces.max_bytes above 0 when trace retention is enabled \
             (TR-1)",
            "traces.max_age_days = 0 and traces.max_bytes = 0",
        );
        return None;
    }
    Some(TraceSettings {
        enabled: enabled?,
        limits,
        cadence: cadence?,
    })
}

/// What a run would do now (`sexton preview`).
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    pub enabled: bool,
    pub limits: Limits,
    #[serde(flatten)]
    pub report: TraceReport,
}

impl std::fmt::Display for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.enabled {
            "enabled"
        } else {
            "disabled (`sexton traces clean` applies the limits on demand)"
        };
        write!(
            f,
            "traces (TR-1 … TR-4), {state}, max_age_days {} / max_bytes {}: {} candidates ({} \
             bytes), {} would go ({} bytes)",
            self.limits.max_age_days,
            self.limits.max_bytes,
            self.report.candidates,
            self.report.candidate_bytes,
            self.report.planned.values().sum::<u64>(),
            self.report.planned_bytes
        )?;
        for (reason, n) in &self.report.planned {
            write!(f, "\n  by {reason:<20} {n:>10}")?;
        }
        for (reason, n) in &self.report.kept {
            write!(f, "\n  kept {reason:<18} {n:>10}")?;
        }
        Ok(())
    }
}

/// Watches one path in a dry run: what the cleaner planned or kept it for.
struct Watch<'a> {
    path: &'a str,
    planned: Option<Planned>,
    kept: Option<&'static str>,
}

impl Observer for Watch<'_> {
    fn planned(&mut self, file: &Planned) {
        if file.raw == self.path.as_bytes() {
            self.planned = Some(file.clone());
        }
    }

    fn kept(&mut self, path: &Path, reason: &'static str) {
        if path.as_os_str().as_bytes() == self.path.as_bytes() {
            self.kept = Some(reason);
        }
    }
}

/// The cleaner's verdict on one file: a dry run of the cleaner itself — the same
/// walk, signature check, live-session check, age and quota — watching that path. `path` is
/// relative to the traces root, or absolute under it.
async fn explain_trace(
    conn: &mut PgConnection,
    settings: &TraceSettings,
    paths: &PathSettings,
    now: DateTime<Utc>,
    path: &str,
) -> Result<Option<Explanation>, Error> {
    let root = paths
        .traces_root
        .canonicalize()
        .map_err(|source| Error::Root {
            path: paths.traces_root.clone(),
            source,
        })?;
    let given = Path::new(path);
    let relative = if given.is_absolute() {
        match given
            .strip_prefix(&root)
            .or_else(|_| given.strip_prefix(&paths.traces_root))
        {
            Ok(relative) => relative.to_string_lossy().into_owned(),
            Err(_) => return Ok(None),
        }
    } else {
        path.to_owned()
    };
    let Ok(meta) = std::fs::symlink_metadata(root.join(&relative)) else {
        return Ok(None);
    };
    let mut watch = Watch {
        path: &relative,
        planned: None,
        kept: None,
    };
    let limits = settings.limits;
    if limits.any() {
        clean(
            conn,
            &root,
            limits,
            now,
            false,
            &mut watch,
            &AtomicBool::new(false),
        )
        .await?;
    }
    let mtime = meta.modified().ok().map(DateTime::<Utc>::from);
    let mut explanation = Explanation {
        job: TraceCleanup::NAME,
        subject: "trace",
        id: relative.clone(),
        account_id: None,
        policy: format!(
            "[traces] enabled = {}, max_age_days = {}, max_bytes = {}",
            settings.enabled, limits.max_age_days, limits.max_bytes
        ),
        measured_from: Some("the file's modification time".into()),
        age_at: mtime,
        cutoff: (limits.max_age_days > 0)
            .then(|| days_before(now, limits.max_age_days))
            .flatten(),
        verdict: ExplainVerdict::Retained,
        reasons: Vec::new(),
        removed_at: None,
        removed_by: None,
    };
    let reason = |code: &'static str, detail: String| ExplainReason::new("TR-3", code, detail);
    if !limits.any() {
        explanation.reasons.push(ExplainReason::new(
            "TR-1",
            "no_limit",
            "neither traces.max_age_days nor traces.max_bytes is set: nothing goes",
        ));
    } else if let Some(planned) = watch.planned {
        explanation.verdict = ExplainVerdict::Eligible;
        let (rule, detail) = match planned.reason {
            Reason::Age => ("TR-2", "older than traces.max_age_days".to_owned()),
            Reason::Quota => (
                "TR-2",
                format!(
                    "among the oldest traces over traces.max_bytes ({} bytes allocated)",
                    planned.bytes
                ),
            ),
        };
        explanation
            .reasons
            .push(ExplainReason::new(rule, planned.reason.as_str(), detail));
        if !settings.enabled {
            explanation.reasons.push(ExplainReason::new(
                "TR-4",
                "background_off",
                "background cleaning is off: `sexton traces clean --confirm` would delete it",
            ));
        }
    } else if let Some(kept) = watch.kept {
        explanation.reasons.push(reason(
            kept,
            match kept {
                "bad_signature" => {
                    "its first line is not a run-trace/1 signature with string agent_id and a \
                     session_id that is a UUID"
                        .into()
                }
                "live_session" => "its session is an agent's current or main session".into(),
                "outside_root" => "a symlink leading out of the traces root: never followed".into(),
                "not_regular" => "not a regular file (a symlink, a directory, a device)".into(),
                _ => "it cannot be read".into(),
            },
        ));
    } else if !relative.ends_with(".trace.jsonl") || !meta.is_file() {
        explanation.reasons.push(reason(
            "not_a_trace",
            "only regular files named *.trace.jsonl are traces".into(),
        ));
    } else {
        explanation.reasons.push(ExplainReason::new(
            "TR-2",
            "within_limits",
            "younger than the age limit, and not among the oldest over the quota",
        ));
    }
    Ok(Some(explanation))
}

/// The background cleaner (TR-4), as the worker registers it: global, on its own cadence, and
/// only when enabled.
pub struct TraceCleanup;

impl Job for TraceCleanup {
    const NAME: &'static str = "trace_cleanup";
    const QUEUE: &'static str = "sexton.trace_cleanup";
    const SCOPE: Scope = Scope::Global;
    const SECTION: &'static str = "traces";
    const SUBJECTS: &'static [&'static str] = &["trace"];
    const RETAIN_REASONS: &'static [&'static str] = &KEPT_REASONS;

    type Args = Args;
    type Settings = TraceSettings;
    type Preview = Preview;
    type Error = Error;

    fn settings(
        section: &serde_json::Value,
        _paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<TraceSettings> {
        settings(section, check)
    }

    fn cadence(settings: &TraceSettings) -> Cadence {
        if settings.enabled {
            Cadence::Every(settings.cadence)
        } else {
            Cadence::Off
        }
    }

    fn first(_account: Option<Uuid>, slot: DateTime<Utc>) -> Args {
        Args {
            version: V1,
            pass_started_at: slot,
        }
    }

    fn position(args: &Args) -> Position {
        Position {
            account: None,
            pass_started_at: args.pass_started_at,
            hop: 0,
        }
    }

    async fn run(
        env: Env<'_>,
        settings: &TraceSettings,
        args: &Args,
        report: &mut Report<Args>,
    ) -> Result<(), Error> {
        let root = &env.paths.traces_root;
        *report = Report {
            outcome: HopOutcome::Finished.as_str(),
            window: 0,
            candidates: 0,
            pruned: 0,
            retained: KEPT_REASONS.iter().map(|r| (*r, 0)).collect(),
            rows: Vec::new(),
            files: FileCounts::default(),
            owner_seconds: 0.0,
            next: None,
            throttled: None,
        };
        if !settings.enabled {
            report.outcome = HopOutcome::Disabled.as_str();
            return Ok(());
        }
        let database_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *env.conn)
            .await?;
        let now = cutoff::reference(args.pass_started_at, database_now);
        let _lease = match Lease::acquire(
            root,
            &holder("sexton worker (trace_cleanup)", database_now),
        ) {
            Ok(lease) => lease,
            Err(Error::LeaseHeld { holder }) => {
                tracing::info!(%holder, "another trace cleaner holds the lease; nothing deleted");
                report.outcome = "lease_held";
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        let started = std::time::Instant::now();
        let done = clean(
            env.conn,
            root,
            settings.limits,
            now,
            true,
            &mut Quiet,
            env.stop,
        )
        .await?;
        report.owner_seconds = started.elapsed().as_secs_f64();
        report.candidates = done.candidates;
        report.pruned = done.deleted;
        for (reason, n) in &mut report.retained {
            *n = done.kept.get(reason).copied().unwrap_or_default();
        }
        report.files = FileCounts {
            deleted: done.deleted,
            bytes: done.deleted_bytes,
            errors: done.kept.get("error").copied().unwrap_or_default(),
        };
        Ok(())
    }

    async fn backlog_seconds(
        _pool: &PgPool,
        _settings: &TraceSettings,
        _now: DateTime<Utc>,
    ) -> Result<Option<f64>, Error> {
        // Measuring it means walking the whole tree: not every few seconds.
        Ok(None)
    }

    fn parse_id(_subject: &str, id: &str) -> Result<(), String> {
        (!id.trim().is_empty())
            .then_some(())
            .ok_or_else(|| "expected a path under the traces root".to_owned())
    }

    async fn explain(
        conn: &mut PgConnection,
        settings: &TraceSettings,
        paths: &PathSettings,
        now: DateTime<Utc>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        explain_trace(conn, settings, paths, now, id).await
    }

    async fn preview(
        conn: &mut PgConnection,
        settings: &TraceSettings,
        paths: &PathSettings,
        now: DateTime<Utc>,
        _accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let report = clean(
            conn,
            &paths.traces_root,
            settings.limits,
            now,
            false,
            &mut Quiet,
            &AtomicBool::new(false),
        )
        .await?;
        Ok(vec![Preview {
            enabled: settings.enabled,
            limits: settings.limits,
            report,
        }])
    }
}
