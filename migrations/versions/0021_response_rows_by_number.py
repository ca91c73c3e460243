"""Response rows by number: a response names its parent by the parent's row id, and its key's index is a hash.

Until now a row of ``agent_responses`` repeated three 37-character ids (its session, its key and its parent's
key), and both its primary key and its key's index carried the key and the session again: 200 chained responses
took 1.21-1.27x the bytes of the same turns kept as one conversation (docs/performance.md). Now:

- ``id``: a row number (an identity on PostgreSQL; SQLite's rowid, ``AUTOINCREMENT`` so a number is never
  reused), given in the order rows were made. PostgreSQL: the primary key is ``(session_id, id)`` (it holds the
  distribution column, for Citus, and serves a session's rows) and an index on ``id`` finds a parent. SQLite: the
  rowid is the key (a parent is found by it; the table is written in order) and an index on ``session_id``
  serves a session's rows.
- ``parent``: the row id of the point a response continued from, looked up in its session and its base (where a
  run continues from). ``parent_id`` (its key) stays where no row names it: a parent key that names no earlier
  row of the same user there, and a parent the store deletes later
  (its children keep its key: db/cut_points.py). Code before this revision reads only ``parent_id``: it would show
  and export new rows without their parents, so ``oldest_code`` becomes 0021 (it refuses to open this schema;
  with ``check_schema=False`` it still runs, and this code reads the parents it writes by key).
- The key's index holds a hash of the key instead of the key and the session again (the store looks keys up by
  equality only): a hash index on PostgreSQL; on SQLite, which has no hash index nor hash function, an index on
  ``key_hash``, the key's 32-bit BLAKE2b hash the store writes (as wide as PostgreSQL's hash index keeps; a lookup
  compares the key too). It is NULL on PostgreSQL and in rows code before this revision writes: the store also
  looks at rows whose hash is NULL.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COPY_UP = """
INSERT INTO agent_responses (session_id, response_id, user_id, seq_end, version, parent_id, created_at, moves)
SELECT session_id, response_id, user_id, seq_end, version, parent_id, created_at, moves FROM agent_responses_0020
ORDER BY created_at, session_id, version, response_id"""
_COPY_DOWN = """
INSERT INTO agent_responses (session_id, response_id, user_id, seq_end, version, parent_id, created_at, moves)
SELECT r.session_id, r.response_id, r.user_id, r.seq_end, r.version, COALESCE(p.response_id, r.parent_id),
       r.created_at, r.moves
FROM agent_responses_0021 r LEFT JOIN agent_responses_0021 p ON p.id = r.parent"""
_PARENT = """
UPDATE agent_responses SET parent = (
    SELECT p.id FROM agent_responses p
    WHERE p.response_id = agent_responses.parent_id AND p.id < agent_responses.id
      AND (p.user_id = agent_responses.user_id OR (p.user_id IS NULL AND agent_responses.user_id IS NULL))
      AND (p.session_id = agent_responses.session_id
           OR p.session_id = (SELECT s.base_id FROM agent_sessions s WHERE s.id = agent_responses.session_id))
    ORDER BY p.id DESC LIMIT 1)
WHERE parent_id IS NOT NULL"""


def _columns() -> list[sa.Column]:  # type: ignore[type-arg]
    return [  # fixed-width columns first: no alignment padding on PostgreSQL
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq_end", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("moves", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("session_id", sa.String(255), sa.ForeignKey("agent_sessions.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("response_id", sa.String(255), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("parent_id", sa.String(255), nullable=True),
        sa.Column("key_hash", sa.Integer(), nullable=True),
    ]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.drop_index("ix_agent_responses_response_id", "agent_responses")
    if postgres:  # index names are the schema's: free the primary key's for the new table
        op.execute("ALTER TABLE agent_responses RENAME CONSTRAINT pk_agent_responses TO pk_agent_responses_0020")
    op.rename_table("agent_responses", "agent_responses_0020")
    row_id = sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False) if postgres else \
        sa.Column("id", sa.Integer(), nullable=False)  # SQLite: exactly INTEGER, the rowid itself  # fmt: skip
    op.create_table(
        "agent_responses",
        row_id,
        sa.Column("parent", sa.BigInteger(), nullable=True),
        *_columns(),
        sa.PrimaryKeyConstraint(*(("session_id", "id") if postgres else ("id",))),
        sqlite_autoincrement=True,
    )
    op.execute(_COPY_UP)  # numbered in the order the rows were made
    op.drop_table("agent_responses_0020")
    if postgres:
        op.create_index("ix_agent_responses_response_id", "agent_responses", ["response_id"], postgresql_using="hash")
        op.execute(_PARENT)
        op.execute("UPDATE agent_responses SET parent_id = NULL WHERE parent IS NOT NULL")
        op.create_index("ix_agent_responses_id", "agent_responses", ["id"])
    else:  # no index on the key to join on: hashes and parents found here, a pass over the rows
        _number_sqlite()
        op.create_index("ix_agent_responses_key_hash", "agent_responses", ["key_hash"])
        op.create_index("ix_agent_responses_session_id", "agent_responses", ["session_id"])
    op.execute("UPDATE agent_schema_compat SET oldest_code = '0021'")  # see above: older code misreads parents


def _number_sqlite() -> None:
    bind = op.get_bind()
    found = bind.execute(sa.text("SELECT id, response_id, user_id, parent_id, session_id FROM agent_responses "
                                 "ORDER BY id")).all()  # fmt: skip
    bases = dict(bind.execute(sa.text("SELECT id, base_id FROM agent_sessions WHERE base_id IS NOT NULL")).all())
    # The latest row so far of each key, user and session: a parent came before, in the session or its base.
    earlier: dict[tuple[str, str | None, str], int] = {}
    changes = []
    for row_id, key, user, parent_key, sid in found:
        parent = None
        if parent_key is not None:
            parent = earlier.get((parent_key, user, sid)) or earlier.get((parent_key, user, bases.get(sid, "")))
        changes.append({"i": row_id, "h": key_hash(key), "p": parent, "k": parent_key if parent is None else None})
        earlier[(key, user, sid)] = row_id
    if changes:
        bind.execute(sa.text("UPDATE agent_responses SET key_hash = :h, parent = :p, parent_id = :k WHERE id = :i"),
                     changes)  # fmt: skip


def key_hash(key: str) -> int:
    """The store's own (agent_store/db/history_tables.py), as it was at this revision."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big", signed=True)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute("UPDATE agent_schema_compat SET oldest_code = '0019'")
    if not postgres:
        op.drop_index("ix_agent_responses_session_id", "agent_responses")
        op.drop_index("ix_agent_responses_key_hash", "agent_responses")
    else:
        op.drop_index("ix_agent_responses_id", "agent_responses")
        op.drop_index("ix_agent_responses_response_id", "agent_responses")
        op.execute("ALTER TABLE agent_responses RENAME CONSTRAINT pk_agent_responses TO pk_agent_responses_0021")
    op.rename_table("agent_responses", "agent_responses_0021")
    op.create_table(
        "agent_responses",
        sa.Column("session_id", sa.String(255), sa.ForeignKey("agent_sessions.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("response_id", sa.String(255), primary_key=True),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("seq_end", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.String(255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("moves", sa.Boolean(), nullable=False, server_default=sa.false()),
        sqlite_with_rowid=False,
    )
    op.execute(_COPY_DOWN)
    op.drop_table("agent_responses_0021")
    op.create_index("ix_agent_responses_response_id", "agent_responses", ["response_id"])
