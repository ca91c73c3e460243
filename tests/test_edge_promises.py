"""Issue 22: promises of the README at their rarest edges (expiry, purge, first commits, deep values, replays).

Each test failed on the code before its fix; every one runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from agent_framework import Message
from helpers import expire_now, lose_the_reply, raw_connect, rows, until
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_store import (
    ConflictError,
    InvalidValueError,
    SessionClosedError,
    SessionExpiredError,
    StorageUnavailableError,
    Store,
)
from agent_store.agent_framework import StoreHistoryProvider


async def test_a_run_loaded_before_expiry_cannot_revive_a_session_purge_has_begun_to_trim(store: Store) -> None:
    """A session too big for one purge batch loses its oldest messages first; a run loaded before it expired
    commits between two batches: it is refused (the purge closed the session first), nothing is revived with
    its start gone, and the purge finishes the session."""
    async with store.session("big", user_id="u") as session:
        session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"m{i}"]) for i in range(7)]
    late = await store.load("big", user_id="u")  # before it expired
    late.history.append(Message(role="user", contents=["a late turn"]))
    await expire_now(store, "big")

    def interrupt(count: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # after the first batch: the 3 oldest are gone
        await store.purge_expired(batch_messages=3, progress=interrupt)
    assert await rows(store, "SELECT min(seq), count(*) FROM agent_messages") == [(3, 4)]
    with pytest.raises(SessionClosedError):
        await late.commit()
    assert await rows(store, "SELECT count(*) FROM agent_messages WHERE text = 'a late turn'") == [(0,)]
    assert await store.purge_expired(batch_messages=3) == 1
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]


@pytest.mark.parametrize("idle_ttl", [None, timedelta(hours=1)], ids=["no-idle-ttl", "idle-ttl"])
async def test_update_ttl_none_drops_the_sessions_own_deadline(url: str, idle_ttl: timedelta | None) -> None:
    """``update(ttl=None)`` removes the session's own TTL: its expiry follows the store's ``idle_ttl`` from now
    (none: it never expires); the short deadline it had does not linger and the session is not purged."""
    async with Store.from_url(url, idle_ttl=idle_ttl) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["n"] = 1
        await store.update("s", user_id="u", ttl=timedelta(seconds=1))
        await store.update("s", user_id="u", ttl=None)
        await asyncio.sleep(1.2)
        assert await store.purge_expired() == 0
        async with store.session("s", user_id="u") as session:
            assert session.state["n"] == 1
        expires = (await store.get("s", user_id="u")).expires_at
        if idle_ttl is None:
            assert expires is None
        else:
            assert expires is not None and timedelta(minutes=59) < expires - datetime.now(UTC) <= idle_ttl


async def test_a_state_value_nested_too_deep_is_a_typed_error_and_nothing_is_written(store: Store) -> None:
    deep: list[object] = []
    for _ in range(2000):
        deep = [deep]
    run = await store.load("deep", user_id="u")
    run.history.append(Message(role="user", contents=["hello"]))
    run.session.state["deep"] = deep
    with pytest.raises(InvalidValueError, match="deep"):
        await run.commit()
    for levels in (300, 2000):  # within and beyond what the framework's to_dict() can walk
        nested: dict[str, object] = {}
        for _ in range(levels):
            nested = {"k": nested}
        run = await store.load("deep", user_id="u")
        run.history.append(Message(role="user", contents=["hello"], additional_properties={"x": nested}))
        with pytest.raises(InvalidValueError, match="deep"):
            await run.commit()
    shallow: object = "leaf"
    for _ in range(90):  # within the limit: stored and loaded back whole
        shallow = [shallow]
    async with store.session("deep", user_id="u") as session:
        session.state["ok"] = shallow
    assert (await store.load("deep", user_id="u")).session.state["ok"] == shallow
    await store.delete("deep", user_id="u")
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


@asynccontextmanager
async def refusing_writes(url: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Another client holds what a commit needs; ``refuse()`` makes the database refuse the waiting commit.

    SQLite: the file's write lock, held by another connection (the store's busy timeout is short, so the
    commit gets "database is locked"). PostgreSQL: an exclusive lock on agent_sessions; ``refuse()`` cancels
    the statement waiting for it (a lock or statement timeout does the same: 55P03 / 57014, nothing kept)."""
    if url.startswith("sqlite"):
        blocker = sqlite3.connect(make_url(url).database or "", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")

        async def wait() -> None:
            return None

        try:
            yield wait
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        return
    blocker_conn = await raw_connect(url)
    tx = blocker_conn.transaction()
    await tx.start()
    await blocker_conn.execute("LOCK TABLE agent_sessions IN ACCESS EXCLUSIVE MODE")

    async def cancel_waiters() -> None:
        async def waiting() -> list[asyncpg.Record]:
            await blocker_conn.execute("SELECT pg_stat_clear_snapshot()")  # a transaction caches what it saw
            return list(await blocker_conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ))  # fmt: skip

        for row in await until(waiting, "a commit to wait for the lock"):
            await blocker_conn.fetchval("SELECT pg_cancel_backend($1)", row["pid"])

    try:
        yield cancel_waiters
    finally:
        await tx.rollback()
        await blocker_conn.close()


