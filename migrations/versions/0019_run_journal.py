"""A run's journal: every event a streamed run sends, numbered per run, for a client that reconnects elsewhere.

- ``agent_streams``: a streamed run (partitioned by user, ``''`` for none): its status, its last sequence number,
  the worker writing it and its lease, a cancel asked, its expiry.
- ``agent_stream_events``: its events by sequence number (1, 2, 3, ... with no gap), JSON.

Only adds tables: code at 0018 runs unchanged on this schema.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
LIVE = sa.text("status = 'in_progress'")


def upgrade() -> None:
    op.create_table(
        "agent_streams",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("stream_id", sa.String(255), primary_key=True),
        sa.Column("conversation_id", sa.String(255), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_agent_streams_expires_at", "agent_streams", ["expires_at"])
    op.create_index("ix_agent_streams_live", "agent_streams", ["lease_until"], postgresql_where=LIVE,
                    sqlite_where=LIVE)  # fmt: skip
    op.create_table(
        "agent_stream_events",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("stream_id", sa.String(255), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("event", JSON_DOC, nullable=False),
        sa.ForeignKeyConstraint(["user_id", "stream_id"], ["agent_streams.user_id", "agent_streams.stream_id"],
                                ondelete="CASCADE"),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("agent_stream_events")
    op.drop_index("ix_agent_streams_live", "agent_streams")
    op.drop_index("ix_agent_streams_expires_at", "agent_streams")
    op.drop_table("agent_streams")
