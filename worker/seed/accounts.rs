//! Accounts and what each has generated so far.
//!
//! Execution retention (EX-1) cycles through the default 90 days, a stricter 30, and disabled;
//! session retention (SS-1) through on with the fallback ages, on with custom ages, off, and no
//! policy at all. Per account, a generated artifact (no TTL, AT-1) that the escaping trace
//! symlink of [`records`](super::records) points at.

use chrono::Duration;
use uuid::Uuid;

use super::{Generator, SeedError};

/// An account, and what later records of it refer back to.
#[derive(Debug)]
pub(super) struct Account {
    pub(super) id: Uuid,
    /// Earlier conversations, to fork from.
    pub(super) conversations: Vec<EarlierConversation>,
    pub(super) agents: Vec<Uuid>,
}

/// A conversation a later one of the same account can fork from.
#[derive(Debug)]
pub(super) struct EarlierConversation {
    pub(super) id: Uuid,
    /// The selected run of each turn, by position (inherited turns included).
    pub(super) runs_by_position: Vec<Uuid>,
}

impl EarlierConversation {
    /// Its turns, inherited ones included.
    pub(super) fn turns(&self) -> i64 {
        self.runs_by_position.len() as i64
    }
}

/// Execution retention of the i-th account: the default 90 days, a stricter 30, or disabled.
fn retention_days(i: u64) -> Option<i64> {
    [Some(90), Some(30), None][(i % 3) as usize]
}

/// A persisted session retention policy (SS-1).
struct SessionPolicy {
    enabled: bool,
    /// Ages per kind, or none to fall back to the defaults.
    days: Option<SessionDays>,
}

struct SessionDays {
    main: i64,
    task: i64,
    subagent: i64,
}

/// Session retention of the i-th account: on with the fallback ages, on with custom ages, off,
/// or no policy at all.
fn session_policy(i: u64) -> Option<SessionPolicy> {
    match i % 4 {
        0 => Some(SessionPolicy {
            enabled: true,
            days: None,
        }),
        1 => Some(SessionPolicy {
            enabled: true,
            days: Some(SessionDays {
                main: 45,
                task: 14,
                subagent: 3,
            }),
        }),
        2 => Some(SessionPolicy {
            enabled: false,
            days: None,
        }),
        _ => None,
    }
}

impl Generator<'_> {
    /// `n` accounts with their retention settings.
    pub(super) fn accounts(&mut self, n: u64) {
        for i in 0..n {
            let id = self.rng.id();
            let created = self.now - Duration::days(800);
            self.t
                .accounts
                .row()
                .uuid(id)
                .text(&format!("account-{i}"))
                .opt_int(retention_days(i))
                .ts(created)
                .end();
            if let Some(policy) = session_policy(i) {
                let days = policy.days.as_ref();
                self.t
                    .session_retention_policies
                    .row()
                    .uuid(id)
                    .bool(policy.enabled)
                    .opt_int(days.map(|d| d.main))
                    .opt_int(days.map(|d| d.task))
                    .opt_int(days.map(|d| d.subagent))
                    .end();
            }
            self.accounts.push(Account {
                id,
                conversations: Vec::new(),
                agents: Vec::new(),
            });
        }
        self.report.accounts = n;
    }

    /// The account the `index`-th conversation or agent belongs to (round robin).
    pub(super) fn account_for(&self, index: u64) -> usize {
        (index % self.accounts.len() as u64) as usize
    }

    /// Per account: a generated artifact, and the hostile traces of its first agent.
    pub(super) fn account_files(&mut self) -> Result<(), SeedError> {
        for i in 0..self.accounts.len() {
            let account_id = self.accounts[i].id;
            let artifact = self
                .disk
                .paths
                .artifacts_root
                .join(account_id.to_string())
                .join("report.bin");
            self.disk
                .filler(&artifact, 512, self.now - Duration::days(365))?;
            if let Some(&agent_id) = self.accounts[i].agents.first() {
                self.hostile_traces(agent_id, &artifact)?;
            }
        }
        Ok(())
    }
}
