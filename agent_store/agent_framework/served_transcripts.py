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
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from agent_framework import AgentSession, Content, Message
from sqlalchemy import select, tuple_, update

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
CHAIN_MAX = 10_000  # left-out responses of a chain one write puts in first
SIZE_MARGIN = 4096  # a message's row carries a little more than its to_dict() (its columns)
PAGE = 500  # unmarked rows a sweep reads at a time
WINDOW = 64  # messages a write loads besides its own turn's count (never a conversation's whole history)


class _Transcripts(StoreSessionStore):
    """The store's sessions with served ids as keys: a conversation's key is its head; every other a point."""

    def __init__(self, store: Store, user_id: str | None, conversation: str | None, turn: int) -> None:
        # A window, not the whole history: a turn only appends, and a turn written twice is at the end of it.
        super().__init__(store, user_id=user_id, history_limit=turn + WINDOW)
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


async def transcribe(store: Store, user: str, rid: str) -> bool:
    """Write the ended response ``rid`` of the partition ``user`` into the transcript, once, after what it follows
    (its conversation's earlier turns, the responses it continues) if a process left that out: one of those that
    cannot be written is logged and holds up nothing. False: nothing to write (not ended, gone, or written).
    Raises what a commit raises for ``rid`` itself; it stays unmarked then."""
    with tenancy.acting_as(user):
        for earlier in await _left_out_before(store, user, rid):  # oldest first: the order served
            try:
                await _write(store, user, earlier)
            except Exception:
                log.warning("served response %r is not in the transcript", earlier, exc_info=True)
        return await _write(store, user, rid)


_ROW = (R.status, R.previous_id, R.conversation_id, R.transcribed, R.history_from, R.created_seq)


async def _left_out_before(store: Store, user: str, rid: str) -> list[str]:
    """The ended responses a process left out that ``rid`` follows, oldest first: its conversation's earlier
    turns, or the responses it continues, back to the first one written."""
    async with store.db.transaction(write=False, doing="reading a served response") as conn:
        row = (await conn.execute(select(*_ROW).where(R.user_id == user, R.response_id == rid))).first()
        if row is None or row.transcribed or row.status not in ENDED:
            return []
        if row.conversation_id is not None:
            return list((await conn.execute(select(R.response_id).where(
                R.user_id == user, R.conversation_id == row.conversation_id, ~R.transcribed, R.status.in_(ENDED),
                R.created_seq < row.created_seq).order_by(R.created_seq))).scalars())  # fmt: skip
        chain: list[str] = []
        at = await _previous(conn, user, rid, row)
        while at is not None and len(chain) < CHAIN_MAX:
            up = (await conn.execute(select(*_ROW).where(R.user_id == user, R.response_id == at))).first()
            if up is None or up.transcribed:
                break
            chain += [at] if up.status in ENDED else []
            at = await _previous(conn, user, at, up)
        return chain[::-1]


async def _previous(conn: Any, user: str, rid: str, row: Any) -> str | None:
    """The response ``rid`` continues (none for a conversation's turn): as the envelope says, or, from a host
    that does not echo it, history.py's pointer, else the response whose last item ends its history."""
    if row.previous_id is not None or row.conversation_id is not None:
        return cast("str | None", row.previous_id)
    return cast("str | None", row.history_from) or await _continued(conn, user, rid)


async def _write(store: Store, user: str, rid: str) -> bool:
    """One response's turn, and its mark."""
    async with store.db.transaction(write=False, doing="reading a served response") as conn:
        row = (await conn.execute(select(*_ROW).where(R.user_id == user, R.response_id == rid))).first()
        if row is None or row.transcribed or row.status not in ENDED:
            return False
        bodies = (await conn.execute(select(T.item_id, T.body).select_from(hosted_links_t.join(
            hosted_items_t, (T.user_id == L.user_id) & (T.item_id == L.item_id))).where(
            L.user_id == user, L.response_id == rid, L.kind.in_(("i", "o"))).order_by(L.kind, L.pos))).all()
        previous = await _previous(conn, user, rid, row)
    cipher = await sealing.for_user(store.db, user, writing=False)  # as agentserver/seals.py opens them
    messages = to_messages([sealing.open_json(cipher, "i\0" + r.item_id, r.body)[0] for r in bodies])
    messages = [_within(m, store.db.settings.max_value_bytes) for m in messages]
    if row.conversation_id is not None:
        await _append(store, user, row.conversation_id, messages)
    else:
        await _point(store, user, rid, previous, messages)
    async with store.db.transaction(write=True, doing="marking a served response transcribed") as conn:
        await conn.execute(update(hosted_responses_t).where(R.user_id == user, R.response_id == rid)
                           .values(transcribed=True))  # fmt: skip
    return True


def _within(message: Message, max_bytes: int) -> Message:
    """A message the store would refuse as too large (``max_value_bytes``) is a line saying so, under its ids:
    the turn stays whole and in order, and the item stays, whole, in the server's own rows."""
    size = len(json.dumps(message.to_dict(), ensure_ascii=False).encode())
    if size <= max_bytes - SIZE_MARGIN:
        return message
    said = Message(role=message.role, contents=[f"[{size} bytes: over this store's max_value_bytes; the server's "
                                                "items keep it]"], message_id=message.message_id)  # fmt: skip
    said.additional_properties[STORE_ID] = message.additional_properties[STORE_ID]
    return said


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
    sessions = _Transcripts(store, user or None, key, len(messages))
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
    sessions, key = _Transcripts(store, user or None, None, len(messages)), key_of(rid)
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
    before 0028), oldest first, about ``limit`` of them: how many were written. A response that cannot be written
    is logged and passed (the sweep reads on past it: no number of them holds up the others). An operator's
    sweep: every partition."""
    written, after = 0, None
    while written < limit:
        page = select(R.user_id, R.response_id, R.created_seq).where(~R.transcribed, R.status.in_(ENDED))
        if after is not None:
            page = page.where(tuple_(R.created_seq, R.user_id, R.response_id) > tuple_(*after))
        async with store.db.transaction(write=False, doing="finding served responses to transcribe") as conn:
            found = (await conn.execute(page.order_by(R.created_seq, R.user_id, R.response_id).limit(PAGE))).all()
        for r in found:
            try:
                written += await transcribe(store, r.user_id, r.response_id)
            except Exception:
                log.warning("served response %r of user %r is not in the transcript", r.response_id, r.user_id,
                            exc_info=True)  # fmt: skip
        if len(found) < PAGE:
            return written
        after = (found[-1].created_seq, found[-1].user_id, found[-1].response_id)
    return written
