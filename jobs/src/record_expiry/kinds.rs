//! The four kinds of short-lived record (TTL-1 … TTL-4): each its table, its age column and
//! its statements.

use super::*;

/// TTL-1: handoffs, 14 days after `created_at`.
pub struct Handoffs;

impl Record for Handoffs {
    const AGE: &'static str = "created_at";
    const SUBJECT: &'static str = "handoff";
    const ROW: &'static str =
        "SELECT account_id, created_at, false FROM handoffs WHERE id = $1::uuid";
    const JOB: &'static str = "expire_handoffs";
    const QUEUE: &'static str = "sexton.expire_handoffs";
    const TABLE: &'static str = "handoffs";
    const RULE: &'static str = "TTL-1";
    const SETTING: &'static str = "expiry.handoffs_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, created_at FROM handoffs
            WHERE created_at < $1 AND (created_at, id) > ($2, $3::uuid)
            ORDER BY created_at, id
            LIMIT $4),
        locked AS (
            SELECT h.id FROM handoffs h JOIN batch b ON b.id = h.id
            WHERE h.created_at < $1
            FOR UPDATE OF h SKIP LOCKED),
        gone AS (
            DELETE FROM handoffs h USING locked WHERE h.id = locked.id RETURNING 1),
        last AS (
            SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT created_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str =
        "SELECT min(created_at) FROM handoffs WHERE created_at < $1 AND created_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM handoffs
        WHERE created_at < $1 AND created_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.handoffs_days
    }
}

/// TTL-2: dream preloads, 7 days after `created_at`.
pub struct DreamPreloads;

impl Record for DreamPreloads {
    const AGE: &'static str = "created_at";
    const SUBJECT: &'static str = "dream_preload";
    const ROW: &'static str =
        "SELECT account_id, created_at, false FROM dream_preloads WHERE id = $1::uuid";
    const JOB: &'static str = "expire_dream_preloads";
    const QUEUE: &'static str = "sexton.expire_dream_preloads";
    const TABLE: &'static str = "dream_preloads";
    const RULE: &'static str = "TTL-2";
    const SETTING: &'static str = "expiry.dream_preloads_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, created_at FROM dream_preloads
            WHERE created_at < $1 AND (created_at, id) > ($2, $3::uuid)
            ORDER BY created_at, id
            LIMIT $4),
        locked AS (
            SELECT d.id FROM dream_preloads d JOIN batch b ON b.id = d.id
            WHERE d.created_at < $1
            FOR UPDATE OF d SKIP LOCKED),
        gone AS (
            DELETE FROM dream_preloads d USING locked WHERE d.id = locked.id RETURNING 1),
        last AS (
            SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT created_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str =
        "SELECT min(created_at) FROM dream_preloads WHERE created_at < $1 AND created_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM dream_preloads
        WHERE created_at < $1 AND created_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.dream_preloads_days
    }
}

/// TTL-3: working records and rolling cards, 90 days after `updated_at`; pinned ones never.
pub struct WorkingRecords;

impl Record for WorkingRecords {
    const AGE: &'static str = "updated_at";
    const SUBJECT: &'static str = "working_record";
    const ROW: &'static str =
        "SELECT account_id, updated_at, pinned FROM working_records WHERE id = $1::uuid";
    const JOB: &'static str = "expire_working_records";
    const QUEUE: &'static str = "sexton.expire_working_records";
    const TABLE: &'static str = "working_records";
    const RULE: &'static str = "TTL-3";
    const SETTING: &'static str = "expiry.working_records_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, updated_at FROM working_records
            WHERE NOT pinned AND updated_at < $1 AND (updated_at, id) > ($2, $3::uuid)
            ORDER BY updated_at, id
            LIMIT $4),
        locked AS (
            SELECT w.id FROM working_records w JOIN batch b ON b.id = w.id
            WHERE NOT w.pinned AND w.updated_at < $1
            FOR UPDATE OF w SKIP LOCKED),
        gone AS (
            DELETE FROM working_records w USING locked WHERE w.id = locked.id RETURNING 1),
        last AS (
            SELECT b.updated_at, b.id::text AS id FROM batch b ORDER BY b.updated_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT updated_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str = "SELECT min(updated_at) FROM working_records
         WHERE NOT pinned AND updated_at < $1 AND updated_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM working_records
        WHERE NOT pinned AND updated_at < $1 AND updated_at > $2
          AND ($3::uuid[] IS NULL OR account_id = ANY($3))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.working_records_days
    }
}

/// TTL-4: conversation event replay, 30 days after `created_at`, whatever the account's
/// execution retention (disabled included).
pub struct ConversationEvents;

impl Record for ConversationEvents {
    const AGE: &'static str = "created_at";
    const SUBJECT: &'static str = "conversation_event";
    const ROW: &'static str = "SELECT c.account_id, e.created_at, false FROM conversation_events e JOIN conversations c ON c.id = e.conversation_id WHERE e.id = $1::bigint";
    const JOB: &'static str = "expire_conversation_events";
    const QUEUE: &'static str = "sexton.expire_conversation_events";
    const TABLE: &'static str = "conversation_events";
    const RULE: &'static str = "TTL-4";
    const SETTING: &'static str = "expiry.conversation_events_days";
    const FIRST_ID: &'static str = "-9223372036854775808";
    const BATCH: &'static str = "
        WITH batch AS (
            SELECT id, created_at FROM conversation_events
            WHERE created_at < $1 AND (created_at, id) > ($2, $3::bigint)
            ORDER BY created_at, id
            LIMIT $4),
        locked AS (
            SELECT e.id FROM conversation_events e JOIN batch b ON b.id = e.id
            WHERE e.created_at < $1
            FOR UPDATE OF e SKIP LOCKED),
        gone AS (
            DELETE FROM conversation_events e USING locked WHERE e.id = locked.id RETURNING 1),
        last AS (
            SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT created_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id";
    const OLDEST: &'static str = "SELECT min(created_at) FROM conversation_events
         WHERE created_at < $1 AND created_at > $2";
    const COUNT: &'static str = "
        SELECT count(*) FROM conversation_events
        WHERE created_at < $1 AND created_at > $2
          AND ($3::uuid[] IS NULL
               OR conversation_id IN (SELECT id FROM conversations WHERE account_id = ANY($3)))";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.conversation_events_days
    }
}
