//! Agents and their sessions, with the edge cases of session retention: the current and main
//! session and sometimes a default session (protected, SS-3); task sessions whose board task is
//! named flattened, nested or malformed, done, cancelled or still in progress, and subagent
//! sessions whose completion is flattened, nested or malformed (SS-4); sessions in every state,
//! `running` and `finalizing` included (SS-3); and each session's history, archives and archive
//! frames on disk (SS-6), with payloads that only json (not jsonb) keeps.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use super::records::AgentKeys;
use super::{Generator, SeedError};

/// A session to write.
struct Session {
    id: Uuid,
    kind: &'static str,
    state: &'static str,
    metadata: Value,
    last_activity: DateTime<Utc>,
}

/// An agent's sessions, by role.
struct AgentSessions {
    /// The current session, also the main one: active.
    current: Session,
    /// An earlier main session, idle for months.
    old_main: Session,
    tasks: Vec<Session>,
    subagents: Vec<Session>,
}

impl AgentSessions {
    /// Every session, in the order they are written.
    fn all(&self) -> impl Iterator<Item = &Session> {
        [&self.current, &self.old_main]
            .into_iter()
            .chain(&self.tasks)
            .chain(&self.subagents)
    }
}

impl Generator<'_> {
    /// The `index`-th agent with sessions of every kind and state, their history and archives
    /// (rows and frames on disk), and its short-lived records and traces.
    pub(super) fn agent(&mut self, index: u64) -> Result<(), SeedError> {
        let account = self.account_for(index);
        let agent = AgentKeys {
            account_id: self.accounts[account].id,
            agent_id: self.rng.id(),
        };
        self.accounts[account].agents.push(agent.agent_id);

        let sessions = self.sessions(agent.account_id);
        // SS-3: some agents' default session is their first task session.
        let default_session = self.rng.chance(0.3).then(|| sessions.tasks[0].id);
        self.t
            .agents
            .row()
            .uuid(agent.agent_id)
            .uuid(agent.account_id)
            .text(&format!("agent-{index}"))
            .uuid(sessions.current.id)
            .uuid(sessions.current.id)
            .opt_uuid(default_session)
            .end();
        for session in sessions.all() {
            self.session(agent, session)?;
        }

        let (current, old_main) = (sessions.current.id, sessions.old_main.id);
        self.handoffs(agent, old_main, current);
        self.dream_preloads(agent);
        self.working_records(agent);
        self.brain_memories(agent);
        self.traces(agent.agent_id, [current, old_main])
    }

    /// Two main sessions, three task sessions (with their board tasks) and three subagent
    /// sessions.
    fn sessions(&mut self, account_id: Uuid) -> AgentSessions {
        let current = self.rng.id();
        let old_main = self.rng.id();
        let current = Session {
            id: current,
            kind: "main",
            state: "active",
            metadata: json!({}),
            last_activity: self.rng.days_ago(3),
        };
        let old_main_days: i64 = self.rng.range(70..200);
        let old_main = Session {
            id: old_main,
            kind: "main",
            state: "idle",
            metadata: json!({}),
            last_activity: self.now - Duration::days(old_main_days),
        };
        let tasks = (0..3).map(|_| self.task_session(account_id)).collect();
        let subagents = (0..3).map(|_| self.subagent_session()).collect();
        AgentSessions {
            current,
            old_main,
            tasks,
            subagents,
        }
    }

    /// A task session and its board task, which is done, cancelled or still in progress and
    /// named in the metadata flattened, nested or malformed (SS-4).
    fn task_session(&mut self, account_id: Uuid) -> Session {
        let board_task = self.rng.id();
        let done = self.rng.chance(0.7);
        let terminal = done.then(|| self.rng.days_ago(120));
        let status = if !done {
            "in_progress"
        } else if self.rng.chance(0.8) {
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
        let shape: i32 = self.rng.range(0..5);
        let metadata = match shape {
            0 | 1 => json!({"board_task_id": board_task}),
            2 | 3 => json!({"board_task": {"id": board_task, "title": "ship it"}}),
            _ => json!({"board_task": "not-an-object"}),
        };
        let state = self.session_state();
        let last_activity = self.rng.days_ago(120);
        Session {
            id: self.rng.id(),
            kind: "task",
            state,
            metadata,
            last_activity,
        }
    }

    /// A subagent session whose completion is flattened, nested or malformed (SS-4).
    fn subagent_session(&mut self) -> Session {
        let completed = self.rng.days_ago(30);
        let shape: i32 = self.rng.range(0..5);
        let metadata = match shape {
            0 | 1 => json!({"completed_at": completed}),
            2 | 3 => json!({"completion": {"completed_at": completed, "status": "passed"}}),
            _ => json!({"completion": "yes"}),
        };
        let state = self.session_state();
        Session {
            id: self.rng.id(),
            kind: "subagent",
            state,
            metadata,
            last_activity: completed,
        }
    }

    /// Mostly finished, sometimes idle, running or finalizing (protected, SS-3).
    fn session_state(&mut self) -> &'static str {
        self.rng.pick(&[
            "completed",
            "completed",
            "completed",
            "failed",
            "cancelled",
            "idle",
            "running",
            "finalizing",
        ])
    }

    /// One session with its history entries and its archives (rows and frames on disk).
    fn session(&mut self, agent: AgentKeys, session: &Session) -> Result<(), SeedError> {
        self.t
            .sessions
            .row()
            .uuid(session.id)
            .uuid(agent.account_id)
            .uuid(agent.agent_id)
            .text(session.kind)
            .text(session.state)
            .text(&session.metadata.to_string())
            .ts(session.last_activity)
            .ts(session.last_activity - Duration::days(1))
            .end();
        let entries: i64 = self.rng.range(3..=8);
        for seq in 0..entries {
            // Payloads are json, not jsonb: escaped NULs and lone surrogates must survive.
            let text = if seq == 1 {
                "\\u0000 kept \\ud800".to_owned()
            } else {
                self.rng.words(12)
            };
            let id = self.serials.next_entry();
            self.t
                .conversation_entries
                .row()
                .int(id)
                .uuid(session.id)
                .text(&format!("e-{seq}"))
                .int(seq)
                .opt_text((seq % 2 == 0).then(|| format!("k-{seq}")).as_deref())
                .text(&format!("{{\"role\":\"user\",\"text\":\"{text}\"}}"))
                .ts(session.last_activity)
                .end();
        }
        let archives: i64 = self.rng.range(0..=2);
        for generation in 0..archives {
            self.archive(session, generation)?;
        }
        Ok(())
    }

    /// A compaction or reset archive of a session: its entries and its frame on disk.
    fn archive(&mut self, session: &Session, generation: i64) -> Result<(), SeedError> {
        let archive_id = self.rng.id();
        let kind = if self.rng.chance(0.7) {
            "compaction"
        } else {
            "reset"
        };
        self.t
            .conversation_archives
            .row()
            .uuid(archive_id)
            .uuid(session.id)
            .text(kind)
            .int(generation)
            .ts(session.last_activity)
            .end();
        let entries: i64 = self.rng.range(2..=4);
        for seq in 0..entries {
            let text = self.rng.words(10);
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
            .disk
            .paths
            .sessions_root
            .join(session.id.to_string())
            .join("archive")
            .join(format!("{kind}-{archive_id}.frame"));
        let bytes: usize = self.rng.range(256..4096);
        self.disk.filler(&frame, bytes, session.last_activity)
    }
}
