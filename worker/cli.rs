//! The command line (OP-1): one binary, one subcommand per operation.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{ArgGroup, Parser, Subcommand};

use crate::config::Settings;
use crate::seed::{SeedOptions, seed};
use crate::{
    clock, db, demo, doctor, erase, explain, generated, holds, orphans, preview, receipts,
    registry, sessions, status, tick, traces, worker,
};

/// sexton removes exactly what has expired from an AI-agent conversation platform.
#[derive(Debug, Parser)]
#[command(name = "sexton", version, about)]
pub struct Cli {
    /// Configuration file over the built-in defaults (environment variables override both).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the reference schema, sexton's objects and the queue's schema (idempotent).
    Migrate,
    /// Validate the configuration and print it; exit 2 if anything is invalid.
    CheckConfig,
    /// Check a deployment before its first night (OP-7): one line per check, each finding with
    /// what to do; exit 0 with none, 1 with findings, 2 when it cannot check.
    Doctor {
        /// Print one JSON object: {"checks": [{check, ok, detail, fix}]}.
        #[arg(long)]
        json: bool,
    },
    /// Run as a fleet member: schedule and queue consumers.
    Worker {
        /// Exit once no job is pending or running (tests, demos, one-shot runs): 0, or 1 if a
        /// job it ran failed for good.
        #[arg(long)]
        exit_when_idle: bool,
    },
    /// Enqueue the nightly slot at (or last due before) a time, exactly once fleet-wide.
    Tick {
        /// The moment to tick at (RFC 3339, from 1970 to 2100); now if omitted.
        #[arg(long, value_name = "RFC3339", value_parser = slot_moment)]
        at: Option<DateTime<Utc>>,
        /// Print one JSON object: {"slot": "...", "outcome": "enqueued" | "duplicate"}.
        #[arg(long)]
        json: bool,
    },
    /// What each job would remove now, deleting nothing: per job, the accounts with something
    /// due and what their passes would remove, by reason and table.
    Preview {
        /// Every job's lines for this account alone, whether anything is due or not.
        #[arg(long, value_name = "ID", conflicts_with = "all")]
        account: Option<uuid::Uuid>,
        /// A line per account with something due, for every per-account job (streamed).
        #[arg(long)]
        all: bool,
        /// Print JSON: one array of objects, each naming its `job`.
        #[arg(long)]
        json: bool,
    },
    /// Old agent sessions (SPEC §3) with ages from SEXTON_SESSION_{MAIN,TASK,SUBAGENT}_DAYS.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Why a row or file is still here (or was removed): the owning job's verdict with every
    /// reason and its rule id.
    Explain {
        // The subjects and their ids are the registry's (`Inspect::SUBJECTS`, `Inspect::parse_id`).
        #[arg(help = explain::subjects_help())]
        subject: String,
        #[arg(help = explain::ids_help())]
        id: String,
        /// Print one JSON object (documented in the README).
        #[arg(long)]
        json: bool,
    },
    /// Run traces (SPEC §4) by the [traces] limits, whether or not background cleaning is on.
    Traces {
        #[command(subcommand)]
        command: TracesCommand,
    },
    /// Derivative cleanup (SPEC §12): files no row owns, by the [orphans] grace, whether or not
    /// the background job is on.
    Orphans {
        #[command(subcommand)]
        command: orphans::OrphansCommand,
    },
    /// Holds (SPEC §9): what legal or security froze stays, whatever a window says, until
    /// released; a hold is never deleted.
    Holds {
        #[command(subcommand)]
        command: HoldsCommand,
    },
    /// Erasure on request (SPEC §11): everything of an account, conversation, agent or session
    /// goes, whatever its age, withheld item by item while in flight or held, verified, with a
    /// chained receipt. Prints the request's id; its pass starts at once.
    #[command(args_conflicts_with_subcommands = true)]
    Erase {
        #[command(subcommand)]
        command: Option<erase::EraseCommand>,
        #[command(flatten)]
        request: erase::EraseRequest,
    },
    /// Erasure receipts (RQ-6): the chain of what each completed request removed, which
    /// outlives the data; the subject only as a keyed hash.
    Receipts {
        #[command(subcommand)]
        command: receipts::ReceiptsCommand,
    },
    /// Per job the latest slot's fan-out and passes by state, the backlog and the queue, the
    /// passes that did not finish, the jobs failed for good (with their last error), and the
    /// active holds.
    Status {
        /// Print one JSON object (documented in the README).
        #[arg(long)]
        json: bool,
        /// List every account's latest pass, finished ones too.
        #[arg(long)]
        all: bool,
        /// List this account's latest passes, finished ones too.
        #[arg(long, value_name = "ID")]
        account: Option<uuid::Uuid>,
        /// Only this job.
        #[arg(long, value_name = "NAME")]
        job: Option<String>,
    },
    /// Write deterministic synthetic platform data (every table, files on disk).
    Seed {
        /// Volume: 1 is about 2,500 runs; volume grows linearly.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        scale: u64,
        /// Random seed; the same seed and --now give the same data.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The moment ages are measured back from (RFC 3339); now if omitted.
        #[arg(long, value_name = "RFC3339")]
        now: Option<DateTime<Utc>>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Seed even though the database already holds accounts.
        #[arg(long)]
        force: bool,
        /// Check every row's foreign keys and triggers, one batch at a time (slower), even
        /// when the role could turn them off for the seed's own transactions.
        #[arg(long)]
        checked: bool,
    },
    /// Migrate, seed a small dataset, run one nightly pass through the queue, report.
    Demo {
        /// Volume of demo data.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
        scale: u64,
    },
    /// For developers, from the repository's root: rewrite what the docs, config/default.toml
    /// and the alert rules repeat from the code (the pool budget, explain's subjects, the kinds
    /// not run nightly) from the registry under the built-in defaults.
    #[command(hide = true)]
    Generate {
        /// Write nothing; exit 1 naming every block that is out of date.
        #[arg(long)]
        check: bool,
    },
}

