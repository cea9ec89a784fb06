//! What a part of the benchmark is — a name for `--only`, a section of latest.md, how it runs
//! and how its section is rendered — and what every part is given when it runs.

use futures::future::LocalBoxFuture;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::cli::Cli;
use crate::compare::Comparison;
use crate::results::{Render, Report, Section};

/// A part runs its methods, writes its figures as it goes and returns the comparisons of the
/// two builds it made (none without `--baseline-sexton`).
pub type Run = for<'a> fn(&'a Bench<'a>) -> LocalBoxFuture<'a, anyhow::Result<Vec<Comparison>>>;

/// A part of the benchmark, as main's table declares it.
pub struct Part {
    /// Its name for `--only`, and its member of latest.json.
    pub name: &'static str,
    /// What it measures, in a few words (`--help`).
    pub about: &'static str,
    /// The heading of its section of latest.md.
    pub heading: &'static str,
    pub run: Run,
    pub render: Render,
}

impl Part {
    /// Its section of latest.md.
    pub fn section(&self) -> Section {
        Section {
            heading: self.heading,
            render: self.render,
        }
    }
}

/// What a part is given: the command line, the cluster (a connection to its maintenance
/// database, and the options every other connection starts from) and its results.
pub struct Bench<'a> {
    pub cli: &'a Cli,
    pub admin: &'a PgPool,
    pub base: &'a PgConnectOptions,
    pub report: Report<'a>,
}
