//! `sexton seed`: deterministic, realistic synthetic platform data over every table of SPEC §1,
//! with the files on disk that rows point at — for demos, tests and benchmarks.
//!
//! The same `--seed` and `--now` give the same rows and files. Volume grows linearly with the
//! scale: one unit is four accounts' worth of conversations (about 2,500 runs with ~40,000
//! execution-detail rows), agents, sessions and files. Rows go in with `COPY`, a batch of
//! conversations per transaction.

mod copy;

use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use self::copy::CopyTable;
use crate::config::PathSettings;

/// Conversations per scale unit.
const CONVERSATIONS_PER_SCALE: u64 = 400;
/// Conversations written per transaction.
const BATCH: u64 = 250;
/// Conversations per agent (agents, sessions and their records follow the conversation volume).
const CONVERSATIONS_PER_AGENT: u64 = 20;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SeedOptions {
    pub scale: u64,
    pub seed: u64,
    /// The moment the data is generated relative to: ages are measured back from it.
    pub now: DateTime<Utc>,
    pub show_progress: bool,
}

/// What was generated.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SeedReport {
    pub accounts: u64,
    pub conversations: u64,
    pub runs: u64,
    pub rows: u64,
    pub files: u64,
    pub file_bytes: u64,
}

/// Why seeding failed.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("writing {table}: {source}")]
    Copy {
        table: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("writing file {}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Accounts for a scale: four at scale 1, then one more for every five units.
pub fn account_count(scale: u64) -> u64 {
    4 + scale.saturating_sub(1) / 5
}

/// Generates and writes everything.
///
/// # Errors
/// [`SeedError`] naming the table or file that could not be written.
pub async fn seed(
    pool: &PgPool,
    paths: &PathSettings,
    options: &SeedOptions,
) -> Result<SeedReport, SeedError> {
    let mut generator = Generator::new(paths, options);
    let conversations = options.scale.max(1) * CONVERSATIONS_PER_SCALE;
    let progress = if options.show_progress {
        ProgressBar::new(conversations)
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template(
            "seeding {bar:40} {pos}/{len} conversations ({per_sec}, eta {eta})",
        )
        .expect("a valid progress template"),
    );

    let mut tx = pool.begin().await?;
    generator.accounts(account_count(options.scale));
    generator.flush(&mut tx).await?;
    tx.commit().await?;

    let mut done = 0;
    while done < conversations {
        let n = BATCH.min(conversations - done);
        for i in done..done + n {
            generator.conversation(i)?;
            if i % CONVERSATIONS_PER_AGENT == 0 {
                generator.agent(i / CONVERSATIONS_PER_AGENT)?;
            }
        }
        let mut tx = pool.begin().await?;
        generator.flush(&mut tx).await?;
        tx.commit().await?;
        done += n;
        progress.inc(n);
    }
    generator.account_files()?;
    progress.finish_and_clear();
    Ok(generator.report)
}

#[derive(Debug, Clone)]
struct Account {
    id: Uuid,
    /// Earlier conversations of this account: (id, turns, runs by position), to fork from.
    conversations: Vec<(Uuid, i64, Vec<Uuid>)>,
    agents: Vec<Uuid>,
}

struct Generator<'a> {
    rng: ChaCha8Rng,
    now: DateTime<Utc>,
    paths: &'a PathSettings,
    accounts: Vec<Account>,
    report: SeedReport,
    t: Tables,
}

/// One buffer per table, in foreign-key order.
struct Tables {
    accounts: CopyTable,
    session_retention_policies: CopyTable,
    conversations: CopyTable,
    turns: CopyTable,
    variants: CopyTable,
    fragments: CopyTable,
    follow_ups: CopyTable,
    runs: CopyTable,
    run_tasks: CopyTable,
    run_task_edges: CopyTable,
    tool_results: CopyTable,
    sealed_requests: CopyTable,
    reasoning_traces: CopyTable,
    invocation_attempts: CopyTable,
    output_files: CopyTable,
    settlement_receipts: CopyTable,
    delegations: CopyTable,
    history_requests: CopyTable,
    history_request_sources: CopyTable,
    usage_records: CopyTable,
    conversation_events: CopyTable,
    agents: CopyTable,
    sessions: CopyTable,
    board_tasks: CopyTable,
    conversation_entries: CopyTable,
    conversation_archives: CopyTable,
    conversation_archive_entries: CopyTable,
    handoffs: CopyTable,
    dream_preloads: CopyTable,
    working_records: CopyTable,
    brain_memories: CopyTable,
    attachments: CopyTable,
}

impl Tables {
    fn new() -> Self {
        Self {
            accounts: CopyTable::new(
                "accounts",
                "id, name, execution_details_retention_days, created_at",
            ),
            session_retention_policies: CopyTable::new(
                "session_retention_policies",
                "account_id, enabled, main_days, task_days, subagent_days",
            ),
            conversations: CopyTable::new(
                "conversations",
                "id, account_id, forked_from_conversation_id, forked_at_position, usage_summary, created_at",
            ),
            turns: CopyTable::new("turns", "id, conversation_id, position, created_at"),
            variants: CopyTable::new(
                "variants",
                "id, turn_id, prompt, requested_model, final_content, selected, created_at",
            ),
            fragments: CopyTable::new("fragments", "id, account_id, content, created_at"),
            follow_ups: CopyTable::new("follow_ups", "id, variant_id, position, landed_at, body"),
            runs: CopyTable::new(
                "runs",
                "id, account_id, conversation_id, variant_id, parent_run_id, kind, status, \
                 requested_model, terminal_model, delivered_at, completed_at, terminal_at, \
                 settled_at, created_at",
            ),
            run_tasks: CopyTable::new(
                "run_tasks",
                "id, run_id, parent_task_id, name, status, input, output",
            ),
            run_task_edges: CopyTable::new("run_task_edges", "run_id, from_task_id, to_task_id"),
            tool_results: CopyTable::new("tool_results", "id, run_id, task_id, tool_name, body"),
            sealed_requests: CopyTable::new(
                "sealed_requests",
                "id, run_id, provider, request, response, sealed_at",
            ),
            reasoning_traces: CopyTable::new("reasoning_traces", "id, run_id, content"),
            invocation_attempts: CopyTable::new(
                "invocation_attempts",
                "id, run_id, attempt, status, started_at, ended_at",
            ),
            output_files: CopyTable::new("output_files", "id, run_id, relative_path, bytes"),
            settlement_receipts: CopyTable::new(
                "settlement_receipts",
                "id, run_id, status, created_at, settled_at",
            ),
            delegations: CopyTable::new(
                "delegations",
                "id, parent_run_id, child_run_id, status, created_at",
            ),
            history_requests: CopyTable::new(
                "history_requests",
                "id, conversation_id, run_id, sealed_at, created_at",
            ),
            history_request_sources: CopyTable::new(
                "history_request_sources",
                "history_request_id, source_run_id",
            ),
            usage_records: CopyTable::new(
                "usage_records",
                "id, account_id, run_id, conversation_id, tokens, cost_micros, created_at",
            ),
            conversation_events: CopyTable::new(
                "conversation_events",
                "conversation_id, run_id, kind, payload, created_at",
            ),
            agents: CopyTable::new(
                "agents",
                "id, account_id, name, current_session_id, main_session_id, default_session_id",
            ),
            sessions: CopyTable::new(
                "sessions",
                "id, account_id, agent_id, kind, state, metadata, last_activity_at, created_at",
            ),
            board_tasks: CopyTable::new("board_tasks", "id, account_id, status, terminal_at"),
            conversation_entries: CopyTable::new(
                "conversation_entries",
                "session_id, entry_id, seq, idempotency_key, payload, created_at",
            ),
            conversation_archives: CopyTable::new(
                "conversation_archives",
                "id, session_id, kind, generation, created_at",
            ),
            conversation_archive_entries: CopyTable::new(
                "conversation_archive_entries",
                "archive_id, entry_id, seq, payload",
            ),
            handoffs: CopyTable::new(
                "handoffs",
                "id, account_id, agent_id, from_session_id, to_session_id, payload, created_at",
            ),
            dream_preloads: CopyTable::new(
                "dream_preloads",
                "id, account_id, agent_id, payload, created_at",
            ),
            working_records: CopyTable::new(
                "working_records",
                "id, account_id, agent_id, kind, pinned, body, updated_at",
            ),
            brain_memories: CopyTable::new(
                "brain_memories",
                "id, account_id, agent_id, revision, body, deleted_at",
            ),
            attachments: CopyTable::new(
                "attachments",
                "id, account_id, relative_path, bytes, created_at",
            ),
        }
    }

    fn in_order(&mut self) -> [&mut CopyTable; 32] {
        [
            &mut self.accounts,
            &mut self.session_retention_policies,
            &mut self.conversations,
            &mut self.turns,
            &mut self.variants,
            &mut self.fragments,
            &mut self.follow_ups,
            &mut self.runs,
            &mut self.run_tasks,
            &mut self.run_task_edges,
            &mut self.tool_results,
            &mut self.sealed_requests,
            &mut self.reasoning_traces,
            &mut self.invocation_attempts,
            &mut self.output_files,
            &mut self.settlement_receipts,
            &mut self.delegations,
            &mut self.history_requests,
            &mut self.history_request_sources,
            &mut self.usage_records,
            &mut self.conversation_events,
            &mut self.agents,
            &mut self.sessions,
            &mut self.board_tasks,
            &mut self.conversation_entries,
            &mut self.conversation_archives,
            &mut self.conversation_archive_entries,
            &mut self.handoffs,
            &mut self.dream_preloads,
            &mut self.working_records,
            &mut self.brain_memories,
            &mut self.attachments,
        ]
    }
}

const MODELS: &[&str] = &["atlas-large", "atlas-small", "quill-2", "quill-2-mini"];
const TOOLS: &[&str] = &["search", "read_file", "write_file", "run_shell", "browse"];
const WORDS: &[&str] = &[
    "the", "agent", "reads", "a", "file", "and", "writes", "summary", "of", "results", "with",
    "tool", "calls", "over", "history", "model", "answer", "question", "plan", "step",
];

/// Retention of the i-th account: the default 90 days, a stricter 30, or disabled.
fn retention_days(i: u64) -> Option<i64> {
    [Some(90), Some(30), None][(i % 3) as usize]
}

impl<'a> Generator<'a> {
    fn new(paths: &'a PathSettings, options: &SeedOptions) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(options.seed),
            now: options.now,
            paths,
            accounts: Vec::new(),
            report: SeedReport::default(),
            t: Tables::new(),
        }
    }

    fn id(&mut self) -> Uuid {
        uuid::Builder::from_random_bytes(self.rng.random()).into_uuid()
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    fn words(&mut self, n: usize) -> String {
        let mut s = String::with_capacity(n * 6);
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(WORDS.choose(&mut self.rng).expect("non-empty"));
        }
        s
    }

    fn days_ago(&mut self, max_days: i64) -> DateTime<Utc> {
        self.now - Duration::seconds(self.rng.random_range(0..max_days * 86_400))
    }

    fn accounts(&mut self, n: u64) {
        for i in 0..n {
            let id = self.id();
            let created = self.now - Duration::days(800);
            self.t
                .accounts
                .row()
                .uuid(id)
                .text(&format!("account-{i}"))
                .opt_int(retention_days(i))
                .ts(created)
                .end();
            // Session retention: enabled with fallback ages, enabled with custom ages, disabled,
            // or no policy at all.
            match i % 4 {
                0 => self
                    .t
                    .session_retention_policies
                    .row()
                    .uuid(id)
                    .bool(true)
                    .null()
                    .null()
                    .null()
                    .end(),
                1 => self
                    .t
                    .session_retention_policies
                    .row()
                    .uuid(id)
                    .bool(true)
                    .int(45)
                    .int(14)
                    .int(3)
                    .end(),
                2 => self
                    .t
                    .session_retention_policies
                    .row()
                    .uuid(id)
                    .bool(false)
                    .null()
                    .null()
                    .null()
                    .end(),
                _ => {}
            }
            self.accounts.push(Account {
                id,
                conversations: Vec::new(),
                agents: Vec::new(),
            });
        }
        self.report.accounts = n;
    }

    async fn flush(&mut self, conn: &mut sqlx::PgConnection) -> Result<(), SeedError> {
        for table in self.t.in_order() {
            let name = table.table();
            self.report.rows += table.flush(conn).await.map_err(|source| SeedError::Copy {
                table: name,
                source,
            })?;
        }
        Ok(())
    }

    fn write_file(
        &mut self,
        path: &Path,
        bytes: usize,
        mtime: DateTime<Utc>,
    ) -> Result<(), SeedError> {
        let fail = |source| SeedError::File {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        let body: Vec<u8> = (0..bytes).map(|i| b"sexton-seed\n"[i % 12]).collect();
        std::fs::write(path, body).map_err(fail)?;
        set_mtime(path, mtime).map_err(fail)?;
        self.report.files += 1;
        self.report.file_bytes += bytes as u64;
        Ok(())
    }

    /// One conversation with its turns, variants, runs, execution detail, blockers, usage,
    /// events, follow-ups and attachments.
    fn conversation(&mut self, index: u64) -> Result<(), SeedError> {
        let account_index = (index % self.accounts.len() as u64) as usize;
        let account_id = self.accounts[account_index].id;
        let conversation_id = self.id();
        let created = self.days_ago(400);
        self.report.conversations += 1;

        // A fork inherits the turns before its fork point from an earlier conversation.
        let fork = if self.chance(0.1) && !self.accounts[account_index].conversations.is_empty() {
            let earlier = &self.accounts[account_index].conversations;
            let pick = self.rng.random_range(0..earlier.len());
            let (source, source_turns, source_runs) = earlier[pick].clone();
            let at = self.rng.random_range(1..=source_turns);
            Some((source, at, source_runs[..at as usize].to_vec()))
        } else {
            None
        };
        let first_position = fork.as_ref().map_or(0, |f| f.1);
        let turns = self.rng.random_range(1..=8i64);
        let mut runs_by_position = fork.as_ref().map_or_else(Vec::new, |f| f.2.clone());
        let mut tokens_total = 0i64;
        let mut cost_total = 0i64;

        for position in first_position..first_position + turns {
            let turn_id = self.id();
            let turn_at = (created + Duration::hours(position - first_position)).min(self.now);
            self.t
                .turns
                .row()
                .uuid(turn_id)
                .uuid(conversation_id)
                .int(position)
                .ts(turn_at)
                .end();
            let variants = if self.chance(0.2) {
                self.rng.random_range(2..=3)
            } else {
                1
            };
            let mut selected_run = None;
            for v in 0..variants {
                let variant_id = self.id();
                let variant_at = turn_at + Duration::minutes(v * 7);
                let model = *MODELS.choose(&mut self.rng).expect("non-empty");
                let prompt = self.words(12);
                let run = self.run(RunSpec {
                    account_id,
                    conversation_id: Some(conversation_id),
                    variant_id: Some(variant_id),
                    parent_run_id: None,
                    created: variant_at,
                    model,
                })?;
                let selected = v == variants - 1;
                let final_content = run.completed.then(|| self.words(40));
                self.t
                    .variants
                    .row()
                    .uuid(variant_id)
                    .uuid(turn_id)
                    .text(&prompt)
                    .text(model)
                    .opt_text(final_content.as_deref())
                    .bool(selected)
                    .ts(variant_at)
                    .end();
                tokens_total += run.tokens;
                cost_total += run.cost_micros;
                if self.chance(0.3) {
                    self.follow_ups(account_id, variant_id, variant_at);
                }
                if selected {
                    selected_run = Some(run.id);
                }
                // A delegated child is its own owner, with its own detail.
                if run.completed && self.chance(0.08) {
                    let child = self.run(RunSpec {
                        account_id,
                        conversation_id: Some(conversation_id),
                        variant_id: None,
                        parent_run_id: Some(run.id),
                        created: variant_at + Duration::minutes(1),
                        model,
                    })?;
                    let status = if child.old && self.chance(0.15) {
                        "outstanding"
                    } else {
                        "returned"
                    };
                    let delegation_id = self.id();
                    self.t
                        .delegations
                        .row()
                        .uuid(delegation_id)
                        .uuid(run.id)
                        .uuid(child.id)
                        .text(status)
                        .ts(variant_at)
                        .end();
                    tokens_total += child.tokens;
                    cost_total += child.cost_micros;
                }
            }
            let run_id = selected_run.expect("every turn has a selected variant");
            // History assembly: the round reads the runs before it, inherited ones included.
            if !runs_by_position.is_empty() && self.chance(0.2) {
                let sealed = if self.chance(0.1) {
                    None
                } else {
                    Some(turn_at)
                };
                let request_id = self.id();
                self.t
                    .history_requests
                    .row()
                    .uuid(request_id)
                    .uuid(conversation_id)
                    .uuid(run_id)
                    .opt_ts(sealed)
                    .ts(turn_at)
                    .end();
                let from = runs_by_position.len().saturating_sub(4);
                for source in &runs_by_position[from..] {
                    self.t
                        .history_request_sources
                        .row()
                        .uuid(request_id)
                        .uuid(*source)
                        .end();
                }
            }
            runs_by_position.push(run_id);
        }

        self.t
            .conversations
            .row()
            .uuid(conversation_id)
            .uuid(account_id)
            .opt_uuid(fork.as_ref().map(|f| f.0))
            .opt_int(fork.as_ref().map(|f| f.1))
            .text(&json!({"tokens": tokens_total, "cost_micros": cost_total}).to_string())
            .ts(created)
            .end();
        self.accounts[account_index].conversations.push((
            conversation_id,
            first_position + turns,
            runs_by_position,
        ));

        // Standalone runs and inference requests live beside conversations and are never pruned.
        if self.chance(0.15) {
            let kind_created = self.days_ago(400);
            self.run(RunSpec {
                account_id,
                conversation_id: None,
                variant_id: None,
                parent_run_id: None,
                created: kind_created,
                model: "atlas-small",
            })?;
        }
        if self.chance(0.5) {
            self.attachment(account_id)?;
        }
        Ok(())
    }

    fn follow_ups(&mut self, account_id: Uuid, variant_id: Uuid, at: DateTime<Utc>) {
        for position in 0..self.rng.random_range(1..=3) {
            let mut fragments = Vec::new();
            for _ in 0..self.rng.random_range(1..=2) {
                let fragment_id = self.id();
                let content = self.words(20);
                self.t
                    .fragments
                    .row()
                    .uuid(fragment_id)
                    .uuid(account_id)
                    .text(&content)
                    .ts(at)
                    .end();
                let binding = if self.chance(0.5) {
                    json!({"upload_id": self.id(), "name": "notes.txt"})
                } else {
                    serde_json::Value::Null
                };
                fragments.push(json!({"fragment_id": fragment_id, "upload_binding": binding}));
            }
            let id = self.id();
            self.t
                .follow_ups
                .row()
                .uuid(id)
                .uuid(variant_id)
                .int(position)
                .ts(at + Duration::minutes(position + 1))
                .text(&json!({"fragments": fragments}).to_string())
                .end();
        }
    }

    /// One run with its execution detail, blockers, usage and events.
    fn run(&mut self, spec: RunSpec) -> Result<RunFacts, SeedError> {
        let id = self.id();
        self.report.runs += 1;
        let kind = match (spec.conversation_id, spec.parent_run_id) {
            (None, _) => {
                if self.chance(0.5) {
                    "standalone"
                } else {
                    "inference"
                }
            }
            (Some(_), Some(_)) => "conversation",
            (Some(_), None) => {
                if self.chance(0.15) {
                    "direct_reply"
                } else {
                    "conversation"
                }
            }
        };
        let in_flight = spec.created > self.now - Duration::hours(2) || self.chance(0.02);
        let status = if in_flight {
            if self.chance(0.5) {
                "pending"
            } else {
                "running"
            }
        } else {
            *[
                "completed",
                "completed",
                "completed",
                "completed",
                "failed",
                "cancelled",
            ]
            .choose(&mut self.rng)
            .expect("non-empty")
        };
        let finished = !in_flight;
        let mut completed_at =
            finished.then(|| spec.created + Duration::seconds(self.rng.random_range(30..1800)));
        let mut delivered_at =
            completed_at.map(|c| c - Duration::seconds(self.rng.random_range(1..30)));
        // Background work that finished long after the reply was delivered (EX-2).
        if finished && kind == "conversation" && self.chance(0.03) {
            delivered_at = Some(spec.created + Duration::seconds(20));
            completed_at = Some(self.days_ago(5).max(spec.created + Duration::minutes(1)));
        }
        let (terminal_at, settled_at) = if kind == "direct_reply" && finished {
            let terminal = completed_at;
            let settled = if self.chance(0.1) {
                None
            } else {
                terminal.map(|t| t + Duration::seconds(5))
            };
            (terminal, settled)
        } else {
            (completed_at.filter(|_| kind != "conversation"), None)
        };
        // Model recovery: the actual terminal model differs from the one asked for.
        let terminal_model = finished.then(|| {
            if self.chance(0.1) {
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
            .text(kind)
            .text(status)
            .text(spec.model)
            .opt_text(terminal_model)
            .opt_ts(delivered_at)
            .opt_ts(completed_at)
            .opt_ts(terminal_at)
            .opt_ts(settled_at)
            .ts(spec.created)
            .end();

        self.execution_detail(id, spec.account_id, spec.created, in_flight)?;

        let old = completed_at.is_some_and(|c| c < self.now - Duration::days(30));
        // Blockers of EX-5 on runs old enough to be pruned otherwise.
        if old && self.chance(0.02) {
            let attempt_id = self.id();
            let status = if self.chance(0.5) {
                "pending"
            } else {
                "running"
            };
            self.t
                .invocation_attempts
                .row()
                .uuid(attempt_id)
                .uuid(id)
                .int(9)
                .text(status)
                .ts(spec.created)
                .null()
                .end();
        }
        if finished {
            let pending = old && self.chance(0.02);
            let receipt_id = self.id();
            self.t
                .settlement_receipts
                .row()
                .uuid(receipt_id)
                .uuid(id)
                .text(if pending { "pending" } else { "settled" })
                .ts(spec.created)
                .opt_ts((!pending).then_some(spec.created + Duration::minutes(1)))
                .end();
        }

        let tokens = if finished {
            self.rng.random_range(200..20_000)
        } else {
            0
        };
        let cost_micros = tokens * 3;
        if finished {
            let usage_id = self.id();
            self.t
                .usage_records
                .row()
                .uuid(usage_id)
                .uuid(spec.account_id)
                .uuid(id)
                .opt_uuid(spec.conversation_id)
                .int(tokens)
                .int(cost_micros)
                .ts(completed_at.unwrap_or(spec.created))
                .end();
        }
        if let Some(conversation_id) = spec.conversation_id {
            let preview = self.words(8);
            self.t
                .conversation_events
                .row()
                .uuid(conversation_id)
                .uuid(id)
                .text(if finished {
                    "run.completed"
                } else {
                    "run.started"
                })
                .text(&json!({"preview": preview}).to_string())
                .ts(completed_at.unwrap_or(spec.created))
                .end();
        }
        Ok(RunFacts {
            id,
            completed: status == "completed",
            old,
            tokens,
            cost_micros,
        })
    }

    /// The seven detail tables of EX-3 for one run, and its output files on disk.
    fn execution_detail(
        &mut self,
        run_id: Uuid,
        account_id: Uuid,
        at: DateTime<Utc>,
        in_flight: bool,
    ) -> Result<(), SeedError> {
        let tasks: Vec<Uuid> = (0..self.rng.random_range(2..=5))
            .map(|_| self.id())
            .collect();
        for (i, task) in tasks.iter().enumerate() {
            let parent = (i > 0).then(|| tasks[0]);
            let input = json!({"instruction": self.words(10)}).to_string();
            let output = json!({"result": self.words(15)}).to_string();
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
        for _ in 0..self.rng.random_range(1..=3) {
            let id = self.id();
            let task = *tasks.choose(&mut self.rng).expect("non-empty");
            let tool = *TOOLS.choose(&mut self.rng).expect("non-empty");
            let body = self.words(60);
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
        for _ in 0..self.rng.random_range(1..=2) {
            let id = self.id();
            let request =
                json!({"messages": [{"role": "user", "content": self.words(25)}]}).to_string();
            let response = json!({"content": self.words(25)}).to_string();
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
        let id = self.id();
        let reasoning = self.words(50);
        self.t
            .reasoning_traces
            .row()
            .uuid(id)
            .uuid(run_id)
            .text(&reasoning)
            .end();
        let attempts = self.rng.random_range(1..=2);
        for attempt in 1..=attempts {
            let id = self.id();
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
        if self.chance(0.25) {
            for n in 0..self.rng.random_range(1..=2) {
                let id = self.id();
                let relative = format!("{account_id}/{run_id}/out-{n}.bin");
                let bytes = self.rng.random_range(64..2048);
                self.t
                    .output_files
                    .row()
                    .uuid(id)
                    .uuid(run_id)
                    .text(&relative)
                    .int(bytes as i64)
                    .end();
                let path = self.paths.output_root.join(&relative);
                self.write_file(&path, bytes, at)?;
            }
        }
        Ok(())
    }
    fn attachment(&mut self, account_id: Uuid) -> Result<(), SeedError> {
        let id = self.id();
        let created = self.days_ago(60);
        let relative = format!("{account_id}/{id}.bin");
        let bytes = self.rng.random_range(100..4000);
        self.t
            .attachments
            .row()
            .uuid(id)
            .uuid(account_id)
            .text(&relative)
            .int(bytes as i64)
            .ts(created)
            .end();
        let path = self.paths.attachments_root.join(&relative);
        self.write_file(&path, bytes, created)
    }

    /// One agent with sessions of every kind and state, their history and archives (rows and
    /// frames on disk), handoffs, dream preloads, working records, brain memories and traces.
    fn agent(&mut self, index: u64) -> Result<(), SeedError> {
        let account_index = (index % self.accounts.len() as u64) as usize;
        let account_id = self.accounts[account_index].id;
        let agent_id = self.id();
        self.accounts[account_index].agents.push(agent_id);

        let current = self.id();
        let old_main = self.id();
        let mut sessions = vec![(current, "main", "active", json!({}), self.days_ago(3))];
        let old_main_at = self.now - Duration::days(self.rng.random_range(70..200));
        sessions.push((old_main, "main", "idle", json!({}), old_main_at));
        for _ in 0..3 {
            let board_task = self.id();
            let done = self.chance(0.7);
            let terminal = done.then(|| self.days_ago(120));
            let status = if !done {
                "in_progress"
            } else if self.chance(0.8) {
                "done"
            } else {
                "cancelled"
            };
            self.t
                .board_tasks
                .row()
                .uuid(board_task)
                .uuid(account_id)
                .text(status)
                .opt_ts(terminal)
                .end();
            let metadata = match self.rng.random_range(0..5) {
                0 | 1 => json!({"board_task_id": board_task}),
                2 | 3 => json!({"board_task": {"id": board_task, "title": "ship it"}}),
                _ => json!({"board_task": "not-an-object"}),
            };
            let state = self.session_state();
            let at = self.days_ago(120);
            sessions.push((self.id(), "task", state, metadata, at));
        }
        for _ in 0..3 {
            let completed = self.days_ago(30);
            let metadata = match self.rng.random_range(0..5) {
                0 | 1 => json!({"completed_at": completed}),
                2 | 3 => json!({"completion": {"completed_at": completed, "status": "passed"}}),
                _ => json!({"completion": "yes"}),
            };
            let state = self.session_state();
            sessions.push((self.id(), "subagent", state, metadata, completed));
        }
        let default_session = self.chance(0.3).then(|| sessions[2].0);
        self.t
            .agents
            .row()
            .uuid(agent_id)
            .uuid(account_id)
            .text(&format!("agent-{index}"))
            .uuid(current)
            .uuid(current)
            .opt_uuid(default_session)
            .end();

        for (session_id, kind, state, metadata, last_activity) in &sessions {
            self.t
                .sessions
                .row()
                .uuid(*session_id)
                .uuid(account_id)
                .uuid(agent_id)
                .text(kind)
                .text(state)
                .text(&metadata.to_string())
                .ts(*last_activity)
                .ts(*last_activity - Duration::days(1))
                .end();
            for seq in 0..self.rng.random_range(3..=8) {
                // Payloads are json, not jsonb: escaped NULs and lone surrogates must survive.
                let text = if seq == 1 {
                    "\\u0000 kept \\ud800".to_owned()
                } else {
                    self.words(12)
                };
                self.t
                    .conversation_entries
                    .row()
                    .uuid(*session_id)
                    .text(&format!("e-{seq}"))
                    .int(seq)
                    .opt_text((seq % 2 == 0).then(|| format!("k-{seq}")).as_deref())
                    .text(&format!("{{\"role\":\"user\",\"text\":\"{text}\"}}"))
                    .ts(*last_activity)
                    .end();
            }
            for generation in 0..self.rng.random_range(0..=2) {
                let archive_id = self.id();
                let archive_kind = if self.chance(0.7) {
                    "compaction"
                } else {
                    "reset"
                };
                self.t
                    .conversation_archives
                    .row()
                    .uuid(archive_id)
                    .uuid(*session_id)
                    .text(archive_kind)
                    .int(generation)
                    .ts(*last_activity)
                    .end();
                for seq in 0..self.rng.random_range(2..=4) {
                    let text = self.words(10);
                    self.t
                        .conversation_archive_entries
                        .row()
                        .uuid(archive_id)
                        .text(&format!("a-{seq}"))
                        .int(seq)
                        .text(&json!({"role": "assistant", "text": text}).to_string())
                        .end();
                }
                let frame = self
                    .paths
                    .sessions_root
                    .join(session_id.to_string())
                    .join("archive")
                    .join(format!("{archive_kind}-{archive_id}.frame"));
                let bytes = self.rng.random_range(256..4096);
                self.write_file(&frame, bytes, *last_activity)?;
            }
        }

        for _ in 0..2 {
            let id = self.id();
            let at = self.days_ago(30);
            self.t
                .handoffs
                .row()
                .uuid(id)
                .uuid(account_id)
                .uuid(agent_id)
                .uuid(old_main)
                .uuid(current)
                .text(&json!({"summary": "continue the plan"}).to_string())
                .ts(at)
                .end();
        }
        for _ in 0..2 {
            let id = self.id();
            let at = self.days_ago(14);
            self.t
                .dream_preloads
                .row()
                .uuid(id)
                .uuid(account_id)
                .uuid(agent_id)
                .text(&json!({"evidence": []}).to_string())
                .ts(at)
                .end();
        }
        for _ in 0..4 {
            let id = self.id();
            let at = self.days_ago(180);
            let kind = if self.chance(0.5) { "record" } else { "card" };
            let pinned = self.chance(0.25);
            self.t
                .working_records
                .row()
                .uuid(id)
                .uuid(account_id)
                .uuid(agent_id)
                .text(kind)
                .bool(pinned)
                .text(&json!({"note": "remember this"}).to_string())
                .ts(at)
                .end();
        }
        for revision in 1..=2 {
            let id = self.id();
            let deleted = (revision == 1 && self.chance(0.3)).then(|| self.days_ago(200));
            self.t
                .brain_memories
                .row()
                .uuid(id)
                .uuid(account_id)
                .uuid(agent_id)
                .int(revision)
                .text(&json!({"memory": "the user prefers short answers"}).to_string())
                .opt_ts(deleted)
                .end();
        }
        for (n, session) in [current, old_main].into_iter().enumerate() {
            let path = self
                .paths
                .traces_root
                .join(agent_id.to_string())
                .join(format!("run-{n}.trace.jsonl"));
            let signature =
                json!({"format": "run-trace/1", "agent_id": agent_id, "session_id": session});
            let mtime = self.days_ago(90);
            self.write_text(
                &path,
                &format!("{signature}\n{{\"event\":\"step\"}}\n"),
                mtime,
            )?;
        }
        Ok(())
    }

    fn session_state(&mut self) -> &'static str {
        [
            "completed",
            "completed",
            "completed",
            "failed",
            "cancelled",
            "idle",
            "running",
            "finalizing",
        ]
        .choose(&mut self.rng)
        .expect("non-empty")
    }

    /// Per account: a generated artifact (no TTL), a trace with a bad signature, and a trace
    /// symlink that escapes the traces root (pointing at the artifact).
    fn account_files(&mut self) -> Result<(), SeedError> {
        for account in self.accounts.clone() {
            let artifact = self
                .paths
                .artifacts_root
                .join(account.id.to_string())
                .join("report.bin");
            self.write_file(&artifact, 512, self.now - Duration::days(365))?;
            let Some(agent) = account.agents.first() else {
                continue;
            };
            let dir = self.paths.traces_root.join(agent.to_string());
            let old = self.now - Duration::days(365);
            self.write_text(
                &dir.join("bad.trace.jsonl"),
                "{\"format\":\"something-else\"}\n",
                old,
            )?;
            let link = dir.join("escape.trace.jsonl");
            let fail = |source| SeedError::File {
                path: link.clone(),
                source,
            };
            match std::fs::remove_file(&link) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
                _ => {}
            }
            std::os::unix::fs::symlink(&artifact, &link).map_err(fail)?;
        }
        Ok(())
    }

    fn write_text(
        &mut self,
        path: &Path,
        text: &str,
        mtime: DateTime<Utc>,
    ) -> Result<(), SeedError> {
        let fail = |source| SeedError::File {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        std::fs::write(path, text).map_err(fail)?;
        set_mtime(path, mtime).map_err(fail)?;
        self.report.files += 1;
        self.report.file_bytes += text.len() as u64;
        Ok(())
    }
}

struct RunSpec {
    account_id: Uuid,
    conversation_id: Option<Uuid>,
    variant_id: Option<Uuid>,
    parent_run_id: Option<Uuid>,
    created: DateTime<Utc>,
    model: &'static str,
}

struct RunFacts {
    id: Uuid,
    completed: bool,
    old: bool,
    tokens: i64,
    cost_micros: i64,
}

/// Sets a file's modification time, so that age-based jobs see it as old.
fn set_mtime(path: &Path, at: DateTime<Utc>) -> std::io::Result<()> {
    let file = std::fs::File::options().write(true).open(path)?;
    file.set_modified(at.into())
}