/// The exit code for an error (OP-1): 2 for bad configuration or usage, 1 for any other
/// failure.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    let bad_configuration = err.chain().any(|e| {
        e.downcast_ref::<crate::config::ConfigError>().is_some()
            || e.downcast_ref::<explain::UsageError>().is_some()
            || matches!(
                e.downcast_ref::<doctor::Error>(),
                Some(doctor::Error::CannotCheck(_))
            )
            || e.downcast_ref::<tick::TickError>()
                .is_some_and(tick::TickError::is_usage)
            || e.downcast_ref::<holds::Error>()
                .is_some_and(holds::Error::is_usage)
            || e.downcast_ref::<erase::Error>()
                .is_some_and(erase::Error::is_usage)
            || e.downcast_ref::<receipts::Error>()
                .is_some_and(receipts::Error::is_usage)
            || e.downcast_ref::<orphans::Error>()
                .is_some_and(orphans::Error::is_usage)
            || matches!(
                e.downcast_ref::<db::DbError>(),
                Some(
                    db::DbError::BadUrl(_)
                        | db::DbError::TransactionPooling { .. }
                        | db::DbError::PoolTooSmall { .. }
                )
            )
    });
    if bad_configuration { 2 } else { 1 }
}

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List every session these ages would delete now; delete them only with --confirm.
    Prune {
        /// Delete the sessions listed (without it nothing is deleted).
        #[arg(long)]
        confirm: bool,
        /// Only this account.
        #[arg(long, value_name = "ID")]
        account: Option<uuid::Uuid>,
        /// Print one JSON object: ages, targets and (with --confirm) what was deleted.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum TracesCommand {
    /// Print the plan (path, allocated bytes, mtime, reason per file, then totals); delete it
    /// only with --confirm.
    Clean {
        /// Delete the files planned (without it nothing is deleted).
        #[arg(long)]
        confirm: bool,
        /// Print one JSON object: {"files": [...], "totals": {...}}.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum HoldsCommand {
    /// Place a hold on one scope that exists, covering what HD-2 says it covers; a scope may
    /// be held more than once. Prints the hold's id.
    #[command(group(ArgGroup::new("scope").required(true)))]
    Place {
        /// Hold this account: everything of it.
        #[arg(long, value_name = "ID", group = "scope")]
        account: Option<uuid::Uuid>,
        /// Hold this conversation: its runs (execution detail, output files) and its events.
        #[arg(long, value_name = "ID", group = "scope")]
        conversation: Option<uuid::Uuid>,
        /// Hold this agent: its sessions, traces, handoffs, dream preloads and working records.
        #[arg(long, value_name = "ID", group = "scope")]
        agent: Option<uuid::Uuid>,
        /// Hold this session: it, its history, frames, traces and the handoffs naming it.
        #[arg(long, value_name = "ID", group = "scope")]
        session: Option<uuid::Uuid>,
        /// Hold this run: its execution detail and output files.
        #[arg(long, value_name = "ID", group = "scope")]
        run: Option<uuid::Uuid>,
        /// The case, ticket or matter the hold is for.
        #[arg(long = "case", value_name = "REF", value_parser = not_blank)]
        case_ref: String,
        /// Why the data must stay.
        #[arg(long, value_name = "TEXT", value_parser = not_blank)]
        reason: String,
        /// Who places the hold.
        #[arg(long, value_name = "NAME", value_parser = not_blank)]
        by: String,
        /// Print the hold as one JSON object instead of its id.
        #[arg(long)]
        json: bool,
    },
    /// Release an active hold (it stays, with who released it and when).
    Release {
        /// The hold's id, as `place` printed it.
        #[arg(value_name = "HOLD_ID")]
        hold: uuid::Uuid,
        /// Who releases the hold.
        #[arg(long, value_name = "NAME", value_parser = not_blank)]
        by: String,
        /// Print the released hold as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The active holds, newest first, with every column.
    List {
        /// Released holds too.
        #[arg(long)]
        all: bool,
        /// Print one JSON array of objects.
        #[arg(long)]
        json: bool,
    },
}

/// A moment a slot can be asked for at (RFC 3339, within the years a schedule names).
fn slot_moment(value: &str) -> Result<DateTime<Utc>, String> {
    let at = value
        .parse::<DateTime<Utc>>()
        .map_err(|e| format!("expected an RFC 3339 moment such as 2026-12-01T03:00:00Z: {e}"))?;
    crate::schedule::in_slot_range(at)
}

/// A value that must say something: the holds' case, reason and names.
fn not_blank(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty or blank".to_owned())
    } else {
        Ok(value.to_owned())
    }
}

/// Runs one command to completion.
///
/// # Errors
/// Whatever stopped the command, with context for the person reading it.
pub async fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::CheckConfig => {
            settings.check_dirs()?;
            settings.reach_stores().await?;
            println!("configuration is valid");
            println!("{settings:#?}");
            Ok(())
        }
        Command::Doctor { json } => {
            let checks = doctor::run(&settings).await?;
            Ok(doctor::report(&checks, json)?)
        }
        Command::Migrate => {
            let pool = db::connect(&settings.database, db::Access::Write).await?;
            db::migrate(&pool).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Worker { exit_when_idle } => {
            // Its object stores are reached in the worker, retried as the database is (ER-2).
            settings.check_dirs()?;
            let mode = if exit_when_idle {
                worker::Mode::UntilIdle
            } else {
                worker::Mode::Fleet
            };
            let ran = worker::run(&settings, mode).await?;
            match mode {
                worker::Mode::UntilIdle => ran.succeeded(),
                worker::Mode::Fleet => Ok(()),
            }
        }
        Command::Tick { at, json } => run_tick(&settings, at, json).await,
        Command::Preview { account, all, json } => {
            let shown = match (account, all) {
                (Some(account), _) => preview::Shown::Account(account),
                (None, true) => preview::Shown::All,
                (None, false) => preview::Shown::Summary,
            };
            run_preview(&settings, shown, json).await
        }
        Command::Sessions {
            command:
                SessionsCommand::Prune {
                    confirm,
                    account,
                    json,
                },
        } => sessions::run(&settings, account, confirm, json).await,
        Command::Explain { subject, id, json } => {
            explain::explain(&settings, &subject, &id, json).await
        }
        Command::Traces {
            command: TracesCommand::Clean { confirm, json },
        } => traces::clean(&settings, confirm, json).await,
        Command::Orphans { command } => orphans::run(&settings, command).await,
        Command::Holds { command } => run_holds(&settings, command).await,
        Command::Erase { command, request } => erase::run(&settings, command, request).await,
        Command::Receipts { command } => receipts::run(&settings, command).await,
        Command::Status {
            json,
            all,
            account,
            job,
        } => run_status(&settings, status::Listed { all, account, job }, json).await,
        Command::Seed {
            scale,
            seed: random_seed,
            now,
            json,
            force,
            checked,
        } => {
            let options = SeedOptions {
                scale,
                seed: random_seed,
                now: now.unwrap_or_else(Utc::now),
                show_progress: !json,
                checked,
            };
            run_seed(&settings, &options, force, json).await
        }
        Command::Demo { scale } => demo::run(&settings, scale).await,
        Command::Generate { check } => run_generate(check),
    }
}

