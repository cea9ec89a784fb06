//! The short-lived record kinds the expiry part measures (SPEC §4), each with its table, job,
//! age setting and id type, and how a template holds them: filled with expired and young records
//! by `INSERT … SELECT` from `generate_series`, and counted.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::sexton::{EXPIRY_AGES, pass_start};

/// A short-lived record kind the expiry part measures (SPEC §4).
pub struct Expiring {
    pub table: &'static str,
    pub job: &'static str,
    /// Its age setting, as an environment override names it (`SEXTON_EXPIRY__…`).
    pub setting: &'static str,
    /// Its age in days, the default (config/default.toml).
    pub days: i32,
    pub id: Id,
    /// Adds rows: `$1` the pass start, `$2` how many, created evenly from `$3` to `$4` days
    /// before the pass, oldest first (an append-only table's order), with a 100-byte payload.
    pub fill: &'static str,
    /// What the writer's new records hang on, and the insert of one (`$1` that parent).
    pub parent: &'static str,
    pub insert: &'static str,
}

/// A record kind's id type.
#[derive(Debug, Clone, Copy)]
pub enum Id {
    Uuid,
    BigInt,
}

impl Id {
    pub fn sql(self) -> &'static str {
        match self {
            Id::Uuid => "uuid",
            Id::BigInt => "bigint",
        }
    }
}

/// The oldest expired record, in days before the pass.
const OLDEST_DAYS: f64 = 400.0;

pub static EXPIRING: [Expiring; 2] = [
    Expiring {
        table: "handoffs",
        job: "expire_handoffs",
        setting: "HANDOFFS_DAYS",
        days: 14,
        id: Id::Uuid,
        fill: "WITH p AS (SELECT array_agg(id ORDER BY id) AS agents FROM agents)
            INSERT INTO handoffs (account_id, agent_id, payload, created_at)
            SELECT a.account_id, a.id, jsonb_build_object('text', repeat('x', 100)),
                   $1 - $3 * interval '1 day' + (g::float8 / $2) * ($3 - $4) * interval '1 day'
            FROM p CROSS JOIN generate_series(1, $2) g
            JOIN agents a ON a.id = p.agents[1 + g % cardinality(p.agents)]",
        parent: "SELECT id::text FROM agents ORDER BY id LIMIT 1",
        insert: "INSERT INTO handoffs (account_id, agent_id, payload)
            SELECT account_id, id, jsonb_build_object('text', repeat('x', 100))
            FROM agents WHERE id = $1::uuid",
    },
    Expiring {
        table: "conversation_events",
        job: "expire_conversation_events",
        setting: "CONVERSATION_EVENTS_DAYS",
        days: 30,
        id: Id::BigInt,
        fill: "WITH p AS (SELECT array_agg(id ORDER BY id) AS conversations FROM conversations)
            INSERT INTO conversation_events (conversation_id, kind, payload, created_at)
            SELECT p.conversations[1 + g % cardinality(p.conversations)], 'delta',
                   jsonb_build_object('text', repeat('x', 100)),
                   $1 - $3 * interval '1 day' + (g::float8 / $2) * ($3 - $4) * interval '1 day'
            FROM p, generate_series(1, $2) g",
        parent: "SELECT id::text FROM conversations ORDER BY id LIMIT 1",
        insert: "INSERT INTO conversation_events (conversation_id, kind, payload)
            VALUES ($1::uuid, 'delta', jsonb_build_object('text', repeat('x', 100)))",
    },
];

impl Expiring {
    /// The cutoff of a pass at the pass start: rows created before it expire.
    pub fn cutoff(&self) -> DateTime<Utc> {
        pass_start() - chrono::Duration::days(self.days.into())
    }

    /// The worker's settings for a pass of this kind alone: its age, the batch, every other
    /// kind off.
    pub fn sexton_env(&self, batch: u32) -> Vec<(String, String)> {
        let mut env = vec![("SEXTON_EXPIRY__BATCH_SIZE".to_owned(), batch.to_string())];
        for age in EXPIRY_AGES {
            let days = if age == self.setting { self.days } else { 0 };
            env.push((format!("SEXTON_EXPIRY__{age}"), days.to_string()));
        }
        env
    }
}

/// The template's rows: an account (execution retention off) with ten agents and a hundred
/// conversations, and for each kind `rows` expired records and a tenth as many young ones.
/// Nothing else: the other jobs find no work.
pub async fn fill(pool: &PgPool, rows: u64) -> anyhow::Result<()> {
    let account: Uuid = sqlx::query_scalar(
        "INSERT INTO accounts (name, execution_details_retention_days)
         VALUES ('bench', NULL) RETURNING id",
    )
    .fetch_one(pool)
    .await?;
    sqlx::query(
        "INSERT INTO agents (account_id, name) SELECT $1, 'agent ' || g FROM generate_series(1, 10) g",
    )
    .bind(account)
    .execute(pool)
    .await?;
    sqlx::query("INSERT INTO conversations (account_id) SELECT $1 FROM generate_series(1, 100)")
        .bind(account)
        .execute(pool)
        .await?;
    let rows = i64::try_from(rows)?;
    for kind in &EXPIRING {
        let days = f64::from(kind.days);
        // Expired, then young (1 day to a day short of the age): far from the cutoff both.
        for (count, oldest, youngest) in [
            (rows, OLDEST_DAYS, days + 1.0),
            (rows / 10, days - 1.0, 1.0),
        ] {
            sqlx::query(kind.fill)
                .bind(pass_start())
                .bind(count)
                .bind(oldest)
                .bind(youngest)
                .execute(pool)
                .await?;
        }
    }
    // Every copy starts alike: hint bits set, visibility map full, statistics fresh.
    sqlx::query("VACUUM (FREEZE, ANALYZE)")
        .execute(pool)
        .await?;
    Ok(())
}

/// A kind's expired rows, and its young ones from before the pass (the writer's new records
/// come after it).
pub async fn counts(pool: &PgPool, kind: &Expiring) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE created_at < $1),
                count(*) FILTER (WHERE created_at >= $1 AND created_at < $2)
         FROM {}",
        kind.table
    )))
    .bind(kind.cutoff())
    .bind(pass_start())
    .fetch_one(pool)
    .await?)
}
