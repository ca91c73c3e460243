"""The erasure log is written only by moving a fence forward (issue 57 item 4): ``agent_store_erasure_fence(user)``
sets a user's ``erased_at`` to the server's clock, or keeps a later one, and is the one way ``erase_user`` writes
the log on PostgreSQL. Under row-level security it fences only the user the transaction names, and it keys the
line itself (a SHA-256 of the id): no one fences another user, or writes a line that is not a key. It runs as the
migration's role (SECURITY DEFINER), so the application's role needs no INSERT, UPDATE or DELETE on
``agent_erasures`` (docs/row-security.md revokes them): plain SQL under it can no
longer delete, back-date or rewrite a user's erasure, which a restore of an older backup and the fence rely on.
Re-applying a log and trimming it stay operator work (roles that bypass row-level security).

Code at 0025 writes the table itself, which works wherever the revokes are not made: ``oldest_code`` is left as
it is. SQLite has no roles: nothing is made there.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The user's own line only: under row-level security a role held to it fences the user its transaction names,
# never another (the policy's rule, kept by a function that runs past it; an operator's role bypasses it anyway).
# The key is made here, from the id, so nothing but a key is written. Only forward: GREATEST keeps a later fence;
# nothing deletes or moves one back.
_FENCE = """CREATE FUNCTION agent_store_erasure_fence(u text) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    named text := NULLIF(current_setting('agent_store.user_id', true), '');
    at timestamptz;
BEGIN
    IF u IS NULL OR u = '' THEN
        RAISE EXCEPTION 'agent_store_erasure_fence: a user id is required' USING ERRCODE = '22023';
    END IF;
    IF named IS DISTINCT FROM u AND (SELECT relrowsecurity FROM pg_class WHERE oid = 'agent_erasures'::regclass)
            AND NOT (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = session_user) THEN
        RAISE EXCEPTION 'agent_store_erasure_fence: a transaction fences only the user it names'
            USING ERRCODE = '42501';
    END IF;
    INSERT INTO agent_erasures (user_key, erased_at)
    VALUES (encode(sha256(convert_to(u, 'UTF8')), 'hex'), clock_timestamp())
    ON CONFLICT (user_key) DO UPDATE SET erased_at = GREATEST(agent_erasures.erased_at, EXCLUDED.erased_at)
    RETURNING erased_at INTO at;
    RETURN at;
END $$"""
# A definer's function resolves names in the schema it was made in, then pg_temp last (never a caller's temporary
# table first), and only the roles granted it may call it (docs/row-security.md grants the application's).
_PATH = """DO $$ BEGIN
    EXECUTE format('ALTER FUNCTION agent_store_erasure_fence(text) SET search_path = %I, pg_temp', current_schema());
END $$"""
_PRIVATE = "REVOKE EXECUTE ON FUNCTION agent_store_erasure_fence(text) FROM PUBLIC"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FENCE)
        op.execute(_PATH)
        op.execute(_PRIVATE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION agent_store_erasure_fence(text)")
