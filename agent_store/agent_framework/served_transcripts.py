"""A served conversation in the store's transcript (issue 58 item 5): every response a Responses server stores
through :class:`~agent_store.agentserver.responses.StoreResponseProvider` is also written, once it ends, as the
store's own messages, so ``agent_transcript``, ``agent-store sessions`` / ``show`` / ``search``, the browser,
search by meaning, export and erasure show it like any other conversation. The server's items stay as they were,
byte for byte, in ``agent_hosted_*``: the transcript is derived from them, never read back by the server.

- A conversation (``conversation``) is one session, its turns (input items, then output items) in the order the
  responses end. A response continuing another (``previous_response_id``) is a point on its previous response's:
  appended where that was the head, a branch at it (the store's one kind of branch, run/points.py) where another
  response continued from it first. Any other response starts a session of its own.
- Keys and session ids are digests (:func:`key_of`, :func:`session_id_for`): session ids are one namespace for all
  users, and a served id may be as long as an id may be; a session is titled with the served id it began with.
- Written through the store's own sessions (``StoreSessionStore``, the commit every run goes through), after the
  server's transaction: a response is marked ``transcribed`` once its turn is in. A process that dies between
  the two leaves it unmarked; the next turn of its conversation (or the next response continuing it) writes it
  first, and :func:`transcribe_pending` (``agent-store transcribe``) sweeps the rest. Each message's store id is
  its item id: written twice, it is there once.
- ``StoreResponseProvider(store, transcript=False)`` writes none (its rows are stored marked): for a host whose
  agent sessions hold the messages already (``ResponsesHostServer(history_source="agent")``).
- Items become framework messages: a ``message`` (its text parts, else its parts' kinds, ``[input_image]``;
  ``developer`` as ``system``), a ``function_call`` and a ``function_call_output``; other items (reasoning,
  server tools) stay only in the server's items.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent_framework import AgentSession, Content, Message
from sqlalchemy import select, update

from agent_store.agent_framework.session_store import StoreSessionStore
from agent_store.db import sealing, tenancy
from agent_store.db.message_rows import STORE_ID
from agent_store.db.tables import hosted_items_t, hosted_links_t, hosted_responses_t
from agent_store.errors import ConflictError, InvalidValueError

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["ENDED", "PREFIX", "after_write", "to_messages", "transcribe", "transcribe_pending"]
log = logging.getLogger(__name__)
R, L, T = hosted_responses_t.c, hosted_links_t.c, hosted_items_t.c
PREFIX = "served:"  # the transcript's session ids: never one of the host's own agent sessions (foundry.py)
ENDED = ("completed", "failed", "incomplete", "cancelled")  # a response's turn is written when it has ended
TRIES = 5  # turns of one conversation ending at once: each retries its append on the head it lost to
MAX_DEPTH = 100  # responses left out that one write puts in first (the rest: the next sweep's)


class _Transcripts(StoreSessionStore):
    """The store's sessions with served ids as keys: a conversation's key is its head; every other a point."""

    def __init__(self, store: Store, user_id: str | None, conversation: str | None) -> None:
        super().__init__(store, user_id=user_id)
        self.conversation = conversation

    def is_response_id(self, key: str) -> bool:
        return key != self.conversation

    def names_head(self, key: str, session: AgentSession) -> bool:  # the conversation's key, beside its session's id
        return key == self.conversation


def to_messages(items: list[Mapping[str, Any]]) -> list[Message]:
    """The transcript's messages for a response's items (see the module docstring), each under its item's id."""
    out = []
    for item in items:
        kind, item_id = item.get("type", "message"), item.get("id")
        if kind == "message":
            content = item.get("content")
            parts = [content] if isinstance(content, str) else [
                p.get("text") or p.get("refusal") for p in content or [] if isinstance(p, Mapping)]  # fmt: skip
            texts = [t for t in parts if isinstance(t, str) and t] or [  # none: what it held, by kind
                f"[{p.get('type')}]" for p in content or [] if isinstance(p, Mapping) and p.get("type")]
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


def key_of(served_id: str) -> str:
    """The key naming a served id among the user's keys (a response's point, a conversation's head): a digest, so
    that no id is too long and no key is an id an app gave one of its own sessions (a key never names another)."""
    return PREFIX + hashlib.sha256(served_id.encode()).hexdigest()[:40]


def session_id_for(user: str, key: str) -> str:
    """A transcript's session id: of its user and first key (session ids are one namespace for every user: two
    users' ``conv_1`` are two sessions; never a key, which is longer). Its title is the served id."""
    return PREFIX + hashlib.sha256(f"{user}\0{key}".encode()).hexdigest()[:32]


