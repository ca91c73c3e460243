"""PostgreSQL: the commit function runs fewer statements (SQLite: nothing changes).

Found with ``bench/server_profile.py`` (``pg_stat_statements``, ``track = all``): the function's own statements
were most of the server's time per run, and two kinds of them do nothing in the common case.

- The duplicate-id check before the message insert (one lookup per id, 0011) goes. The unique index on
  ``(session_id, md5(message_id))`` refuses an id stored already, or two ids of one MD5, in the insert itself:
  the call fails whole, nothing is kept, and the caller takes the checked path on the unique violation
  (``fast_commit.py``), which names the id, exactly as after the check's AS000.
- The state deletes run only when the call does not say ``"no_deletes": true`` (a run that deletes no key says so).
  A call without the flag (an older agent_store) still runs them; an older function ignores the flag.

Measured against 0011 in alternating S2 runs (8 each): 2-3% more runs per second; the function's server time
per run went from 0.30 to 0.26 ms with one worker. The function is replaced in place: no table is touched.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DECLARE = ("    bumped record;\n    hashed uuid;\n", "    bumped record;\n")
_CHECK = (
    """        -- An id already stored: the checked path says which. (No other commit of this session can insert
        -- meanwhile: every one holds the session row's lock, as this one does from step 2 on.)
        FOR hashed IN SELECT md5(e->>'message_id')::uuid FROM jsonb_array_elements(p->'messages') e LOOP
            IF EXISTS (SELECT 1 FROM agent_messages WHERE session_id = sid AND md5(message_id)::uuid = hashed) THEN
                RAISE EXCEPTION 'agent_store: take the checked path' USING ERRCODE = 'AS000';
            END IF;
        END LOOP;
""",
    """        -- An id already stored (or two ids of one MD5) fails this insert on the unique index: the call fails
        -- whole and the caller takes the checked path, which names it (0012).
""",
)


# Each scope's delete, run only when the call does not say no_deletes.
_DELETES = (
    (
        """        DELETE FROM agent_state WHERE session_id = sid AND key IN (
            SELECT e->>'key' FROM jsonb_array_elements(p->'own') e WHERE (e->>'del')::boolean);
""",
        """        IF NOT coalesce((p->>'no_deletes')::boolean, false) THEN  -- a run that deletes no key says so (0012)
            DELETE FROM agent_state WHERE session_id = sid AND key IN (
                SELECT e->>'key' FROM jsonb_array_elements(p->'own') e WHERE (e->>'del')::boolean);
        END IF;
""",
    ),
    (
        """        DELETE FROM agent_user_state WHERE user_id = p->>'uid' AND key IN (
            SELECT e->>'key' FROM jsonb_array_elements(p->'user') e WHERE (e->>'del')::boolean);
""",
        """        IF NOT coalesce((p->>'no_deletes')::boolean, false) THEN  -- a run that deletes no key says so (0012)
            DELETE FROM agent_user_state WHERE user_id = p->>'uid' AND key IN (
                SELECT e->>'key' FROM jsonb_array_elements(p->'user') e WHERE (e->>'del')::boolean);
        END IF;
""",
    ),
    (
        """        DELETE FROM agent_app_state WHERE app_id = p->>'app_id' AND key IN (
            SELECT e->>'key' FROM jsonb_array_elements(p->'app') e WHERE (e->>'del')::boolean);
""",
        """        IF NOT coalesce((p->>'no_deletes')::boolean, false) THEN  -- a run that deletes no key says so (0012)
            DELETE FROM agent_app_state WHERE app_id = p->>'app_id' AND key IN (
                SELECT e->>'key' FROM jsonb_array_elements(p->'app') e WHERE (e->>'del')::boolean);
        END IF;
""",
    ),
)


def _revision(revision_id: str) -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(__file__).resolve().parents[1])).get_revision(revision_id).module


def commit_function() -> str:
    before = _revision("0010")  # its function_of() and splice()
    return str(before.splice(before.function_of("0011"), (_DECLARE, _CHECK, *_DELETES), revision))


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(commit_function())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_revision("0011").commit_function())
