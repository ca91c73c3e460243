"""PostgreSQL: a run's commit in one round trip, ``agent_store_commit(jsonb)`` (SQLite: nothing changes).

The function is the common case of agent_store/run.py's checked commit, in the same order and under the same
locks, for a session that exists and that no other commit touched since the run loaded it. Whenever that is
not so it raises SQLSTATE ``AS000`` before anything is kept (the whole statement rolls back) and the client
takes the checked path, which names the precise error. See agent_store/fast_commit.py.

Why it is correct under READ COMMITTED: a plpgsql function takes a new snapshot for each statement, so every
check below reads what is committed *after* the lock it depends on was granted: the user's lock (``user:``
keys, the erasure fence), the session row's lock (taken by the UPDATE, whose WHERE is re-checked on the
newest row version: ``version`` unchanged means no commit wrote the session's own keys since the load), the
app's lock (``app:`` keys). A stamp that moved, a row that changed, a message id already stored: ``AS000``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COMMIT_FUNCTION = r"""
CREATE FUNCTION agent_store_commit(p jsonb) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    sid text := p->>'sid';
    now_ timestamptz := (p->>'now')::timestamptz;
    n integer := jsonb_array_length(p->'messages');
    bumped record;
BEGIN
    -- 0. A call built for another version of this function (an older or newer agent_store): the checked path.
    IF (p->>'format') IS DISTINCT FROM '1' THEN
        RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
    END IF;
    -- 1. The user's lock before any row lock (the one lock order), then the erasure fence.
    IF p ? 'user' THEN
        PERFORM pg_advisory_xact_lock(2, hashtext(p->>'uid'));
        IF EXISTS (SELECT 1 FROM agent_erasures
                   WHERE user_key = p->>'user_key' AND erased_at >= (p->>'since')::timestamptz) THEN
            RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
        END IF;
    END IF;
    -- 2. The session row: the same life of the id, this user and agent, open, no commit since the load.
    UPDATE agent_sessions SET
        version = version + 1, next_seq = next_seq + n, updated_at = now_, last_run_at = now_,
        expires_at = CASE WHEN ttl_seconds IS NULL THEN (p->>'default_expires')::timestamptz
                          ELSE now_ + make_interval(secs => ttl_seconds) END,
        service_session_id = CASE WHEN (p->>'ssid_changed')::boolean THEN nullif(p->'ssid', 'null'::jsonb)
                                  ELSE service_session_id END
    WHERE id = sid AND incarnation = (p->>'incarnation')::bigint AND version = (p->>'version')::integer
      AND closed_at IS NULL AND user_id IS NOT DISTINCT FROM p->>'uid'
      AND (agent_id IS NULL OR agent_id = p->>'agent')
      AND (NOT (p->>'ssid_changed')::boolean  -- a JSON null (stored for None before 0005) is no conversation
           OR coalesce(service_session_id, 'null'::jsonb) = coalesce(p->'loaded_ssid', 'null'::jsonb))
    RETURNING version, next_seq INTO bumped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
    END IF;
    -- 3. Shared keys: other sessions write them, so their stamps are checked (under the user's / app's lock).
    IF p ? 'app' THEN
        PERFORM pg_advisory_xact_lock(3, hashtext(p->>'app_id'));
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(coalesce(p->'user', '[]')) AS k(key text, loaded bigint)
               LEFT JOIN agent_user_state u ON u.user_id = p->>'uid' AND u.key = k.key
               WHERE u.version IS DISTINCT FROM k.loaded)
    OR EXISTS (SELECT 1 FROM jsonb_to_recordset(coalesce(p->'app', '[]')) AS k(key text, loaded bigint)
               LEFT JOIN agent_app_state a ON a.app_id = p->>'app_id' AND a.key = k.key
               WHERE a.version IS DISTINCT FROM k.loaded) THEN
        RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
    END IF;
    -- 4. State, scope by scope: deletes, then upserts stamped with this commit's stamp. (Elements are read with
    --    e->'value', which keeps a JSON null a JSON null.)
{state_writes}    -- 5. Messages at the seq numbers the bump reserved, their tool calls, and the run log.
    IF n > 0 THEN
        -- An id already stored: the checked path says which. (No other commit of this session can insert
        -- meanwhile: every one holds the session row's lock, as this one does from step 2 on.)
        IF EXISTS (SELECT 1 FROM agent_messages WHERE session_id = sid AND message_id IN (
                   SELECT e->>'message_id' FROM jsonb_array_elements(p->'messages') e)) THEN
            RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
        END IF;
        INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at, body)
            SELECT sid, bumped.next_seq - n + m.i, m.message_id, p->>'run_id', m.role, m.author_name, m.text, now_,
                   m.body
            FROM jsonb_to_recordset(p->'messages')
                AS m(i integer, message_id text, role text, author_name text, text text, body jsonb);
    END IF;
    IF p ? 'tools' THEN
        INSERT INTO agent_tool_calls (session_id, seq, call_id, kind, tool_name)
            SELECT sid, bumped.next_seq - n + t.i, t.call_id, t.kind,
                   coalesce(t.tool_name, (SELECT c.tool_name FROM agent_tool_calls c WHERE c.session_id = sid
                                          AND c.call_id = t.call_id AND c.kind = 'call' LIMIT 1))
            FROM jsonb_to_recordset(p->'tools') AS t(i integer, call_id text, kind text, tool_name text);
    END IF;
    INSERT INTO agent_runs (session_id, run_id, version, messages_written, state_keys_written, started_at,
                            committed_at, agent_name, messages_in, messages_out, input_tokens, output_tokens, outcome)
        SELECT sid, p->>'run_id', bumped.version, n, r.state_keys_written, r.started_at, r.committed_at,
               r.agent_name, r.messages_in, r.messages_out, r.input_tokens, r.output_tokens, 'committed'
        FROM jsonb_to_record(p->'log') AS r(state_keys_written integer, started_at timestamptz,
             committed_at timestamptz, agent_name text, messages_in integer, messages_out integer,
             input_tokens integer, output_tokens integer);
    RETURN bumped.version;
END
$$
"""


# Step 4 for each scope: the payload's part, its table, the owner column and the owner's value.
_SCOPE_WRITES = r"""    IF p ? '{part}' THEN
        DELETE FROM {table} WHERE {owner} = {value} AND key IN (
            SELECT e->>'key' FROM jsonb_array_elements(p->'{part}') e WHERE (e->>'del')::boolean);
        INSERT INTO {table} ({owner}, key, value, version, updated_at)
            SELECT {value}, e->>'key', e->'value', (p->>'stamp')::bigint, now_
            FROM jsonb_array_elements(p->'{part}') e WHERE NOT (e->>'del')::boolean
        ON CONFLICT ({owner}, key) DO UPDATE
            SET value = excluded.value, version = excluded.version, updated_at = excluded.updated_at;
    END IF;
"""
_SCOPES = [
    ("own", "agent_state", "session_id", "sid"),
    ("user", "agent_user_state", "user_id", "p->>'uid'"),
    ("app", "agent_app_state", "app_id", "p->>'app_id'"),
]
COMMIT_FUNCTION = _COMMIT_FUNCTION.replace(
    "{state_writes}",
    "".join(
        _SCOPE_WRITES.format(part=part, table=table, owner=owner, value=value) for part, table, owner, value in _SCOPES
    ),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(COMMIT_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS agent_store_commit(jsonb)")
