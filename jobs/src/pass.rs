//! The pass, for every job kind, written once (EX-7): a chain of hops, each a queue job whose
//! payload is the envelope [`Args`] — the scope, when the pass started, the cutoff it fixed, the
//! kind's cursor and the hop's number. The engine ([`hop`]) reads the database's now once per
//! hop, asks the kind for its current cutoff ([`Job::policy`]), applies the carry rule, runs the
//! kind's loop ([`Job::run`]) and builds the next hop's envelope; a kind supplies its policy
//! and its cursor type, and never writes an envelope.
//!
//! **The carry rule (EX-1, EX-7), its one meaning:** the first hop of a pass fixes the cutoff
//! the account's policy gives it then, and every later hop carries that same cutoff; a hop
//! prunes up to the stricter ([`Cutoff::stricter`]) of the carried cutoff and the one the
//! policy gives when it runs — never past either. Tightening a policy mid-pass takes effect at
//! the next hop; loosening it waits for the next pass.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::cutoff;
pub use crate::cutoff::{Cutoff, Policy};
pub use crate::files::Removals;
use crate::job::{Env, HopOutcome, Job, Position, Report};
pub use crate::job::{Now, Rest, Step};
use crate::owner_loop::{End, Files, Hop};
pub use crate::payload::Payload;
use crate::payload::V1;

/// The envelope of `J`'s hops.
pub type ArgsOf<J> = Args<<J as Job>::Cutoff, <J as Job>::Cursor>;

/// One hop's payload, the same envelope for every kind (FL-1: versioned, unknown fields
/// refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args<T, C> {
    pub version: V1,
    /// The account, for a per-account kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<Uuid>,
    /// When the pass started (its slot): the cutoff is measured back from it.
    pub pass_started_at: DateTime<Utc>,
    /// Fixed by the first hop and carried by every later one (the carry rule above).
    #[serde(default = "none")]
    pub cutoff: Option<T>,
    /// Where the previous hop stopped; the first hop starts at the beginning.
    #[serde(default = "none")]
    pub cursor: Option<C>,
    /// 0 for the first hop of a pass.
    #[serde(default)]
    pub hop: u32,
}

fn none<T>() -> Option<T> {
    None
}

impl<T, C> Args<T, C> {
    /// The first hop of a pass for `slot` (of `account`, for a per-account kind).
    pub fn first(account_id: Option<Uuid>, pass_started_at: DateTime<Utc>) -> Self {
        Self {
            version: V1,
            account_id,
            pass_started_at,
            cutoff: None,
            cursor: None,
            hop: 0,
        }
    }

    /// Where the hop stands: whose pass, which pass, which hop.
    pub fn position(&self) -> Position {
        Position {
            account: self.account_id,
            pass_started_at: self.pass_started_at,
            hop: self.hop,
        }
    }
}

/// Runs one hop of `J` from its envelope `args` into `report`: the files an earlier hop left
/// drained first (whatever the pass then finds), the database's now read once, the kind's
/// policy asked, the carry rule applied, the kind's loop run; the next hop's envelope if the
/// pass goes on. `report` holds what was committed when it fails.
///
/// # Errors
/// The kind's error; what was committed stays counted in `report`.
pub async fn hop<J: Job>(
    env: Env<'_>,
    settings: &J::Settings,
    args: &Args<J::Cutoff, J::Cursor>,
    report: &mut Report<J::Reason>,
) -> Result<Option<Args<J::Cutoff, J::Cursor>>, J::Error> {
    let Env {
        conn,
        pool,
        clock,
        stop,
        paths,
        health,
    } = env;
    let removals = J::removals(settings, paths);
    let files = removals.as_ref().map(|r| Files {
        root: r.root,
        store: &r.store,
        scope: args.account_id,
        // A kind that declares a second connection drains beside its hop.
        beside: (J::CONNECTIONS > 1).then_some(pool),
    });
    let bounds = J::bounds(settings);
    report.window = bounds.window.unwrap_or(report.window);
    // The loop's futures are boxed: a hop's state lives on the heap, whatever calls it.
    let hop = Box::pin(Hop::start(conn, health, stop, bounds, files, report)).await?;
    let database_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *hop.conn)
        .await?;
    let reference = cutoff::reference(args.pass_started_at, database_now);
    let now = Now {
        conn: &mut *hop.conn,
        settings,
        account: args.account_id,
        reference,
        report: &mut *report,
    };
    let current = match Box::pin(J::policy(now)).await? {
        Policy::Cutoff(current) => current,
        Policy::Ends(outcome) => {
            report.outcome = outcome;
            return Ok(None);
        }
    };
    let carried = args.cutoff.clone().unwrap_or_else(|| current.clone());
    let step = Step {
        hop,
        settings,
        env: Rest {
            pool,
            clock,
            paths,
            stop,
            health,
        },
        account: args.account_id,
        cutoff: carried.stricter(&current),
        cursor: args.cursor.clone(),
        reference,
    };
    let end: End<J::Cursor> = Box::pin(J::run(step, report)).await?;
    // A kind may end its hop with an outcome of its own (the trace cleaner's lease held
    // elsewhere); otherwise the loop's end says how it ended.
    if report.outcome == HopOutcome::Finished {
        report.outcome = end.outcome();
    }
    Ok(end.next().map(|cursor| Args {
        cutoff: Some(carried),
        cursor,
        hop: args.hop + 1,
        ..args.clone()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Prune = Args<DateTime<Utc>, (DateTime<Utc>, Uuid)>;

    #[test]
    fn fl1_the_envelope_round_trips_and_refuses_unknown_fields() {
        let args = Prune {
            cursor: Some(("2026-10-01T00:00:00Z".parse().unwrap(), Uuid::nil())),
            cutoff: Some("2026-09-01T00:00:00Z".parse().unwrap()),
            hop: 3,
            ..Prune::first(Some(Uuid::nil()), "2026-12-01T03:00:00Z".parse().unwrap())
        };
        let json = serde_json::to_value(&args).unwrap();
        assert_eq!(serde_json::from_value::<Prune>(json.clone()).unwrap(), args);
        let mut bad = json;
        bad["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Prune>(bad).is_err());
    }

    #[test]
    fn ex7_the_carried_cutoff_is_the_first_and_a_hop_never_passes_either() {
        let first: DateTime<Utc> = "2026-09-01T00:00:00Z".parse().unwrap();
        let tighter: DateTime<Utc> = "2026-08-01T00:00:00Z".parse().unwrap();
        let looser: DateTime<Utc> = "2026-10-01T00:00:00Z".parse().unwrap();
        assert_eq!(first.stricter(&tighter), tighter);
        assert_eq!(first.stricter(&looser), first);
    }
}
