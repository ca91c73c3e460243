"""Incarnations and one stamp scheme: sessions get a random incarnation, own-key stamps become random 64-bit.

- ``agent_sessions.incarnation``: drawn when a session row is created; a run commits only into the
  incarnation it loaded (an id deleted and used again is a different conversation).
- ``agent_state.version``: a random write stamp like the shared scopes' (was the session version, which
  restarted at 0 when an id was re-created and was copied verbatim by fork).
- ``run_id`` columns widen to 255 characters: a caller's own idempotency key can be a run id.
- ``agent_erasures``: when a user was erased, under a SHA-256 of the user id (not the id): a run loaded before
  the erasure cannot create a session of that user or write its ``user:`` keys after it. Kept 7 days.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column("agent_sessions", sa.Column("incarnation", sa.BigInteger(), nullable=False, server_default="0"))
    if postgres:
        op.execute("UPDATE agent_sessions SET incarnation = (random() * 4611686018427387903)::bigint")
    else:
        op.execute("UPDATE agent_sessions SET incarnation = abs(random() % 4611686018427387903)")
    op.create_table(
        "agent_erasures",
        sa.Column("user_key", sa.String(64), primary_key=True),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
    )
    # On SQLite these are table rebuilds (batch mode), done with the agent_transcript view in place.
    with op.batch_alter_table("agent_state") as batch:
        batch.alter_column("version", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False)
    for table in ("agent_runs", "agent_messages"):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("run_id", type_=sa.String(255), existing_type=sa.String(36), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # Stamps above 2^31 do not fit the old column: keep their low bits (any value works as a stamp).
        op.execute("UPDATE agent_state SET version = version % 2147483647")
    for table in ("agent_messages", "agent_runs"):  # a caller's longer key is cut to the old width
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                "run_id", type_=sa.String(36), existing_type=sa.String(255), existing_nullable=False,
                postgresql_using="left(run_id, 36)",
            )  # fmt: skip
    with op.batch_alter_table("agent_state") as batch:
        batch.alter_column("version", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False)
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_column("incarnation")
    op.drop_table("agent_erasures")
