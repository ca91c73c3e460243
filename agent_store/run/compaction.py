"""What a compaction changed in a run's history, as rows to rewrite (pure; delta.py calls it, commit writes it).

Agent Framework's ``CompactionProvider`` edits the persisted list in place: it marks messages (``_group``,
``_excluded``, ``_exclude_reason``, summary links; message_rows.MARK_KEYS) and inserts summaries where the
messages they replace were. A commit writes only what changed: the marks of the stored messages whose marks
differ from what was loaded, and places for the messages the list has out of commit order (positions.py).
Nothing is deleted: an excluded message stays a row, with ``excluded`` set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_framework import Message

from agent_store.db import message_rows
from agent_store.db.load_statement import POSITION_STEP
from agent_store.run.positions import Order, assign, order_of
from agent_store.run.snapshot import Snapshot

__all__ = ["Rewrites", "committed", "give_places", "link_summaries", "rewrites"]


@dataclass(frozen=True)
class Rewrites:
    """A commit's changes to messages stored already, and the places its new messages need."""

    marks: dict[str, dict[str, Any]] = field(default_factory=dict)  # store id -> its new mark columns
    order: Order = field(default_factory=list)  # the list up to the appended tail, when some message needs a place
    placed: dict[str, int] = field(default_factory=dict)  # filled in by the commit: the places it gave
    # agent_sessions.included_from after the commit: set to it when the run loaded every included message,
    # else only lowered to it (a message the window did not load may be included below).
    included_from: int = 0
    knows_every_included: bool = False

    @property
    def needs_places(self) -> bool:
        return any(place is None for _, place in self.order)

    def __bool__(self) -> bool:
        return bool(self.marks) or self.needs_places

    def moved(self, new: set[str]) -> dict[str, int]:
        """The stored messages the commit gave a new place (``new``: the ids of the messages it inserts)."""
        return {mid: place for mid, place in self.placed.items() if mid not in new}

    def rewritten(self, new: set[str]) -> int:
        """How many stored messages the commit rewrote (marks or place): the run log's messages_rewritten."""
        return len(self.marks.keys() | self.moved(new).keys())


def rewrites(history: Sequence[Message], ids: Sequence[str], snap: Snapshot, *, max_bytes: int) -> Rewrites:
    """Compare the run's list with what was loaded (``snap``: places and marks by store id; the ids it has seen,
    loaded, committed, or made up for the model and never stored: those have no place)."""
    places, loaded_marks, known = snap.places, snap.marks, snap.message_ids
    marks: dict[str, dict[str, Any]] = {}
    last, new_seen, in_order = None, False, True
    # One pass, cheap for a history no compaction touched (every commit runs it): a message without marks, and
    # loaded without, is skipped on a set test; the list order is only worked out if it left commit order.
    for message, identity in zip(history, ids, strict=True):
        place = places.get(identity)
        if place is None:  # new (its marks go in with its row), or made up for the model and never stored
            new_seen = new_seen or identity not in known
            continue
        in_order = in_order and not new_seen and (last is None or place > last)
        last = place
        if not message_rows.has_marks(message) and identity not in loaded_marks:
            continue
        now = message_rows.marks_of(message)
        if now != loaded_marks.get(identity):  # compared as values (the message holds copies of what was loaded)
            marks[identity] = message_rows.mark_columns(now, where=f"message {identity!r}", max_bytes=max_bytes)
    if in_order and not marks:
        return Rewrites()
    order, _ = order_of([i for i in ids if i in places or i not in known], places)
    # The lowest seq of an included message at its seq's place (every message committed from here on is above
    # it): a load of the included messages reads the range from there, and below it only the placed rows. A
    # placed message whose pos is a multiple of the step is counted too: the bound is only lower, never wrong.
    at_seq = (
        places[i] // POSITION_STEP
        for m, i in zip(history, ids, strict=True)
        if i in places and places[i] % POSITION_STEP == 0 and not m.additional_properties.get("_excluded")
    )
    return Rewrites(
        marks=marks, order=order if any(p is None for _, p in order) else [],
        included_from=min(at_seq, default=snap.end // POSITION_STEP), knows_every_included=not snap.windowed,
    )  # fmt: skip


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


def first_low(order: Order, end: int) -> int:
    """The place below a run at the very start of a list loaded whole: one step below its first stored place."""
    stored = [place for _, place in order if place is not None]
    return (stored[0] if stored else end) - POSITION_STEP


def give_places(changed: Rewrites, snap: Snapshot, lows: Mapping[int, int] | None = None) -> dict[str, int]:
    """The places a commit gives (kept in ``changed.placed``). ``lows``: for a load that skipped stored messages
    (a window, or only the included), the stored predecessor of the place after each run, read by the checked
    transaction; without them, the stored list is the loaded one."""
    if not changed.needs_places:
        return {}
    low = first_low(changed.order, snap.end) if lows is None else -(2**62)
    placed = assign(changed.order, lows or {}, first_low=low, end=snap.end)
    changed.placed.clear()
    changed.placed.update(placed)
    return placed


def committed(
    snap: Snapshot, records: Sequence[message_rows.EncodedMessage], changed: Rewrites, version: int, written: int
) -> None:
    """Make ``snap`` say where a commit's messages now are, and their marks, for a later commit's compaction."""
    alone = version == snap.version + 1 if snap.exists else version == 1  # no other commit came between
    if not alone or written != len(records):
        snap.places_known = False  # another run's messages are in between: a compaction must reload first
        return
    first_seq = snap.end // POSITION_STEP if snap.exists else 0
    for i, record in enumerate(records):
        if record.message_id not in changed.placed:
            snap.places[record.message_id] = (first_seq + i) * POSITION_STEP
        if record.columns["marks"] is not None:
            snap.marks[record.message_id] = _as_loaded(record.columns)
    for message_id, columns in changed.marks.items():
        if columns["marks"] is None:
            snap.marks.pop(message_id, None)
        else:
            snap.marks[message_id] = _as_loaded(columns)
    snap.places.update(changed.placed)
    snap.end = (first_seq + len(records)) * POSITION_STEP


def _as_loaded(columns: dict[str, Any]) -> dict[str, Any]:
    """A message's marks as a load reads its mark columns back (the summary's links into its _group)."""
    links = json.loads(columns["summary_of"]) if columns["summary_of"] is not None else None
    return message_rows.with_links(json.loads(columns["marks"]), links) or {}