/// `sexton generate [--check]`, in the current directory: the repository's root.
fn run_generate(check: bool) -> anyhow::Result<()> {
    let root = std::path::Path::new(".");
    let facts = generated::Facts::defaults()?;
    if check {
        generated::check(root, &facts)?;
        println!("every generated block is up to date");
    } else {
        let written = generated::write(root, &facts)?;
        if written.is_empty() {
            println!("every generated block is up to date");
        }
        for file in written {
            println!("wrote {file}");
        }
    }
    Ok(())
}

/// `sexton tick`: the slot due at `at` (the database's now by default), enqueued once.
async fn run_tick(
    settings: &Settings,
    at: Option<DateTime<Utc>>,
    json: bool,
) -> anyhow::Result<()> {
    let pool = db::connect(&settings.database, db::Access::Write).await?;
    // The database's now, not this host's: a host clock days ahead would enqueue a
    // slot days out (FL-2).
    let now = clock::database_now(&pool).await?;
    let ticked = tick::tick(&pool, settings, at.unwrap_or(now)).await?;
    if ticked.slot > now {
        // Accepted, and harmless: a pass never cuts off later than the database's
        // now minus the window (EX-1).
        eprintln!(
            "sexton: note: slot {} is in the future; its passes prune only what is \
             already past each account's window now",
            ticked.slot.to_rfc3339()
        );
    }
    if json {
        println!("{}", serde_json::to_string(&ticked)?);
    } else {
        println!("slot {}: {}", ticked.slot.to_rfc3339(), ticked.outcome);
    }
    Ok(())
}

