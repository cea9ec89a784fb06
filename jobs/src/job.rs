//! What a job kind declares about itself (the model is underway's `Task`): its stable name, its
//! scope, its typed and versioned arguments, its settings section, and a `run` that does one hop
//! and reports. The worker does everything else once, for every kind: decoding, the scope lock,
//! the next hop, retries, metrics, logs, the pass ledger, fan-out, `preview` and `status`.

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicBool;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::clock::Clock;
use crate::cutoff::{Cutoff, Policy};
use crate::estimate::Backlog;
use crate::explain::Explanation;
use crate::files::{DrainError, PathSettings, Removals};
use crate::health::Health;
use crate::owner_loop::{Bounds, End, Hop};
use crate::payload::Payload;
pub use crate::report::{HopOutcome, NoReason, Reason, Report};
use crate::settings::Check;

/// What a pass covers, and so what its lock guards: at most one hop of a kind per scope runs
/// at any moment across the fleet (FL-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One pass per account per slot.
    Account,
    /// One pass per slot for the whole database.
    Global,
}

/// When a job kind's passes start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cadence {
    /// With every nightly slot (FL-2), fanned out per account or once.
    Nightly,
    /// Once per period of this length, fleet-wide (the period's start is its slot key), the
    /// current period on start included.
    Every(chrono::Duration),
    /// Never: the job is turned off.
    Off,
}

impl Cadence {
    /// Once per `period` while the kind is `enabled`, else [`Cadence::Off`].
    pub fn every_while(enabled: bool, period: chrono::Duration) -> Self {
        if enabled {
            Cadence::Every(period)
        } else {
            Cadence::Off
        }
    }
}

/// Where a hop stands: whose pass, which pass, which hop of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The account, for a per-account job.
    pub account: Option<Uuid>,
    /// When the pass started: the nightly slot it belongs to.
    pub pass_started_at: DateTime<Utc>,
    /// 0 for the first hop of a pass.
    pub hop: u32,
}

/// A kind's discovery (FL-8): one set-based statement, with its arguments bound, that selects
/// the ids of the accounts whose pass has something to do — in any order, each as often as it
/// comes: [`Discovery`] makes them distinct and walks them in id order.
pub type Due = sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Every account: what a per-account job that does not say better is asked to do.
pub fn every_account() -> Due {
    sqlx::query("SELECT id FROM accounts")
}

/// A kind's discovery under way on one connection: its statement run once, into a cursor held
/// by the server (`WITH HOLD`: it outlives the statement, so the connection pushes and previews
/// between reads), and read in batches in account id order — the worker holds one batch, never
/// every due account. Close it when done; one left open by a failed walk is closed by the next
/// [`Discovery::open`] on the same connection.
pub struct Discovery(());

/// The cursor's name on its connection: one discovery at a time per connection.
const CURSOR: &str = "sexton_due";

impl Discovery {
    /// Runs `due` into the connection's cursor.
    ///
    /// # Errors
    /// A database error, or an argument of `due` that could not be encoded.
    pub async fn open(conn: &mut PgConnection, mut due: Due) -> Result<Self, sqlx::Error> {
        use sqlx::Execute as _;
        let arguments = due.take_arguments().map_err(sqlx::Error::Encode)?;
        let statement = format!(
            "DECLARE {CURSOR} NO SCROLL CURSOR WITH HOLD FOR
             SELECT DISTINCT account_id FROM ({}) due (account_id) ORDER BY account_id",
            due.sql().as_str()
        );
        let left_open: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_cursors WHERE name = $1)")
                .bind(CURSOR)
                .fetch_one(&mut *conn)
                .await?;
        if left_open {
            sqlx::query(sqlx::AssertSqlSafe(format!("CLOSE {CURSOR}")))
                .execute(&mut *conn)
                .await?;
        }
        sqlx::query_with(
            sqlx::AssertSqlSafe(statement),
            arguments.unwrap_or_default(),
        )
        .execute(&mut *conn)
        .await?;
        Ok(Self(()))
    }

    /// The next at most `size` due accounts, in id order; empty past the last.
    ///
    /// # Errors
    /// A database error.
    pub async fn next(&self, conn: &mut PgConnection, size: u32) -> Result<Vec<Uuid>, sqlx::Error> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("FETCH {size} FROM {CURSOR}")))
            .fetch_all(conn)
            .await
    }

    /// Closes the cursor.
    ///
    /// # Errors
    /// A database error.
    pub async fn close(self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!("CLOSE {CURSOR}")))
            .execute(conn)
            .await?;
        Ok(())
    }
}

