"""The two commit paths store the same thing: the one-call commit of the common case (PostgreSQL: one round
trip; SQLite: one hop to the connection's thread) and the checked transaction.

Every case runs on both backends; a run without an idempotency key takes the one-call path, one with a key the
checked path, so each case is committed both ways and the stored rows must be the same.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Content, Message
from helpers import rows
from sqlalchemy import event

from agent_store import ConflictError, InvalidValueError, Store
from agent_store.errors import CheckedPathNeeded
from agent_store.run import commit_postgresql as fast_commit
from agent_store.run import commit_sqlite as sqlite_commit

PATHS = [None, "key"]  # no idempotency key: the one-call path; a key: the checked path


def call_and_result(call_id: str) -> list[Message]:
    return [
        Message(role="assistant", contents=[Content.from_function_call(call_id=call_id, name="f", arguments={})]),
        Message(role="tool", contents=[Content.from_function_result(call_id=call_id, result="ok")]),
    ]


@pytest.mark.parametrize("key", PATHS)
async def test_a_message_holding_a_call_and_its_result_is_stored(store: Store, key: str | None) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 0
    whole = Message(
        role="assistant",
        contents=[
            Content.from_function_call(call_id="c1", name="f", arguments={}),
            Content.from_function_result(call_id="c1", result="ok"),
        ],
    )
    run = await store.load("s", user_id="u", run_id=key)
    run.history.append(whole)
    assert (await run.commit()).messages_written == 1
    loaded = (await store.load("s", user_id="u")).history
    assert [c.type for c in loaded[0].contents] == ["function_call", "function_result"]


@pytest.mark.parametrize("key", PATHS)
async def test_a_moved_service_session_id_can_be_cleared_and_moved_again(store: Store, key: str | None) -> None:
    """None is "no service-side conversation" (SQL NULL), and the next run may start one."""
    for n, value in enumerate(["resp_1", None, "resp_2", None, "resp_3"]):
        run = await store.load("s", user_id="u", run_id=f"{key}-{n}" if key else None)
        run.session.service_session_id = value
        await run.commit()
        assert (await store.load("s", user_id="u")).session.service_session_id == value
    assert await rows(store, "SELECT count(*) FROM agent_sessions WHERE service_session_id IS NULL") == [(0,)]


async def test_a_window_over_reused_call_ids_stays_small(store: Store) -> None:
    """Providers reuse call ids ("call_0" every turn): each result's nearest call is what the window needs."""
    async with store.session("s", user_id="u") as session:
        for turn in range(50):
            session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"t{turn}"])]
            session.state["in_memory"]["messages"] += call_and_result("call_0")
    history = (await store.load("s", user_id="u", history_limit=4)).history
    assert [m.role for m in history] == ["user", "assistant", "tool"] * 2  # widened to the turn's user message
    assert history[0].text == "t48" and history[-1].contents[0].type == "function_result"


async def test_the_size_limit_counts_a_message_s_text_once(url: str) -> None:
    """Text that stays in the body (a message that is not one plain text) is not counted again for its column."""
    async with Store.from_url(url, max_value_bytes=1024 * 1024) as store:
        await store.migrate()
        text = "长" * (600 * 1024 // 3)  # 600 KiB: under 1 MiB once, over it twice
        message = Message(role="assistant", contents=[text, Content.from_function_call(call_id="c", name="f")])
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"] += [message, *call_and_result("c")[1:]]
        assert await rows(store, "SELECT length(text) FROM agent_messages WHERE seq = 0") == [(len(text),)]


async def test_what_the_one_call_cannot_carry_goes_the_checked_way(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a run over the call's size bound, or a call of another format (a stale or newer function).
    SQLite: an aiosqlite without its one way into the connection's thread, or a one-call commit refused after it
    wrote (rolled back whole). Each commits through the checked transaction; nothing is lost or written twice."""
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 0
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split()[0].upper())

    event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    if store.engine.dialect.name == "postgresql":
        first = ("LARGEST_CALL", fast_commit, 10)
        real = fast_commit.payload
        second: Any = (fast_commit, "payload", lambda *a: real(*a).replace('"format": 1', '"format": 99', 1))
    else:
        first = ("AVAILABLE", sqlite_commit, False)
        real_write = sqlite_commit._Commit._write

        def write_then_refuse(self: Any, conn: Any, now: Any) -> int:
            real_write(self, conn, now)  # every row of the run is written in the transaction ...
            raise CheckedPathNeeded("refused late")  # ... and rolled back

        second = (sqlite_commit._Commit, "_write", write_then_refuse)
    monkeypatch.setattr(first[1], first[0], first[2])
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 1
        session.state["in_memory"]["messages"].append(Message(role="user", contents=["longer than ten"]))
    monkeypatch.undo()
    monkeypatch.setattr(*second)
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 2
        session.state["in_memory"]["messages"].append(Message(role="user", contents=["again"]))
    event.remove(store.engine.sync_engine, "before_cursor_execute", count)
    assert statements.count("UPDATE") == 2  # both commits bumped the row in the checked transaction
    state = (await store.load("s", user_id="u")).session
    assert state.state["k"] == 2 and [m.text for m in state.state["in_memory"]["messages"]] == [
        "longer than ten",
        "again",
    ]
    assert await rows(store, "SELECT version, messages_written FROM agent_runs ORDER BY version") == [
        (1, 0), (2, 1), (3, 1)
    ]  # fmt: skip


@pytest.mark.parametrize("key", PATHS)
async def test_a_run_that_joined_a_new_session_never_overwrites_keys_it_did_not_read(
    store: Store, key: str | None
) -> None:
    """Two runs load a session that does not exist yet; one creates it, the other joins it. The joiner never
    read the creator's keys: a later commit of it that writes one of them is a conflict, not a silent overwrite."""
    joiner = await store.load("s", user_id="u", run_id=key)
    creator = await store.load("s", user_id="u")
    creator.session.state["k"] = 1
    await creator.commit()
    joiner.session.state["a"] = 1
    await joiner.commit()  # joins the session the creator made
    joiner.session.state["k"] = 2
    with pytest.raises(ConflictError):
        await joiner.commit()
    assert (await store.load("s", user_id="u")).session.state["k"] == 1


async def test_a_sqlite_commit_that_waited_for_the_write_lock_is_stamped_when_it_wrote(tmp_path: Path) -> None:
    """The one-hop commit reads its clock once the write lock is held: a commit that waited longer than the
    session's idle TTL leaves the session alive, stamped from when it wrote (as the checked path does)."""
    path = tmp_path / "wait.db"
    async with Store.from_url(f"sqlite+aiosqlite:///{path}", idle_ttl=timedelta(seconds=1)) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["n"] = 0
        run = await store.load("s", user_id="u")
        run.session.state["n"] = 1
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock for longer than the TTL
        threading.Timer(1.5, lambda: holder.execute("COMMIT")).start()
        started = datetime.now(UTC)
        await run.commit()
        holder.close()
        assert datetime.now(UTC) - started >= timedelta(seconds=1.4)  # it did wait
        loaded = await store.load("s", user_id="u")  # not expired: its expiry counts from the write
        assert loaded.session.state["n"] == 1


@pytest.mark.parametrize("author", [5, {"name": "x"}])
async def test_an_author_name_that_is_not_text_is_refused_by_name(store: Store, author: Any) -> None:
    run = await store.load("s", user_id="u")
    run.history.append(Message(role="assistant", contents=["hi"], author_name=author))
    with pytest.raises(InvalidValueError, match="must be text"):
        await run.commit()
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
