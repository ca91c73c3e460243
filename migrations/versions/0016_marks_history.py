"""What a compaction changed, kept: a stored message's marks and place before each commit that rewrote them.

A fork or a truncation at an earlier message must hand the model the history as it was at that message (issue
37): a message excluded then and included again by a later compaction must be excluded again, its group, reason,
summary link and place as they were. One column (``excluded_at``) could say when an exclusion began, not what a
later inclusion undid. So every rewrite of a message's compaction columns keeps the row's previous values in
``agent_message_marks``, under the ``horizon`` of the commit that rewrote it (the first seq that commit wrote,
as ``excluded_at``). The cut at seq c restores, for each message at or before c, its values from the first row
with a horizon above c: those it had at c.

A trigger writes the rows, on both backends, whichever path rewrote the message (the one-call commit functions,
the checked path, an operator's UPDATE): a rewrite comes before the commit's new messages are inserted, so the
horizon is the session's highest stored seq plus one, and ``version`` the session's version after that commit's
bump (a point, which is a version, reads its marks by it: a commit that adds no message has no horizon of its
own). Within one commit only the first rewrite of a message is kept (the values before that commit). Only a
compaction's commits write here; rows go with their session.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
CHANGED = ("marks", "excluded", "exclude_reason", "summarized_by", "pos")
KEPT = ("marks", "excluded", "exclude_reason", "summarized_by", "excluded_at", "pos")
_HORIZON = "(SELECT coalesce(max(seq), -1) + 1 FROM agent_messages WHERE session_id = OLD.session_id)"
_VERSION = "(SELECT version FROM agent_sessions WHERE id = OLD.session_id)"  # the rewriting commit's (bumped first)

PG_FUNCTION = f"""
CREATE FUNCTION agent_store_keep_marks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_message_marks (session_id, horizon, message_id, version, {", ".join(KEPT)})
    VALUES (OLD.session_id, {_HORIZON}, OLD.message_id, {_VERSION}, {", ".join(f"OLD.{c}" for c in KEPT)})
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$
"""  # noqa: S608 (the module's own column names, no input)
PG_TRIGGER = f"""
CREATE TRIGGER agent_messages_keep_marks AFTER UPDATE OF {", ".join(CHANGED)} ON agent_messages
FOR EACH ROW WHEN ({" OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in CHANGED)})
EXECUTE FUNCTION agent_store_keep_marks()
"""
SQLITE_TRIGGER = f"""
CREATE TRIGGER agent_messages_keep_marks AFTER UPDATE OF {", ".join(CHANGED)} ON agent_messages
FOR EACH ROW WHEN {" OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in CHANGED)}
BEGIN
    INSERT OR IGNORE INTO agent_message_marks (session_id, horizon, message_id, version, {", ".join(KEPT)})
    VALUES (OLD.session_id, {_HORIZON}, OLD.message_id, {_VERSION}, {", ".join(f"OLD.{c}" for c in KEPT)});
END
"""  # noqa: S608


def upgrade() -> None:
    op.create_table(
        "agent_message_marks",
        sa.Column(
            "session_id", sa.String(255), sa.ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("horizon", sa.Integer(), primary_key=True),
        sa.Column("message_id", sa.String(255), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("marks", JSON_DOC, nullable=True),
        sa.Column("excluded", sa.Boolean(), nullable=False),
        sa.Column("exclude_reason", sa.String(255), nullable=True),
        sa.Column("summarized_by", sa.String(255), nullable=True),
        sa.Column("excluded_at", sa.Integer(), nullable=True),
        sa.Column("pos", sa.BigInteger(), nullable=True),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        op.execute(PG_TRIGGER)
    else:
        op.execute(SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS agent_messages_keep_marks ON agent_messages")
    else:
        op.execute("DROP TRIGGER IF EXISTS agent_messages_keep_marks")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS agent_store_keep_marks()")
    op.drop_table("agent_message_marks")
