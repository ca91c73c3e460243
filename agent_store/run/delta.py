"""The pure half of a run: what was loaded (Snapshot), what changed since (Delta), and tool-history repair.

Nothing here touches a connection. load.py loads into a Snapshot; commit.py computes a Delta with :func:`diff`
and writes it. Keeping the diff pure is what lets a retried commit write exactly the delta of its first attempt.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_framework import Content, Message

import agent_store.run.compaction as compaction
from agent_store.db import codec, ledger, message_rows, sealing
from agent_store.db.ledger import ModelCall
from agent_store.db.scopes import TEMP_PREFIX, Scope, scope_of
from agent_store.db.statements import new_stamp
from agent_store.errors import InvalidValueError
from agent_store.run.compaction import Rewrites
from agent_store.run.snapshot import Snapshot


@dataclass(frozen=True)
class Delta:
    """One commit's writes, frozen at its first attempt: a retry writes exactly these or nothing."""

    upserts: dict[str, str]  # state key -> canonical JSON, as stored (sealed: db/sealing.py)
    deletes: list[str]
    messages: list[message_rows.EncodedMessage]
    service_session_id: Any
    service_session_id_changed: bool
    stamp: int  # the write stamp every state row of this commit gets
    incarnation: int  # the incarnation this commit creates, if the session does not exist
    run_id: str
    calls: tuple[ModelCall, ...]  # the model calls this commit records (the usage ledger)
    rewrites: Rewrites = field(default_factory=Rewrites)  # what a compaction changed in the stored history
    opened: dict[str, str] = field(default_factory=dict)  # a sealed upsert's canonical JSON (the next snapshot's)

    @property
    def empty(self) -> bool:
        return not (
            self.upserts or self.deletes or self.messages or self.service_session_id_changed or self.rewrites
            or self.calls
        )  # fmt: skip

    @property
    def usage(self) -> dict[str, int]:
        """The run log's token counts: the sums of its calls'."""
        return ledger.totals(self.calls)

    @property
    def compacts(self) -> bool:
        """Whether the commit rewrites stored messages, places messages, or stores marks (the checked path)."""
        return bool(self.rewrites) or any(r.columns["marks"] is not None for r in self.messages)

    @property
    def changed_keys(self) -> list[str]:
        return [*self.upserts, *self.deletes]


def diff(
    snap: Snapshot,
    state: dict[str, Any],
    history: Sequence[Message],
    scopes: Sequence[Scope],
    *,
    max_bytes: int,
    cipher: message_rows.MessageCipher | None,
    run_id: str,
    history_key: str,
    service_session_id: Any,
    calls: Sequence[ModelCall],
) -> Delta:
    """Encode and compare in memory; a value that cannot be stored fails here, before any SQL."""
    kept = {k: v for k, v in state.items() if not k.startswith(TEMP_PREFIX) and k != history_key}
    slot = state.get(history_key)
    if isinstance(slot, dict):
        if rest := {k: v for k, v in slot.items() if k != "messages"}:
            kept[history_key] = rest
    elif slot is not None:
        kept[history_key] = slot
    for key, value in list(kept.items()):  # a provider's slot that shows the run's history (for a compaction)
        if isinstance(value, dict) and value.get("messages") is history:
            if rest := {k: v for k, v in value.items() if k != "messages"}:
                kept[key] = rest
            else:
                del kept[key]
    upserts: dict[str, str] = {}
    opened: dict[str, str] = {}
    for key, value in kept.items():
        codec.check_id(key, "a state key")
        scope_of(key, scopes)  # a user: key without a user fails here, not in SQL
        encoded = codec.dumps(codec.encode_state(value, key=key), where=f"state[{key!r}]", max_bytes=max_bytes)
        if snap.state_text.get(key) != encoded:  # compared as it was loaded: opened, if it was sealed
            upserts[key] = encoded
            if sealing.seals_state(cipher, key):
                upserts[key], opened[key] = sealing.seal_state(cipher, key, encoded), encoded
    seen = set(snap.message_ids)
    new_messages, ids = [], []
    for message in history:
        if not isinstance(message, Message):
            raise InvalidValueError(f"history holds a {type(message).__name__}, not an agent_framework.Message")
        ids.append(identity := message_rows.store_id(message))
        if identity not in seen:
            new_messages.append(message)
            seen.add(identity)
    names: dict[str, str] = {}
    records = [
        message_rows.message_record(m, max_bytes=max_bytes, tool_names=names, cipher=cipher) for m in new_messages
    ]
    changed = compaction.rewrites(history, ids, snap, max_bytes=max_bytes)
    if snap.included_only and (changed or any(r.columns["marks"] is not None for r in records)):
        raise InvalidValueError(
            "a compaction changed a history loaded with skip_excluded=True (only the included messages): the "
            "framework names messages by their place in the whole list, so it must compact the whole history; "
            "load the session whole when the agent compacts"
        )
    if linked := {**changed.marks, **{r.message_id: r.columns for r in records if r.columns["marks"] is not None}}:
        compaction.link_summaries(history, ids, linked)
    return Delta(
        upserts=upserts,
        deletes=[key for key in snap.state_text if key not in kept],
        messages=records,
        service_session_id=service_session_id,
        service_session_id_changed=service_session_id != snap.service_session_id,
        stamp=new_stamp(),
        incarnation=new_stamp(),
        run_id=run_id,
        calls=tuple(calls),
        rewrites=changed,
        opened=opened,
    )