/// The accounts `$1` (a `uuid[]`) names, or every account when it is NULL, as a relation to
/// select from: where a preview of some accounts starts. Each named account is read by its key;
/// given a few thousand of them in `= ANY($1)`, the planner would rather read every account.
pub const ACCOUNTS_NAMED: &str = "(SELECT * FROM accounts WHERE $1::uuid[] IS NULL
      UNION ALL
      SELECT n.* FROM (SELECT DISTINCT unnest($1::uuid[]) AS id) u
      CROSS JOIN LATERAL (SELECT * FROM accounts WHERE id = u.id OFFSET 0) n)";

/// How many accounts there are: what a fan-out and `preview` report beside the due ones.
///
/// # Errors
/// A database error.
pub async fn accounts(conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM accounts")
        .fetch_one(conn)
        .await?;
    Ok(n.max(0) as u64)
}

/// Whether `error`, or an error it comes from, is the database refusing a statement for what it
/// says rather than for when it ran (SQLSTATE class 42: a table, column or function missing, a
/// privilege not granted). Running the hop again meets the same refusal, so it is failed for
/// good and the operator sees it at once; a lost connection, a lock timeout, a read-only or
/// restarting server are tried again.
pub fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>() {
            return db.code().is_some_and(|code| code.starts_with("42"));
        }
        // Behind a transparent wrapper the chain skips the `sqlx::Error` and names the
        // server's error itself.
        if let Some(db) = error.downcast_ref::<Box<dyn sqlx::error::DatabaseError>>() {
            return db.code().is_some_and(|code| code.starts_with("42"));
        }
        next = error.source();
    }
    false
}

/// What a hop works with.
pub struct Env<'a> {
    /// The hop's one connection, which also holds its scope lock: a job that needs more
    /// declares [`Job::CONNECTIONS`].
    pub conn: &'a mut PgConnection,
    pub pool: &'a PgPool,
    pub clock: &'a dyn Clock,
    /// Raised on shutdown (FL-5): finish the owner in hand, take no more, hand over.
    pub stop: &'a AtomicBool,
    pub paths: &'a PathSettings,
    /// The database's health, checked between owner transactions.
    pub health: &'a Health,
}

