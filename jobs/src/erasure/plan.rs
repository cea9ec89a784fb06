//! What a request covers (RQ-2): the ids of its scope, written to `sexton.erasure_members` at
//! the start of each of its passes. Ids found by an earlier pass stay (their rows may be gone;
//! the verification still reads every table by them), and a row added to the scope since (a
//! fork, a run, a session) is found by the next pass.
//!
//! - a conversation: itself and its forks, transitively; their runs of every kind and those
//!   runs' delegated children, transitively (`parent_run_id`, `delegations.child_run_id`); the
//!   conversations' turns, variants and history requests;
//! - a session: itself, and its archives;
//! - an agent: itself, and its sessions as above;
//! - an account: itself, and all of the above for each of its conversations and agents, and
//!   every run of the account (standalone and inference runs included).
//!
//! `$1` is the request, `$2` the scope's id. One statement per scope kind. A request's first
//! plan inserts its ids plainly, in key order: no other insert of the same ids can race it — a
//! request is worked by one pass at a time (FL-3), and a dry run plans under an id of its own.
//! `ON CONFLICT DO NOTHING` cost 0.5 s of 1.3 s at 132 k ids (its speculative insertion), and a
//! `NOT EXISTS` against the table being written may be planned on its empty statistics as a
//! scan of it per id (26 s at PF-8's sizes while a second statement wrote it). A later plan,
//! whose request holds ids already, inserts with `ON CONFLICT DO NOTHING`.

use super::Subject;

/// A conversation's forks, transitively: `convs (id)` from the seed `seed (id)`.
const FORKS: &str = "convs (id) AS (
        SELECT id FROM seed
        UNION
        SELECT c.id FROM conversations c JOIN convs ON c.forked_from_conversation_id = convs.id)";

/// Runs and their delegated children, transitively: `all_runs (id)` from `first_runs (id)`.
const DELEGATED: &str = "all_runs (id) AS (
        SELECT id FROM first_runs
        UNION
        SELECT child.id FROM all_runs a
        CROSS JOIN LATERAL (SELECT r.id FROM runs r WHERE r.parent_run_id = a.id
                            UNION ALL
                            SELECT d.child_run_id FROM delegations d
                            WHERE d.parent_run_id = a.id AND d.child_run_id IS NOT NULL) child)";

/// Every id of the scope, by kind. A history request is found by each of its two links in a
/// semi-join of its own, never by an `OR` of the two: the planner, which guesses a recursive CTE
/// at millions of rows, would test each history request of the database that is not of the
/// scope's conversations against the scope's runs by scanning them.
const IDS: &str = "ids (kind, id) AS (
        SELECT 'conversation', id FROM convs
        UNION ALL SELECT 'run', id FROM all_runs
        UNION ALL SELECT 'turn', t.id FROM turns t WHERE t.conversation_id IN (SELECT id FROM convs)
        UNION ALL SELECT 'variant', v.id FROM variants v
                  JOIN turns t ON t.id = v.turn_id WHERE t.conversation_id IN (SELECT id FROM convs)
        UNION ALL SELECT 'history_request', q.id FROM history_requests q
                  WHERE q.conversation_id IN (SELECT id FROM convs)
        UNION ALL SELECT 'history_request', q.id FROM history_requests q
                  WHERE q.run_id IN (SELECT id FROM all_runs)
        UNION ALL SELECT 'agent', id FROM agents_of
        UNION ALL SELECT 'session', id FROM sessions_of
        UNION ALL SELECT 'archive', a.id FROM conversation_archives a
                  WHERE a.session_id IN (SELECT id FROM sessions_of)
        UNION ALL SELECT 'account', id FROM accounts_of)";

/// What follows the CTE `ids (kind, id)` when the request holds no ids yet: their insert, in key
/// order.
const FIRST: &str = "
    INSERT INTO sexton.erasure_members (request_id, kind, id)
    SELECT DISTINCT $1, kind, id FROM ids
    ORDER BY 2, 3";

/// What follows the CTE `ids (kind, id)` on a later pass: the insert of the ids the request does
/// not hold yet.
const AGAIN: &str = "
    INSERT INTO sexton.erasure_members (request_id, kind, id)
    SELECT DISTINCT $1, kind, id FROM ids
    ORDER BY 2, 3
    ON CONFLICT DO NOTHING";

/// The statement that writes a request's members, for its scope; `again` when the request holds
/// ids already (an earlier pass's).
pub fn members(subject: Subject, again: bool) -> String {
    let insert = if again { AGAIN } else { FIRST };
    let seeds = match subject {
        Subject::Conversation => {
            "seed (id) AS (SELECT $2::uuid),
             first_runs (id) AS (SELECT r.id FROM runs r
                                 WHERE r.conversation_id IN (SELECT id FROM convs)),
             agents_of (id) AS (SELECT NULL::uuid WHERE false),
             sessions_of (id) AS (SELECT NULL::uuid WHERE false),
             accounts_of (id) AS (SELECT NULL::uuid WHERE false)"
        }
        Subject::Session => {
            "seed (id) AS (SELECT NULL::uuid WHERE false),
             first_runs (id) AS (SELECT NULL::uuid WHERE false),
             agents_of (id) AS (SELECT NULL::uuid WHERE false),
             sessions_of (id) AS (SELECT $2::uuid),
             accounts_of (id) AS (SELECT NULL::uuid WHERE false)"
        }
        Subject::Agent => {
            "seed (id) AS (SELECT NULL::uuid WHERE false),
             first_runs (id) AS (SELECT NULL::uuid WHERE false),
             agents_of (id) AS (SELECT $2::uuid),
             sessions_of (id) AS (SELECT $2::uuid WHERE false
                                  UNION ALL SELECT s.id FROM sessions s WHERE s.agent_id = $2),
             accounts_of (id) AS (SELECT NULL::uuid WHERE false)"
        }
        Subject::Account => {
            "seed (id) AS (SELECT c.id FROM conversations c WHERE c.account_id = $2),
             first_runs (id) AS (SELECT r.id FROM runs r WHERE r.account_id = $2),
             agents_of (id) AS (SELECT g.id FROM agents g WHERE g.account_id = $2),
             sessions_of (id) AS (SELECT s.id FROM sessions s WHERE s.account_id = $2),
             accounts_of (id) AS (SELECT $2::uuid)"
        }
    };
    format!("WITH RECURSIVE {seeds}, {FORKS}, {DELEGATED}, {IDS}{insert}")
}
