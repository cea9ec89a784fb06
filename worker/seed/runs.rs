//! Runs and their execution detail, with the edge cases of execution retention: every kind
//! (standalone and inference runs are never touched), runs still in flight, background work
//! that completed long after delivery and unsettled direct replies (EX-2), the seven detail
//! tables and output files on disk (EX-3), a model recovered to another terminal model, and
//! what holds an old run back — a pending attempt or an unsettled receipt (EX-5) — beside the
//! usage and events that stay (EX-4).

use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use uuid::Uuid;

use super::random::TOOLS;
use super::{Generator, SeedError};

/// The run to generate: who owns it and what it hangs off.
pub(super) struct RunSpec {
    pub(super) account_id: Uuid,
    /// None for standalone runs and inference requests.
    pub(super) conversation_id: Option<Uuid>,
    pub(super) variant_id: Option<Uuid>,
    /// Set for a delegated child.
    pub(super) parent_run_id: Option<Uuid>,
    pub(super) created: DateTime<Utc>,
    pub(super) model: &'static str,
}

/// What callers need to know of a generated run.
pub(super) struct RunFacts {
    pub(super) id: Uuid,
    /// It finished with status `completed`.
    pub(super) completed: bool,
    /// It completed over 30 days before now: old enough to be pruned but for its blockers.
    pub(super) old: bool,
    pub(super) tokens: i64,
    pub(super) cost_micros: i64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RunKind {
    Conversation,
    DirectReply,
    Standalone,
    Inference,
}

impl RunKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Conversation => "conversation",
            Self::DirectReply => "direct_reply",
            Self::Standalone => "standalone",
            Self::Inference => "inference",
        }
    }
}

/// The moments a finished run reached (all None while it is in flight).
struct RunTimes {
    delivered: Option<DateTime<Utc>>,
    completed: Option<DateTime<Utc>>,
    terminal: Option<DateTime<Utc>>,
    settled: Option<DateTime<Utc>>,
}

