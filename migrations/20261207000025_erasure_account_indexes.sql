-- What an account's erasure finds the agents' records and handoffs kept under the account
-- through, beside those of migration 19: its verification reads each table by every column
-- that links a row to the scope, one index read per column (RQ-5, RQ-8), and the account row
-- goes only once none is left. Without these, each erasure of an account, however small, read
-- the four tables whole. On a platform database, build them with CREATE INDEX CONCURRENTLY
-- first (docs/operating.md).
CREATE INDEX IF NOT EXISTS handoffs_account_id ON handoffs (account_id);
CREATE INDEX IF NOT EXISTS dream_preloads_account_id ON dream_preloads (account_id);
CREATE INDEX IF NOT EXISTS working_records_account_id ON working_records (account_id);
CREATE INDEX IF NOT EXISTS brain_memories_account_id ON brain_memories (account_id);