def assign_id(message: Any) -> None:
    """Give a message its store identity the first time agent_store sees it (never a provider's id)."""
    if isinstance(message, Message):
        message_rows.store_id(message)


class IdentifiedHistory(dict[str, Any]):
    """The in-memory provider's state slot: every message list stored in it gets ids on the way in.

    The framework de-duplicates saves by content when messages have no id, so two identical turns in one
    block would be stored as one; an id from the first append makes each turn its own message.
    """

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "messages" and isinstance(value, list):
            for message in value:
                assign_id(message)
        super().__setitem__(key, value)


def pair_safe_tail(messages: list[Message], limit: int | None) -> list[Message]:
    """The last ``limit`` messages, widened back until no function result in them lacks its call and they
    start with the user message that began their first turn (or at the very start, if no user message is
    before): what load_statement.py's window is, in memory."""
    if not limit or len(messages) <= limit:
        return list(messages)
    # Each result's call: the nearest message at or before it with a call of its id (providers reuse ids).
    last_call: dict[str, int] = {}
    pairs: list[tuple[int, int]] = []  # (result's index, its call's index)
    for j, m in enumerate(messages):
        last_call.update((c.call_id, j) for c in m.contents if c.type == "function_call" and c.call_id)
        pairs += [(j, last_call[c.call_id]) for c in m.contents
                  if c.type == "function_result" and c.call_id in last_call]  # fmt: skip
    start = len(messages) - limit
    while start > 0:
        if messages[start].role != "user":
            start = max((i for i in range(start) if messages[i].role == "user"), default=0)
            continue
        needed = [call for result, call in pairs if result >= start and call < start]
        if not needed:
            break
        start = min(needed)
    return list(messages[start:])


INTERRUPTED = "error: this tool call was interrupted before it returned; no result was recorded"


def close_tool_pairs(messages: list[Message], answered: Iterable[str] = ()) -> tuple[list[Message], set[str]]:
    """Make a loaded history valid for a model: every function result has its call, every call a result.

    Calls and results pair in order (a call id may be reused later in a conversation). A result with no open
    call before it is dropped from the list handed over; a call never answered (an interrupted tool loop) gets
    a synthetic error result right after its message, unless it is the last open call of an id in ``answered``
    (its result is in the request being made). Returns the list and the ids of the synthetic messages (which
    the caller must not store). The stored transcript is never changed.
    """
    open_at: dict[str, int] = {}  # call id -> index of the message holding its still-open call
    dangling: dict[int, list[str]] = {}  # message index -> its calls that are never answered
    orphans: set[tuple[int, int]] = set()  # (message index, content index) of results without a call
    for i, m in enumerate(messages):
        for j, c in enumerate(m.contents):
            if c.type == "function_call" and c.call_id:
                if c.call_id in open_at:  # the same id called again before an answer: the first never was
                    dangling.setdefault(open_at[c.call_id], []).append(c.call_id)
                open_at[c.call_id] = i
            elif c.type == "function_result" and c.call_id:
                if open_at.pop(c.call_id, None) is None:
                    orphans.add((i, j))
    answered = set(answered)
    for call_id, i in open_at.items():
        if call_id not in answered:
            dangling.setdefault(i, []).append(call_id)
    if not orphans and not dangling:  # every call answered, no stray result: the usual history, as it is
        return list(messages), set()
    out: list[Message] = []
    synthetic: set[str] = set()
    for i, m in enumerate(messages):
        if any((i, j) in orphans for j in range(len(m.contents))):
            kept = [c for j, c in enumerate(m.contents) if (i, j) not in orphans]
            if not kept:
                continue
            m = copy.copy(m)  # the loaded object only; the stored row keeps what was stored
            m.contents = kept
        out.append(m)
        if missing := dangling.get(i):
            filler = Message(
                role="tool",
                contents=[Content.from_function_result(call_id=call_id, result=INTERRUPTED) for call_id in missing],
                message_id=f"interrupted-{message_rows.store_id(m)}-{len(out)}",
            )
            filler.additional_properties[message_rows.STORE_ID] = filler.message_id
            # It follows its call under compaction: in the call's group, excluded with it (issue 37). Rebuilt on
            # every load from the call's marks, as the filler itself is never stored.
            for key in message_rows.MARK_KEYS:
                if key in m.additional_properties:
                    filler.additional_properties[key] = copy.deepcopy(m.additional_properties[key])
            synthetic.add(filler.message_id)  # type: ignore[arg-type]
            out.append(filler)
    return out, synthetic
