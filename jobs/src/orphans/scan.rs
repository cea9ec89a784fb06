//! A scan: each root of [`Scan::roots`] walked, what no row owns judged (DC-1, DC-2), listed,
//! and — confirmed — removed; the counts per root and reason (DC-5).

use std::sync::atomic::AtomicBool;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use crate::cutoff::days_before;
pub(super) use crate::files::object::{time_ns, to_time};
use crate::files::{PathSettings, Root, Store};

use super::judge::Kind;
use super::{Error, OrphanReport, RootCounts, local, objects};

/// One scan's terms.
pub struct Scan<'a> {
    pub paths: &'a PathSettings,
    /// The roots walked, in this order.
    pub roots: &'a [Root],
    pub grace_days: i32,
    /// What the grace is measured back from: the database's now.
    pub now: DateTime<Utc>,
    /// Whether orphans are removed, or only listed.
    pub confirm: bool,
}

/// One entry that would go (a dry run) or is to go (confirmed): the line `sexton orphans
/// scan` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    pub root: &'static str,
    /// Relative to the root, for people: rendered lossily where a name is not UTF-8 (never a
    /// way to find the file); a directory's ends with `/`.
    pub path: String,
    /// Its bytes (a directory's: every file's in it).
    pub bytes: u64,
    /// Its modification time (a directory's: the newest of anything in it).
    pub mtime: DateTime<Utc>,
    /// Why it goes: `no_row`.
    pub reason: &'static str,
}

/// Sees each entry listed.
pub trait Observer: Send {
    fn listed(&mut self, _entry: &Listed) {}
}

/// An observer that looks at nothing.
pub struct Quiet;

impl Observer for Quiet {}

/// What one root's walk works with.
pub(super) struct Ctx<'c> {
    pub conn: &'c mut PgConnection,
    pub root: Root,
    pub counts: &'c mut RootCounts,
    pub observer: &'c mut dyn Observer,
    pub stop: &'c AtomicBool,
    /// Only what was last modified before this (ns since the epoch) is an orphan.
    pub cutoff_ns: i128,
    pub confirm: bool,
}

impl Ctx<'_> {
    /// Lists one entry that goes.
    pub(super) fn list(&mut self, path: &[u8], directory: bool, bytes: u64, mtime_ns: i128) {
        let mut path = String::from_utf8_lossy(path).into_owned();
        if directory {
            path.push('/');
        }
        self.counts.listed += 1;
        self.counts.listed_bytes += bytes;
        self.observer.listed(&Listed {
            root: self.root.as_str(),
            path,
            bytes,
            mtime: to_time(mtime_ns),
            reason: "no_row",
        });
    }

    /// Whether the scan was asked to stop (FL-5): the batch in hand is finished, no other
    /// is taken.
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// What each root's entries are judged as.
pub(super) fn kinds(root: Root) -> Kind {
    match root {
        Root::Outputs => Kind::Output,
        Root::Attachments => Kind::Attachment,
        Root::Sessions => Kind::SessionDir,
        Root::Traces => Kind::TraceDir,
    }
}

impl Scan<'_> {
    /// Scans each root: lists what no row owns and, confirmed, removes it. A root that is
    /// missing, not a directory or unreadable (a store that does not answer) is reported in its
    /// counts, nothing deleted there, and the scan goes on with the next. When `stop` is raised
    /// the scan ends after the batch in hand.
    ///
    /// # Errors
    /// A database error (what was removed before it stays removed, and counted in the records
    /// of no scan).
    pub async fn run(
        &self,
        conn: &mut PgConnection,
        observer: &mut dyn Observer,
        stop: &AtomicBool,
    ) -> Result<OrphanReport, Error> {
        // A grace the calendar cannot subtract: nothing is old enough.
        let cutoff_ns = days_before(self.now, self.grace_days).map_or(i128::MIN, time_ns);
        let mut report = OrphanReport {
            confirmed: self.confirm,
            grace_days: self.grace_days,
            ..OrphanReport::default()
        };
        for root in self.roots {
            let mut counts = RootCounts::new();
            let mut ctx = Ctx {
                conn: &mut *conn,
                root: *root,
                counts: &mut counts,
                observer: &mut *observer,
                stop,
                cutoff_ns,
                confirm: self.confirm,
            };
            match self.paths.store(*root) {
                Store::Local(path) => local::scan_root(&mut ctx, &path).await?,
                Store::Object(objects) => objects::scan_root(&mut ctx, &objects).await?,
            }
            report.roots.insert(root.as_str(), counts);
        }
        Ok(report)
    }
}
