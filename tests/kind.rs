//! Adding a job kind touches its module and nothing shared (README, "Adding a job kind"). A
//! per-account kind written here, in the tests alone — its module and statements (this file),
//! its settings section (read through `Job::settings`), its table (the migration a real kind
//! would add) — runs through the worker's own hop path (`sexton::hop::run`: the scope lock,
//! the next hop, the pass ledger) and the owner loop, and its pass completes over three hops,
//! the old rows gone and the young one kept. A real kind adds one line to `KINDS` besides.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sexton::context::JobContext;
use sexton_jobs::clock::ManualClock;
use sexton_jobs::cutoff::{EARLIEST, days_before};
use sexton_jobs::files::PathSettings;
use sexton_jobs::job::{Env, Inspect, Job, Look, Position, Report};
use sexton_jobs::owner_loop::{
    self, Bounds, Candidates, Chunks, Error, Hop, Mode, Taken, Window, Windowed,
};
use sexton_jobs::payload::V1;
use sexton_jobs::settings::{Check, Raw};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::common::{self, fixture};

/// Notes older than `[probe] max_age_days` go.
struct Probe;

#[derive(Debug, Clone)]
struct ProbeSettings {
    max_age_days: i32,
    window_size: u32,
}

#[derive(Debug, Deserialize)]
struct RawSettings {
    max_age_days: Raw<i64>,
    window_size: Raw<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    version: V1,
    account_id: Uuid,
    pass_started_at: DateTime<Utc>,
    after: Option<(DateTime<Utc>, Uuid)>,
    hop: u32,
}

#[derive(Debug, Serialize)]
struct Preview;

impl fmt::Display for Preview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("probe notes")
    }
}

/// An account's old notes, in (age, id) order.
struct Notes {
    account_id: Uuid,
    cutoff: DateTime<Utc>,
}

impl Window for Notes {
    type Candidate = (Uuid, DateTime<Utc>);
    type Cursor = (DateTime<Utc>, Uuid);
    type Report = Report<Args>;

    const TABLES: &'static [&'static str] = &["probe_notes"];

    async fn read(
        &mut self,
        conn: &mut PgConnection,
        at: Option<&Self::Cursor>,
        room: u32,
        _report: &mut Report<Args>,
    ) -> Result<Candidates<Self::Candidate, Self::Cursor>, Error> {
        let (after_at, after_id) = at.copied().unwrap_or((EARLIEST, Uuid::nil()));
        let candidates = sqlx::query_as(
            "SELECT id, created_at FROM probe_notes
             WHERE account_id = $1 AND created_at < $2 AND (created_at, id) > ($3, $4)
             ORDER BY created_at, id LIMIT $5",
        )
        .bind(self.account_id)
        .bind(self.cutoff)
        .bind(after_at)
        .bind(after_id)
        .bind(i64::from(room))
        .fetch_all(conn)
        .await?;
        Ok(Candidates {
            candidates,
            tail: None,
        })
    }

    fn cursor(&self, (id, at): &Self::Candidate) -> Self::Cursor {
        (*at, *id)
    }

    async fn take(
        &mut self,
        conn: &mut PgConnection,
        chunk: &[Self::Candidate],
        report: &mut Report<Args>,
    ) -> Result<Taken, Error> {
        let mut tx = owner_loop::begin(conn, Some(std::time::Duration::from_secs(1)), true).await?;
        owner_loop::lock(&mut tx, "accounts", Mode::Share, &[self.account_id]).await?;
        let ids: Vec<Uuid> = chunk.iter().map(|(id, _)| *id).collect();
        let deleted = sqlx::query(
            "DELETE FROM probe_notes WHERE id = ANY($1) AND account_id = $2 AND created_at < $3",
        )
        .bind(&ids)
        .bind(self.account_id)
        .bind(self.cutoff)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        report.pruned += deleted;
        Ok(Taken::default())
    }
}

