//! Conversations: forks that inherit the turns before their fork point, turns with regenerated
//! variants (each variant's run ages on its own, EX-2), delegated children with their
//! delegations (EX-5), history requests whose sources include inherited runs (EX-5), and
//! follow-ups with their fragments (kept by EX-4). Per conversation, sometimes a standalone run
//! and an attachment beside it.

use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use uuid::Uuid;

use super::accounts::EarlierConversation;
use super::random::MODELS;
use super::runs::{RunFacts, RunSpec};
use super::{Generator, SeedError};

/// A conversation being generated, and its owner.
#[derive(Clone, Copy)]
struct ConversationKeys {
    account_id: Uuid,
    conversation_id: Uuid,
}

/// Where a fork comes from.
struct Fork {
    source: Uuid,
    /// Turns before this position are inherited from the source.
    at_position: i64,
    /// The source's selected runs of those turns.
    inherited_runs: Vec<Uuid>,
}

/// Tokens and cost of a conversation's runs, for its `usage_summary`.
#[derive(Default)]
struct Usage {
    tokens: i64,
    cost_micros: i64,
}

impl Usage {
    fn add(&mut self, run: &RunFacts) {
        self.tokens += run.tokens;
        self.cost_micros += run.cost_micros;
    }
}

impl Generator<'_> {
    /// The `index`-th conversation with its turns, variants, runs and their records; sometimes
    /// a standalone run and an attachment of its account.
    pub(super) fn conversation(&mut self, index: u64) -> Result<(), SeedError> {
        let account = self.account_for(index);
        let keys = ConversationKeys {
            account_id: self.accounts[account].id,
            conversation_id: self.rng.id(),
        };
        let created = self.rng.days_ago(400);
        self.report.conversations += 1;

        let fork = self.fork(account);
        let first_position = fork.as_ref().map_or(0, |f| f.at_position);
        let turns = self.rng.range(1..=8i64);
        let mut runs_by_position = fork
            .as_ref()
            .map_or_else(Vec::new, |f| f.inherited_runs.clone());
        let mut usage = Usage::default();
        for position in first_position..first_position + turns {
            let turn_at = (created + Duration::hours(position - first_position)).min(self.now);
            let run_id = self.turn(keys, position, turn_at, &mut usage)?;
            self.history_request(keys.conversation_id, run_id, turn_at, &runs_by_position);
            runs_by_position.push(run_id);
        }

        self.t
            .conversations
            .row()
            .uuid(keys.conversation_id)
            .uuid(keys.account_id)
            .opt_uuid(fork.as_ref().map(|f| f.source))
            .opt_int(fork.as_ref().map(|f| f.at_position))
            .text(&json!({"tokens": usage.tokens, "cost_micros": usage.cost_micros}).to_string())
            .ts(created)
            .end();
        self.accounts[account]
            .conversations
            .push(EarlierConversation {
                id: keys.conversation_id,
                runs_by_position,
            });

        if self.rng.chance(0.15) {
            self.standalone_run(keys.account_id)?;
        }
        if self.rng.chance(0.5) {
            self.attachment(keys.account_id)?;
        }
        Ok(())
    }

    /// Sometimes, a fork of an earlier conversation of the account at a random turn.
    fn fork(&mut self, account: usize) -> Option<Fork> {
        if !self.rng.chance(0.1) {
            return None;
        }
        let earlier = &self.accounts[account].conversations;
        if earlier.is_empty() {
            return None;
        }
        let source = &earlier[self.rng.range(0..earlier.len())];
        let at_position = self.rng.range(1..=source.turns());
        Some(Fork {
            source: source.id,
            at_position,
            inherited_runs: source.runs_by_position[..at_position as usize].to_vec(),
        })
    }

    /// One turn and its variants, the last one selected; returns the selected variant's run.
    fn turn(
        &mut self,
        keys: ConversationKeys,
        position: i64,
        at: DateTime<Utc>,
        usage: &mut Usage,
    ) -> Result<Uuid, SeedError> {
        let turn_id = self.rng.id();
        self.t
            .turns
            .row()
            .uuid(turn_id)
            .uuid(keys.conversation_id)
            .int(position)
            .ts(at)
            .end();
        // Regenerated candidates: each variant's run ages on its own (EX-2).
        let variants: i64 = if self.rng.chance(0.2) {
            self.rng.range(2..=3)
        } else {
            1
        };
        let mut selected_run = None;
        for v in 0..variants {
            let selected = v == variants - 1;
            let run = self.variant(
                keys,
                turn_id,
                at + Duration::minutes(v * 7),
                selected,
                usage,
            )?;
            if selected {
                selected_run = Some(run);
            }
        }
        Ok(selected_run.expect("every turn has a selected variant"))
    }

    /// One variant with its run, follow-ups and perhaps a delegated child; returns its run.
    fn variant(
        &mut self,
        keys: ConversationKeys,
        turn_id: Uuid,
        at: DateTime<Utc>,
        selected: bool,
        usage: &mut Usage,
    ) -> Result<Uuid, SeedError> {
        let variant_id = self.rng.id();
        let model = self.rng.pick(MODELS);
        let prompt = self.rng.words(12);
        let run = self.run(RunSpec {
            account_id: keys.account_id,
            conversation_id: Some(keys.conversation_id),
            variant_id: Some(variant_id),
            parent_run_id: None,
            created: at,
            model,
        })?;
        let final_content = run.completed.then(|| self.rng.words(40));
        self.t
            .variants
            .row()
            .uuid(variant_id)
            .uuid(turn_id)
            .text(&prompt)
            .text(model)
            .opt_text(final_content.as_deref())
            .bool(selected)
            .ts(at)
            .end();
        usage.add(&run);
        if self.rng.chance(0.3) {
            self.follow_ups(keys.account_id, variant_id, at);
        }
        if run.completed && self.rng.chance(0.08) {
            let child = self.delegated_child(keys, &run, at, model)?;
            usage.add(&child);
        }
        Ok(run.id)
    }

    /// A delegated child of `parent`: its own owner with its own detail (EX-2), and the
    /// delegation, sometimes still outstanding on an old child (EX-5).
    fn delegated_child(
        &mut self,
        keys: ConversationKeys,
        parent: &RunFacts,
        at: DateTime<Utc>,
        model: &'static str,
    ) -> Result<RunFacts, SeedError> {
        let child = self.run(RunSpec {
            account_id: keys.account_id,
            conversation_id: Some(keys.conversation_id),
            variant_id: None,
            parent_run_id: Some(parent.id),
            created: at + Duration::minutes(1),
            model,
        })?;
        let status = if child.old && self.rng.chance(0.15) {
            "outstanding"
        } else {
            "returned"
        };
        let delegation_id = self.rng.id();
        self.t
            .delegations
            .row()
            .uuid(delegation_id)
            .uuid(parent.id)
            .uuid(child.id)
            .text(status)
            .ts(at)
            .end();
        Ok(child)
    }

    /// Sometimes, the history assembly of the round `run_id`: it reads the last runs before
    /// it, inherited ones included, and is sometimes still active (unsealed, EX-5).
    fn history_request(
        &mut self,
        conversation_id: Uuid,
        run_id: Uuid,
        at: DateTime<Utc>,
        earlier_runs: &[Uuid],
    ) {
        if earlier_runs.is_empty() || !self.rng.chance(0.2) {
            return;
        }
        let sealed = if self.rng.chance(0.1) { None } else { Some(at) };
        let request_id = self.rng.id();
        self.t
            .history_requests
            .row()
            .uuid(request_id)
            .uuid(conversation_id)
            .uuid(run_id)
            .opt_ts(sealed)
            .ts(at)
            .end();
        let from = earlier_runs.len().saturating_sub(4);
        for source in &earlier_runs[from..] {
            self.t
                .history_request_sources
                .row()
                .uuid(request_id)
                .uuid(*source)
                .end();
        }
    }

    /// Follow-ups of a variant, each with its fragments and, sometimes, upload bindings.
    fn follow_ups(&mut self, account_id: Uuid, variant_id: Uuid, at: DateTime<Utc>) {
        let follow_ups: i64 = self.rng.range(1..=3);
        for position in 0..follow_ups {
            let mut fragments = Vec::new();
            let count: i32 = self.rng.range(1..=2);
            for _ in 0..count {
                let fragment_id = self.rng.id();
                let content = self.rng.words(20);
                self.t
                    .fragments
                    .row()
                    .uuid(fragment_id)
                    .uuid(account_id)
                    .text(&content)
                    .ts(at)
                    .end();
                let binding = if self.rng.chance(0.5) {
                    json!({"upload_id": self.rng.id(), "name": "notes.txt"})
                } else {
                    serde_json::Value::Null
                };
                fragments.push(json!({"fragment_id": fragment_id, "upload_binding": binding}));
            }
            let id = self.rng.id();
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
}
