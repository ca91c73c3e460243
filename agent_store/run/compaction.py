"""What a compaction changed in a run's history, as rows to rewrite (pure; delta.py calls it, commit writes it).

Agent Framework's ``CompactionProvider`` edits the persisted list in place: it marks messages (``_group``,
``_excluded``, ``_exclude_reason``, summary links; message_rows.MARK_KEYS) and inserts summaries where the
messages they replace were. A commit writes only what changed: the marks of the stored messages whose marks
differ from what was loaded, and places for the messages the list has out of commit order (positions.py).
Nothing is deleted: an excluded message stays a row, with ``excluded`` set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_framework import Message

from agent_store.db import message_rows
from agent_store.run.positions import Order, order_of

__all__ = ["Rewrites", "link_summaries", "rewrites"]


@dataclass(frozen=True)
class Rewrites:
    """A commit's changes to messages stored already, and the places its new messages need."""

    marks: dict[str, dict[str, Any]] = field(default_factory=dict)  # store id -> its new mark columns
    order: Order = field(default_factory=list)  # the list up to the appended tail, when some message needs a place
    placed: dict[str, int] = field(default_factory=dict)  # filled in by the commit: the places it gave

    @property
    def needs_places(self) -> bool:
        return any(place is None for _, place in self.order)

    def __bool__(self) -> bool:
        return bool(self.marks) or self.needs_places


def rewrites(
    history: Sequence[Message], ids: Sequence[str], places: dict[str, int], loaded_marks: dict[str, str],
    known: set[str], *, max_bytes: int,
) -> Rewrites:  # fmt: skip
    """Compare the run's list with what was loaded (``places``, ``loaded_marks`` by store id). ``known``: the
    ids the run has seen (loaded, committed, or made up for the model and never stored: those have no place)."""
    marks: dict[str, dict[str, Any]] = {}
    for message, identity in zip(history, ids, strict=True):
        if identity not in places:
            continue  # new: its marks go in with its row
        now = message_rows.marks_of(message)
        if now is None and identity not in loaded_marks:
            continue
        columns = message_rows.mark_columns(now, where=f"message {identity!r}", max_bytes=max_bytes)
        if columns["marks"] != loaded_marks.get(identity):
            marks[identity] = columns
    order, _ = order_of([i for i in ids if i in places or i not in known], places)
    return Rewrites(marks=marks, order=order if any(p is None for _, p in order) else [])


def link_summaries(history: Sequence[Message], ids: Sequence[str], columns: dict[str, dict[str, Any]]) -> None:
    """Set ``summarized_by`` in ``columns`` (by store id): the store id of the summary a message names.

    The framework links by its own ``message_id`` (``summary_<n>``, which a later summary can reuse), so the
    link goes to the nearest message of that id before the original (a summary sits where its originals began),
    else the nearest after it.
    """
    at: dict[str, list[int]] = {}
    for index, message in enumerate(history):
        if message.message_id:
            at.setdefault(message.message_id, []).append(index)
    for index, (message, identity) in enumerate(zip(history, ids, strict=True)):
        if identity not in columns or (link := message_rows.summary_link(message_rows.marks_of(message))) is None:
            continue
        candidates = at.get(link, [])
        before = [i for i in candidates if i < index]
        chosen = before[-1] if before else next((i for i in candidates if i > index), None)
        columns[identity]["summarized_by"] = ids[chosen] if chosen is not None else None
