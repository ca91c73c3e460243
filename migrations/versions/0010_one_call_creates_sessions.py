"""PostgreSQL: ``agent_store_commit`` also creates the session on a run's first commit (SQLite: nothing changes).

A run that found no session committed through the checked path: eight statements through SQLAlchemy, about 5 ms
of CPU against 1.5 ms for any later run. With 200 new sessions in 2,000 runs (the benchmark's S2) that was a
fifth of a run's average cost. A call of format ``2`` with ``create`` inserts the row in the state the checked
path's create-then-bump leaves (version 1, ``next_seq`` = the run's messages, expiry from the store's default),
after the same user lock (shared: ``erase_user`` waits) and erasure fence. A row already there (another run
created it meanwhile, or it was never gone) is ``AS000``: the checked path joins it, as it always did.

No own state row can exist for a session without its row (foreign keys cascade), so the own keys need no stamp
check; shared keys are checked as before. Calls of format ``1`` (every other commit) are unchanged.

The function is 0005's, with the three changes below spliced in by exact text (each must match once), so the
difference is all there is to read here.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FORMAT = (
    "IF (p->>'format') IS DISTINCT FROM '1' THEN",
    "IF coalesce(p->>'format', '') NOT IN ('1', '2') OR (p ? 'create' AND p->>'format' <> '2') THEN",
)
_USER_LOCK = (
    """    IF p ? 'user' THEN
        PERFORM pg_advisory_xact_lock(2, hashtext(p->>'uid'));
        IF EXISTS (""",
    """    IF p ? 'user' OR (p ? 'create' AND p->>'uid' IS NOT NULL) THEN
        IF p ? 'user' THEN
            PERFORM pg_advisory_xact_lock(2, hashtext(p->>'uid'));
        ELSE  -- creating one of the user's sessions: shared, as the checked path (erase_user takes it exclusive)
            PERFORM pg_advisory_xact_lock_shared(2, hashtext(p->>'uid'));
        END IF;
        IF EXISTS (""",
)
_CREATE = (
    "    UPDATE agent_sessions SET",
    """    IF p ? 'create' THEN  -- a run's first commit: the row as the checked path's create + bump leave it
        INSERT INTO agent_sessions (id, incarnation, user_id, agent_id, service_session_id, version, next_seq,
                                    created_at, updated_at, last_run_at, expires_at)
        VALUES (sid, (p->>'incarnation')::bigint, p->>'uid', p->>'agent',
                CASE WHEN (p->>'ssid_changed')::boolean THEN nullif(p->'ssid', 'null'::jsonb) END,
                1, n, now_, now_, now_, (p->>'default_expires')::timestamptz)
        ON CONFLICT (id) DO NOTHING
        RETURNING version, next_seq INTO bumped;
    ELSE
    UPDATE agent_sessions SET""",
)
_BUMPED = (
    "    RETURNING version, next_seq INTO bumped;\n    IF NOT FOUND THEN",
    "    RETURNING version, next_seq INTO bumped;\n    END IF;\n    IF NOT FOUND THEN",
)


def function_of(revision_id: str) -> str:
    """The commit function as an earlier revision defines it (``COMMIT_FUNCTION`` or ``commit_function()``)."""
    from alembic.script import ScriptDirectory

    module = ScriptDirectory(str(Path(__file__).resolve().parents[1])).get_revision(revision_id).module
    return str(module.commit_function() if hasattr(module, "commit_function") else module.COMMIT_FUNCTION)


def splice(function: str, changes: Sequence[tuple[str, str]], revision_id: str) -> str:
    """``function`` with each (old, new) replaced; each old text must be there exactly once."""
    for old, new in changes:
        if function.count(old) != 1:
            raise RuntimeError(f"{revision_id}: the function it changes is not as expected; {old!r} not found once")
        function = function.replace(old, new)
    return function


def commit_function() -> str:
    replaced = splice(function_of("0005"), (_FORMAT, _USER_LOCK, _CREATE, _BUMPED), revision)
    return replaced.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(commit_function())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(function_of("0005").replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
