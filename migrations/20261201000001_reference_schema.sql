-- The platform's reference schema (SPEC §1): the tables sexton reads and prunes.
--
-- The platform owns these tables. This migration creates them for development, tests, demos and
-- benchmarks; against an existing platform database every statement is a no-op for what already
-- exists (IF NOT EXISTS), so only what is missing is added.
--
-- Defaults follow the contract: ids default to random uuids, created_at/sealed_at/started_at/
-- updated_at to now(), booleans to false, jsonb metadata/payload/body to {}. Status columns of
-- the tables that can hold a run back default to their settled state (an attempt `succeeded`, a
-- receipt `settled`, a delegation `returned`), so a row inserted without naming its status never
-- holds a run back by accident; a test about a blocker names the blocking status.

-- 1.1 Accounts and conversations -------------------------------------------------------------

CREATE TABLE IF NOT EXISTS accounts (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name text NOT NULL DEFAULT '',
    execution_details_retention_days integer DEFAULT 90
        CONSTRAINT accounts_execution_details_retention_days_positive
        CHECK (execution_details_retention_days > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS conversations (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    forked_from_conversation_id uuid REFERENCES conversations (id) ON DELETE SET NULL,
    forked_at_position integer,
    usage_summary jsonb NOT NULL DEFAULT '{"tokens":0,"cost_micros":0}',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS conversations_account_id ON conversations (account_id);
CREATE INDEX IF NOT EXISTS conversations_forked_from ON conversations (forked_from_conversation_id)
    WHERE forked_from_conversation_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS turns (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    conversation_id uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (conversation_id, position)
);

CREATE TABLE IF NOT EXISTS variants (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    turn_id uuid NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    prompt text NOT NULL DEFAULT '',
    requested_model text NOT NULL DEFAULT '',
    final_content text,
    selected boolean NOT NULL DEFAULT false,
    details_pruned_at timestamptz,
    runner_effects jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS variants_turn_id ON variants (turn_id);

CREATE TABLE IF NOT EXISTS follow_ups (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    variant_id uuid NOT NULL REFERENCES variants (id) ON DELETE CASCADE,
    position integer NOT NULL DEFAULT 0,
    landed_at timestamptz,
    body jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS follow_ups_variant_id ON follow_ups (variant_id, position);

CREATE TABLE IF NOT EXISTS fragments (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    content text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS fragments_account_id ON fragments (account_id);

CREATE TABLE IF NOT EXISTS runs (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    conversation_id uuid REFERENCES conversations (id) ON DELETE CASCADE,
    variant_id uuid REFERENCES variants (id) ON DELETE SET NULL,
    parent_run_id uuid REFERENCES runs (id) ON DELETE SET NULL,
    kind text NOT NULL DEFAULT 'conversation'
        CHECK (kind IN ('conversation', 'direct_reply', 'standalone', 'inference')),
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    requested_model text NOT NULL DEFAULT '',
    terminal_model text,
    delivered_at timestamptz,
    completed_at timestamptz,
    terminal_at timestamptz,
    settled_at timestamptz,
    details_pruned_at timestamptz,
    runner_effects jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS runs_conversation_id ON runs (conversation_id);
CREATE INDEX IF NOT EXISTS runs_variant_id ON runs (variant_id) WHERE variant_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_parent_run_id ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_account_id ON runs (account_id);

-- Execution detail (EX-3): every table is reached by run_id.

CREATE TABLE IF NOT EXISTS run_tasks (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    parent_task_id uuid,
    name text NOT NULL DEFAULT '',
    status text NOT NULL DEFAULT 'completed',
    input jsonb,
    output jsonb
);
CREATE INDEX IF NOT EXISTS run_tasks_run_id ON run_tasks (run_id);

CREATE TABLE IF NOT EXISTS run_task_edges (
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    from_task_id uuid NOT NULL,
    to_task_id uuid NOT NULL
);
CREATE INDEX IF NOT EXISTS run_task_edges_run_id ON run_task_edges (run_id);

CREATE TABLE IF NOT EXISTS tool_results (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    task_id uuid,
    tool_name text NOT NULL DEFAULT '',
    body text NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS tool_results_run_id ON tool_results (run_id);

CREATE TABLE IF NOT EXISTS sealed_requests (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    provider text NOT NULL DEFAULT '',
    request jsonb NOT NULL DEFAULT '{}',
    response jsonb,
    sealed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS sealed_requests_run_id ON sealed_requests (run_id);

CREATE TABLE IF NOT EXISTS reasoning_traces (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    content text NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS reasoning_traces_run_id ON reasoning_traces (run_id);

CREATE TABLE IF NOT EXISTS invocation_attempts (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    attempt integer NOT NULL DEFAULT 1,
    status text NOT NULL DEFAULT 'succeeded'
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed')),
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz
);
CREATE INDEX IF NOT EXISTS invocation_attempts_run_id ON invocation_attempts (run_id);

CREATE TABLE IF NOT EXISTS output_files (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    relative_path text NOT NULL,
    bytes bigint NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS output_files_run_id ON output_files (run_id);

-- What holds a run back (EX-5).

CREATE TABLE IF NOT EXISTS settlement_receipts (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    status text NOT NULL DEFAULT 'settled' CHECK (status IN ('pending', 'settled')),
    created_at timestamptz NOT NULL DEFAULT now(),
    settled_at timestamptz
);
CREATE INDEX IF NOT EXISTS settlement_receipts_pending ON settlement_receipts (run_id)
    WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS settlement_receipts_run_id ON settlement_receipts (run_id);

CREATE TABLE IF NOT EXISTS delegations (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    parent_run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    child_run_id uuid REFERENCES runs (id) ON DELETE SET NULL,
    status text NOT NULL DEFAULT 'returned'
        CHECK (status IN ('outstanding', 'returned', 'abandoned')),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS delegations_parent_run_id ON delegations (parent_run_id);
CREATE INDEX IF NOT EXISTS delegations_child_run_id ON delegations (child_run_id)
    WHERE child_run_id IS NOT NULL;

-- history_requests.sealed_at defaults to now() as the contract says; an active (unsealed) first
-- round is written with sealed_at NULL.
CREATE TABLE IF NOT EXISTS history_requests (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    conversation_id uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    sealed_at timestamptz DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS history_requests_active ON history_requests (id) WHERE sealed_at IS NULL;
CREATE INDEX IF NOT EXISTS history_requests_conversation_id ON history_requests (conversation_id);
CREATE INDEX IF NOT EXISTS history_requests_run_id ON history_requests (run_id);

CREATE TABLE IF NOT EXISTS history_request_sources (
    history_request_id uuid NOT NULL REFERENCES history_requests (id) ON DELETE CASCADE,
    source_run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    PRIMARY KEY (history_request_id, source_run_id)
);
CREATE INDEX IF NOT EXISTS history_request_sources_source_run_id
    ON history_request_sources (source_run_id);

-- Never touched by execution retention. usage_records keep their own billing lifetime: no
-- foreign key to runs or conversations, so nothing there can ever cascade into them.

CREATE TABLE IF NOT EXISTS usage_records (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    run_id uuid,
    conversation_id uuid,
    tokens bigint NOT NULL DEFAULT 0,
    cost_micros bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS usage_records_account_id ON usage_records (account_id, created_at);

CREATE TABLE IF NOT EXISTS conversation_events (
    id bigserial PRIMARY KEY,
    conversation_id uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    run_id uuid,
    kind text NOT NULL DEFAULT '',
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS conversation_events_created_at ON conversation_events (created_at, id);
CREATE INDEX IF NOT EXISTS conversation_events_conversation_id ON conversation_events (conversation_id);

-- 1.2 Agents, sessions and history -----------------------------------------------------------

-- The agents' session pointers carry no foreign key: the platform writes agents and their
-- sessions in either order, and SS-3 protects every pointed-at session from deletion.
CREATE TABLE IF NOT EXISTS agents (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name text NOT NULL DEFAULT '',
    current_session_id uuid,
    main_session_id uuid,
    default_session_id uuid
);
CREATE INDEX IF NOT EXISTS agents_account_id ON agents (account_id);
CREATE INDEX IF NOT EXISTS agents_current_session_id ON agents (current_session_id);
CREATE INDEX IF NOT EXISTS agents_main_session_id ON agents (main_session_id);
CREATE INDEX IF NOT EXISTS agents_default_session_id ON agents (default_session_id);

CREATE TABLE IF NOT EXISTS sessions (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    agent_id uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    kind text NOT NULL DEFAULT 'main' CHECK (kind IN ('main', 'task', 'subagent')),
    state text NOT NULL DEFAULT 'idle'
        CHECK (state IN ('active', 'idle', 'running', 'finalizing', 'completed', 'failed', 'cancelled')),
    metadata jsonb NOT NULL DEFAULT '{}',
    last_activity_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS sessions_retention ON sessions (account_id, kind, last_activity_at);
CREATE INDEX IF NOT EXISTS sessions_agent_id ON sessions (agent_id);

CREATE TABLE IF NOT EXISTS board_tasks (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    status text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'in_progress', 'done', 'cancelled')),
    terminal_at timestamptz
);

CREATE TABLE IF NOT EXISTS session_retention_policies (
    account_id uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    enabled boolean NOT NULL DEFAULT false,
    main_days integer CHECK (main_days > 0),
    task_days integer CHECK (task_days > 0),
    subagent_days integer CHECK (subagent_days > 0)
);

CREATE TABLE IF NOT EXISTS conversation_entries (
    id bigserial PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    entry_id text NOT NULL,
    seq bigint NOT NULL DEFAULT 0,
    idempotency_key text,
    payload json NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, entry_id)
);

CREATE TABLE IF NOT EXISTS conversation_archives (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    session_id uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    kind text NOT NULL DEFAULT 'compaction' CHECK (kind IN ('compaction', 'reset')),
    generation integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS conversation_archives_session_id ON conversation_archives (session_id);

CREATE TABLE IF NOT EXISTS conversation_archive_entries (
    archive_id uuid NOT NULL REFERENCES conversation_archives (id) ON DELETE CASCADE,
    entry_id text NOT NULL,
    seq bigint NOT NULL DEFAULT 0,
    payload json NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS conversation_archive_entries_archive_id
    ON conversation_archive_entries (archive_id);

CREATE TABLE IF NOT EXISTS handoffs (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    agent_id uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    from_session_id uuid REFERENCES sessions (id) ON DELETE SET NULL,
    to_session_id uuid REFERENCES sessions (id) ON DELETE SET NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS handoffs_created_at ON handoffs (created_at, id);
CREATE INDEX IF NOT EXISTS handoffs_from_session_id ON handoffs (from_session_id);
CREATE INDEX IF NOT EXISTS handoffs_to_session_id ON handoffs (to_session_id);

CREATE TABLE IF NOT EXISTS dream_preloads (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    agent_id uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS dream_preloads_created_at ON dream_preloads (created_at, id);

CREATE TABLE IF NOT EXISTS working_records (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    agent_id uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    kind text NOT NULL DEFAULT 'record' CHECK (kind IN ('record', 'card')),
    pinned boolean NOT NULL DEFAULT false,
    body jsonb NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS working_records_expiry ON working_records (updated_at, id) WHERE NOT pinned;

CREATE TABLE IF NOT EXISTS brain_memories (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    agent_id uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    revision integer NOT NULL DEFAULT 1,
    body jsonb NOT NULL DEFAULT '{}',
    deleted_at timestamptz
);

CREATE TABLE IF NOT EXISTS attachments (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    relative_path text NOT NULL,
    bytes bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    bytes_expired_at timestamptz
);
CREATE INDEX IF NOT EXISTS attachments_live ON attachments (created_at, id) WHERE bytes_expired_at IS NULL;
