"""A Responses server's store: response envelopes, their items stored once, history read through the chain.

``azure-ai-agentserver-responses`` (``ResponsesAgentServerHost(store=...)``) keeps responses through a
``ResponseProviderProtocol``; agent_store's (agent_store/agentserver/responses.py) keeps them here, partitioned by
the request's user (``""``: a request that names none).

- ``agent_hosted_responses``: the envelope without its output items; a response whose history is the end of
  another's history, input and output (``history_from``, ``history_skip``, ``history_len``) stores no history rows.
- ``agent_hosted_items``: every input and output item once per user, by id.
- ``agent_hosted_links``: a response's items in order (``h`` history it could not point at, ``i`` input, ``o``
  output).

- ``agent_responses.moves``: the key names its session's head and moves with it (a conversation id that
  agent-framework-foundry-hosting keeps beside the session's own id), instead of a point that never changes.

Only adds (tables, a column with a default): code at 0017 runs unchanged on this schema.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("agent_responses", sa.Column("moves", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "agent_hosted_responses",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("response_id", sa.String(255), primary_key=True),
        sa.Column("conversation_id", sa.String(255), nullable=True),
        sa.Column("previous_id", sa.String(255), nullable=True),
        sa.Column("status", sa.String(64), nullable=True),
        sa.Column("envelope", JSON_DOC, nullable=False),
        sa.Column("history_from", sa.String(255), nullable=True),
        sa.Column("history_skip", sa.Integer(), nullable=False),
        sa.Column("history_len", sa.Integer(), nullable=False),
        sa.Column("created_seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_agent_hosted_responses_conversation", "agent_hosted_responses",
                    ["user_id", "conversation_id", "created_seq"])  # fmt: skip
    op.create_index("ix_agent_hosted_responses_history_from", "agent_hosted_responses", ["user_id", "history_from"])
    op.create_table(
        "agent_hosted_items",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("item_id", sa.String(255), primary_key=True),
        sa.Column("type", sa.String(64), nullable=True),
        sa.Column("body", JSON_DOC, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "agent_hosted_links",
        sa.Column("user_id", sa.String(255), primary_key=True),
        sa.Column("response_id", sa.String(255), primary_key=True),
        sa.Column("kind", sa.String(1), primary_key=True),
        sa.Column("pos", sa.Integer(), primary_key=True),
        sa.Column("item_id", sa.String(255), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id", "response_id"],
            ["agent_hosted_responses.user_id", "agent_hosted_responses.response_id"],
            ondelete="CASCADE",
        ),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("agent_hosted_links")
    op.drop_table("agent_hosted_items")
    op.drop_index("ix_agent_hosted_responses_history_from", "agent_hosted_responses")
    op.drop_index("ix_agent_hosted_responses_conversation", "agent_hosted_responses")
    op.drop_table("agent_hosted_responses")
    op.drop_column("agent_responses", "moves")
