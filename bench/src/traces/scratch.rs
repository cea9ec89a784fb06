//! One size's scratch: its directory, the roots sexton is given under it (the traces root among
//! them), a directory outside them that symlinks lead to, and its database; and the same in a
//! bucket of the object store.

use std::path::PathBuf;

use anyhow::bail;
use sqlx::PgPool;

use crate::cli::Cli;
use crate::cluster::recreate;
use crate::disk;
use crate::objects::Server;
use crate::sexton::{ROOTS, sexton};

/// What sexton's plan of a run is printed to (`--json`), then read back for its totals.
const PLAN_FILE: &str = "plan.json";
/// One scale's scratch: its directory, the roots sexton is given under it (the traces root
/// among them), a directory outside them that symlinks lead to, and its database.
pub struct Scratch {
    pub files: u64,
    pub dir: PathBuf,
    pub roots: PathBuf,
    pub root: PathBuf,
    pub outside: PathBuf,
    pub db: String,
}

impl Scratch {
    /// Makes the directories for `files` trace files (removed first), checks that the disk has
    /// room for the tree, and creates the database and migrates it.
    pub async fn prepare(cli: &Cli, admin: &PgPool, files: u64) -> anyhow::Result<Self> {
        let dir = cli.scratch.join(format!("traces-{files}"));
        let roots = dir.join("roots");
        let root = roots.join("traces");
        let outside = dir.join("outside");
        let _ = std::fs::remove_dir_all(&dir);
        for (_, name) in ROOTS {
            std::fs::create_dir_all(roots.join(name))?;
        }
        std::fs::create_dir_all(&outside)?;
        // A 1–4 KiB body takes one or two 4 KiB blocks; the signature alone, one.
        let need = files * if cli.trace_small { 4096 } else { 5000 } + (1 << 30);
        let free = disk::free_bytes(&dir)?;
        if free < need {
            bail!(
                "{files} trace files need about {} MB under {}, {} MB are free: free some, or pass \
                 --trace-small (bodies of the signature line alone)",
                need >> 20,
                dir.display(),
                free >> 20
            );
        }
        let db = format!("benchtr_{files}");
        recreate(admin, &db, None).await?;
        if !sexton(&cli.sexton, &db, &roots, &["migrate"])
            .status()
            .await?
            .success()
        {
            bail!("migrating {db} failed");
        }
        Ok(Self {
            files,
            dir,
            roots,
            root,
            outside,
            db,
        })
    }

    /// The same scratch in a bucket of `server` (its roots prefixes there, made afresh), on the
    /// same database.
    pub fn in_bucket(&self, server: &Server) -> anyhow::Result<Self> {
        let dir = server.bucket("benchtraces");
        let roots = dir.join("roots");
        let _ = std::fs::remove_dir_all(&dir);
        for (_, name) in ROOTS {
            std::fs::create_dir_all(roots.join(name))?;
        }
        Ok(Self {
            files: self.files,
            root: roots.join("traces"),
            roots,
            outside: dir.join("outside"),
            db: self.db.clone(),
            dir,
        })
    }

    /// Where sexton's plan of a run is printed to.
    pub fn plan_file(&self) -> PathBuf {
        self.dir.join(PLAN_FILE)
    }
}
