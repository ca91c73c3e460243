"""``StoreResponseProvider``: the store of a self-hosted Responses server (``azure-ai-agentserver-responses``'s
``ResponseProviderProtocol``) on the store's database (migration 0018; ``pip install "agent-store[agentserver]"``).

    host = ResponsesAgentServerHost(store=StoreResponseProvider(store))

Its default, ``FileResponseStore``, is not for production: writers in several processes race. Here every call is
one short transaction: a create or an update is atomic, a duplicate create is ``ResponseAlreadyExistsError``
(the server's idempotent-create signal) however many processes race, and a response's items are stored once.

**Partitioned by the request's user**: ``context.user_id_key`` (the platform's ``x-agent-user-id``); a call with no
context, or none sent, is the unscoped partition ``""`` (local development), which never reads a user's rows, and
a user's calls never read it. A header sent empty is refused (``InvalidValueError``): it names nobody.
``erase_user(user_id)`` deletes that partition's rows.

Tables of their own (items handed back verbatim, envelopes whose status moves); each ended response is also in the
store's transcript (served_transcripts.py). Continuing a history read before its user's erasure is refused (fence.py).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from azure.ai.agentserver.responses.store import ResponseAlreadyExistsError
from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.agent_framework import served_transcripts
from agent_store.agentserver import history as chains
from agent_store.agentserver import seals
from agent_store.agentserver.fence import HostedReads
from agent_store.db import codec, tenancy
from agent_store.db.tables import hosted_items_t, hosted_links_t, hosted_responses_t
from agent_store.errors import InvalidValueError

if TYPE_CHECKING:
    from azure.ai.agentserver.responses import PlatformContext

    from agent_store.store import Store

__all__ = ["StoreResponseProvider"]
R, L, T = hosted_responses_t.c, hosted_links_t.c, hosted_items_t.c  # T: items


def partition(context: PlatformContext | None) -> str:
    """The partition a call reads and writes (see the module docstring)."""
    key = None if context is None else context.user_id_key
    if key is None:
        return ""
    if not isinstance(key, str) or not key:
        raise InvalidValueError("the request's user id (x-agent-user-id) was sent empty: it names no partition")
    codec.check_id(key, "the request's user id")
    return key


def _id_of(item: Any) -> str | None:
    value = item.get("id") if isinstance(item, Mapping) else getattr(item, "id", None)
    return None if value is None else str(value)


Result = TypeVar("Result")


def _in_partition(method: Callable[..., Awaitable[Result]]) -> Callable[..., Awaitable[Result]]:
    """Run a provider call as acting for its request's partition (row-level security: db/tenancy.py)."""

    @functools.wraps(method)
    async def named(self: Any, *args: Any, context: PlatformContext | None = None, **kwargs: Any) -> Result:
        with tenancy.acting_as(partition(context)):
            return await method(self, *args, context=context, **kwargs)

    return named


def _usable(response_id: Any) -> bool:
    """An id a row can have (a read of anything else finds nothing, as for an unknown id)."""
    with contextlib.suppress(InvalidValueError):  # (the refusal is the answer: not found)
        codec.check_id(response_id, "response id", required=True)
        return True
    return False


