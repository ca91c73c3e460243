"""After a commit: the run's snapshot describes the database as the commit left it, so a later commit of the same
run writes only what is new (commit.py's ``Run._committed``)."""

from __future__ import annotations

from typing import Any

import agent_store.run.compaction as compaction
from agent_store.models import CommitResult
from agent_store.run.delta import Delta

__all__ = ["committed"]


def committed(run: Any, delta: Delta, incarnation: int, written: Any) -> CommitResult:
    """Make the snapshot describe the database as this run left it, so a later commit writes only news."""
    version, messages, keys, *rest = written
    snap = run.snapshot
    compaction.committed(snap, delta.messages, delta.rewrites, int(version), int(messages))
    if not snap.exists and int(version) != 1:
        # It joined a session another run created meanwhile, whose keys this run never read: its later
        # commits check every key's stamp (a blind write over one is a conflict) and skip the one-call path.
        snap.verify_new_ids = True
    snap.exists, snap.incarnation, snap.version = True, incarnation, int(version)
    snap.service_session_id = delta.service_session_id
    for key in delta.deletes:
        snap.state_text.pop(key, None)
        snap.state_stamp.pop(key, None)
    for key, text in delta.upserts.items():
        snap.state_text[key], snap.state_stamp[key] = delta.opened.get(key, text), delta.stamp
    snap.message_ids.update(r.message_id for r in delta.messages)
    run.pending, run.commits = None, run.commits + 1
    del run.calls[: len(delta.calls)]  # what was recorded is not recorded again (later calls stay)
    return CommitResult(
        session_id=run.storage_id, run_id=delta.run_id, version=int(version),
        messages_written=int(messages), state_keys_written=int(keys),
        messages_rewritten=int(rest[0] if rest else 0),
    )  # fmt: skip
