"""Row-level security on PostgreSQL, opt-in (issue 41): a policy on every table that holds a user's data, and
``agent_store_row_security(on)``, the switch that enables (and forces) or disables them (``agent-store rls``).

Each policy admits the rows of the user (and app) that the transaction names with
``set_config('agent_store.user_id', ..., true)`` (and ``agent_store.app_id``): agent_store sets both at the start
of each transaction once the switch is on (db/tenancy.py); a transaction that names no one sees no rows. The
setting is read as ``(SELECT NULLIF(current_setting(...), ''))``: evaluated once per statement, not per row,
and empty is no one (a setting made earlier on a connection reads as empty, not as missing, after its
transaction; and the rows the store keeps for "no user" have an empty user id). Tables keyed by
session admit the rows of the named user's sessions (through ``agent_sessions``' primary key).

Views become security invokers' (they read as whoever queries them, so the policies apply to them too).
The migration only creates policies and the switch; until the switch is on they do nothing, so code at 0023 runs
unchanged (``oldest_code`` is left as it is). SQLite has no row-level security: nothing is made there.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The switch: every table a policy covers, enabled and forced (the tables' owner is held to them too), or not.
_SWITCH = """CREATE FUNCTION agent_store_row_security(enabled boolean) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['agent_sessions', 'agent_messages', 'agent_message_marks', 'agent_branch_marks',
        'agent_runs', 'agent_state', 'agent_state_history', 'agent_tool_calls', 'agent_message_vectors',
        'agent_responses', 'agent_user_state', 'agent_app_state', 'agent_usage', 'agent_usage_budgets',
        'agent_checkpoints', 'agent_checkpoint_workflows', 'agent_ui_snapshots', 'agent_streams',
        'agent_stream_events', 'agent_hosted_responses', 'agent_hosted_items', 'agent_hosted_links',
        'agent_erasures'] LOOP
        IF enabled THEN
            EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY', t);
        ELSE
            EXECUTE format('ALTER TABLE %I DISABLE ROW LEVEL SECURITY, NO FORCE ROW LEVEL SECURITY', t);
        END IF;
    END LOOP;
END $$"""

# One policy a table, FOR ALL: the rows it admits are the rows that can be read, changed or written.
_POLICIES = """DO $$
DECLARE
    t text;
BEGIN
    CREATE POLICY agent_store_tenant ON agent_sessions
        USING (user_id = (SELECT NULLIF(current_setting('agent_store.user_id', true), '')));
    FOREACH t IN ARRAY ARRAY['agent_messages', 'agent_message_marks', 'agent_branch_marks', 'agent_runs',
        'agent_state', 'agent_state_history', 'agent_tool_calls', 'agent_message_vectors', 'agent_responses'] LOOP
        EXECUTE format('CREATE POLICY agent_store_tenant ON %I USING (EXISTS (SELECT 1 FROM agent_sessions s '
            'WHERE s.id = %I.session_id '
            'AND s.user_id = (SELECT NULLIF(current_setting(''agent_store.user_id'', true), ''''))))', t, t);
    END LOOP;
    FOREACH t IN ARRAY ARRAY['agent_user_state', 'agent_checkpoints', 'agent_checkpoint_workflows',
        'agent_streams', 'agent_stream_events', 'agent_hosted_responses', 'agent_hosted_items',
        'agent_hosted_links'] LOOP
        EXECUTE format('CREATE POLICY agent_store_tenant ON %I '
            'USING (user_id = (SELECT NULLIF(current_setting(''agent_store.user_id'', true), '''')))',
            t);
    END LOOP;
    CREATE POLICY agent_store_tenant ON agent_app_state
        USING (app_id = (SELECT NULLIF(current_setting('agent_store.app_id', true), '')));
    -- A ledger row is written only onto a run of the named user's own session: its foreign key's check reads
    -- agent_runs past the policies, so without this a user could hang rows on (and charge) another's run.
    CREATE POLICY agent_store_tenant ON agent_usage
        USING (user_id = (SELECT NULLIF(current_setting('agent_store.user_id', true), ''))
               AND app_id = (SELECT NULLIF(current_setting('agent_store.app_id', true), '')))
        WITH CHECK (user_id = (SELECT NULLIF(current_setting('agent_store.user_id', true), ''))
               AND app_id = (SELECT NULLIF(current_setting('agent_store.app_id', true), ''))
               AND EXISTS (SELECT 1 FROM agent_sessions s WHERE s.id = agent_usage.session_id
                           AND s.user_id = (SELECT NULLIF(current_setting('agent_store.user_id', true), ''))));
    CREATE POLICY agent_store_tenant ON agent_usage_budgets
        USING ((scope = 'user' AND subject = (SELECT NULLIF(current_setting('agent_store.user_id', true), '')))
               OR (scope = 'app' AND subject = (SELECT NULLIF(current_setting('agent_store.app_id', true), ''))));
    CREATE POLICY agent_store_tenant ON agent_ui_snapshots
        USING (scope = (SELECT NULLIF(current_setting('agent_store.user_id', true), '')));
    -- The erasure fence: a user's own line only (its key is the id's SHA-256, db/erasures.py).
    CREATE POLICY agent_store_tenant ON agent_erasures
        USING (user_key = (SELECT encode(sha256(convert_to(
            NULLIF(current_setting('agent_store.user_id', true), ''), 'UTF8')), 'hex')));
END $$"""

# The one-round-trip commit, naming its user first in the same statement (its own transaction): the name is
# transaction-local, so it ends with the call. SECURITY INVOKER, as every function here: the policies hold.
_COMMIT_AS = """CREATE FUNCTION agent_store_commit_as(u text, a text, p jsonb) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('agent_store.user_id', u, true), set_config('agent_store.app_id', a, true);
    RETURN agent_store_commit(p);
END $$"""
_COMMIT_USAGE_AS = """CREATE FUNCTION agent_store_commit_usage_as(u text, a text, p jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('agent_store.user_id', u, true), set_config('agent_store.app_id', a, true);
    RETURN agent_store_commit_usage(p);
END $$"""

_DROP = """DO $$
DECLARE
    t text;
BEGIN
    PERFORM agent_store_row_security(false);
    FOR t IN SELECT tablename FROM pg_policies WHERE policyname = 'agent_store_tenant' AND schemaname = current_schema()
    LOOP
        EXECUTE format('DROP POLICY agent_store_tenant ON %I', t);
    END LOOP;
END $$"""


# A view reads its tables as its owner unless it is a security invoker's: owned by the operator's role (which
# bypasses the policies), each would show every user's rows to anyone allowed to read it.
_INVOKER = ["ALTER VIEW agent_transcript SET (security_invoker = true)",
            "ALTER VIEW agent_model_view SET (security_invoker = true)",
            "ALTER VIEW agent_usage_daily SET (security_invoker = true)"]  # fmt: skip
_DEFINER = ["ALTER VIEW agent_transcript RESET (security_invoker)",
            "ALTER VIEW agent_model_view RESET (security_invoker)",
            "ALTER VIEW agent_usage_daily RESET (security_invoker)"]  # fmt: skip


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_SWITCH)
        op.execute(_POLICIES)
        op.execute(_COMMIT_AS)
        op.execute(_COMMIT_USAGE_AS)
        for statement in _INVOKER:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in _DEFINER:
            op.execute(statement)
        op.execute(_DROP)
        op.execute("DROP FUNCTION agent_store_row_security(boolean)")
        op.execute("DROP FUNCTION agent_store_commit_as(text, text, jsonb)")
        op.execute("DROP FUNCTION agent_store_commit_usage_as(text, text, jsonb)")
