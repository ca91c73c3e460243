"""Tool calls as rows; user- and app-scoped state (long-term memory shared across sessions).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)
ID = sa.String(255)


def upgrade() -> None:
    op.create_table(
        "agent_tool_calls",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("call_id", ID, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("tool_name", ID, nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id", "seq"],
            ["agent_messages.session_id", "agent_messages.seq"],
            ondelete="CASCADE",
            name=op.f("fk_agent_tool_calls_session_id_agent_messages"),
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", "call_id", name=op.f("pk_agent_tool_calls")),
    )
    op.create_index(op.f("ix_agent_tool_calls_session_id_call_id"), "agent_tool_calls", ["session_id", "call_id"])
    for table, owner in (("agent_user_state", "user_id"), ("agent_app_state", "app_id")):
        op.create_table(
            table,
            sa.Column(owner, ID, nullable=False),
            sa.Column("key", ID, nullable=False),
            sa.Column("value", JSON_DOC, nullable=False),
            sa.Column("version", sa.BigInteger(), nullable=False),
            sa.Column("updated_at", TS, nullable=False),
            sa.PrimaryKeyConstraint(owner, "key", name=op.f(f"pk_{table}")),
        )


def downgrade() -> None:
    op.drop_table("agent_app_state")
    op.drop_table("agent_user_state")
    op.drop_index(op.f("ix_agent_tool_calls_session_id_call_id"), table_name="agent_tool_calls")
    op.drop_table("agent_tool_calls")
