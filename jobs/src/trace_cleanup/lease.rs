//! The lease that makes one cleaner at a time own a traces root across the fleet (TR-3).

use super::*;

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
