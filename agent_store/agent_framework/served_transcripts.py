"""A served conversation in the store's transcript (issue 58 item 5): every response a Responses server stores
through :class:`~agent_store.agentserver.responses.StoreResponseProvider` is also written, once it ends, as the
store's own messages, so ``agent_transcript``, ``agent-store sessions`` / ``show`` / ``search``, the browser,
search by meaning, export and erasure show it like any other conversation. The server's items stay as they were,
byte for byte, in ``agent_hosted_*``: the transcript is derived from them, never read back by the server.

- A response of a conversation (``conversation``) is a turn of the session ``served:<conversation id>``: its
  input items, then its output items, in the order the responses end.
- A response continuing another (``previous_response_id``) is a point, ``served:<response id>``, on its previous
  response's: its turn appended where that was the head, or a branch at it (the store's one kind of branch,
  run/points.py) where another response continued from it first. Any other response starts a session of its own.
- Written through the store's own sessions (``StoreSessionStore``, the commit every run goes through), after the
  server's transaction: a response is marked ``transcribed`` once its turn is in. A process that dies between
  the two leaves it unmarked, and :meth:`StoreResponseProvider.transcribe_pending` writes it (each message's store
  id is its item id: written twice, it is there once).
- ``StoreResponseProvider(store, transcript=False)`` writes none: for a host whose agent sessions hold the
  messages already (``ResponsesHostServer(history_source="agent")``), which would otherwise show every turn twice.
- Items become framework messages: a ``message`` (its text parts; ``developer`` as ``system``), a
  ``function_call`` and a ``function_call_output``; other items (reasoning, images, server tools) are not text a
  transcript shows, and stay only in the server's items.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent_framework import AgentSession, Content, Message
from sqlalchemy import select, update

from agent_store.agent_framework.session_store import StoreSessionStore
from agent_store.db import sealing, tenancy
from agent_store.db.message_rows import STORE_ID
from agent_store.db.schema_base import ID_MAX
from agent_store.db.tables import hosted_items_t, hosted_links_t, hosted_responses_t
from agent_store.errors import ConflictError

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["ENDED", "PREFIX", "after_write", "to_messages", "transcribe", "transcribe_pending"]
log = logging.getLogger(__name__)
R, L, T = hosted_responses_t.c, hosted_links_t.c, hosted_items_t.c
PREFIX = "served:"  # the transcript's session ids: never one of the host's own agent sessions (foundry.py)
ENDED = ("completed", "failed", "incomplete", "cancelled")  # a response's turn is written when it has ended
TRIES = 5  # turns of one conversation ending at once: each retries its append on the head it lost to


class _Transcripts(StoreSessionStore):
    """The store's sessions with served ids as keys: a conversation's key is its head; every other a point."""

    def __init__(self, store: Store, user_id: str | None, conversation: str | None) -> None:
        super().__init__(store, user_id=user_id)
        self.conversation = conversation

    def is_response_id(self, key: str) -> bool:
        return key != self.conversation


def to_messages(items: list[Mapping[str, Any]]) -> list[Message]:
    """The transcript's messages for a response's items (see the module docstring), each under its item's id."""
    out = []
    for item in items:
        kind, item_id = item.get("type", "message"), item.get("id")
        if kind == "message":
            content = item.get("content")
            parts = [content] if isinstance(content, str) else [
                p.get("text") or p.get("refusal") for p in content or [] if isinstance(p, Mapping)]  # fmt: skip
            texts = [t for t in parts if isinstance(t, str) and t]
            role = {"developer": "system"}.get(str(item.get("role")), str(item.get("role") or "user"))
            message = Message(role=role, contents=texts) if texts else None
        elif kind == "function_call":
            message = Message(role="assistant", contents=[Content.from_function_call(
                call_id=str(item.get("call_id")), name=str(item.get("name")), arguments=item.get("arguments"))])
        elif kind == "function_call_output":
            message = Message(role="tool", contents=[Content.from_function_result(
                call_id=str(item.get("call_id")), result=item.get("output"))])  # fmt: skip
        else:
            message = None
        if message is not None and isinstance(item_id, str):
            message.message_id = item_id
            message.additional_properties[STORE_ID] = item_id  # the same item written again is the same message
            out.append(message)
    return out