/// A job kind. Implement it in one module of this crate and register it in the worker with one
/// line; nothing else in the worker changes. The pass around its hops — the envelope, the
/// database's now, the carry rule, the next hop — is the engine's ([`crate::pass`]).
pub trait Job: Sized + Send + Sync + 'static {
    /// Stable name: the metric and log label, and the queue `sexton.<NAME>` ([`queue`]).
    const NAME: &'static str;
    /// Per account (one pass each) unless the kind is global.
    const SCOPE: Scope = Scope::Account;
    /// The configuration section of its settings.
    const SECTION: &'static str;
    /// Connections one hop holds at once, the one carrying its scope lock included; a kind
    /// that declares two drains its files beside its hop on the second.
    const CONNECTIONS: u32 = 1;
    /// The tables its hops delete rows of, counted in [`Report::rows`].
    const TABLES: &'static [&'static str] = &[];
    /// Whether its hops run beside the others, in a slot of their own (one hop at a time per
    /// worker), rather than in the shared `queue.concurrency` budget: a kind whose work comes on
    /// request at any hour (erasure) never takes a slot the nightly passes would have (PF-8).
    const BESIDE: bool = false;

    /// Why it leaves an owner in place.
    type Reason: Reason;
    /// What its pass prunes up to, carried from hop to hop.
    type Cutoff: Cutoff;
    /// Where a hop stops and the next one starts.
    type Cursor: Payload;
    /// Its section as given, before it is checked (leaves are [`crate::settings::Raw`]).
    type Raw: DeserializeOwned;
    type Settings: fmt::Debug + Clone + Send + Sync + 'static;
    type Error: std::error::Error + From<sqlx::Error> + From<DrainError> + Send + Sync + 'static;

    /// Checks the job's section as given (read into [`Job::Raw`], every default filled in);
    /// problems go to `check`, each naming its setting as `<SECTION>.<name>`.
    fn settings(
        raw: Self::Raw,
        paths: &PathSettings,
        check: &mut Check<'_>,
    ) -> Option<Self::Settings>;

    /// When its passes start: with the nightly slot (the default), on a cadence of its own, or
    /// not at all (turned off by its settings).
    fn cadence(_settings: &Self::Settings) -> Cadence {
        Cadence::Nightly
    }

    /// Its discovery (FL-8): the accounts whose pass for `slot` has something to do — a
    /// candidate past its cutoff under the account's current setting (held-back ones included,
    /// so that what holds them is looked at again), a window the pass must report as invalid, or
    /// file removals waiting in the job's root. One set-based statement driven from the
    /// candidates' side through the job's indexes, so that an account with nothing due is never
    /// read; it may name an account whose pass then finds nothing, never miss one a pass would
    /// prune for. By default every account.
    fn due(_settings: &Self::Settings, _slot: DateTime<Utc>) -> Due {
        every_account()
    }

    /// How much one hop may do.
    fn bounds(settings: &Self::Settings) -> Bounds;

    /// Where its hops remove files, if they do: the removals an earlier hop recorded there are
    /// drained before anything else.
    fn removals(_settings: &Self::Settings, _paths: &PathSettings) -> Option<Removals> {
        None
    }

    /// Its current cutoff for the account's pass (a global kind: none), measured back from the
    /// pass's reference (EX-1), or why the pass ends here.
    fn policy(
        now: Now<'_, Self>,
    ) -> impl Future<Output = Result<Policy<Self::Cutoff>, Self::Error>> + Send;

    /// Runs one hop's loop into `report`, which it keeps up to date with what it has committed
    /// as it goes: when the hop fails, what `report` holds was done all the same, and the pass
    /// ledger and the metrics count it (a retry finds it gone). A hop run twice (a retry, a
    /// duplicate delivery) ends in the same state. Where the next hop starts, if one follows.
    fn run(
        step: Step<'_, Self>,
        report: &mut Report<Self::Reason>,
    ) -> impl Future<Output = Result<End<Self::Cursor>, Self::Error>> + Send;

    /// Whether a failed hop is tried again; a hop that can never succeed is failed for good.
    /// By default, every failure but the database's refusal of the statement itself
    /// ([`refused`]) is retried.
    fn retryable(error: &Self::Error) -> bool {
        !refused(error)
    }
}

/// What a kind's policy is asked with ([`Job::policy`]).
pub struct Now<'a, J: Job> {
    pub conn: &'a mut sqlx::PgConnection,
    pub settings: &'a J::Settings,
    /// The account, for a per-account kind.
    pub account: Option<Uuid>,
    /// What the pass measures its windows back from (EX-1: its start, or the database's now
    /// if that is earlier).
    pub reference: DateTime<Utc>,
    /// Anything the policy counts (an invalid window).
    pub report: &'a mut Report<J::Reason>,
}

/// A hop as the kind's loop gets it ([`Job::run`]): the owner loop started (the files an
/// earlier hop recorded drained), and where the pass stands.
pub struct Step<'a, J: Job> {
    pub hop: Hop<'a>,
    pub env: Rest<'a>,
    pub settings: &'a J::Settings,
    /// The account, for a per-account kind.
    pub account: Option<Uuid>,
    /// What this hop prunes up to: the stricter of the carried and the current cutoff.
    pub cutoff: J::Cutoff,
    /// Where the previous hop stopped.
    pub cursor: Option<J::Cursor>,
    /// What the pass measures its windows back from (EX-1: its start, or the database's now
    /// if that is earlier).
    pub reference: DateTime<Utc>,
}