@pytest.mark.parametrize("key", [None, "request-1"], ids=["one-call", "checked"])
async def test_a_first_commit_the_database_refused_can_be_retried(url: str, key: str | None) -> None:
    """A new session's first commit meets a lock it cannot get and the database refuses it (a retryable
    StorageUnavailableError): nothing was written, so ``commit()`` again creates the session with exactly that
    run, once (before the fix the retry looked for a session the refused attempt never made)."""
    short_wait = {"connect_args": {"timeout": 0.2}} if url.startswith("sqlite") else {}  # refused in 0.2 s, not 30
    async with Store.from_url(url, **short_wait) as store:
        await store.migrate()
        run = await store.load("new", user_id="u", run_id=key)
        run.history.append(Message(role="user", contents=["hello"]))
        run.session.state["n"] = 1
        async with refusing_writes(url) as refuse:
            commit = asyncio.ensure_future(run.commit())
            await refuse()
            with pytest.raises(StorageUnavailableError) as refused:
                await commit
        assert refused.value.retryable and refused.value.refused
        assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]
        result = await run.commit()
        assert (result.version, result.messages_written, result.state_keys_written) == (1, 1, 1)
        assert await rows(store, "SELECT text FROM agent_messages") == [("hello",)]
        assert await rows(store, "SELECT count(*) FROM agent_runs WHERE outcome = 'committed'") == [(1,)]


async def test_a_save_that_replays_the_stored_tail_is_not_stored_again(store: Store) -> None:
    """``StoreHistoryProvider.save_messages`` given new ``Message`` objects with the ids it stored last (a request
    retried after a timeout; an AG-UI client sending its own ids) stores nothing again, as the framework's own
    providers decide (``filter_new_messages``); what follows the replayed part is stored, and a provider id
    reused in a later turn is still a new message."""
    provider = StoreHistoryProvider(store, user_id="u")

    def turn(*parts: tuple[str, str, str | None]) -> list[Message]:
        return [Message(role=role, contents=[text], message_id=mid) for role, text, mid in parts]

    first = (("user", "hi", "m1"), ("assistant", "hello", "m2"))
    await provider.save_messages("s", turn(*first))
    await provider.save_messages("s", turn(*first))  # rebuilt objects, same ids: a replay
    await provider.save_messages("s", turn(first[1], ("user", "how are you", "m3")))  # overlaps the tail
    await provider.save_messages("s", turn(("user", "no id", None), ("assistant", "no id either", None)))
    await provider.save_messages("s", turn(("user", "no id", None), ("assistant", "no id either", None)))
    await provider.save_messages("s", turn(("user", "a new turn", "m1")))  # an id reused later: new
    stored = await rows(store, "SELECT text FROM agent_messages WHERE session_id = 's' ORDER BY seq")
    assert [t for (t,) in stored] == ["hi", "hello", "how are you", "no id", "no id either", "a new turn"]


@pytest.mark.parametrize("key", [None, "request-1"], ids=["one-call", "checked"])
async def test_a_first_commit_whose_reply_was_lost_is_recognised_by_its_retry(store: Store, key: str | None) -> None:
    """A new session's first commit lands, its reply is lost, the caller commits again: the retry finds its own
    run by id under the lock and reports it, on a new session as on an existing one; no ConflictError on the
    keys it wrote, nothing written twice, and ``retry_on_conflict`` has no reason to run the turn again."""
    run = await store.load("new", user_id="u", run_id=key)
    run.history.extend(Message(role=role, contents=[f"{role} says"]) for role in ("user", "assistant"))
    run.session.state["n"] = 1
    run.session.state["user:seen"] = True
    lose_the_reply(store)
    with pytest.raises(StorageUnavailableError):
        await run.commit()
    result = await run.commit()
    assert (result.version, result.messages_written, result.state_keys_written) == (1, 2, 2)
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(2,)]
    assert await rows(store, "SELECT version, next_seq FROM agent_sessions") == [(1, 2)]
    assert await rows(store, "SELECT count(*) FROM agent_runs WHERE outcome = 'committed'") == [(1,)]
    run.session.state["n"] = 2  # and the run goes on in the session it created
    assert (await run.commit()).version == 2