impl Job for Probe {
    const NAME: &'static str = "probe";
    const QUEUE: &'static str = "sexton.probe";
    const SECTION: &'static str = "probe";
    const RETAIN_REASONS: &'static [&'static str] = &[];

    type Args = Args;
    type Raw = RawSettings;
    type Settings = ProbeSettings;
    type Error = Error;

    fn settings(s: RawSettings, _paths: &PathSettings, c: &mut Check<'_>) -> Option<ProbeSettings> {
        let max_age_days = c.int("probe.max_age_days", &s.max_age_days, 1..=3650, "days");
        let window_size = c.int("probe.window_size", &s.window_size, 1..=1000, "rows");
        Some(ProbeSettings {
            max_age_days: max_age_days?,
            window_size: window_size?,
        })
    }

    fn first(account: Option<Uuid>, slot: DateTime<Utc>) -> Args {
        Args {
            version: V1,
            account_id: account.unwrap_or_default(),
            pass_started_at: slot,
            after: None,
            hop: 0,
        }
    }

    fn position(args: &Args) -> Position {
        Position {
            account: Some(args.account_id),
            pass_started_at: args.pass_started_at,
            hop: args.hop,
        }
    }

    async fn run(
        env: Env<'_>,
        settings: &ProbeSettings,
        args: &Args,
        report: &mut Report<Args>,
    ) -> Result<(), Error> {
        *report = Report::new(Self::RETAIN_REASONS);
        let bounds = Bounds {
            window: Some(settings.window_size),
            budget: std::time::Duration::from_secs(60),
        };
        let hop = Hop::start(env.conn, env.health, env.stop, bounds, None, report).await?;
        let Some(cutoff) = days_before(args.pass_started_at, settings.max_age_days) else {
            return Ok(());
        };
        let notes = Notes {
            account_id: args.account_id,
            cutoff,
        };
        let mut notes = Windowed::new(notes, Chunks::Fixed(1));
        let end = hop.run(&mut notes, args.after, report).await?;
        report.outcome = end.outcome();
        report.next = end.next().map(|after| Args {
            after,
            hop: args.hop + 1,
            ..args.clone()
        });
        Ok(())
    }
}

impl Inspect for Probe {
    type Preview = Preview;

    async fn preview(
        _look: Look<'_, ProbeSettings>,
        _accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        Ok(vec![Preview])
    }
}

#[sqlx::test]
async fn a_kind_written_in_its_own_module_runs_through_the_worker_and_the_owner_loop(pool: PgPool) {
    common::migrate(&pool).await;
    // Its migration.
    sqlx::query(
        "CREATE TABLE probe_notes (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                                   account_id uuid NOT NULL REFERENCES accounts (id),
                                   created_at timestamptz NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let account = fixture::account(&pool, None).await;
    let other = fixture::account(&pool, None).await;
    for (owner, days) in [
        (account, 90.0),
        (account, 60.0),
        (account, 40.0),
        (account, 1.0),
    ] {
        sqlx::query("INSERT INTO probe_notes (account_id, created_at) VALUES ($1, $2)")
            .bind(owner)
            .bind(fixture::days_before_pass(days))
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query("INSERT INTO probe_notes (account_id, created_at) VALUES ($1, $2)")
        .bind(other)
        .bind(fixture::days_before_pass(90.0))
        .execute(&pool)
        .await
        .unwrap();

    // Its settings section, read as every kind's is.
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::settings(dir.path());
    let mut problems = Vec::new();
    let mut check = Check::new(&mut problems);
    let section = serde_json::json!({"max_age_days": 30, "window_size": 2});
    let raw = check.section(Probe::SECTION, &section).unwrap();
    let probe = Probe::settings(raw, &settings.paths, &mut check).expect("the section is valid");
    assert!(problems.is_empty());
    settings.jobs.set(Probe::NAME, probe);
    let ctx = JobContext::new(
        pool.clone(),
        Arc::new(settings),
        Arc::new(ManualClock::new(fixture::pass_start())),
    );

    // The worker's hop path, hop after hop as the queue hands them over.
    let mut args = Probe::first(Some(account), fixture::pass_start());
    let mut hops = 0;
    loop {
        sexton::hop::run::<Probe>(&ctx, args.clone()).await.unwrap();
        hops += 1;
        let next: Option<(String, Vec<u8>)> = sqlx::query_as(
            "UPDATE apalis.jobs SET status = 'Done' WHERE id = (
                 SELECT id FROM apalis.jobs WHERE job_type = $1 AND status = 'Pending' LIMIT 1)
             RETURNING id, job",
        )
        .bind(Probe::QUEUE)
        .fetch_optional(&pool)
        .await
        .unwrap();
        match next {
            Some((_, payload)) => args = serde_json::from_slice(&payload).unwrap(),
            None => break,
        }
    }
    // A window of two: the first hop's is full and hands over, the second's is short.
    assert_eq!(hops, 2, "the pass went on while its window was full");
    let left: Vec<(Uuid, f64)> = sqlx::query_as(
        "SELECT account_id, extract(epoch FROM $1 - created_at)::float8 / 86400 FROM probe_notes
         ORDER BY account_id = $2 DESC",
    )
    .bind(fixture::pass_start())
    .bind(account)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(left, vec![(account, 1.0), (other, 90.0)]);
    let (finished, hop_count): (bool, i32) = sqlx::query_as(
        "SELECT finished_at IS NOT NULL, hops FROM sexton.passes WHERE job = $1 AND scope = $2",
    )
    .bind(Probe::NAME)
    .bind(account)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((finished, hop_count), (true, hops));
}
