"""Workflow checkpoints and AG-UI thread snapshots, in the same database as the sessions.

- ``agent_checkpoints``: one row per checkpoint, its payload as the framework's checkpoint encoding produced it
  (PostgreSQL ``json``: kept as written), keyed by (user_id, checkpoint_id): each user has a namespace of their own.
- ``agent_checkpoint_workflows``: the next sequence number of one user's workflow; saves take its row lock, so
  a workflow's checkpoints are numbered in commit order.
- ``agent_ui_snapshots``: the latest AG-UI thread snapshot per (scope, thread_id) (the ``ag-ui`` extra).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A checkpoint's payload (and an AG-UI snapshot) must come back exactly as written: json keeps the text (key order, 1e20
# as a float); jsonb would normalize both.
EXACT_JSON = sa.Text().with_variant(postgresql.JSON(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "agent_checkpoints",
        sa.Column("user_id", sa.String(255), nullable=False),
        sa.Column("checkpoint_id", sa.String(255), nullable=False),
        sa.Column("workflow_name", sa.String(255), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("previous_checkpoint_id", sa.String(255), nullable=True),
        sa.Column("timestamp", sa.String(64), nullable=False),
        sa.Column("iteration_count", sa.Integer(), nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", EXACT_JSON, nullable=False),
        sa.PrimaryKeyConstraint("user_id", "checkpoint_id", name="pk_agent_checkpoints"),
    )
    op.create_index(
        "ix_agent_checkpoints_user_id_workflow_name_seq",
        "agent_checkpoints",
        ["user_id", "workflow_name", "seq"],
        unique=True,
    )
    op.create_index(
        "ix_agent_checkpoints_user_id_previous_checkpoint_id",
        "agent_checkpoints",
        ["user_id", "previous_checkpoint_id"],
    )
    op.create_index("ix_agent_checkpoints_saved_at", "agent_checkpoints", ["saved_at"])
    op.create_table(
        "agent_checkpoint_workflows",
        sa.Column("user_id", sa.String(255), nullable=False),
        sa.Column("workflow_name", sa.String(255), nullable=False),
        sa.Column("next_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "workflow_name", name="pk_agent_checkpoint_workflows"),
    )
    op.create_table(
        "agent_ui_snapshots",
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("thread_id", sa.String(255), nullable=False),
        sa.Column("snapshot", EXACT_JSON, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "thread_id", name="pk_agent_ui_snapshots"),
    )


def downgrade() -> None:
    op.drop_table("agent_ui_snapshots")
    op.drop_table("agent_checkpoint_workflows")
    op.drop_table("agent_checkpoints")
