//! Short-lived records and files, with the edge cases of their jobs: handoffs (TTL-1), dream
//! preloads (TTL-2), working records and rolling cards, some pinned (TTL-3), conversation
//! events (TTL-4), brain memories that no job may touch, attachments whose bytes expire
//! (AT-1), and run traces — signed, badly signed, and a symlink escaping the traces root
//! (TR-3).

use std::path::Path;

use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use uuid::Uuid;

use super::{Generator, SeedError};

/// An agent, and its account.
#[derive(Clone, Copy)]
pub(super) struct AgentKeys {
    pub(super) account_id: Uuid,
    pub(super) agent_id: Uuid,
}

impl Generator<'_> {
    /// Two handoffs from the agent's old main session to its current one (TTL-1).
    pub(super) fn handoffs(&mut self, agent: AgentKeys, from: Uuid, to: Uuid) {
        for _ in 0..2 {
            let id = self.rng.id();
            let at = self.rng.days_ago(30);
            self.t
                .handoffs
                .row()
                .uuid(id)
                .uuid(agent.account_id)
                .uuid(agent.agent_id)
                .uuid(from)
                .uuid(to)
                .text(&json!({"summary": "continue the plan"}).to_string())
                .ts(at)
                .end();
        }
    }

    /// Two dream preloads (TTL-2).
    pub(super) fn dream_preloads(&mut self, agent: AgentKeys) {
        for _ in 0..2 {
            let id = self.rng.id();
            let at = self.rng.days_ago(14);
            self.t
                .dream_preloads
                .row()
                .uuid(id)
                .uuid(agent.account_id)
                .uuid(agent.agent_id)
                .text(&json!({"evidence": []}).to_string())
                .ts(at)
                .end();
        }
    }

    /// Four working records or rolling cards, some pinned (TTL-3).
    pub(super) fn working_records(&mut self, agent: AgentKeys) {
        for _ in 0..4 {
            let id = self.rng.id();
            let at = self.rng.days_ago(180);
            let kind = if self.rng.chance(0.5) {
                "record"
            } else {
                "card"
            };
            let pinned = self.rng.chance(0.25);
            self.t
                .working_records
                .row()
                .uuid(id)
                .uuid(agent.account_id)
                .uuid(agent.agent_id)
                .text(kind)
                .bool(pinned)
                .text(&json!({"note": "remember this"}).to_string())
                .ts(at)
                .end();
        }
    }

    /// Two revisions of a brain memory, the first sometimes deleted long ago: no job touches
    /// them (TTL-5).
    pub(super) fn brain_memories(&mut self, agent: AgentKeys) {
        for revision in 1..=2 {
            let id = self.rng.id();
            let deleted = (revision == 1 && self.rng.chance(0.3)).then(|| self.rng.days_ago(200));
            self.t
                .brain_memories
                .row()
                .uuid(id)
                .uuid(agent.account_id)
                .uuid(agent.agent_id)
                .int(revision)
                .text(&json!({"memory": "the user prefers short answers"}).to_string())
                .opt_ts(deleted)
                .end();
        }
    }

    /// A signed trace of each of `sessions` (the agent's current and old main session).
    pub(super) fn traces(&mut self, agent_id: Uuid, sessions: [Uuid; 2]) -> Result<(), SeedError> {
        for (n, session) in sessions.into_iter().enumerate() {
            let path = self
                .disk
                .paths
                .traces_root
                .join(agent_id.to_string())
                .join(format!("run-{n}.trace.jsonl"));
            let signature =
                json!({"format": "run-trace/1", "agent_id": agent_id, "session_id": session});
            let mtime = self.rng.days_ago(90);
            self.disk.text(
                &path,
                &format!("{signature}\n{{\"event\":\"step\"}}\n"),
                mtime,
            )?;
        }
        Ok(())
    }

    /// Traces no cleaner may delete (TR-3): one with a bad signature, and a symlink that
    /// escapes the traces root, pointing at `target`.
    pub(super) fn hostile_traces(
        &mut self,
        agent_id: Uuid,
        target: &Path,
    ) -> Result<(), SeedError> {
        let dir = self.disk.paths.traces_root.join(agent_id.to_string());
        self.disk.text(
            &dir.join("bad.trace.jsonl"),
            "{\"format\":\"something-else\"}\n",
            self.now - Duration::days(365),
        )?;
        self.disk.symlink(target, &dir.join("escape.trace.jsonl"))
    }

    /// An attachment of the account: its row and its file under the attachments root (AT-1).
    pub(super) fn attachment(&mut self, account_id: Uuid) -> Result<(), SeedError> {
        let id = self.rng.id();
        let created = self.rng.days_ago(60);
        let relative = format!("{account_id}/{id}.bin");
        let bytes: usize = self.rng.range(100..4000);
        self.t
            .attachments
            .row()
            .uuid(id)
            .uuid(account_id)
            .text(&relative)
            .int(bytes as i64)
            .ts(created)
            .end();
        let path = self.disk.paths.attachments_root.join(&relative);
        self.disk.filler(&path, bytes, created)
    }

    /// The event a run leaves in its conversation's replay log (TTL-4).
    pub(super) fn conversation_event(
        &mut self,
        conversation_id: Uuid,
        run_id: Uuid,
        finished: bool,
        at: DateTime<Utc>,
    ) {
        let preview = self.rng.words(8);
        let id = self.serials.next_event();
        self.t
            .conversation_events
            .row()
            .int(id)
            .uuid(conversation_id)
            .uuid(run_id)
            .text(if finished {
                "run.completed"
            } else {
                "run.started"
            })
            .text(&json!({"preview": preview}).to_string())
            .ts(at)
            .end();
    }
}