impl Generator<'_> {
    /// A standalone run or inference request: beside conversations, never pruned (EX-2).
    pub(super) fn standalone_run(&mut self, account_id: Uuid) -> Result<(), SeedError> {
        let created = self.rng.days_ago(400);
        self.run(RunSpec {
            account_id,
            conversation_id: None,
            variant_id: None,
            parent_run_id: None,
            created,
            model: "atlas-small",
        })?;
        Ok(())
    }

    /// One run with its execution detail, blockers, usage and events.
    pub(super) fn run(&mut self, spec: RunSpec) -> Result<RunFacts, SeedError> {
        let id = self.rng.id();
        self.report.runs += 1;
        let kind = self.run_kind(&spec);
        let in_flight = spec.created > self.now - Duration::hours(2) || self.rng.chance(0.02);
        let status = self.run_status(in_flight);
        let finished = !in_flight;
        let times = self.run_times(&spec, kind, finished);
        // Model recovery: the actual terminal model differs from the one asked for.
        let terminal_model = finished.then(|| {
            if self.rng.chance(0.1) {
                "atlas-small"
            } else {
                spec.model
            }
        });
        self.t
            .runs
            .row()
            .uuid(id)
            .uuid(spec.account_id)
            .opt_uuid(spec.conversation_id)
            .opt_uuid(spec.variant_id)
            .opt_uuid(spec.parent_run_id)
            .text(kind.as_str())
            .text(status)
            .text(spec.model)
            .opt_text(terminal_model)
            .opt_ts(times.delivered)
            .opt_ts(times.completed)
            .opt_ts(times.terminal)
            .opt_ts(times.settled)
            .ts(spec.created)
            .end();

        self.execution_detail(id, spec.account_id, spec.created, in_flight)?;

        let old = times
            .completed
            .is_some_and(|c| c < self.now - Duration::days(30));
        self.blockers(id, spec.created, old, finished);

        let tokens = if finished {
            self.rng.range(200..20_000)
        } else {
            0
        };
        let cost_micros = tokens * 3;
        let at = times.completed.unwrap_or(spec.created);
        if finished {
            let usage_id = self.rng.id();
            self.t
                .usage_records
                .row()
                .uuid(usage_id)
                .uuid(spec.account_id)
                .uuid(id)
                .opt_uuid(spec.conversation_id)
                .int(tokens)
                .int(cost_micros)
                .ts(at)
                .end();
        }
        if let Some(conversation_id) = spec.conversation_id {
            self.conversation_event(conversation_id, id, finished, at);
        }
        Ok(RunFacts {
            id,
            completed: status == "completed",
            old,
            tokens,
            cost_micros,
        })
    }

    /// Without a conversation: standalone or inference. A delegated child: a conversation run.
    /// Otherwise a conversation run, or now and then a direct reply.
    fn run_kind(&mut self, spec: &RunSpec) -> RunKind {
        match (spec.conversation_id, spec.parent_run_id) {
            (None, _) => {
                if self.rng.chance(0.5) {
                    RunKind::Standalone
                } else {
                    RunKind::Inference
                }
            }
            (Some(_), Some(_)) => RunKind::Conversation,
            (Some(_), None) => {
                if self.rng.chance(0.15) {
                    RunKind::DirectReply
                } else {
                    RunKind::Conversation
                }
            }
        }
    }

    fn run_status(&mut self, in_flight: bool) -> &'static str {
        if in_flight {
            if self.rng.chance(0.5) {
                "pending"
            } else {
                "running"
            }
        } else {
            self.rng.pick(&[
                "completed",
                "completed",
                "completed",
                "completed",
                "failed",
                "cancelled",
            ])
        }
    }

    fn run_times(&mut self, spec: &RunSpec, kind: RunKind, finished: bool) -> RunTimes {
        let mut completed = finished.then(|| {
            let seconds: i64 = self.rng.range(30..1800);
            spec.created + Duration::seconds(seconds)
        });
        let mut delivered = completed.map(|c| {
            let seconds: i64 = self.rng.range(1..30);
            c - Duration::seconds(seconds)
        });
        // Background work that finished long after the reply was delivered (EX-2).
        if finished && kind == RunKind::Conversation && self.rng.chance(0.03) {
            delivered = Some(spec.created + Duration::seconds(20));
            completed = Some(
                self.rng
                    .days_ago(5)
                    .max(spec.created + Duration::minutes(1)),
            );
        }
        // A direct reply ages from `terminal_at` once settled; some are not settled yet.
        let (terminal, settled) = if kind == RunKind::DirectReply && finished {
            let settled = if self.rng.chance(0.1) {
                None
            } else {
                completed.map(|t| t + Duration::seconds(5))
            };
            (completed, settled)
        } else {
            (completed.filter(|_| kind != RunKind::Conversation), None)
        };
        RunTimes {
            delivered,
            completed,
            terminal,
            settled,
        }
    }

    /// What holds an old run back (EX-5), now and then: a pending or running attempt, and a
    /// pending settlement receipt (every finished run has a receipt).
    fn blockers(&mut self, run_id: Uuid, created: DateTime<Utc>, old: bool, finished: bool) {
        if old && self.rng.chance(0.02) {
            let attempt_id = self.rng.id();
            let status = if self.rng.chance(0.5) {
                "pending"
            } else {
                "running"
            };
            self.t
                .invocation_attempts
                .row()
                .uuid(attempt_id)
                .uuid(run_id)
                .int(9)
                .text(status)
                .ts(created)
                .null()
                .end();
        }
        if finished {
            let pending = old && self.rng.chance(0.02);
            let receipt_id = self.rng.id();
            self.t
                .settlement_receipts
                .row()
                .uuid(receipt_id)
                .uuid(run_id)
                .text(if pending { "pending" } else { "settled" })
                .ts(created)
                .opt_ts((!pending).then_some(created + Duration::minutes(1)))
                .end();
        }
    }

    /// The seven detail tables of EX-3 for one run, and its output files on disk.
    fn execution_detail(
        &mut self,
        run_id: Uuid,
        account_id: Uuid,
        at: DateTime<Utc>,
        in_flight: bool,
    ) -> Result<(), SeedError> {
        let tasks = self.task_graph(run_id, in_flight);
        let results: i32 = self.rng.range(1..=3);
        for _ in 0..results {
            let id = self.rng.id();
            let task = self.rng.pick(&tasks);
            let tool = self.rng.pick(TOOLS);
            let body = self.rng.words(60);
            self.t
                .tool_results
                .row()
                .uuid(id)
                .uuid(run_id)
                .uuid(task)
                .text(tool)
                .text(&body)
                .end();
        }
        let requests: i32 = self.rng.range(1..=2);
        for _ in 0..requests {
            let id = self.rng.id();
            let request =
                json!({"messages": [{"role": "user", "content": self.rng.words(25)}]}).to_string();
            let response = json!({"content": self.rng.words(25)}).to_string();
            self.t
                .sealed_requests
                .row()
                .uuid(id)
                .uuid(run_id)
                .text("provider-a")
                .text(&request)
                .opt_text((!in_flight).then_some(response.as_str()))
                .ts(at)
                .end();
        }
        let id = self.rng.id();
        let reasoning = self.rng.words(50);
        self.t
            .reasoning_traces
            .row()
            .uuid(id)
            .uuid(run_id)
            .text(&reasoning)
            .end();
        self.attempts(run_id, at, in_flight);
        if self.rng.chance(0.25) {
            self.output_files(run_id, account_id, at)?;
        }
        Ok(())
    }

    /// A root task and its children, with an edge from the root to each; returns the tasks.
    fn task_graph(&mut self, run_id: Uuid, in_flight: bool) -> Vec<Uuid> {
        let count: i32 = self.rng.range(2..=5);
        let tasks: Vec<Uuid> = (0..count).map(|_| self.rng.id()).collect();
        for (i, task) in tasks.iter().enumerate() {
            let parent = (i > 0).then(|| tasks[0]);
            let input = json!({"instruction": self.rng.words(10)}).to_string();
            let output = json!({"result": self.rng.words(15)}).to_string();
            self.t
                .run_tasks
                .row()
                .uuid(*task)
                .uuid(run_id)
                .opt_uuid(parent)
                .text(&format!("step-{i}"))
                .text(if in_flight { "running" } else { "completed" })
                .text(&input)
                .text(&output)
                .end();
            if let Some(parent) = parent {
                self.t
                    .run_task_edges
                    .row()
                    .uuid(run_id)
                    .uuid(parent)
                    .uuid(*task)
                    .end();
            }
        }
        tasks
    }

    /// One or two attempts: earlier ones failed, the last one succeeded or is still running.
    fn attempts(&mut self, run_id: Uuid, at: DateTime<Utc>, in_flight: bool) {
        let attempts: i64 = self.rng.range(1..=2);
        for attempt in 1..=attempts {
            let id = self.rng.id();
            let status = match (in_flight, attempt == attempts) {
                (true, true) => "running",
                (_, false) => "failed",
                (false, true) => "succeeded",
            };
            self.t
                .invocation_attempts
                .row()
                .uuid(id)
                .uuid(run_id)
                .int(attempt)
                .text(status)
                .ts(at)
                .opt_ts((status != "running").then_some(at + Duration::seconds(10)))
                .end();
        }
    }

    /// Output files of a run: rows and the files under the output root.
    fn output_files(
        &mut self,
        run_id: Uuid,
        account_id: Uuid,
        at: DateTime<Utc>,
    ) -> Result<(), SeedError> {
        let count: i32 = self.rng.range(1..=2);
        for n in 0..count {
            let id = self.rng.id();
            let relative = format!("{account_id}/{run_id}/out-{n}.bin");
            let bytes: usize = self.rng.range(64..2048);
            self.t
                .output_files
                .row()
                .uuid(id)
                .uuid(run_id)
                .text(&relative)
                .int(bytes as i64)
                .end();
            let path = self.disk.paths.output_root.join(&relative);
            self.disk.filler(&path, bytes, at)?;
        }
        Ok(())
    }
}
