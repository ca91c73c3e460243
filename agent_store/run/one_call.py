"""What a run's one-call commit takes of the run: commit_postgresql.py and commit_sqlite.py read this, nothing else.

commit.py builds a :class:`OneCall` for the common case (a first attempt, outside a serialized run, with no
idempotency key to look up) and hands it to the backend's ``attempt``, which returns ``(written, lost)``:
``written`` the new version and counts if the call committed; else ``lost`` says whether it may have landed
(the connection died after it was sent) or certainly did not (refused, or never sent: the checked path runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_store.db.database import Database
from agent_store.db.scopes import Scope
from agent_store.run.delta import Delta
from agent_store.run.snapshot import Snapshot

__all__ = ["OneCall", "Outcome"]

# ((version, messages, keys[, rewritten]) if committed, may have landed)
Outcome = tuple[tuple[int, ...] | None, bool]


@dataclass(frozen=True)
class OneCall:
    db: Database
    session_id: str
    user_id: str | None
    agent_id: str | None
    scopes: Sequence[Scope]  # the session's own keys, the user's, the app's
    snapshot: Snapshot  # what the run loaded
    delta: Delta  # what it writes
    log_ids: dict[str, Any]  # its run-log row's ids: session_id, run_id, started_at
    since: datetime  # the erasure fence: the user erased at or after this refuses the commit
    sent: Callable[[], None]  # called just before the call is sent: from then on it may have landed
    # The checked path only (0017): the response to record with the commit, and a branch's base_seq (its
    # compaction of earlier messages, which are its base's, goes to agent_branch_marks).
    response: Any = None
    base_seq: int | None = None
    cipher: Any = None  # the user's keys (db/sealing.py) or the store's message_cipher: replays are read with it
