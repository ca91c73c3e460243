"""Session lifecycle (title, metadata, close, expiry), a fuller run log, and the agent_transcript view.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)

# One row per message, with the session's user and the tool a message calls (or answers), for analysts.
TRANSCRIPT_VIEW = """
CREATE VIEW agent_transcript AS
SELECT m.session_id, s.user_id, m.seq, m.role, m.author_name, m.text,
       (SELECT MIN(t.tool_name) FROM agent_tool_calls t WHERE t.session_id = m.session_id AND t.seq = m.seq)
           AS tool_name,
       m.created_at
FROM agent_messages m JOIN agent_sessions s ON s.id = m.session_id
"""


def upgrade() -> None:
    with op.batch_alter_table("agent_sessions") as batch:
        batch.add_column(sa.Column("title", sa.String(512), nullable=True))
        batch.add_column(sa.Column("metadata", JSON_DOC, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("last_run_at", TS, nullable=True))
        batch.add_column(sa.Column("closed_at", TS, nullable=True))
        batch.add_column(sa.Column("ttl_seconds", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("expires_at", TS, nullable=True))
        batch.drop_index("ix_agent_sessions_user_id_updated_at")
        batch.create_index("ix_agent_sessions_user_id_updated_at_id", ["user_id", "updated_at", "id"])
        batch.create_index("ix_agent_sessions_updated_at_id", ["updated_at", "id"])
        batch.create_index("ix_agent_sessions_expires_at", ["expires_at"])
    with op.batch_alter_table("agent_runs") as batch:
        batch.add_column(sa.Column("agent_name", sa.String(255), nullable=True))
        batch.add_column(sa.Column("messages_in", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("messages_out", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("input_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("output_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("outcome", sa.String(32), nullable=False, server_default="committed"))
    op.execute(TRANSCRIPT_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW agent_transcript")
    with op.batch_alter_table("agent_runs") as batch:
        for column in ("outcome", "output_tokens", "input_tokens", "messages_out", "messages_in", "agent_name"):
            batch.drop_column(column)
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_index("ix_agent_sessions_expires_at")
        batch.drop_index("ix_agent_sessions_updated_at_id")
        batch.drop_index("ix_agent_sessions_user_id_updated_at_id")
        batch.create_index("ix_agent_sessions_user_id_updated_at", ["user_id", "updated_at"])
        for column in ("expires_at", "ttl_seconds", "closed_at", "last_run_at", "metadata", "title"):
            batch.drop_column(column)
