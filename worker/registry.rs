//! The job kinds this worker runs: one line each in [`KINDS`]. Fan-out, configuration, the
//! queue consumers, `preview`, `status`, the demo and the gauges all iterate this list; a kind
//! is the job's module in `sexton-jobs` and its line here, nothing else.

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sexton_jobs::attachment_expiry::AttachmentExpiry;
use sexton_jobs::erasure::Erase;
use sexton_jobs::explain::Explanation;
use sexton_jobs::job::{self, Cadence, Due, HopOutcome, Inspect, Job, Look, Reason, Scope};
use sexton_jobs::orphans::Orphans;
use sexton_jobs::pass::ArgsOf;
use sexton_jobs::prune_execution_details::PruneExecutionDetails;
use sexton_jobs::queue_retention::QueueRetention;
use sexton_jobs::record_expiry::{
    ConversationEvents, DreamPreloads, Expire, Handoffs, WorkingRecords,
};
use sexton_jobs::session_retention::SessionRetention;
use sexton_jobs::settings::Check;
use sexton_jobs::trace_cleanup::TraceCleanup;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::config::{AnySettings, ConfigError, PathSettings, PoolBudget, Section, Settings};
use crate::context::{JobContext, JobFailure, decode};
use crate::hop;
use crate::queue::{PushOutcome, QueueError};
use crate::telemetry::metrics::KindLabels;

/// Every registered job kind, in the order reports list them, each with the tables its hops
/// count deleted rows of (the `table` labels of its metrics, exported at 0 from start: OP-3).
pub static KINDS: &[&dyn Kind] = &[
    &Registered::<PruneExecutionDetails>::new(),
    &Registered::<SessionRetention>::new(),
    &Registered::<Expire<Handoffs>>::new(),
    &Registered::<Expire<DreamPreloads>>::new(),
    &Registered::<Expire<WorkingRecords>>::new(),
    &Registered::<Expire<ConversationEvents>>::new(),
    &Registered::<QueueRetention>::new(),
    &Registered::<AttachmentExpiry>::new(),
    &Registered::<TraceCleanup>::new().ending(&[HopOutcome::LeaseHeld]),
    &Registered::<Orphans>::new(),
    &Registered::<Erase>::new(),
];

/// A job kind as the worker sees it: [`Job`] with its types erased, implemented once for every
/// job by [`Registered`].
pub trait Kind: Section + Send + Sync {
    /// The job's stable name (the `kind` label of its metrics).
    fn name(&self) -> &'static str;
    /// Its queue (`sexton.<name>`).
    fn queue(&self) -> &'static str;
    /// Every value its metrics' labels can take (OP-3).
    fn labels(&self) -> KindLabels;
    fn scope(&self) -> Scope;
    /// When its passes start, under these settings.
    fn cadence(&self, settings: &Settings) -> Cadence;
    /// What `sexton explain` asks it about.
    fn subjects(&self) -> &'static [&'static str];
    /// Whether `id` is well formed for `subject`.
    fn parse_id(&self, subject: &str, id: &str) -> Result<(), String>;
    /// Its verdict on one subject.
    fn explain<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        settings: &'a Settings,
        now: DateTime<Utc>,
        subject: &'static str,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Explanation>>>;
    /// Runs one hop from its JSON payload.
    fn handle<'a>(
        &'a self,
        ctx: &'a JobContext,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<(), JobFailure>>;
    /// Pushes the first hop of a pass for `slot` (per account: `account` is set).
    fn push_first<'a>(
        &'a self,
        ctx: &'a JobContext,
        account: Option<Uuid>,
        slot: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<PushOutcome, QueueError>>;
    /// Its discovery of the accounts that have something due for `slot` (FL-8).
    fn due(&self, settings: &Settings, slot: DateTime<Utc>) -> Due;
    /// The first hops of these accounts' passes for `slot`, as pushed: (key, payload) each.
    fn first_hops(
        &self,
        accounts: &[Uuid],
        slot: DateTime<Utc>,
    ) -> Result<Vec<(String, Vec<u8>)>, serde_json::Error>;
    /// The first hop's payload, as it would be pushed.
    fn first_payload(&self, account: Option<Uuid>, slot: DateTime<Utc>) -> serde_json::Value;
    /// The job's backlog in seconds, if it measures one.
    fn backlog<'a>(
        &'a self,
        pool: &'a PgPool,
        settings: &'a Settings,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Option<f64>>>;
    /// What a pass would do now, for `accounts` or every one ([`Inspect::preview`]): per line
    /// its JSON object (with `"job"`), its text and its tally.
    fn preview<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        settings: &'a Settings,
        now: DateTime<Utc>,
        accounts: Option<&'a [Uuid]>,
    ) -> BoxFuture<'a, anyhow::Result<Vec<PreviewLine>>>;
}

