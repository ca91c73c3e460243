"""Sessions, messages, state and the run log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# JSONB on PostgreSQL; UTF-8 JSON text on SQLite (readable, and LIKE finds words in it).
JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)
ID = sa.String(255)


def _session_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["session_id"], ["agent_sessions.id"], ondelete="CASCADE", name=op.f(f"fk_{table}_session_id_agent_sessions")
    )


def upgrade() -> None:
    op.create_table(
        "agent_sessions",
        sa.Column("id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=True),
        sa.Column("agent_id", ID, nullable=True),
        sa.Column("service_session_id", JSON_DOC, nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("next_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_sessions")),
    )
    op.create_index(op.f("ix_agent_sessions_user_id_updated_at"), "agent_sessions", ["user_id", "updated_at"])
    op.create_table(
        "agent_messages",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("message_id", ID, nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("author_name", ID, nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("body", JSON_DOC, nullable=False),
        _session_fk("agent_messages"),
        sa.PrimaryKeyConstraint("session_id", "seq", name=op.f("pk_agent_messages")),
    )
    op.create_index(
        op.f("ix_agent_messages_session_id_message_id"), "agent_messages", ["session_id", "message_id"], unique=True
    )
    op.create_table(
        "agent_state",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("key", ID, nullable=False),
        sa.Column("value", JSON_DOC, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        _session_fk("agent_state"),
        sa.PrimaryKeyConstraint("session_id", "key", name=op.f("pk_agent_state")),
    )
    op.create_table(
        "agent_runs",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("messages_written", sa.Integer(), nullable=False),
        sa.Column("state_keys_written", sa.Integer(), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("committed_at", TS, nullable=False),
        _session_fk("agent_runs"),
        sa.PrimaryKeyConstraint("session_id", "run_id", name=op.f("pk_agent_runs")),
    )


def downgrade() -> None:
    op.drop_table("agent_runs")
    op.drop_table("agent_state")
    op.drop_index(op.f("ix_agent_messages_session_id_message_id"), table_name="agent_messages")
    op.drop_table("agent_messages")
    op.drop_index(op.f("ix_agent_sessions_user_id_updated_at"), table_name="agent_sessions")
    op.drop_table("agent_sessions")
