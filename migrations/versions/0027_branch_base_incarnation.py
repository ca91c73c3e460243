"""A branch names its base by id *and* incarnation (issue 58 item 2): ``agent_sessions.base_incarnation``.

Every walk of a chain of bases (db/chains.py ``base_of``) follows a branch's ``base_id`` only to the session of that
id that was there when the branch was made (its ``incarnation``), of the branch's own user. A base whose id was
freed (deleted, expired, purged, erased) and taken again, by anyone, is not read as the branch's history: the walk
stops there and the read is refused with a typed error, never a history of another session.

Existing branches get their base's incarnation now; one whose base is already gone gets -1, which no session has
(incarnations are 62-bit stamps, 0 on rows from before 0004), so a later session of that id is never its base.

The column only adds: code at 0026 runs here (``oldest_code`` is left as it is); a branch that code makes during a
rollout has no incarnation and is checked by id and user only.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BACKFILL = """UPDATE agent_sessions SET base_incarnation = COALESCE((
    SELECT b.incarnation FROM agent_sessions b WHERE b.id = agent_sessions.base_id
      AND (b.user_id = agent_sessions.user_id OR (b.user_id IS NULL AND agent_sessions.user_id IS NULL))), -1)
WHERE base_id IS NOT NULL"""


def upgrade() -> None:
    # A plain ADD COLUMN on both (no table rebuild on SQLite): the agent_transcript view stays as it is.
    op.add_column("agent_sessions", sa.Column("base_incarnation", sa.BigInteger(), nullable=True))
    op.execute(_BACKFILL)


def downgrade() -> None:
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_column("base_incarnation")