/// One line of a job's preview.
pub struct PreviewLine {
    /// The line as JSON, with `"job"`.
    pub json: serde_json::Value,
    /// The line for people.
    pub text: String,
    /// What it counts ([`Inspect::tally`]).
    pub tally: Vec<(String, i64)>,
}

/// A [`Job`] registered with the worker, with the labels its hops' metrics take beside its
/// reasons ([`Job::Reason`]) and the outcomes every hop can end with.
pub struct Registered<J> {
    job: PhantomData<J>,
    /// The outcomes of its own its hops can end with, beside [`HopOutcome::ALL`] and
    /// [`HopOutcome::Failed`].
    outcomes: &'static [HopOutcome],
}

impl<J> Default for Registered<J> {
    fn default() -> Self {
        Self::new()
    }
}

impl<J> Registered<J> {
    /// `J`, its hops ending with the outcomes every kind's can.
    pub const fn new() -> Self {
        Self {
            job: PhantomData,
            outcomes: &[],
        }
    }

    /// With hop outcomes of its own beside [`HopOutcome`]'s.
    pub const fn ending(self, outcomes: &'static [HopOutcome]) -> Self {
        Self { outcomes, ..self }
    }
}

impl<J: Job> Section for Registered<J> {
    fn job(&self) -> &'static str {
        J::NAME
    }

    fn section(&self) -> &'static str {
        J::SECTION
    }

    fn connections(&self) -> u32 {
        J::CONNECTIONS
    }

    fn beside(&self) -> bool {
        J::BESIDE
    }

    fn parse(
        &self,
        section: &serde_json::Value,
        paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<Arc<dyn AnySettings>> {
        let raw = check.section(J::SECTION, section)?;
        J::settings(raw, paths, check).map(|s| Arc::new(s) as Arc<dyn AnySettings>)
    }
}

impl<J: Inspect> Kind for Registered<J> {
    fn name(&self) -> &'static str {
        J::NAME
    }

    fn queue(&self) -> &'static str {
        job::queue(J::NAME)
    }

    fn labels(&self) -> KindLabels {
        let outcomes = HopOutcome::ALL.iter().map(|o| o.as_str());
        let own = self.outcomes.iter().map(|o| o.as_str());
        KindLabels {
            kind: J::NAME,
            reasons: <J::Reason as Reason>::ALL
                .iter()
                .map(|r| r.as_str())
                .collect(),
            tables: J::TABLES,
            outcomes: outcomes
                .chain(own)
                .chain([HopOutcome::Failed.as_str()])
                .collect(),
        }
    }

    fn scope(&self) -> Scope {
        J::SCOPE
    }

    fn cadence(&self, settings: &Settings) -> Cadence {
        J::cadence(settings.jobs.get::<J::Settings>(J::NAME))
    }

    fn subjects(&self) -> &'static [&'static str] {
        J::SUBJECTS
    }

    fn parse_id(&self, subject: &str, id: &str) -> Result<(), String> {
        J::parse_id(subject, id)
    }

    fn explain<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        settings: &'a Settings,
        now: DateTime<Utc>,
        subject: &'static str,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Explanation>>> {
        Box::pin(async move {
            let look = Look {
                conn,
                settings: settings.jobs.get::<J::Settings>(J::NAME),
                paths: &settings.paths,
                now,
            };
            Ok(J::explain(look, subject, id).await?)
        })
    }

    fn handle<'a>(
        &'a self,
        ctx: &'a JobContext,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<(), JobFailure>> {
        Box::pin(async move {
            let args: ArgsOf<J> = decode(job::queue(J::NAME), payload)?;
            hop::run::<J>(ctx, args).await
        })
    }

    fn push_first<'a>(
        &'a self,
        ctx: &'a JobContext,
        account: Option<Uuid>,
        slot: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<PushOutcome, QueueError>> {
        Box::pin(async move { hop::push::<J>(ctx, &ArgsOf::<J>::first(account, slot)).await })
    }

    fn due(&self, settings: &Settings, slot: DateTime<Utc>) -> Due {
        J::due(settings.jobs.get::<J::Settings>(J::NAME), slot)
    }

    fn first_hops(
        &self,
        accounts: &[Uuid],
        slot: DateTime<Utc>,
    ) -> Result<Vec<(String, Vec<u8>)>, serde_json::Error> {
        accounts
            .iter()
            .map(|account| {
                let args = ArgsOf::<J>::first(Some(*account), slot);
                Ok((hop::hop_key(&args.position()), serde_json::to_vec(&args)?))
            })
            .collect()
    }

    fn first_payload(&self, account: Option<Uuid>, slot: DateTime<Utc>) -> serde_json::Value {
        serde_json::to_value(ArgsOf::<J>::first(account, slot)).unwrap_or_default()
    }

    fn backlog<'a>(
        &'a self,
        pool: &'a PgPool,
        settings: &'a Settings,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Option<f64>>> {
        Box::pin(async move {
            let settings = settings.jobs.get::<J::Settings>(J::NAME);
            Ok(J::backlog_seconds(pool, settings, now).await?)
        })
    }

    fn preview<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        settings: &'a Settings,
        now: DateTime<Utc>,
        accounts: Option<&'a [Uuid]>,
    ) -> BoxFuture<'a, anyhow::Result<Vec<PreviewLine>>> {
        Box::pin(async move {
            let look = Look {
                conn,
                settings: settings.jobs.get::<J::Settings>(J::NAME),
                paths: &settings.paths,
                now,
            };
            let lines = J::preview(look, accounts).await?;
            Ok(lines
                .into_iter()
                .map(|line| {
                    let mut json = serde_json::json!({"job": J::NAME});
                    if let (Some(json), Ok(serde_json::Value::Object(fields))) =
                        (json.as_object_mut(), serde_json::to_value(&line))
                    {
                        json.extend(fields);
                    }
                    PreviewLine {
                        tally: J::tally(&line),
                        text: line.to_string(),
                        json,
                    }
                })
                .collect())
        })
    }
}