async def transcribe(store: Store, user: str, rid: str, *, depth: int = 0) -> bool:
    """Write the ended response ``rid`` of the partition ``user`` into the transcript, once, after what it follows
    (a conversation's earlier turns, the response it continues) if a process left that out. False: nothing to
    write (not ended, gone, or written). Raises what a commit raises; the response stays unmarked then."""
    with tenancy.acting_as(user):
        async with store.db.transaction(write=False, doing="reading a served response") as conn:
            row = (await conn.execute(select(R.status, R.previous_id, R.conversation_id, R.transcribed, R.history_from,
                                             R.created_seq).where(R.user_id == user, R.response_id == rid))).first()
            if row is None or row.transcribed or row.status not in ENDED:
                return False
            bodies = (await conn.execute(select(T.item_id, T.body).select_from(hosted_links_t.join(
                hosted_items_t, (T.user_id == L.user_id) & (T.item_id == L.item_id))).where(
                L.user_id == user, L.response_id == rid, L.kind.in_(("i", "o"))).order_by(L.kind, L.pos))).all()
            previous, before = row.previous_id, []
            if previous is None and row.conversation_id is None:  # a host that does not echo it: the response
                previous = row.history_from or await _continued(conn, user, rid)  # (history.py's pointer, else
                # the response whose last item ends this one's history)
            if row.conversation_id is not None and depth == 0:  # its conversation's turns left out before it
                before = list((await conn.execute(select(R.response_id).where(
                    R.user_id == user, R.conversation_id == row.conversation_id, ~R.transcribed, R.status.in_(ENDED),
                    R.created_seq < row.created_seq).order_by(R.created_seq))).scalars())  # fmt: skip
        for earlier in before if depth < MAX_DEPTH else []:  # in the order they were served
            await transcribe(store, user, earlier, depth=depth + 1)
        if previous is not None and depth < MAX_DEPTH:  # (already written: one read, and nothing to do)
            await transcribe(store, user, previous, depth=depth + 1)
        cipher = await sealing.for_user(store.db, user, writing=False)  # as agentserver/seals.py opens them
        messages = to_messages([sealing.open_json(cipher, "i\0" + r.item_id, r.body)[0] for r in bodies])
        if row.conversation_id is not None:
            await _append(store, user, row.conversation_id, messages)
        else:
            await _point(store, user, rid, previous, messages)
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


async def _set(sessions: _Transcripts, key: str, session: AgentSession, served_id: str) -> None:
    """``set`` the turn; a transcript's first is a session of its own, titled with the served id it began with."""
    fresh = session.session_id == session_id_for(sessions.user_id or "", key)
    await sessions.set(key, session)
    if fresh:
        await sessions.store.update(session.session_id, user_id=sessions.user_id, title=served_id[:512])


async def _append(store: Store, user: str, conversation: str, messages: list[Message]) -> None:
    """The turn on the conversation's head; lost to another turn ending at once: again, on the new head."""
    key = key_of(conversation)
    sessions = _Transcripts(store, user or None, key)
    for attempt in range(TRIES):
        session = await sessions.get(key) or AgentSession(session_id=session_id_for(user, key))
        there = {m.additional_properties.get(STORE_ID) for m in _history(session)}
        _history(session).extend(m for m in messages if m.additional_properties[STORE_ID] not in there)
        try:
            await _set(sessions, key, session, conversation)
            return
        except ConflictError:
            if attempt == TRIES - 1:
                raise


async def _point(store: Store, user: str, rid: str, previous: str | None, messages: list[Message]) -> None:
    """The turn at its own point, on its previous response's (a branch where that is not the head any more)."""
    sessions, key = _Transcripts(store, user or None, None), key_of(rid)
    if await sessions.get(key) is not None:  # written before its mark (a process that died between the two)
        return
    session = await sessions.get(key_of(previous)) if previous is not None else None
    session = session or AgentSession(session_id=session_id_for(user, key))
    _history(session).extend(messages)
    try:
        await _set(sessions, key, session, rid)
    except InvalidValueError:  # another sweep wrote it meanwhile (its key is there now): done; else the refusal
        if await sessions.get(key) is None:
            raise


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
    written = 0
    for r in found:  # one that cannot be written (logged) never holds up the others
        try:
            written += await transcribe(store, r.user_id, r.response_id)
        except Exception:
            log.warning("served response %r of user %r is not in the transcript", r.response_id, r.user_id,
                        exc_info=True)  # fmt: skip
    return written
