//! The lease that makes one cleaner at a time own a traces root across the fleet (TR-3): an
//! exclusive `flock(2)` on a file in a directory root, a row in `sexton.trace_leases` with its
//! holder and expiry, renewed while the cleaner runs, where the root is an object store (OS-2).

use std::io::{self, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;

use chrono::{DateTime, Utc};
use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::files::Store;

use super::{Error, LEASE_FILE};

/// How long a row lease lasts unless renewed.
const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(120);

/// How long after its last renewal a row lease is renewed again: before every batch of deletes
/// and every so many files walked, once this old.
const RENEW_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

/// The cleaner's lease: held while the value lives (a file lock goes with its descriptor; a row
/// lease expires unless renewed, and [`release`](Self::release) ends it at once).
#[derive(Debug)]
pub enum Lease {
    File(OwnedFd),
    Row {
        root: String,
        token: Uuid,
        renewed: std::time::Instant,
    },
}

impl Lease {
    /// Takes the lease on `store` for `holder` (who it is: worker, host, pid), or says who
    /// holds it.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] with the holder's line when another cleaner holds it;
    /// [`Error::Lease`] when the lease file cannot be opened (or is a symlink);
    /// [`Error::Database`] when the lease row cannot be written.
    pub async fn take(
        conn: &mut PgConnection,
        store: &Store,
        holder: &str,
    ) -> Result<Lease, Error> {
        match store {
            Store::Local(root) => Self::acquire(root, holder),
            Store::Object(objects) => Self::row(conn, &objects.to_string(), holder).await,
        }
    }

    /// Takes the file lease on the directory `root` for `holder`, or says who holds it.
    ///
    /// # Errors
    /// As [`take`](Self::take).
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
        Ok(Lease::File(OwnedFd::from(file)))
    }

    /// The row lease on the object root `root`: taken when there is none or the last one
    /// expired, in one statement (two cleaners racing for it: one wins).
    async fn row(conn: &mut PgConnection, root: &str, holder: &str) -> Result<Lease, Error> {
        let token = Uuid::new_v4();
        let taken: Option<Uuid> = sqlx::query_scalar(include_str!("lease_take.sql"))
            .bind(root)
            .bind(holder)
            .bind(token)
            .bind(LEASE_TTL.as_secs_f64())
            .fetch_optional(&mut *conn)
            .await?;
        if taken.is_some() {
            return Ok(Lease::Row {
                root: root.to_owned(),
                token,
                renewed: std::time::Instant::now(),
            });
        }
        let holder: Option<String> = sqlx::query_scalar(
            "SELECT holder || ' (until ' || to_char(expires_at AT TIME ZONE 'UTC',
                                                    'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') || ')'
             FROM sexton.trace_leases WHERE root = $1",
        )
        .bind(root)
        .fetch_optional(&mut *conn)
        .await?;
        Err(Error::LeaseHeld {
            holder: holder.unwrap_or_else(|| "a cleaner that has just released it".to_owned()),
        })
    }

    /// Renews a row lease last renewed [`RENEW_AFTER`] ago or more (a file lease needs
    /// nothing): called before deleting, so that nothing is deleted by a cleaner whose lease
    /// another has taken over.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the row is no longer this cleaner's; a database error.
    pub async fn keep(&mut self, conn: &mut PgConnection) -> Result<(), Error> {
        let Lease::Row {
            root,
            token,
            renewed,
        } = self
        else {
            return Ok(());
        };
        if renewed.elapsed() < RENEW_AFTER {
            return Ok(());
        }
        let kept: Option<i32> = sqlx::query_scalar(
            "UPDATE sexton.trace_leases
             SET expires_at = now() + make_interval(secs => $3)
             WHERE root = $1 AND token = $2 AND expires_at > now()
             RETURNING 1",
        )
        .bind(&*root)
        .bind(*token)
        .bind(LEASE_TTL.as_secs_f64())
        .fetch_optional(&mut *conn)
        .await?;
        match kept {
            Some(_) => {
                *renewed = std::time::Instant::now();
                Ok(())
            }
            None => Err(Error::LeaseLost { root: root.clone() }),
        }
    }

    /// Ends the lease now (a row lease would otherwise last until it expires).
    ///
    /// # Errors
    /// A database error; the row then expires by itself.
    pub async fn release(self, conn: &mut PgConnection) -> Result<(), Error> {
        if let Lease::Row { root, token, .. } = self {
            sqlx::query("DELETE FROM sexton.trace_leases WHERE root = $1 AND token = $2")
                .bind(root)
                .bind(token)
                .execute(conn)
                .await?;
        }
        Ok(())
    }
}

/// Who a cleaner is, for the lease: name, host, pid and since when.
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
