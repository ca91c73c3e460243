"""Message embeddings for hybrid search (issue 40): ``agent_embedding_profiles`` and ``agent_message_vectors``.

A vector row is keyed by its message and its profile; the foreign key to ``agent_messages`` deletes it with the
message (erasure, purge, delete, truncate). A trigger deletes a message's vectors when its text changes, so the
next backfill embeds the new text; a stale vector is never ranked.

Only adds tables and a trigger: code at 0022 runs unchanged on this schema (its deletes cascade, its rewrites
fire the trigger), so ``oldest_code`` is left as it is.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PG_FUNCTION = """CREATE FUNCTION agent_message_text_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM agent_message_vectors WHERE session_id = OLD.session_id AND seq = OLD.seq;
    RETURN NULL;
END $$"""
_PG_TRIGGER = """CREATE TRIGGER agent_message_text_changed AFTER UPDATE OF text ON agent_messages
FOR EACH ROW WHEN (OLD.text IS DISTINCT FROM NEW.text) EXECUTE FUNCTION agent_message_text_changed()"""
_SQLITE_TRIGGER = """CREATE TRIGGER agent_message_text_changed AFTER UPDATE OF text ON agent_messages
FOR EACH ROW WHEN OLD.text IS NOT NEW.text
BEGIN DELETE FROM agent_message_vectors WHERE session_id = OLD.session_id AND seq = OLD.seq; END"""


def upgrade() -> None:
    op.create_table(
        "agent_embedding_profiles",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),  # a hash of the name: no sequence
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("dimensions", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("name", name="uq_agent_embedding_profiles_name"),
    )
    op.create_table(
        "agent_message_vectors",
        sa.Column("session_id", sa.String(255), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("profile_id", sa.Integer(), primary_key=True),
        sa.Column("vec", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["session_id", "seq"], ["agent_messages.session_id", "agent_messages.seq"],
                                name="fk_agent_message_vectors_session_id_agent_messages", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["profile_id"], ["agent_embedding_profiles.id"],
                                name="fk_agent_message_vectors_profile_id_agent_embedding_profiles",
                                ondelete="CASCADE"),
        sqlite_with_rowid=False,
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        op.execute(_PG_TRIGGER)
    else:
        op.execute(_SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS agent_message_text_changed ON agent_messages")
        op.execute("DROP FUNCTION IF EXISTS agent_message_text_changed()")
    else:
        op.execute("DROP TRIGGER IF EXISTS agent_message_text_changed")
    op.drop_table("agent_message_vectors")
    op.drop_table("agent_embedding_profiles")
