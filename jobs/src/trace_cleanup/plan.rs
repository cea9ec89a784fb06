//! The quota planner (TR-4): which traces go, oldest first, so that the root fits its byte
//! quota — from a histogram of ages, narrowed until the boundary fits in memory.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::shown::Shown;

use super::walk::{Candidate, Entry, Listing, Step, Walk, allocated, as_path, seen, to_time};
use super::{BATCH, BUCKETS, Error, Lease, Observer, Planned, Reason, TraceReport, kept};

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

/// Allocated bytes by mtime, in at most [`BUCKETS`] buckets of equal width (a power of two of
/// nanoseconds), merged as the range grows.
#[derive(Debug, Default)]
pub(super) struct Histogram {
    pub(super) shift: u32,
    pub(super) buckets: BTreeMap<i128, u64>,
    pub(super) total: u64,
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
    pub(super) fn line(&self, excess: u64) -> Option<(i128, u64)> {
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
pub(super) enum QuotaLine {
    /// Every candidate ordered at or before `(mtime, path)` goes (the path's bytes: two names
    /// that only show alike are not the same).
    Upto(i128, Vec<u8>),
    /// Every candidate older than this mtime goes, and of those with exactly this mtime (too
    /// many to sort), as many as cover the bytes given, in walk order: all are equally old.
    Ties(i128, u64),
}

/// Most files of the boundary bucket sorted in memory; a fuller bucket is narrowed first.
pub(super) const BOUNDARY_FILES: usize = 20_000;

/// How many bits a narrowing step divides a bucket's width by.
pub(super) const NARROW_BITS: u32 = 14;

/// What one walk is for.
pub(super) enum Pass {
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

pub(super) fn finer_shift(shift: u32) -> u32 {
    shift.saturating_sub(NARROW_BITS)
}

/// Planned files of the current directory, acted on in batches.
pub(super) struct Plan<'a> {
    pub(super) conn: &'a mut PgConnection,
    pub(super) report: TraceReport,
    /// Candidates of the current directory awaiting their live-session check.
    pub(super) candidates: Vec<Candidate>,
    /// Planned files of the current directory awaiting deletion (confirmed runs).
    pub(super) pending: Vec<Planned>,
    pub(super) observer: &'a mut dyn Observer,
    /// The lease of a confirmed run, which deletes; `None` for a dry run.
    pub(super) lease: Option<&'a mut Lease>,
    pub(super) age_cutoff_ns: Option<i128>,
    /// Allocated bytes of the traces kept whatever the limits (held, or of live sessions): they
    /// count toward the quota but never go.
    pub(super) live_bytes: u64,
    pub(super) stop: &'a AtomicBool,
    pub(super) stopped: bool,
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
            agent_id: candidate.agent_id,
            session_id: candidate.session_id,
            seen: candidate.seen,
        };
        self.observer.planned(&planned);
        *self.report.planned.entry(reason.as_str()).or_default() += 1;
        self.report.planned_bytes += planned.bytes;
        if self.lease.is_some() {
            self.pending.push(planned);
        }
    }

    /// One walk of the tree for `pass`; stops early (and says so) when the worker stops.
    pub(super) async fn walk(&mut self, walk: &mut Walk, pass: &mut Pass) -> Result<(), Error> {
        let mut steps = 0u64;
        while let Some(step) = walk.next_step().await? {
            steps += 1;
            // The walk is file-system work on the runtime's thread: let others run, see a
            // shutdown (FL-5) and keep the lease, every so often.
            if steps.is_multiple_of(1024) {
                tokio::task::yield_now().await;
                if self.stop.load(Ordering::Relaxed) {
                    self.stopped = true;
                    return Ok(());
                }
                if let Some(lease) = self.lease.as_deref_mut() {
                    lease.keep(self.conn).await?;
                }
            }
            match step {
                Step::DirDone(dir) => {
                    self.resolve(pass).await?;
                    self.flush(&dir).await?;
                }
                Step::Entry(_, Entry::Young(bytes)) => {
                    if matches!(pass, Pass::Age(_)) {
                        self.report.candidates += 1;
                        self.report.candidate_bytes += bytes;
                    }
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

    /// Checks the waiting candidates against the holds and the live sessions, then gives each
    /// to `pass`: a held or live session's trace is kept (and counted once, by the first walk).
    async fn resolve(&mut self, pass: &mut Pass) -> Result<(), Error> {
        if self.candidates.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.candidates);
        let traces: Vec<(&str, Uuid)> = batch
            .iter()
            .map(|c| (c.agent_id.as_str(), c.session_id))
            .collect();
        let kept = kept(self.conn, &traces).await?;
        for (candidate, kept) in batch.into_iter().zip(kept) {
            if let Some(reason) = kept {
                if let Pass::Age(_) = pass {
                    self.report.candidates += 1;
                    self.report.candidate_bytes += candidate.blocks_bytes;
                    self.live_bytes += candidate.blocks_bytes;
                    self.report.keep(reason);
                    self.observer.kept(as_path(&candidate.path), reason);
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

    /// Deletes the pending files of `dir`, the lease kept: a held or live session's trace kept,
    /// and each file looked at again just before it goes.
    async fn flush(&mut self, dir: &Listing) -> Result<(), Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if let Some(lease) = self.lease.as_deref_mut() {
            lease.keep(self.conn).await?;
        }
        let batch = std::mem::take(&mut self.pending);
        self.observer.before_delete(&batch);
        let traces: Vec<(&str, Uuid)> = batch
            .iter()
            .map(|p| (p.agent_id.as_str(), p.session_id))
            .collect();
        // The last hold check and the removals in one transaction through the hold gate
        // (HD-3): a hold placed after the check waits for the removals to end.
        let mut tx = crate::owner_loop::begin(&mut *self.conn, None, true).await?;
        let kept = kept(&mut tx, &traces).await?;
        let mut going = Vec::with_capacity(batch.len());
        for (file, kept) in batch.into_iter().zip(kept) {
            match kept {
                Some(reason) => self.report.keep(reason),
                None => going.push(file),
            }
        }
        let mut removal = Removal {
            report: &mut self.report,
            age_cutoff_ns: self.age_cutoff_ns,
        };
        match dir {
            Listing::Local(dir) => removal.unlink(dir, &going),
            Listing::Object(root) => removal.delete_objects(root, going).await,
        }
        tx.commit().await?;
        Ok(())
    }
}

/// The removals of one flushed batch, counted into the report.
pub(super) struct Removal<'r> {
    pub(super) report: &'r mut TraceReport,
    age_cutoff_ns: Option<i128>,
}

impl Removal<'_> {
    fn old(&self, mtime_ns: i128) -> bool {
        self.age_cutoff_ns.is_some_and(|cut| mtime_ns < cut)
    }

    /// Unlinks `batch` from `dir`, each file looked at again just before it goes.
    fn unlink(&mut self, dir: &OwnedFd, batch: &[Planned]) {
        for file in batch {
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
                    tracing::warn!(path = %Shown(&file.path), error = %err, "trace not deleted");
                    self.report.keep("error");
                }
            }
        }
    }
}