async def test_an_export_after_a_commit_from_a_server_whose_clock_lags_succeeds(store: Store) -> None:
    """App servers' clocks differ: a commit from one a few seconds behind leaves the session's ``updated_at``
    earlier than messages committed before it (as here, set back by SQL). An export of that intact session
    succeeds; consistency is judged by commit order (versions), never by comparing clocks."""
    for turn in range(3):
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=[f"turn {turn}"]))
    async with store.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text("UPDATE agent_sessions SET updated_at = updated_at - interval '5 seconds'"))
        else:  # SQLite keeps UTC text: the same value, five seconds earlier
            (updated,) = (await conn.execute(text("SELECT updated_at FROM agent_sessions"))).one()
            lagging = datetime.fromisoformat(str(updated)) - timedelta(seconds=5)
            await conn.execute(text("UPDATE agent_sessions SET updated_at = :t"), {"t": lagging.isoformat(" ")})
    lines = [json.loads(line) async for line in store.export(user_id="u")]
    assert [line["row"]["text"] for line in lines if line["kind"] == "message"] == ["turn 0", "turn 1", "turn 2"]


async def test_an_export_refuses_a_session_deleted_and_created_again_midway(store: Store) -> None:
    """The same id, a new conversation with as many messages (low versions, so commit order alone cannot
    tell): the incarnation does, and the export raises instead of mixing two conversations."""
    for turn in range(2):
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=[f"old {turn}"]))
    lines = store.export(user_id="u")
    async for line in lines:
        if json.loads(line)["kind"] == "run":  # the session's row is read; its messages are not yet
            await store.delete("s", user_id="u")
            async with store.session("s", user_id="u") as session:
                session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"new {i}"]) for i in (0, 1)]
            break
    with pytest.raises(ConflictError, match="truncated, cleared or compacted"):
        async for _ in lines:
            pass


async def test_sqlite_writers_wait_as_long_as_the_caller_says(sqlite_url: str) -> None:
    """30 s for the lock by default; ``connect_args={"timeout": s}`` is honoured (it was overridden to 30 s);
    an engine made elsewhere with sqlite3's 5 s default gets the store's 30 s."""

    async def busy_ms(store: Store) -> int:
        async with store.engine.connect() as conn:
            return int((await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar_one())

    async with Store.from_url(sqlite_url) as store:
        await store.migrate()  # the database (a read never creates one)
        assert await busy_ms(store) == 30_000
    async with Store.from_url(sqlite_url, connect_args={"timeout": 0.2}) as store:
        assert await busy_ms(store) == 200
    async with Store(create_async_engine(sqlite_url)) as store:
        assert await busy_ms(store) == 30_000


async def test_a_first_commit_that_joined_a_session_and_lost_its_reply_is_recognised(store: Store) -> None:
    """Two tabs start one new chat: B creates it first, A's first commit joins it and lands, but A's reply is
    lost. A's retry finds its run in the log of the session there (not under the incarnation it drew)."""
    a, b = await store.load("chat", user_id="u"), await store.load("chat", user_id="u")
    a.history.append(Message(role="user", contents=["from tab a"]))
    b.history.append(Message(role="user", contents=["from tab b"]))
    await b.commit()
    lose_the_reply(store)
    with pytest.raises(StorageUnavailableError):
        await a.commit()
    result = await a.commit()
    assert (result.version, result.messages_written) == (2, 1)
    assert await rows(store, "SELECT text FROM agent_messages ORDER BY seq") == [("from tab b",), ("from tab a",)]


async def test_purge_finishes_what_it_began_whatever_happens_in_between(store: Store) -> None:
    """Interrupted after its first batch: ``if_expired="restart"`` still starts afresh (the half-purged session
    is expired, not merely closed), and a TTL set meanwhile does not strand it: the next purge ends it."""
    for sid in ("big", "other"):
        async with store.session(sid, user_id="u") as session:
            session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"m{i}"]) for i in range(7)]
        await expire_now(store, sid)

    def interrupt(count: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # after one batch of "big" (the first in the purge's order)
        await store.purge_expired(batch_messages=3, progress=interrupt)
    assert await rows(store, "SELECT id FROM agent_sessions WHERE closed_at IS NOT NULL") == [("big",)]
    async with store.session("big", user_id="u", if_expired="restart") as session:
        assert session.state["in_memory"]["messages"] == []
        session.state["fresh"] = True
    with pytest.raises(KeyboardInterrupt):  # now "other" is begun on, and its TTL set before the purge ends it
        await store.purge_expired(batch_messages=3, progress=interrupt)
    with pytest.raises(SessionExpiredError):  # its TTL can no longer change: it would stay half gone
        await store.update("other", user_id="u", ttl=timedelta(hours=1))
    assert await store.purge_expired(batch_messages=3) == 1
    assert await rows(store, "SELECT id, closed_at IS NULL FROM agent_sessions") == [("big", True)]
