//! The benchmark of SPEC §8, run by a person with `bash bench/run.sh` (never by the tests). Its
//! method — what each part measures, against which floors, and what the columns mean — is
//! docs/benchmark.md.
//!
//! Here: the command line ([`cli`]), the table of the parts ([`PARTS`], each its own module),
//! and the run: each part chosen by `--only` in the table's order, its figures written into the
//! results files ([`results`]) as it goes and its section printed when it ends, then the
//! comparisons of two builds ([`compare`]) if an earlier one was given. What the parts share: [`sexton`] runs the binary and times a
//! pass, [`writer`] and [`sampler`] run beside each method, [`method`] holds its figures,
//! [`cluster`] the databases and the WAL position, [`disk`] the file parts' trees, caches and
//! timed processes, [`objects`] the S3-compatible server, [`table`] the markdown.

mod attachments;
mod cli;
mod cluster;
mod compare;
mod disk;
mod erasure;
mod expiry;
mod method;
mod objects;
mod orphans;
mod part;
// The loopback proxy of the tests, its rate mode a store that throttles (PF-7): one file for
// both; the benchmark uses its rate mode alone.
#[path = "../../tests/common/proxy.rs"]
#[allow(
    dead_code,
    reason = "the tests' hold, drop and cut modes are not the benchmark's"
)]
mod proxy;
mod results;
mod sampler;
mod scales;
mod sexton;
mod table;
mod tenants;
mod traces;
mod writer;

use clap::{CommandFactory as _, FromArgMatches as _};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::cli::Cli;
use crate::part::{Bench, Part};
use crate::results::Results;

/// The parts, in the order they run and their sections stand in latest.md.
static PARTS: &[Part] = &[
    Part {
        name: "scales",
        about: "execution details and sessions at each seed scale (PF-1 … PF-3, PF-6)",
        heading: "## Execution details and sessions",
        run: scales::run,
        render: scales::render,
    },
    Part {
        name: "expiry",
        about: "the short-lived records' expiry (TTL-1, TTL-4)",
        heading: "## Short-lived records",
        run: expiry::run,
        render: expiry::render,
    },
    Part {
        name: "traces",
        about: "run traces against find and the walk of the same end state (TR-1 … TR-4)",
        heading: "## Run traces",
        run: traces::run,
        render: traces::render,
    },
    Part {
        name: "attachments",
        about: "attachment bytes against a plain stat-and-unlink loop (AT-1)",
        heading: "## Attachment bytes",
        run: attachments::run,
        render: attachments::render,
    },
    Part {
        name: "tenants",
        about: "the whole night over many accounts (PF-5)",
        heading: "## Many accounts",
        run: tenants::run,
        render: tenants::render,
    },
    Part {
        name: "erasure",
        about: "one account's erasure against children-first batches, beside the night (PF-8)",
        heading: "## Erasure on request",
        run: erasure::run,
        render: erasure::render,
    },
    Part {
        name: "orphans",
        about: "derivative cleanup of files no row owns against a walk and an anti-join (DC-4)",
        heading: "## Files no row owns",
        run: orphans::run,
        render: orphans::render,
    },
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = parse();
    let results = Results::new(&cli.out, PARTS.iter().map(Part::section).collect());
    if cli.render {
        return results.render_all();
    }
    scales::check_methods(&cli)?;
    let base = PgConnectOptions::new();
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(base.clone())
        .await?;
    let mut comparisons = Vec::new();
    for (index, part) in PARTS.iter().enumerate() {
        if !cli.runs(part.name) {
            continue;
        }
        let bench = Bench {
            cli: &cli,
            admin: &admin,
            base: &base,
            report: results.report(index),
        };
        comparisons.extend((part.run)(&bench).await?);
        if let Some(section) = results.section(index)? {
            println!("{section}\n");
        }
    }
    if !comparisons.is_empty() {
        println!("## Before and after\n\n{}", compare::markdown(&comparisons));
    }
    Ok(())
}

/// The command line, `--only` held to the names of [`PARTS`] (listed in `--help` with what
/// each measures).
fn parse() -> Cli {
    let names = PARTS
        .iter()
        .map(|part| clap::builder::PossibleValue::new(part.name).help(part.about));
    let matches = Cli::command()
        .mut_arg("only", |only| {
            only.value_parser(clap::builder::PossibleValuesParser::new(names))
        })
        .get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}
