"""PostgreSQL: the message id's unique index keys a 16-byte MD5 of the id, not the id (SQLite: nothing changes).

The index exists to refuse a message id stored twice in one session and to find the ids a retried save carries
(both look up a handful of ids in one session). Keyed by the id itself, a 32-character text, it was the second
largest index per message (82 bytes on the benchmark's messages, after the trigram index); keyed by
``md5(message_id)::uuid`` it is about 40. Lookups compare both the hash (the index) and the id itself; two ids
with one MD5 (which only someone crafting ids could make) are refused as one id stored twice, with a typed error.

The index keeps its name. The commit function's duplicate check (0005, 0010) becomes the same lookup.
Rebuilding the index reads ``agent_messages`` once; writes to it wait meanwhile. A database where one session
holds two ids of one MD5 (stored before this revision; only crafted ids collide) cannot take the new index: the
upgrade fails on its unique violation, keeps 0010 and changes nothing. Find such rows with
``SELECT session_id, md5(message_id) FROM agent_messages GROUP BY 1, 2 HAVING count(*) > 1``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DROP = "DROP INDEX ix_agent_messages_session_id_message_id"
_BY_HASH = (
    "CREATE UNIQUE INDEX ix_agent_messages_session_id_message_id"
    " ON agent_messages (session_id, (md5(message_id)::uuid))"
)
_BY_ID = "CREATE UNIQUE INDEX ix_agent_messages_session_id_message_id ON agent_messages (session_id, message_id)"
_CHECK = (
    """        IF EXISTS (SELECT 1 FROM agent_messages WHERE session_id = sid AND message_id IN (
                   SELECT e->>'message_id' FROM jsonb_array_elements(p->'messages') e)) THEN
            RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
        END IF;""",
    # One point lookup per id: both index columns by equality, so every plan is a unique-index probe. (A join
    # of the ids with the session's rows let the function's cached generic plan, costed for an average session,
    # read a session's every message: O(session) per commit.)
    """        FOR hashed IN SELECT md5(e->>'message_id')::uuid FROM jsonb_array_elements(p->'messages') e LOOP
            IF EXISTS (SELECT 1 FROM agent_messages WHERE session_id = sid AND md5(message_id)::uuid = hashed) THEN
                RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
            END IF;
        END LOOP;""",
)
_DECLARE = ("    bumped record;\n", "    bumped record;\n    hashed uuid;\n")


def _revision_0010() -> Any:  # its function_of() and splice()
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(__file__).resolve().parents[1])).get_revision("0010").module


def commit_function() -> str:
    before = _revision_0010()
    return str(before.splice(before.function_of("0010"), (_DECLARE, _CHECK), revision))


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_DROP)
        op.execute(_BY_HASH)
        op.execute(commit_function())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_revision_0010().function_of("0010"))
        op.execute(_DROP)
        op.execute(_BY_ID)
