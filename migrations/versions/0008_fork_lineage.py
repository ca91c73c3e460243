"""Fork lineage: a forked session names the session and message it was branched from.

``forked_from`` / ``forked_at_seq`` are set by ``Store.fork`` (NULL for every other session, and for forks made
before this revision); a partial index finds a session's branches without reading the table.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FORKED = sa.text("forked_from IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("agent_sessions") as batch:
        batch.add_column(sa.Column("forked_from", sa.String(255), nullable=True))
        batch.add_column(sa.Column("forked_at_seq", sa.Integer(), nullable=True))
    op.create_index("ix_agent_sessions_forked_from", "agent_sessions", ["forked_from"],
                    postgresql_where=_FORKED, sqlite_where=_FORKED)  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_agent_sessions_forked_from", table_name="agent_sessions")
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_column("forked_at_seq")
        batch.drop_column("forked_from")
