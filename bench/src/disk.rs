//! What the file parts (run traces, attachment bytes) share: a deterministic generator, the page
//! cache, free space, and child processes timed with their peak RSS.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::Context as _;
use tokio::io::AsyncReadExt as _;
use uuid::Uuid;

/// SplitMix64: the same numbers for the same seed, on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A version-4 UUID.
    pub fn uuid(&mut self) -> Uuid {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }
}

/// How a method found the page cache: dropped before it (cold), or else warmed by a walk of its
/// tree.
pub fn cache_state(dropped: bool) -> &'static str {
    if dropped {
        "cold: page cache, dentries and inodes dropped before each method"
    } else {
        "warm: each method ran after a walk of its tree (`--warm`, or /proc/sys/vm/drop_caches not writable)"
    }
}

/// Writes dirty pages out, then drops the page cache, dentries and inodes so that the next method
/// starts cold. False when this process may not (not root, or a container without it), or with
/// `keep_cache`: then the tree under `warm` is walked once instead, so that every method at least
/// starts alike.
pub fn start_alike(warm: &Path, keep_cache: bool) -> bool {
    sync();
    if !keep_cache && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok() {
        return true;
    }
    let _ = std::process::Command::new("find")
        .arg(warm)
        .args(["-printf", ""])
        .status();
    false
}

/// Writes every dirty page out (sync(1)).
pub fn sync() {
    let _ = std::process::Command::new("sync").status();
}

/// The 1-minute load average (`/proc/loadavg`).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// Bytes free for an unprivileged writer on the file system holding `dir` (df(1)).
pub fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|line| line.trim().parse().ok())
        .with_context(|| {
            format!(
                "df {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Sets the modification time of a symlink itself (touch(1) -h: std sets a file's only).
pub fn set_symlink_mtime(path: &Path, ns: i128) -> anyhow::Result<()> {
    let at = format!(
        "@{}.{:09}",
        ns.div_euclid(1_000_000_000),
        ns.rem_euclid(1_000_000_000)
    );
    let status = std::process::Command::new("touch")
        .args(["-h", "-d", &at])
        .arg(path)
        .status()?;
    if !status.success() {
        anyhow::bail!("touch -h {} failed", path.display());
    }
    Ok(())
}

/// A child process's wall time, CPU time (user and system) and peak RSS (GNU time's `%U`, `%S`
/// and `%M`: the kernel's rusage from `wait4`).
pub struct Timed {
    pub seconds: f64,
    pub cpu_seconds: Option<f64>,
    pub peak_rss_kb: Option<u64>,
}

/// Runs `program` with `args` (and whatever `configure` sets: environment, standard output)
/// under `/usr/bin/time`, from spawn to exit. Fails when it exits unsuccessfully.
pub async fn timed(
    program: &Path,
    args: &[&str],
    configure: impl FnOnce(&mut tokio::process::Command),
) -> anyhow::Result<Timed> {
    let mut cmd = tokio::process::Command::new("/usr/bin/time");
    cmd.args(["-f", "max_rss_kb=%M cpu_s=%U %S"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    configure(&mut cmd);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .context("/usr/bin/time (Debian package time) runs the method")?;
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .await?;
    let status = child.wait().await?;
    let seconds = started.elapsed().as_secs_f64();
    let (mut peak_rss_kb, mut cpu_seconds) = (None, None);
    let mut rest = Vec::new();
    for line in stderr.lines() {
        match line.strip_prefix("max_rss_kb=") {
            Some(figures) => {
                let (kb, cpu) = figures.split_once(" cpu_s=").unwrap_or((figures, ""));
                peak_rss_kb = kb.trim().parse().ok();
                cpu_seconds = cpu
                    .split_whitespace()
                    .map(|s| s.parse::<f64>().ok())
                    .sum::<Option<f64>>();
            }
            None => rest.push(line),
        }
    }
    let stderr = rest.join("\n");
    if !status.success() {
        anyhow::bail!("{} {args:?} failed ({status}): {stderr}", program.display());
    }
    Ok(Timed {
        seconds,
        cpu_seconds,
        peak_rss_kb,
    })
}

/// CPU seconds spent by the database server's backends for `application` on `db` while `work`
/// runs: their pids sampled from `pg_stat_activity` every 100 ms and their user and system
/// time read from `/proc` (the server runs on this machine, as pg_virtualenv's does); `None`
/// when no backend could be read. A backend's last 100 ms before it exits may be missed.
pub async fn with_backend_cpu<T>(
    base: &sqlx::postgres::PgConnectOptions,
    db: &str,
    application: &'static str,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, Option<f64>)> {
    let pool = crate::cluster::connect(base, db, "bench-cpu-sampler").await?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut ticks = std::collections::HashMap::<i32, u64>::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let pids: Vec<i32> = sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = $1",
                )
                .bind(application)
                .fetch_all(&pool)
                .await
                .unwrap_or_default();
                for pid in pids {
                    if let Some(t) = cpu_ticks(pid) {
                        let seen = ticks.entry(pid).or_default();
                        *seen = (*seen).max(t);
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            pool.close().await;
            ticks
        }
    });
    let result = work.await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let ticks = sampler.await?;
    let per_second = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0);
    let cpu = (!ticks.is_empty()).then(|| ticks.values().sum::<u64>() as f64 / per_second);
    Ok((result?, cpu))
}

/// A process's user and system time in clock ticks, from `/proc/<pid>/stat`.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5): 12 and 13 after the name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Files left under `root` (its subdirectories walked).
pub fn files_left(root: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(entry.path());
            } else {
                n += 1;
            }
        }
    }
    Ok(n)
}