async def transcribe(store: Store, user: str, rid: str) -> bool:
    """Write the ended response ``rid`` of the partition ``user`` into the transcript, once. False: not ended
    (or gone, or an id too long to prefix). Raises what a commit raises; the response stays unmarked then."""
    with tenancy.acting_as(user):
        async with store.db.transaction(write=False, doing="reading a served response") as conn:
            row = (await conn.execute(select(R.status, R.previous_id, R.conversation_id, R.transcribed, R.history_from)
                                      .where(R.user_id == user, R.response_id == rid))).first()  # fmt: skip
            if row is None or row.transcribed or row.status not in ENDED:
                return False
            bodies = (await conn.execute(select(T.item_id, T.body).select_from(hosted_links_t.join(
                hosted_items_t, (T.user_id == L.user_id) & (T.item_id == L.item_id))).where(
                L.user_id == user, L.response_id == rid, L.kind.in_(("i", "o"))).order_by(L.kind, L.pos))).all()
            previous = row.previous_id
            if previous is None and row.conversation_id is None:  # a host that does not echo it: the response
                previous = row.history_from or await _continued(conn, user, rid)  # (history.py's pointer, else
                # the response whose last item ends this one's history)
        cipher = await sealing.for_user(store.db, user, writing=False)  # as agentserver/seals.py opens them
        messages = to_messages([sealing.open_json(cipher, "i\0" + r.item_id, r.body)[0] for r in bodies])
        named = [PREFIX + i for i in (rid, previous, row.conversation_id) if i is not None]
        if any(len(key) > ID_MAX for key in named):
            log.warning("served response %r is not transcribed: its ids are too long for a session id", rid)
            return False
        if row.conversation_id is not None:
            await _append(store, user or None, PREFIX + row.conversation_id, messages)
        else:
            await _point(store, user or None, rid, previous, messages)
        async with store.db.transaction(write=True, doing="marking a served response transcribed") as conn:
            await conn.execute(update(hosted_responses_t).where(R.user_id == user, R.response_id == rid)
                               .values(transcribed=True))  # fmt: skip
    return True


async def _continued(conn: Any, user: str, rid: str) -> str | None:
    """The response this one continued, where its history is rows of its own: the one whose output (or, with
    none, input) holds its history's last item (a chain's history is its previous response's full list)."""
    last = select(L.item_id).where(L.user_id == user, L.response_id == rid, L.kind == "h").order_by(L.pos.desc())
    found = (await conn.execute(select(L.response_id).where(L.user_id == user, L.item_id == last.limit(1)
                                                            .scalar_subquery(), L.kind.in_(("i", "o")),
                                                            L.response_id != rid)
                                .order_by(L.kind.desc()).limit(1))).scalar()  # fmt: skip
    return None if found is None else str(found)


def _history(session: AgentSession) -> list[Message]:
    return session.state.setdefault("in_memory", {}).setdefault("messages", [])  # type: ignore[no-any-return]


async def _append(store: Store, user_id: str | None, key: str, messages: list[Message]) -> None:
    """The turn on the conversation's head; lost to another turn ending at once: again, on the new head."""
    sessions = _Transcripts(store, user_id, key)
    for attempt in range(TRIES):
        session = await sessions.get(key) or AgentSession(session_id=key)
        there = {m.additional_properties.get(STORE_ID) for m in _history(session)}
        _history(session).extend(m for m in messages if m.additional_properties[STORE_ID] not in there)
        try:
            await sessions.set(key, session)
            return
        except ConflictError:
            if attempt == TRIES - 1:
                raise


async def _point(store: Store, user_id: str | None, rid: str, previous: str | None, messages: list[Message]) -> None:
    """The turn at its own point, on its previous response's (a branch where that is not the head any more)."""
    sessions, key = _Transcripts(store, user_id, None), PREFIX + rid
    if await sessions.get(key) is not None:  # written before its mark (a process that died between the two)
        return
    session = (await sessions.get(PREFIX + previous) if previous is not None else None) or AgentSession(session_id=key)
    _history(session).extend(messages)
    await sessions.set(key, session)


async def after_write(provider: Any, user: str, rid: str) -> None:
    """A provider's write is done: the response's turn into the transcript if it has ended (and the provider's
    ``transcript`` is on). The caller is answered from the server's own rows whatever happens here: a failure is
    logged and left for :func:`transcribe_pending`."""
    if not provider.transcript:
        return
    try:
        await transcribe(provider.store, user, rid)
    except Exception:
        log.warning("served response %r is not in the transcript yet (transcribe_pending writes it)", rid,
                    exc_info=True)  # fmt: skip


async def transcribe_pending(store: Store, *, limit: int = 500) -> int:
    """Write the ended responses not transcribed yet (a process died between a response and its turn; or stored
    before 0028), oldest first, at most ``limit``: how many were written. An operator's sweep: every partition."""
    async with store.db.transaction(write=False, doing="finding served responses to transcribe") as conn:
        found = (await conn.execute(select(R.user_id, R.response_id).where(~R.transcribed, R.status.in_(ENDED))
                                    .order_by(R.created_seq).limit(limit))).all()  # fmt: skip
    return sum([await transcribe(store, r.user_id, r.response_id) for r in found])
