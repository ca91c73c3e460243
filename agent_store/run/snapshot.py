"""What a run loaded: the basis its commit diffs against (delta.py) and checks against (checked_commit.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Snapshot"]


@dataclass
class Snapshot:
    """What the run loaded; the commit writes the difference between this and the session."""

    exists: bool = False
    incarnation: int | None = None  # which life of the session id was loaded (a re-created id gets a new one)
    version: int = 0
    service_session_id: Any = None
    state_text: dict[str, str] = field(default_factory=dict)  # canonical JSON of each key as loaded
    state_stamp: dict[str, int] = field(default_factory=dict)  # the stamp of the commit that wrote each key
    message_ids: set[str] = field(default_factory=set)
    # A run for a session it did not load may carry messages stored already (a retried save): look their ids up.
    verify_new_ids: bool = False
    # Compaction (compaction.py): each loaded message's place in the list and its marks as loaded (canonical
    # JSON, only where it had some); whether the load skipped stored messages before the first one loaded (a
    # window) or between loaded ones (only the included); and the place the next committed message takes.
    places: dict[str, int] = field(default_factory=dict)
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    windowed: bool = False  # a window: stored messages may lie before and between loaded ones
    included_only: bool = False  # only the included messages: excluded ones may lie between loaded ones
    end: int = 0
    places_known: bool = True  # False once a commit of this run joined others': a compaction must reload first
    budgeted: bool = False  # a budget applies to the run (its user's or app's): unrecorded calls then matter

    @property
    def gapped(self) -> bool:
        return self.windowed or self.included_only
