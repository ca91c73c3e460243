"""The erasure log is written only by moving a fence forward (issue 57 item 4): ``agent_store_erasure_fence(key)``
sets a user's ``erased_at`` to the server's clock, or keeps a later one, and is the one way ``erase_user`` writes
the log on PostgreSQL. It runs as the migration's role (SECURITY DEFINER), so the application's role needs no
INSERT, UPDATE or DELETE on ``agent_erasures`` (docs/row-security.md revokes them): plain SQL under it can no
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

# search_path fixed at creation: a definer's function must not resolve names through its caller's path.
# Only forward: GREATEST keeps a later fence; no branch deletes or moves one back.
_FENCE = """CREATE FUNCTION agent_store_erasure_fence(k text) RETURNS timestamptz
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    INSERT INTO agent_erasures (user_key, erased_at) VALUES (k, clock_timestamp())
    ON CONFLICT (user_key) DO UPDATE SET erased_at = GREATEST(agent_erasures.erased_at, EXCLUDED.erased_at)
    RETURNING erased_at
$$"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FENCE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION agent_store_erasure_fence(text)")
