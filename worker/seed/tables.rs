//! The tables the seed writes: one [`CopyTable`] buffer each, with the columns it fills, in
//! foreign-key order (the order they are flushed in).

use super::copy::CopyTable;

/// Declares [`Tables`] from one list, so that a table's buffer, its columns and its place in
/// the flush order are written once. Each field is named after its table.
macro_rules! tables {
    ($($table:ident: $columns:literal,)*) => {
        /// One buffer per table, in foreign-key order.
        pub(super) struct Tables {
            $(pub(super) $table: CopyTable,)*
        }

        impl Tables {
            pub(super) fn new() -> Self {
                Self {
                    $($table: CopyTable::new(stringify!($table), $columns),)*
                }
            }

            /// Every buffer, parents before children.
            pub(super) fn in_order(&mut self) -> impl Iterator<Item = &mut CopyTable> {
                [$(&mut self.$table,)*].into_iter()
            }
        }
    };
}

tables! {
    accounts: "id, name, execution_details_retention_days, created_at",
    session_retention_policies: "account_id, enabled, main_days, task_days, subagent_days",
    conversations: "id, account_id, forked_from_conversation_id, forked_at_position, \
                    usage_summary, created_at",
    turns: "id, conversation_id, position, created_at",
    variants: "id, turn_id, prompt, requested_model, final_content, selected, created_at",
    fragments: "id, account_id, content, created_at",
    follow_ups: "id, variant_id, position, landed_at, body",
    runs: "id, account_id, conversation_id, variant_id, parent_run_id, kind, status, \
           requested_model, terminal_model, delivered_at, completed_at, terminal_at, \
           settled_at, created_at",
    run_tasks: "id, run_id, parent_task_id, name, status, input, output",
    run_task_edges: "run_id, from_task_id, to_task_id",
    tool_results: "id, run_id, task_id, tool_name, body",
    sealed_requests: "id, run_id, provider, request, response, sealed_at",
    reasoning_traces: "id, run_id, content",
    invocation_attempts: "id, run_id, attempt, status, started_at, ended_at",
    output_files: "id, run_id, relative_path, bytes",
    settlement_receipts: "id, run_id, status, created_at, settled_at",
    delegations: "id, parent_run_id, child_run_id, status, created_at",
    history_requests: "id, conversation_id, run_id, sealed_at, created_at",
    history_request_sources: "history_request_id, source_run_id",
    usage_records: "id, account_id, run_id, conversation_id, tokens, cost_micros, created_at",
    conversation_events: "id, conversation_id, run_id, kind, payload, created_at",
    agents: "id, account_id, name, current_session_id, main_session_id, default_session_id",
    sessions: "id, account_id, agent_id, kind, state, metadata, last_activity_at, created_at",
    board_tasks: "id, account_id, status, terminal_at",
    conversation_entries: "id, session_id, entry_id, seq, idempotency_key, payload, created_at",
    conversation_archives: "id, session_id, kind, generation, created_at",
    conversation_archive_entries: "archive_id, entry_id, seq, payload",
    handoffs: "id, account_id, agent_id, from_session_id, to_session_id, payload, created_at",
    dream_preloads: "id, account_id, agent_id, payload, created_at",
    working_records: "id, account_id, agent_id, kind, pinned, body, updated_at",
    brain_memories: "id, account_id, agent_id, revision, body, deleted_at",
    attachments: "id, account_id, relative_path, bytes, created_at",
}
