"""Issue 4: listing, metadata, close/delete/clear, expiry, erasure, fork/truncate, export/import, view, telemetry."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from agent_framework import Agent, Message, tool
from helpers import rows
from sqlalchemy import text

from agent_store import (
    ConflictError,
    InvalidValueError,
    SessionClosedError,
    SessionExpiredError,
    SessionNotFoundError,
    Store,
)
from agent_store.offline import OfflineChatClient


async def chat(store: Store, agent: Agent, session_id: str, *words: str, user_id: str = "u") -> None:
    async with store.session(session_id, user_id=user_id) as session:
        for w in words:
            await agent.run(w, session=session)


@tool
def weather() -> str:
    """Today's weather."""
    return "晴"


async def test_listing_is_newest_first_with_an_opaque_keyset_cursor(store: Store, agent: Agent) -> None:
    for i in range(7):
        await chat(store, agent, f"s{i}", f"hello {i}")
    await chat(store, agent, "other-user", "hi", user_id="someone-else")
    await chat(store, agent, "s2", "again")  # s2 becomes the most recently active
    seen: list[str] = []
    page = await store.list_sessions(user_id="u", limit=3)
    while True:
        seen += [s.id for s in page.items]
        if page.next_cursor is None:
            break
        page = await store.list_sessions(user_id="u", limit=3, cursor=page.next_cursor)
    assert seen == ["s2", "s6", "s5", "s4", "s3", "s1", "s0"]
    first = (await store.list_sessions(user_id="u", limit=1)).items[0]
    assert (first.id, first.message_count, first.user_id) == ("s2", 4, "u")
    assert first.last_run_at is not None and first.created_at <= first.updated_at
    with pytest.raises(InvalidValueError, match="cursor"):
        await store.list_sessions(user_id="u", cursor="not-a-cursor")
    assert len((await store.list_sessions(all_users=True, limit=100)).items) == 8


async def test_title_and_metadata_can_be_set_and_filtered_on(store: Store, agent: Agent) -> None:
    for sid, topic in (("a", "billing"), ("b", "support"), ("c", "billing")):
        await chat(store, agent, sid, "hi")
        await store.update(sid, user_id="u", title=f"About {topic}", metadata={"topic": topic, "priority": 2})
    page = await store.list_sessions(user_id="u", metadata={"topic": "billing", "priority": 2})
    assert sorted(s.id for s in page.items) == ["a", "c"]
    info = await store.get("a", user_id="u")
    assert (info.title, info.metadata) == ("About billing", {"topic": "billing", "priority": 2})
    with pytest.raises(SessionNotFoundError):
        await store.update("a", user_id="intruder", title="mine now")
    with pytest.raises(InvalidValueError, match="title, metadata and ttl"):
        await store.update("a", user_id="u", owner="x")


async def test_messages_page_through_a_transcript(store: Store, agent: Agent) -> None:
    await chat(store, agent, "s", "one", "two", "three")
    first = await store.messages("s", user_id="u", limit=4)
    rest = await store.messages("s", user_id="u", after_seq=first[-1].seq, limit=4)
    assert [m.seq for m in first + rest] == list(range(6))
    assert Message.from_dict(first[0].body).text == "one" and first[1].author_name == "Bot"
    with pytest.raises(SessionNotFoundError):
        await store.messages("s", user_id="intruder")


async def test_a_closed_session_is_readable_and_refuses_runs(store: Store, agent: Agent) -> None:
    await chat(store, agent, "s", "hi")
    in_flight = await store.load("s", user_id="u")
    await store.close_session("s", user_id="u")
    with pytest.raises(SessionClosedError):
        await store.load("s", user_id="u")
    await agent.run("late", session=in_flight.session)
    with pytest.raises(SessionClosedError):
        await in_flight.commit()
    assert len(await store.messages("s", user_id="u")) == 2
    assert (await store.get("s", user_id="u")).closed_at is not None


async def test_delete_and_clear(store: Store, agent: Agent) -> None:
    await chat(store, agent, "keep", "hi")
    await chat(store, agent, "gone", "call weather")
    async with store.session("keep", user_id="u") as session:
        session.state["prefs"] = {"theme": "dark"}
    assert await store.delete("gone", user_id="intruder") is False
    assert await store.delete("gone", user_id="u") is True
    for table in ("agent_messages", "agent_state", "agent_runs", "agent_tool_calls"):
        assert await rows(store, f"SELECT count(*) FROM {table} WHERE session_id = 'gone'") == [(0,)]  # noqa: S608
    assert await store.clear("keep", user_id="u") == 2
    async with store.session("keep", user_id="u") as session:
        assert session.state["in_memory"]["messages"] == [] and session.state["prefs"] == {"theme": "dark"}
        await agent.run("fresh start", session=session)
    assert [m.seq for m in await store.messages("keep", user_id="u")] == [0, 1]