/// What a hop works with besides its connection (which the owner loop holds).
#[derive(Clone, Copy)]
pub struct Rest<'a> {
    pub pool: &'a sqlx::PgPool,
    pub clock: &'a dyn crate::clock::Clock,
    pub paths: &'a crate::files::PathSettings,
    pub stop: &'a std::sync::atomic::AtomicBool,
    pub health: &'a crate::health::Health,
}

/// The queue of a kind named `name`: `sexton.<name>`, stable whatever the Rust types are
/// called. Spelled once per name for the life of the process.
pub fn queue(name: &'static str) -> &'static str {
    static QUEUES: std::sync::Mutex<Vec<(&str, &str)>> = std::sync::Mutex::new(Vec::new());
    let mut queues = QUEUES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, queue)) = queues.iter().find(|(n, _)| *n == name) {
        return queue;
    }
    let queue: &'static str = format!("sexton.{name}").leak();
    queues.push((name, queue));
    queue
}

/// What a read of a job kind's state is given: a connection, the kind's settings, the roots, and
/// the time the verdicts are for.
pub struct Look<'a, S> {
    pub conn: &'a mut PgConnection,
    pub settings: &'a S,
    pub paths: &'a PathSettings,
    pub now: DateTime<Utc>,
}

/// The read side of a job kind (`sexton preview`, `sexton explain`, the backlog gauge): what its
/// passes would do, from the same code and statements as their decisions, deleting nothing. A
/// kind implements it in its `read` module.
pub trait Inspect: Job {
    /// What `sexton explain <subject> <id>` asks this job about.
    const SUBJECTS: &'static [&'static str] = &[];

    /// One line of `sexton preview`: serialized for `--json`, displayed for people.
    type Preview: Serialize + fmt::Display + Send + 'static;

    /// The statement of its backlog, when the kind measures one by a statement of its own.
    fn backlog() -> Option<Backlog> {
        None
    }

    /// How far past its cutoff the oldest eligible item is, in seconds (OP-3), if the job
    /// measures a backlog: by default, what [`Inspect::backlog`] reads.
    fn backlog_seconds(
        pool: &PgPool,
        _settings: &Self::Settings,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<f64>, Self::Error>> + Send {
        async move {
            match Self::backlog() {
                Some(backlog) => Ok(Some(backlog.seconds(pool, now).await?)),
                None => Ok(None),
            }
        }
    }

    /// Whether `id` is well formed for `subject` (a UUID unless the job says otherwise).
    fn parse_id(_subject: &str, id: &str) -> Result<(), String> {
        Uuid::parse_str(id)
            .map(|_| ())
            .map_err(|_| format!("expected a UUID, got {id:?}"))
    }

    /// This job's verdict on one `subject` (one of [`Inspect::SUBJECTS`]) named by `id`, from the
    /// same code as its own decision; `Ok(None)` when there is no such thing. `id` has been
    /// checked by [`Inspect::parse_id`].
    fn explain(
        _look: Look<'_, Self::Settings>,
        _subject: &'static str,
        _id: &str,
    ) -> impl Future<Output = Result<Option<Explanation>, Self::Error>> + Send {
        async { Ok(None) }
    }

    /// What a pass would do now, deleting nothing (`sexton preview`): a per-account job gives
    /// a line per account of `accounts` (every account when `None`); a global job counts what
    /// it would remove of those accounts, or of all.
    fn preview(
        look: Look<'_, Self::Settings>,
        accounts: Option<&[Uuid]>,
    ) -> impl Future<Output = Result<Vec<Self::Preview>, Self::Error>> + Send;

    /// What a line of [`Inspect::preview`] counts, as (what, how many) pairs that add up over
    /// accounts: the summary `sexton preview` prints of a per-account job.
    fn tally(_preview: &Self::Preview) -> Vec<(String, i64)> {
        Vec::new()
    }
}