/// The settings sections of every kind, for [`Settings::load`].
pub fn sections() -> Vec<&'static dyn Section> {
    KINDS.iter().map(|kind| *kind as &dyn Section).collect()
}

/// The pool a worker running `concurrency` hops of the registered kinds needs (FL-6): what
/// configuration checks `database.max_connections` against.
pub fn pool_budget(concurrency: usize) -> PoolBudget {
    PoolBudget::new(concurrency, &sections())
}

/// Loads the configuration with every registered job's section.
///
/// # Errors
/// As [`Settings::load`].
pub fn load_settings(file: Option<&Path>) -> Result<Settings, ConfigError> {
    let settings = Settings::load(file, &sections())?;
    // A period's key lives in the queue as long as finished jobs do: a longer cadence could run
    // a period twice once the key is gone (FL-7).
    let problems: Vec<crate::config::Problem> = KINDS
        .iter()
        .filter_map(|kind| match kind.cadence(&settings) {
            Cadence::Every(period) if period > settings.queue.finished_job_retention => {
                Some(crate::config::Problem {
                    setting: format!("{}.cadence_minutes", kind.section()),
                    message: format!(
                        "expected at most queue.finished_job_retention_days ({} days) in \
                         minutes, got {}",
                        settings.queue.finished_job_retention.num_days(),
                        period.num_minutes()
                    ),
                })
            }
            _ => None,
        })
        .collect();
    if problems.is_empty() {
        Ok(settings)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// The kind whose queue is `queue`.
pub fn by_queue(queue: &str) -> Option<&'static dyn Kind> {
    KINDS.iter().copied().find(|kind| kind.queue() == queue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op2_every_kind_has_its_section_in_the_defaults_and_a_unique_name() {
        let settings = load_settings(None).expect("defaults load");
        let mut names = std::collections::BTreeSet::new();
        for kind in KINDS {
            assert!(
                crate::config::DEFAULT_TOML.contains(&format!("[{}]", kind.section())),
                "config/default.toml documents [{}]",
                kind.section()
            );
            assert!(
                names.insert(kind.name()),
                "{} registered twice",
                kind.name()
            );
            assert_eq!(kind.queue(), format!("sexton.{}", kind.name()));
            assert!(settings.jobs.contains(kind.name()));
        }
    }
}
