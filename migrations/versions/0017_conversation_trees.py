"""Conversation trees: response ids that name snapshots, branches that point at their base instead of copying it.

A served conversation (Agent Framework's hosting packages) names a point by a response id: many requests may
continue from one point, each storing its result under a new id, and a point never changes afterwards.

- ``agent_responses``: a key (a response id) -> a point: the session holding its last turn, the seq after that
  turn's last message (``seq_end``) and the session's version then. Written in the commit that made the point.
- ``agent_sessions.base_id`` / ``base_seq`` / ``base_version``: a branch. A request that continues from a point
  its session has moved
  past gets a session of its own whose messages before ``base_seq`` are its base's (read through the chain of
  bases, never copied); its own start at ``base_seq``. Deleting a session deletes its branches.
- ``agent_sessions.keeps_history``: set once a point was recorded on a session; from then on every change of its
  own state keys keeps the value before it in ``agent_state_history`` (a trigger, whichever path writes), so the
  state at any recorded version can be read back. ``until_version`` is the version of the commit that changed it;
  ``existed`` false records a key created by that commit. Messages are append-only and their compaction columns
  keep their history since 0016: a point needs nothing else.
- ``agent_branch_marks``: a branch's compaction of its base's messages (the base's rows are shared, never
  rewritten by a branch): the values from its commit (``version``, first seq ``horizon``) on, for that branch.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
_VERSION = "(SELECT version FROM agent_sessions WHERE id = {row}.session_id)"
_KEEPS = "(SELECT keeps_history FROM agent_sessions WHERE id = {row}.session_id)"

PG_FUNCTION = f"""
CREATE FUNCTION agent_store_keep_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF {_KEEPS.format(row="NEW")} IS TRUE THEN
            INSERT INTO agent_state_history (session_id, key, until_version, value, existed)
            VALUES (NEW.session_id, NEW.key, {_VERSION.format(row="NEW")}, NULL, false) ON CONFLICT DO NOTHING;
        END IF;
    ELSIF {_KEEPS.format(row="OLD")} IS TRUE THEN
        INSERT INTO agent_state_history (session_id, key, until_version, value, existed)
        VALUES (OLD.session_id, OLD.key, {_VERSION.format(row="OLD")}, OLD.value, true) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$
"""  # noqa: S608 (the module's own text, no input)
PG_TRIGGERS = [
    "CREATE TRIGGER agent_state_keep_inserts AFTER INSERT ON agent_state FOR EACH ROW "
    "EXECUTE FUNCTION agent_store_keep_state()",
    "CREATE TRIGGER agent_state_keep_changes AFTER UPDATE OR DELETE ON agent_state FOR EACH ROW "
    "EXECUTE FUNCTION agent_store_keep_state()",
]
SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER agent_state_keep_inserts AFTER INSERT ON agent_state
FOR EACH ROW WHEN {_KEEPS.format(row="NEW")} IS 1
BEGIN
    INSERT OR IGNORE INTO agent_state_history (session_id, key, until_version, value, existed)
    VALUES (NEW.session_id, NEW.key, {_VERSION.format(row="NEW")}, NULL, 0);
END""",  # noqa: S608
    f"""CREATE TRIGGER agent_state_keep_updates AFTER UPDATE ON agent_state
FOR EACH ROW WHEN {_KEEPS.format(row="OLD")} IS 1
BEGIN
    INSERT OR IGNORE INTO agent_state_history (session_id, key, until_version, value, existed)
    VALUES (OLD.session_id, OLD.key, {_VERSION.format(row="OLD")}, OLD.value, 1);
END""",  # noqa: S608
    f"""CREATE TRIGGER agent_state_keep_deletes AFTER DELETE ON agent_state
FOR EACH ROW WHEN {_KEEPS.format(row="OLD")} IS 1
BEGIN
    INSERT OR IGNORE INTO agent_state_history (session_id, key, until_version, value, existed)
    VALUES (OLD.session_id, OLD.key, {_VERSION.format(row="OLD")}, OLD.value, 1);
END""",  # noqa: S608
]


def _session_fk() -> sa.ForeignKey:
    return sa.ForeignKey("agent_sessions.id", ondelete="CASCADE")


def upgrade() -> None:
    # No foreign key on base_id: a branch and its base are two sessions, which Citus places on two shards (docs/
    # SCALING.md); deleting a session deletes its branches in the same transaction (operations/lifecycle.py), and
    # the purge never takes a session that still has a branch.
    op.add_column("agent_sessions", sa.Column("base_id", sa.String(255), nullable=True))
    op.add_column("agent_sessions", sa.Column("base_seq", sa.Integer(), nullable=True))
    op.add_column("agent_sessions", sa.Column("base_version", sa.Integer(), nullable=True))
    op.add_column("agent_sessions", sa.Column("keeps_history", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_agent_sessions_base_id", "agent_sessions", ["base_id"],
                    postgresql_where=sa.text("base_id IS NOT NULL"),
                    sqlite_where=sa.text("base_id IS NOT NULL"))  # fmt: skip
    op.create_table(
        "agent_responses",
        sa.Column("session_id", sa.String(255), _session_fk(), primary_key=True),
        sa.Column("response_id", sa.String(255), primary_key=True),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("seq_end", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.String(255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sqlite_with_rowid=False,  # the primary key is the table (no second copy of every key)
    )
    # Found by its key (one key, one point: the store checks under a lock on the key; no unique index, as the
    # key is not the distribution column on Citus).
    op.create_index("ix_agent_responses_response_id", "agent_responses", ["response_id"])
    op.create_table(
        "agent_state_history",
        sa.Column("session_id", sa.String(255), _session_fk(), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("until_version", sa.Integer(), primary_key=True),
        sa.Column("value", JSON_DOC, nullable=True),
        sa.Column("existed", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "agent_branch_marks",
        sa.Column("session_id", sa.String(255), _session_fk(), primary_key=True),
        sa.Column("message_id", sa.String(255), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("horizon", sa.Integer(), nullable=False),
        sa.Column("marks", JSON_DOC, nullable=True),
        sa.Column("excluded", sa.Boolean(), nullable=False),
        sa.Column("exclude_reason", sa.String(255), nullable=True),
        sa.Column("summarized_by", sa.String(255), nullable=True),
        sa.Column("pos", sa.BigInteger(), nullable=True),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        for trigger in PG_TRIGGERS:
            op.execute(trigger)
    else:
        for trigger in SQLITE_TRIGGERS:
            op.execute(trigger)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute("DROP TRIGGER IF EXISTS agent_state_keep_inserts ON agent_state")
        op.execute("DROP TRIGGER IF EXISTS agent_state_keep_changes ON agent_state")
    else:
        op.execute("DROP TRIGGER IF EXISTS agent_state_keep_inserts")
        op.execute("DROP TRIGGER IF EXISTS agent_state_keep_updates")
        op.execute("DROP TRIGGER IF EXISTS agent_state_keep_deletes")
    if postgres:
        op.execute("DROP FUNCTION IF EXISTS agent_store_keep_state()")
    op.drop_table("agent_branch_marks")
    op.drop_table("agent_state_history")
    op.drop_index("ix_agent_responses_response_id", "agent_responses")
    op.drop_table("agent_responses")
    op.drop_index("ix_agent_sessions_base_id", "agent_sessions")
    for column in ("keeps_history", "base_version", "base_seq", "base_id"):  # SQLite 3.35+ drops a column in place
        op.drop_column("agent_sessions", column)