async def test_expiry_is_pushed_forward_by_runs_and_enforced(url: str, agent: Agent) -> None:
    async with Store.from_url(url, idle_ttl=timedelta(hours=1)) as store:
        await store.migrate()
        await chat(store, agent, "s", "我叫李明")
        expires = (await store.get("s", user_id="u")).expires_at
        assert expires is not None and timedelta(minutes=59) < expires - datetime.now(UTC) <= timedelta(hours=1)
        await store.update("s", user_id="u", ttl=timedelta(seconds=1))  # this session's own, shorter ttl
        await asyncio.sleep(1.2)
        with pytest.raises(SessionExpiredError):
            await store.load("s", user_id="u")
        async with store.session("s", user_id="u", if_expired="restart") as session:
            reply = await agent.run("我叫什么名字？", session=session)
        assert reply.text == "我不知道你叫什么名字。"  # a fresh session, not the expired one
        assert await rows(store, "SELECT count(*) FROM agent_messages") == [(2,)]


async def test_purge_expired_deletes_in_batches_and_spares_live_sessions(store: Store, agent: Agent) -> None:
    for i in range(7):
        await chat(store, agent, f"old{i}", "hi")
    await chat(store, agent, "live", "hi")
    async with store.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(minutes=5)
        await conn.execute(text("UPDATE agent_sessions SET expires_at = :t WHERE id LIKE 'old%'"), {"t": past})
    batches: list[int] = []
    assert await store.purge_expired(batch_size=3, progress=batches.append) == 7
    assert batches == [3, 3, 1]
    assert await rows(store, "SELECT id FROM agent_sessions") == [("live",)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(2,)]