class StoreResponseProvider:
    """``ResponseProviderProtocol`` on the store's tables (see the module docstring)."""

    def __init__(self, store: Store, *, transcript: bool = True) -> None:  # transcript: served_transcripts.py
        self.store, self.db, self._reads = store, store.db, HostedReads()  # the erasure fence (fence.py)
        self.transcript = transcript

    # -- writes ---------------------------------------------------------------------------------------------

    @_in_partition
    async def create_response(
        self, response: Any, input_items: Iterable[Any] | None, history_item_ids: Iterable[str] | None, *,
        context: PlatformContext | None = None,
    ) -> None:  # fmt: skip
        """Persist a new response, its input and output items and its history (one transaction)."""
        user = partition(context)
        envelope, outputs = self._split(response)
        rid = _id_of(response)
        codec.check_id(rid, "response id", required=True)
        assert rid is not None
        inputs = self._items(input_items or [], where=f"response {rid!r}: input")
        history = [str(i) for i in history_item_ids or []]
        conversation, previous = _conversation_of(response), response.get("previous_response_id")
        codec.check_id(conversation, "conversation id")
        codec.check_id(previous, "previous_response_id")
        now, since = datetime.now(UTC), self._reads.since(user, previous, conversation, history)
        fence = self._reads.before_sealing(self.db, user, since)
        envelope, inputs, outputs = await seals.sealed(self.db, user, rid, envelope, inputs, outputs, fence=fence)
        async with self.db.transaction(write=True, doing="storing a response") as conn:
            await self._reads.check(conn, user, since)  # never continues what an erasure removed since it was read
            latest = await self._latest(conn, user, conversation) if conversation else None
            source, skip = await chains.compress(conn, user, history, [previous, latest])
            row = {"user_id": user, "response_id": rid, "conversation_id": conversation, "previous_id": previous,
                   "status": _status(response), "envelope": envelope, "history_from": source, "history_skip": skip,
                   "history_len": len(history), "created_seq": await self._next_seq(conn, user, conversation),
                   "created_at": now, "updated_at": now, "deleted_at": None, "transcribed": not self.transcript}
            insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(hosted_responses_t)
            if not (await conn.execute(insert.on_conflict_do_nothing(), row)).rowcount:  # there: alive or deleted
                there = (await conn.execute(select(R.deleted_at).where(R.user_id == user, R.response_id == rid)
                                            .with_for_update())).first()  # fmt: skip
                if there is None or there.deleted_at is None:  # (None: deleted meanwhile by an erasure)
                    raise ResponseAlreadyExistsError(rid)
                # Created again after a delete: what pointed at it keeps what it read.
                await chains.materialize_children(conn, user, rid)
                await conn.execute(delete(hosted_responses_t).where(R.user_id == user, R.response_id == rid))
                await conn.execute(hosted_responses_t.insert(), row)
            await self._put_items(conn, user, [*inputs, *outputs])
            links = chains.link_rows(user, rid, "h", history) if source is None else []
            links += chains.link_rows(user, rid, "i", [i for i, _, _ in inputs])
            links += chains.link_rows(user, rid, "o", [i for i, _, _ in outputs])
            if links:
                await conn.execute(hosted_links_t.insert(), links)
        await served_transcripts.after_write(self, user, rid)

    @_in_partition
    async def update_response(self, response: Any, *, context: PlatformContext | None = None) -> None:
        """Replace a stored response's envelope and output items. KeyError if missing or deleted."""
        user, rid = partition(context), _id_of(response)
        if not _usable(rid):
            raise KeyError(f"response '{rid}' not found")
        envelope, outputs = await seals.sealed(self.db, user, str(rid), *self._split(response))
        async with self.db.transaction(write=True, doing="updating a response") as conn:
            there = (await conn.execute(select(R.deleted_at).where(R.user_id == user, R.response_id == rid)
                                        .with_for_update())).first()  # fmt: skip
            if there is None or there.deleted_at is not None:
                raise KeyError(f"response '{rid}' not found")
            old = list((await conn.execute(select(L.item_id).where(L.user_id == user, L.response_id == rid,
                                                                   L.kind == "o").order_by(L.pos))).scalars())
            new = [i for i, _, _ in outputs]
            if old != new:  # its full list changes: what points at it keeps what it read
                await chains.materialize_children(conn, user, str(rid))
                await conn.execute(delete(hosted_links_t).where(L.user_id == user, L.response_id == rid, L.kind == "o"))
                if new:
                    await conn.execute(hosted_links_t.insert(), chains.link_rows(user, str(rid), "o", new))
            await self._put_items(conn, user, outputs)
            await conn.execute(update(hosted_responses_t).where(R.user_id == user, R.response_id == rid).values(
                envelope=envelope, status=_status(response), updated_at=datetime.now(UTC)))  # fmt: skip
        await served_transcripts.after_write(self, user, str(rid))

    @_in_partition
    async def delete_response(self, response_id: str, *, context: PlatformContext | None = None) -> None:
        """Mark a response deleted (its items stay for the histories that hold them). KeyError if missing or gone."""
        user = partition(context)
        if not _usable(response_id):
            raise KeyError(f"response '{response_id}' not found")
        async with self.db.transaction(write=True, doing="deleting a response") as conn:
            done = await conn.execute(update(hosted_responses_t)
                                      .where(R.user_id == user, R.response_id == response_id, R.deleted_at.is_(None))
                                      .values(deleted_at=datetime.now(UTC)))  # fmt: skip
        if not done.rowcount:
            raise KeyError(f"response '{response_id}' not found")

    # -- reads ----------------------------------------------------------------------------------------------

    @_in_partition
    async def get_response(self, response_id: str, *, context: PlatformContext | None = None) -> Any:
        """The stored response with its output items: one statement. KeyError if missing or deleted."""
        user = partition(context)
        if not _usable(response_id):
            raise KeyError(f"response '{response_id}' not found")
        self._reads.read(user, response=response_id)
        rows = await self.db.one_statement(chains.ONE_RESPONSE, {"user": user, "rid": response_id},
                                           doing="reading a response")  # fmt: skip  # its own snapshot
        if not rows or rows[0].deleted_at is not None:
            raise KeyError(f"response '{response_id}' not found")
        return await seals.opened_response(self.db, user, response_id, rows)

    @_in_partition
    async def get_input_items(
        self, response_id: str, limit: int = 20, ascending: bool = False, after: str | None = None,
        before: str | None = None, *, context: PlatformContext | None = None,
    ) -> list[Any]:  # fmt: skip
        """A response's history then input items, newest first unless ``ascending``, between the cursors, at most
        ``limit`` (1 to 100). KeyError if missing, ValueError if deleted."""
        user = partition(context)
        if not _usable(response_id):
            raise KeyError(f"response '{response_id}' not found")
        self._reads.read(user, response=response_id)
        async with self.db.transaction(write=False, doing="reading a response's input items") as conn:
            there = (await conn.execute(select(R.deleted_at).where(R.user_id == user,
                                                                   R.response_id == response_id))).first()  # fmt: skip
            if there is None:
                raise KeyError(f"response '{response_id}' not found")
            if there.deleted_at is not None:
                raise ValueError(f"response '{response_id}' has been deleted")
            ids = await chains.history_of(conn, user, response_id)
            ids += list((await conn.execute(select(L.item_id).where(L.user_id == user, L.response_id == response_id,
                                                                    L.kind == "i").order_by(L.pos))).scalars())
            ordered = ids if ascending else ids[::-1]
            if after is not None and after in ordered:
                ordered = ordered[ordered.index(after) + 1 :]
            if before is not None and before in ordered:
                ordered = ordered[: ordered.index(before)]
            page = ordered[: max(1, min(100, int(limit)))]
            found = await self._bodies(conn, user, page)
        found = await seals.opened(self.db, user, found)
        return [found[i] for i in page if i in found]

    @_in_partition
    async def get_items(self, item_ids: Iterable[str], *, context: PlatformContext | None = None) -> list[Any]:
        """Items by id, in the order asked; None for an id not stored (in this partition)."""
        user, wanted = partition(context), [str(i) for i in item_ids]
        usable = list(dict.fromkeys(i for i in wanted if _usable(i)))
        pg = self.db.dialect == "postgresql"
        ids = usable if pg else codec.dumps(usable, where="item ids", max_bytes=2**62)
        found = {r.item_id: r.body for r in await self.db.one_statement(chains.ITEMS[pg], {"user": user, "ids": ids},
                 doing="reading response items")} if usable else {}  # fmt: skip  # one statement, own snapshot
        found = await seals.opened(self.db, user, found)
        return [found.get(i) for i in wanted]

    @_in_partition
    async def get_history_item_ids(
        self, previous_response_id: str | None, conversation_id: str | None, limit: int, *,
        context: PlatformContext | None = None,
    ) -> list[str]:  # fmt: skip
        """The full list of ``previous_response_id``, then of every response of ``conversation_id`` in the order
        they were created (deleted ones skipped), each id once; the last ``limit`` (-1: all)."""
        user = partition(context)
        self._reads.read(user, response=previous_response_id, conversation=conversation_id)
        starts = [previous_response_id] if previous_response_id and _usable(previous_response_id) else []
        members: list[str] = []
        if conversation_id and _usable(conversation_id):
            async with self.db.transaction(write=False, doing="reading a conversation's history") as conn:
                members = list((await conn.execute(
                    select(R.response_id).where(R.user_id == user, R.conversation_id == conversation_id,
                                                R.deleted_at.is_(None)).order_by(R.created_seq, R.response_id)
                )).scalars())  # fmt: skip
                found = await chains.specs(conn, user, [*starts, *members])
        else:  # a chain: one statement, its own snapshot
            found = chains.specs_from(await self.db.one_statement(*chains.walk(user, starts), doing="reading a "
                                                                  "response's history") if starts else [])  # fmt: skip
        starts = [s for s in starts if s in found and not found[s].deleted]
        lists = chains.full_lists(found, [*starts, *members])
        resolved = chains.dedup([i for rid in [*starts, *members] for i in lists[rid]])
        if limit == -1:
            return resolved
        return resolved[-limit:] if limit > 0 else []

    # -- helpers --------------------------------------------------------------------------------------------

    def _split(self, response: Any) -> tuple[str, list[tuple[str, str, str | None]]]:
        """The envelope's JSON without its output, and its output items (id, JSON, type)."""
        if not isinstance(response, Mapping):
            raise InvalidValueError(f"a response is a mapping (a ResponseObject), not {type(response).__name__}")
        rid = _id_of(response)
        envelope = codec.dumps({k: v for k, v in response.items() if k != "output"}, where=f"response {rid!r}")
        return envelope, self._items(response.get("output") or [], where=f"response {rid!r}: output")

    def _items(self, items: Iterable[Any], *, where: str) -> list[tuple[str, str, str | None]]:
        out = []
        for item in items:
            item_id = _id_of(item)
            if item_id is None:  # as the package's own stores do: an item without an id is not kept
                continue
            codec.check_id(item_id, f"{where} item id")
            kind = item.get("type") if isinstance(item, Mapping) else getattr(item, "type", None)
            out.append((item_id, codec.dumps(item, where=f"{where} item {item_id!r}"), kind))
        return out

    async def _put_items(self, conn: AsyncConnection, user: str, items: list[tuple[str, str, str | None]]) -> None:
        """Insert or replace items, each id once, in id order (two writers never lock them in opposite orders)."""
        by_id = {item_id: (body, kind) for item_id, body, kind in items}
        if not by_id:
            return
        rows = [{"user_id": user, "item_id": i, "body": by_id[i][0], "type": by_id[i][1]} for i in sorted(by_id)]
        insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(hosted_items_t)
        await conn.execute(insert.on_conflict_do_update(index_elements=["user_id", "item_id"],
                                                        set_={"body": insert.excluded.body,
                                                              "type": insert.excluded.type}), rows)  # fmt: skip

    async def _bodies(self, conn: AsyncConnection, user: str, ids: list[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for chunk in chains._chunks(list(dict.fromkeys(i for i in ids if _usable(i)))):
            rows = await conn.execute(select(T.item_id, T.body).where(T.user_id == user, T.item_id.in_(chunk)))
            found.update((r.item_id, r.body) for r in rows)
        return found

    async def _next_seq(self, conn: AsyncConnection, user: str, conversation: str | None) -> int:
        """A conversation's order, set by what the database holds, never by this host's clock alone: past every
        response the conversation has (a host whose clock is behind still puts its turn last)."""
        now = time.time_ns()
        if conversation is None:
            return now
        last = (await conn.execute(select(func.max(R.created_seq))
                                   .where(R.user_id == user, R.conversation_id == conversation))).scalar()  # fmt: skip
        return now if last is None else max(now, int(last) + 1)

    async def _latest(self, conn: AsyncConnection, user: str, conversation: str) -> str | None:
        return (await conn.execute(
            select(R.response_id).where(R.user_id == user, R.conversation_id == conversation, R.deleted_at.is_(None))
            .order_by(R.created_seq.desc(), R.response_id.desc()).limit(1)
        )).scalar()  # fmt: skip


def _conversation_of(response: Mapping[str, Any]) -> str | None:
    conversation = response.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    return conversation if isinstance(conversation, str) and conversation else None


def _status(response: Mapping[str, Any]) -> str | None:
    return None if (status := response.get("status")) is None else str(status)[:64]
