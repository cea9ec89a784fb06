//! The four kinds of short-lived record (TTL-1 … TTL-4): each its table, its age column, its
//! ids and what else keeps a row (a pin); the statements are rendered from these ([`super::sql`]).

use super::{ExpirySettings, Record};

/// TTL-1: handoffs, 14 days after `created_at`.
pub struct Handoffs;

impl Record for Handoffs {
    const ID_TYPE: &'static str = "uuid";
    const AGE: &'static str = "created_at";
    const HOLDS: &'static str =
        "sexton.handoff_holds(t.account_id, t.agent_id, t.from_session_id, t.to_session_id)";
    const SUBJECT: &'static str = "handoff";
    const ROW: &'static str =
        "SELECT account_id, created_at, false FROM handoffs WHERE id = $1::uuid";
    const JOB: &'static str = "expire_handoffs";
    const TABLE: &'static str = "handoffs";
    const RULE: &'static str = "TTL-1";
    const SETTING: &'static str = "expiry.handoffs_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.handoffs_days
    }
}

/// TTL-2: dream preloads, 7 days after `created_at`.
pub struct DreamPreloads;

impl Record for DreamPreloads {
    const ID_TYPE: &'static str = "uuid";
    const AGE: &'static str = "created_at";
    const SUBJECT: &'static str = "dream_preload";
    const ROW: &'static str =
        "SELECT account_id, created_at, false FROM dream_preloads WHERE id = $1::uuid";
    const JOB: &'static str = "expire_dream_preloads";
    const TABLE: &'static str = "dream_preloads";
    const RULE: &'static str = "TTL-2";
    const SETTING: &'static str = "expiry.dream_preloads_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.dream_preloads_days
    }
}

/// TTL-3: working records and rolling cards, 90 days after `updated_at`; pinned ones never.
pub struct WorkingRecords;

impl Record for WorkingRecords {
    const ID_TYPE: &'static str = "uuid";
    const PINNED: Option<&'static str> = Some("pinned");
    const AGE: &'static str = "updated_at";
    const SUBJECT: &'static str = "working_record";
    const ROW: &'static str =
        "SELECT account_id, updated_at, pinned FROM working_records WHERE id = $1::uuid";
    const JOB: &'static str = "expire_working_records";
    const TABLE: &'static str = "working_records";
    const RULE: &'static str = "TTL-3";
    const SETTING: &'static str = "expiry.working_records_days";
    const FIRST_ID: &'static str = "00000000-0000-0000-0000-000000000000";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.working_records_days
    }
}

/// TTL-4: conversation event replay, 30 days after `created_at`, whatever the account's
/// execution retention (disabled included).
pub struct ConversationEvents;

impl Record for ConversationEvents {
    const ID_TYPE: &'static str = "bigint";
    const OF_ACCOUNTS: &'static str =
        "conversation_id IN (SELECT id FROM conversations WHERE account_id = ANY($3))";
    const AGE: &'static str = "created_at";
    const HOLDS: &'static str = "sexton.event_holds(t.conversation_id)";
    const SUBJECT: &'static str = "conversation_event";
    const ROW: &'static str = "SELECT c.account_id, e.created_at, false FROM conversation_events e JOIN conversations c ON c.id = e.conversation_id WHERE e.id = $1::bigint";
    const JOB: &'static str = "expire_conversation_events";
    const TABLE: &'static str = "conversation_events";
    const RULE: &'static str = "TTL-4";
    const SETTING: &'static str = "expiry.conversation_events_days";
    const FIRST_ID: &'static str = "-9223372036854775808";

    fn days(settings: &ExpirySettings) -> i32 {
        settings.conversation_events_days
    }
}