async def test_retention_batches_are_bounded_by_messages_too(store: Store, agent: Agent) -> None:
    """Each expired session holds 2 messages: with room for 5 a batch takes 2 sessions; a session larger than
    the room (4 messages, room for 3) loses its 3 oldest in a batch of their own, then goes whole."""
    for i in range(7):
        await chat(store, agent, f"old{i}", "hi")
    async with store.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(minutes=5)
        await conn.execute(text("UPDATE agent_sessions SET expires_at = :t"), {"t": past})
    batches: list[int] = []
    assert await store.purge_expired(batch_size=3, batch_messages=5, progress=batches.append) == 7
    assert batches == [2, 2, 2, 1]

    await chat(store, agent, "a", "hi", "there", user_id="li")
    await chat(store, agent, "b", "hi", user_id="li")
    erased: list[int] = []
    report = await store.erase_user("li", batch_messages=3, progress=erased.append)
    assert (erased, report.batches, report.sessions, report.messages) == ([0, 1, 1], 4, 2, 6)
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_a_session_bigger_than_a_batch_is_emptied_oldest_first_in_bounded_batches(store: Store) -> None:
    for sid, user in (("big", "li"), ("old", "wang")):
        async with store.session(sid, user_id=user) as session:
            session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"m{i}"]) for i in range(7)]

    def interrupt(count: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # after the first batch: 3 oldest gone, the session closed
        await store.erase_user("li", batch_messages=3, progress=interrupt)
    assert await rows(store, "SELECT min(seq), count(*) FROM agent_messages WHERE session_id = 'big'") == [(3, 4)]
    with pytest.raises(SessionClosedError):
        await store.load("big", user_id="li")
    erased: list[int] = []
    report = await store.erase_user("li", batch_messages=3, progress=erased.append)
    assert (erased, report.sessions, report.messages, report.batches) == ([0, 1], 1, 4, 3)

    async with store.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(minutes=5)
        await conn.execute(text("UPDATE agent_sessions SET expires_at = :t"), {"t": past})
    purged: list[int] = []
    assert await store.purge_expired(batch_messages=3, progress=purged.append) == 1
    assert purged == [0, 0, 1]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_an_interrupted_erasure_leaves_whole_sessions_and_finishes_when_run_again(
    store: Store, agent: Agent
) -> None:
    await chat(store, agent, "a", "hi", user_id="li")
    await chat(store, agent, "b", "hi", "there", user_id="li")
    async with store.session("a", user_id="li") as session:
        session.state["user:name"] = "李明"

    def interrupt(count: int) -> None:
        raise KeyboardInterrupt  # after the first batch committed: the process is stopped

    with pytest.raises(KeyboardInterrupt):
        await store.erase_user("li", batch_messages=2, progress=interrupt)
    assert await rows(store, "SELECT id, next_seq FROM agent_sessions") == [("b", 4)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(4,)]  # b whole, a wholly gone
    assert await rows(store, "SELECT count(*) FROM agent_user_state") == [(1,)]
    report = await store.erase_user("li")
    assert (report.sessions, report.messages, report.user_state_rows) == (1, 4, 1)
    assert await rows(
        store, "SELECT (SELECT count(*) FROM agent_sessions) + (SELECT count(*) FROM agent_user_state)"
    ) == [(0,)]


async def test_erase_user_removes_everything_of_that_user_only(store: Store, agent: Agent) -> None:
    await chat(store, agent, "a", "hi", "there", user_id="li")
    await chat(store, agent, "b", "hi", user_id="li")
    await chat(store, agent, "c", "hi", user_id="wang")
    for sid, user in (("a", "li"), ("c", "wang")):
        async with store.session(sid, user_id=user) as session:
            session.state["k"] = 1
            session.state["user:fact.name"] = user
    report = await store.erase_user("li")
    assert (report.sessions, report.messages, report.state_rows, report.user_state_rows) == (2, 6, 1, 1)
    assert await rows(store, "SELECT DISTINCT user_id FROM agent_sessions") == [("wang",)]
    assert await rows(store, "SELECT user_id FROM agent_user_state") == [("wang",)]


async def test_fork_branches_the_conversation_and_keeps_tool_pairs(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", tools=[weather])
    await chat(store, agent, "main", "我叫李明", "call weather")  # seq 0-1, then 2-5 (call at 3, result at 4)
    async with store.session("main", user_id="u") as session:
        session.state["mood"] = "good"
    branch = await store.fork("main", user_id="u", at_seq=3, new_id="branch")  # would split call 3 / result 4
    assert branch == "branch"
    assert [m.seq for m in await store.messages("branch", user_id="u")] == [0, 1, 2]
    async with store.session("branch", user_id="u") as session:
        assert session.state["mood"] == "good"
        reply = await agent.run("我叫什么名字？", session=session)
    assert reply.text == "你叫李明。"
    assert len(await store.messages("main", user_id="u")) == 6  # the original is untouched
    lineage = await store.get("branch", user_id="u")
    assert (lineage.forked_from, lineage.forked_at_seq) == ("main", 2)  # the cut moved back to keep the pair
    assert (await store.get("main", user_id="u")).forked_from is None
    with pytest.raises(SessionNotFoundError):
        await store.fork("main", user_id="intruder")
    whole = await store.fork("main", user_id="u")
    assert len(await store.messages(whole, user_id="u")) == 6


async def test_truncate_rewinds_without_splitting_a_tool_call(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", tools=[weather])
    await chat(store, agent, "s", "hi", "call weather")  # 0-1, then 2 user, 3 call, 4 result, 5 answer
    assert await store.truncate("s", 3, user_id="u") == 3  # the cut moves to 2: the call needs its result
    assert [m.seq for m in await store.messages("s", user_id="u")] == [0, 1, 2]
    assert await rows(store, "SELECT count(*) FROM agent_tool_calls") == [(0,)]
    await chat(store, agent, "s", "next")
    assert [m.seq for m in await store.messages("s", user_id="u")] == [0, 1, 2, 3, 4]


async def test_export_then_import_into_an_empty_database_reproduces_the_rows(
    store: Store, agent: Agent, tmp_path: Any
) -> None:
    agent_with_tool = Agent(client=agent.client, name="Bot", tools=[weather])
    await chat(store, agent_with_tool, "a", "我叫李明", "call weather", user_id="li")
    await chat(store, agent, "b", "hello", user_id="li")
    async with store.session("a", user_id="li") as session:
        session.state.update({"when": datetime(2026, 1, 1, 9, 0), "user:fact.name": "李明"})
    await store.update("a", user_id="li", title="T", metadata={"k": [1, 2]})
    lines = [line async for line in store.export(user_id="li")]
    target_url = f"sqlite+aiosqlite:///{tmp_path}/copy.db"
    async with Store.from_url(target_url) as copy:
        await copy.migrate()
        first = await copy.import_lines(lines)
        again = await copy.import_lines(lines)
        assert (first.imported, first.skipped, again.imported, again.skipped) == (2, 0, 0, 2)
        # Every column but the conflict tokens, which an import draws afresh (incarnation, state stamps).
        session_columns = ("id, user_id, agent_id, service_session_id, version, next_seq, created_at, updated_at, "
                           "title, metadata, last_run_at, closed_at, ttl_seconds, expires_at")  # fmt: skip
        tables = {
            "agent_sessions": (session_columns, "id"), "agent_messages": ("*", "session_id, seq"),
            "agent_state": ("session_id, key, value, updated_at", "session_id, key"),
            "agent_tool_calls": ("*", "session_id, seq"), "agent_runs": ("*", "session_id, run_id"),
            "agent_user_state": ("user_id, key, value, updated_at", "user_id, key"),
        }  # fmt: skip
        for table, (columns, order) in tables.items():
            sql = f"SELECT {columns} FROM {table} ORDER BY {order}"  # noqa: S608
            assert [norm(r) for r in await rows(copy, sql)] == [norm(r) for r in await rows(store, sql)], table
        stamps = "SELECT version FROM agent_state UNION ALL SELECT incarnation FROM agent_sessions"
        assert not {r[0] for r in await rows(copy, stamps)} & {r[0] for r in await rows(store, stamps)}
        assert without_tokens([line async for line in copy.export(user_id="li")]) == without_tokens(lines)
    with pytest.raises(SessionNotFoundError):
        [line async for line in store.export(user_id="intruder", session_id="a")]


def without_tokens(lines: list[str]) -> list[Any]:
    import json

    records = [json.loads(line) for line in lines]
    for r in records:
        if r["kind"] in ("session", "state", "user_state"):
            r["row"].pop("incarnation" if r["kind"] == "session" else "version")
    return records


def norm(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Compare rows across backends: JSON as parsed values, timestamps as UTC instants."""
    import json

    out: list[Any] = []
    for value in row:
        if isinstance(value, str) and value[:1] in '{["':
            try:
                value = json.loads(value)
            except ValueError:
                pass
        if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] in " T":
            try:
                value = datetime.fromisoformat(value).replace(tzinfo=UTC)
            except ValueError:
                pass
        if isinstance(value, datetime) and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        out.append(value)
    return tuple(out)


async def test_the_run_log_records_agent_counts_tokens_and_conflicts(store: Store, agent: Agent) -> None:
    from agent_store.agent_framework import StoreHistoryProvider

    counted = Agent(client=agent.client, name="Counter", context_providers=[StoreHistoryProvider(store)])
    async with store.session("s", user_id="u") as session:
        session.state["n"] = 0
        await counted.run("hello", session=session)
    a, b = await store.load("s", user_id="u"), await store.load("s", user_id="u")
    a.session.state["n"], b.session.state["n"] = 1, 2
    await a.commit()
    with pytest.raises(ConflictError, match=r"\['n'\]"):
        await b.commit()
    log = await rows(
        store,
        "SELECT agent_name, messages_in, messages_out, input_tokens > 0, output_tokens > 0, outcome "
        "FROM agent_runs ORDER BY committed_at",
    )
    assert log[0] in (("Counter", 1, 1, True, True, "committed"), ("Counter", 1, 1, 1, 1, "committed"))
    assert [r[5] for r in log] == ["committed", "committed", "conflict"]


async def test_the_transcript_view_names_users_and_tools(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", tools=[weather])
    await chat(store, agent, "s", "call weather", user_id="li")
    view = "SELECT user_id, seq, role, author_name, tool_name FROM agent_transcript ORDER BY seq"
    assert await rows(store, view) == [
        ("li", 0, "user", None, None), ("li", 1, "assistant", "Bot", "weather"),
        ("li", 2, "tool", "Bot", "weather"), ("li", 3, "assistant", "Bot", None),
    ]  # fmt: skip


async def test_listings_and_transcripts_can_read_from_a_replica(url: str, agent: Agent) -> None:
    """This machine has no streaming replica: the "replica" is a second engine on the same database."""
    async with Store.from_url(url, replica_url=url) as store:
        await store.migrate()
        replica_pool = store.db._replica.pool  # type: ignore[union-attr]
        await chat(store, agent, "s", "hi")
        assert replica_pool.checkedin() == 0  # runs load and commit on the primary only
        assert [s.id for s in (await store.list_sessions(user_id="u")).items] == ["s"]
        assert len(await store.messages("s", user_id="u")) == 2
        assert replica_pool.checkedin() >= 1