/// `sexton preview`, written to stdout as it goes.
async fn run_preview(settings: &Settings, shown: preview::Shown, json: bool) -> anyhow::Result<()> {
    let pool = db::connect(&settings.database, db::Access::Read).await?;
    let mut conn = pool.acquire().await?;
    let now = clock::database_now(&pool).await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    preview::write(&mut conn, settings, now, shown, json, &mut out).await?;
    out.flush()?;
    Ok(())
}

/// `sexton holds place`, `release` and `list`.
async fn run_holds(settings: &Settings, command: HoldsCommand) -> anyhow::Result<()> {
    let pool = db::connect(
        &settings.database,
        match command {
            HoldsCommand::List { .. } => db::Access::Read,
            HoldsCommand::Place { .. } | HoldsCommand::Release { .. } => db::Access::Write,
        },
    )
    .await?;
    match command {
        HoldsCommand::Place {
            account,
            conversation,
            agent,
            session,
            run,
            case_ref,
            reason,
            by,
            json,
        } => {
            // Clap's group gives exactly one.
            let (scope, id) = [
                (holds::Scope::Account, account),
                (holds::Scope::Conversation, conversation),
                (holds::Scope::Agent, agent),
                (holds::Scope::Session, session),
                (holds::Scope::Run, run),
            ]
            .into_iter()
            .find_map(|(scope, id)| Some((scope, id?)))
            .context("holds place: a scope flag is required")?;
            let hold = holds::place(&pool, scope, id, &case_ref, &reason, &by).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&hold)?);
            } else {
                println!("{}", hold.placed.id);
            }
        }
        HoldsCommand::Release { hold, by, json } => {
            let hold = holds::release(&pool, hold, &by).await?;
            // RQ-4: requests waiting on what it held go on now, with no operator action.
            erase::resume(&pool, settings).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&hold)?);
            } else {
                print!("{}", holds::released(&pool, &hold).await?);
            }
        }
        HoldsCommand::List { all, json } => {
            let listed = holds::list(&pool, all).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&listed)?);
            } else if listed.is_empty() && !all {
                println!("no active hold (sexton holds list --all lists released ones too)");
            } else if listed.is_empty() {
                println!("no hold was ever placed");
            } else {
                print!("{}", holds::table(&listed));
            }
        }
    }
    Ok(())
}

/// `sexton status`; an unknown `--job` is bad usage.
async fn run_status(settings: &Settings, listed: status::Listed, json: bool) -> anyhow::Result<()> {
    if let Some(job) = &listed.job
        && !registry::KINDS.iter().any(|kind| kind.name() == job)
    {
        return Err(explain::UsageError(format!(
            "--job: expected one of {}, got {job:?}",
            registry::KINDS
                .iter()
                .map(|kind| kind.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into());
    }
    let pool = db::connect(&settings.database, db::Access::Read).await?;
    let now = clock::database_now(&pool).await?;
    let status = status::read(&pool, settings, now, &listed, None).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", status.render());
    }
    Ok(())
}

/// `sexton seed`, refusing a database that holds accounts unless `force`d.
async fn run_seed(
    settings: &Settings,
    options: &SeedOptions,
    force: bool,
    json: bool,
) -> anyhow::Result<()> {
    let pool = db::connect(&settings.database, db::Access::Write).await?;
    let existing: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(&pool)
        .await
        .context("could not count the accounts (run `sexton migrate` first?)")?;
    if existing > 0 && !force {
        anyhow::bail!(
            "the database already holds {existing} accounts; `sexton seed` writes \
             synthetic accounts and files, so it refuses a database in use \
             (pass --force to seed anyway)"
        );
    }
    let started = std::time::Instant::now();
    let report = seed(&pool, &settings.paths, options).await.context(
        "seeding failed (what was written stays: recreate the database before seeding again)",
    )?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "seeded {} accounts, {} conversations, {} runs: {} rows and {} files ({} bytes) in {:.1}s",
            report.accounts,
            report.conversations,
            report.runs,
            report.rows,
            report.files,
            report.file_bytes,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
