"""The core contract (issue 2): rebuild, delta in one transaction, concurrency, idempotency, scoping."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime

import pytest
from agent_framework import Agent, Message
from helpers import lose_the_reply, rows
from sqlalchemy import func, select

from agent_store import ConflictError, InvalidValueError, SessionNotFoundError, StorageUnavailableError, Store
from agent_store.db import message_rows
from agent_store.db.tables import messages_t, runs_t, sessions_t, state_t


async def test_a_second_store_remembers_the_name_and_the_state(url: str, agent: Agent) -> None:
    async with Store.from_url(url) as first:
        await first.migrate()
        async with first.session("chat-42", user_id="u1") as session:
            reply = await agent.run("我叫李明", session=session)
            session.state["count"] = 1
    assert "李明" in reply.text

    async with Store.from_url(url) as second:
        async with second.session("chat-42", user_id="u1") as session:
            assert session.session_id == "chat-42"
            assert session.state["count"] == 1
            reply = await agent.run("我叫什么名字？", session=session)
            session.state["count"] += 1
        assert reply.text == "你叫李明。"
        assert await rows(second, "SELECT seq, role, author_name FROM agent_messages ORDER BY seq") == [
            (0, "user", None),
            (1, "assistant", "Bot"),
            (2, "user", None),
            (3, "assistant", "Bot"),
        ]
        assert await rows(second, "SELECT value FROM agent_state WHERE key = 'count'") in ([(2,)], [("2",)])


async def test_a_fresh_agent_without_the_store_does_not_know_the_name(store: Store, agent: Agent) -> None:
    async with store.session("a", user_id="u1") as session:
        await agent.run("我叫李明", session=session)
    async with store.session("b", user_id="u1") as session:
        reply = await agent.run("我叫什么名字？", session=session)
    assert reply.text == "我不知道你叫什么名字。"


ROUND_TRIP_VALUES = [
    pytest.param({"theme": "dark", "language": "zh", "n": [1, 2.5, None, True]}, id="json"),
    pytest.param(datetime(2026, 11, 30, 8, 1, 2, 345678), id="naive-datetime"),
    pytest.param(datetime(2026, 11, 30, 8, 1, 2, tzinfo=UTC), id="aware-datetime"),
    pytest.param(date(2026, 11, 30), id="date"),
    pytest.param((1, "two", (3,)), id="tuple"),
    pytest.param({"type": "message", "role": "user", "contents": []}, id="dict-that-looks-like-a-message"),
    pytest.param({"$datetime": "2026-01-01"}, id="dict-that-looks-like-a-tag"),
    pytest.param([{"turn": 1, "timestamp": datetime(2026, 1, 1, 9, 30)}], id="seed-history-list"),
    pytest.param("李明 \u2028 emoji 🎉", id="unicode"),
]


@pytest.mark.parametrize("value", ROUND_TRIP_VALUES)
async def test_state_values_round_trip_as_the_same_types(store: Store, value: object) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["v"] = value
    async with store.session("s", user_id="u") as session:
        assert session.state["v"] == value
        assert type(session.state["v"]) is type(value)


async def test_a_message_in_state_comes_back_as_a_message(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["pinned"] = {"note": Message(role="user", contents=["记住这个"], author_name="ann")}
    async with store.session("s", user_id="u") as session:
        pinned = session.state["pinned"]["note"]
    assert isinstance(pinned, Message)
    assert (pinned.role, pinned.text, pinned.author_name) == ("user", "记住这个", "ann")


class Opaque:
    pass


UNSTORABLE = [
    pytest.param({1, 2}, "set", id="set"),
    pytest.param(b"raw", "bytes", id="bytes"),
    pytest.param(Opaque(), "Opaque", id="object"),
    pytest.param(float("nan"), "finite", id="nan"),
    pytest.param({"deep": [float("inf")]}, "finite", id="nested-infinity"),
    pytest.param({1: "int key"}, "string keys", id="int-key"),
    pytest.param("nul\x00char", "NUL", id="nul"),
    pytest.param("lone \ud800 surrogate", "surrogate", id="surrogate"),
]


@pytest.mark.parametrize(("value", "reason"), UNSTORABLE)
async def test_an_unstorable_value_is_refused_by_key_and_nothing_is_written(
    store: Store, agent: Agent, value: object, reason: str
) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["kept"] = "before"
    before = await rows(store, "SELECT key, version FROM agent_state")
    with pytest.raises(InvalidValueError, match=rf"state\['bad'\].*{reason}"):
        async with store.session("s", user_id="u") as session:
            await agent.run("hello", session=session)
            session.state["kept"] = "after"
            session.state["bad"] = value
    assert await rows(store, "SELECT key, version FROM agent_state") == before
    assert await rows(store, "SELECT version FROM agent_sessions") == [(1,)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_a_cycle_is_refused(store: Store) -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(InvalidValueError, match=r"state\['loop'\].*cycle"):
        async with store.session("s", user_id="u") as session:
            session.state["loop"] = loop


async def test_only_changed_keys_are_written_and_a_deleted_key_leaves_no_row(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state.update(same="x", nested={"a": {"b": [1]}}, gone=1)
    first = dict(await rows(store, "SELECT key, version FROM agent_state"))
    async with store.session("s", user_id="u") as session:
        session.state["nested"]["a"]["b"].append(2)  # an in-place edit, no reassignment
        del session.state["gone"]
        session.state["new"] = True
    second = dict(await rows(store, "SELECT key, version FROM agent_state"))
    assert sorted(second) == ["nested", "new", "same"]
    assert second["same"] == first["same"]  # not rewritten: same stamp
    assert second["nested"] == second["new"] != first["nested"]  # both written by the second commit's stamp
    async with store.session("s", user_id="u") as session:
        assert session.state["nested"] == {"a": {"b": [1, 2]}}
        assert "gone" not in session.state


async def test_history_is_not_duplicated_into_the_state_table(store: Store, agent: Agent) -> None:
    async with store.session("s", user_id="u") as session:
        await agent.run("hi", session=session)
    assert await rows(store, "SELECT count(*) FROM agent_state") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(2,)]


async def test_an_exception_in_the_block_writes_nothing_and_propagates_unchanged(store: Store, agent: Agent) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["n"] = 1
    boom = RuntimeError("model failed")
    with pytest.raises(RuntimeError) as raised:
        async with store.session("s", user_id="u") as session:
            await agent.run("hi", session=session)
            session.state["n"] = 2
            raise boom
    assert raised.value is boom
    assert await rows(store, "SELECT version FROM agent_sessions") == [(1,)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
    async with store.session("s", user_id="u") as session:
        assert session.state["n"] == 1


async def test_a_run_that_raises_on_a_new_session_leaves_no_session(store: Store) -> None:
    with pytest.raises(KeyError):
        async with store.session("new", user_id="u") as session:
            session.state["x"] = 1
            raise KeyError("x")
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]


async def test_overlapping_runs_keep_both_histories_and_merge_disjoint_keys(store: Store, agent: Agent) -> None:
    first = await store.load("s", user_id="u")
    second = await store.load("s", user_id="u")
    await agent.run("from tab one", session=first.session)
    await agent.run("from tab two", session=second.session)
    first.session.state["theme"] = "dark"
    second.session.state["language"] = "zh"
    await second.commit()
    await first.commit()
    assert await rows(store, "SELECT seq, text FROM agent_messages WHERE role = 'user' ORDER BY seq") == [
        (0, "from tab two"),
        (2, "from tab one"),
    ]
    assert await rows(store, "SELECT min(seq), max(seq), count(*) FROM agent_messages") == [(0, 3, 4)]
    async with store.session("s", user_id="u") as session:
        assert (session.state["theme"], session.state["language"]) == ("dark", "zh")
        assert len(session.state["in_memory"]["messages"]) == 4


@pytest.mark.parametrize("change", ["set", "delete", "create"])
async def test_the_same_key_changed_by_two_runs_is_a_conflict_and_the_loser_writes_nothing(
    store: Store, agent: Agent, change: str
) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["counter" if change != "create" else "other"] = 0
    first = await store.load("s", user_id="u")
    second = await store.load("s", user_id="u")
    first.session.state["counter"] = 1
    await first.commit()
    await agent.run("lost?", session=second.session)
    if change == "delete":
        del second.session.state["counter"]
    else:
        second.session.state["counter"] = 1
    with pytest.raises(ConflictError, match="counter") as conflict:
        await second.commit()
    assert conflict.value.keys == ["counter"]
    assert await rows(store, "SELECT version FROM agent_sessions") == [(2,)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_concurrent_commits_from_two_engines_get_gap_free_seq(url: str, agent: Agent) -> None:
    async with Store.from_url(url) as a, Store.from_url(url) as b:
        await a.migrate()

        async def one_run(store: Store, i: int) -> None:
            async with store.session("shared", user_id="u") as session:
                await agent.run(f"turn {i}", session=session)

        await asyncio.gather(*(one_run(a if i % 2 else b, i) for i in range(10)))
        seqs = [r[0] for r in await rows(a, "SELECT seq FROM agent_messages ORDER BY seq")]
        assert seqs == list(range(20))
        assert await rows(a, "SELECT version, next_seq FROM agent_sessions") == [(10, 20)]


async def test_a_retried_commit_after_a_lost_reply_writes_nothing_twice(store: Store, agent: Agent) -> None:
    run = await store.load("s", user_id="u")
    await agent.run("hello", session=run.session)
    run.session.state["n"] = 1
    lose_the_reply(store)
    with pytest.raises(StorageUnavailableError, match="connection lost"):
        await run.commit()
    assert run.session.state["n"] == 1  # the in-memory session is intact
    result = await run.commit()
    assert result.messages_written == 2
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(2,)]
    assert await rows(store, "SELECT count(*), max(version) FROM agent_runs") == [(1, 1)]


async def test_a_session_is_invisible_to_another_user(store: Store, agent: Agent) -> None:
    async with store.session("chat-42", user_id="u1") as session:
        await agent.run("我叫李明", session=session)
    with pytest.raises(SessionNotFoundError, match="chat-42"):
        async with store.session("chat-42", user_id="u2"):
            pass
    with pytest.raises(SessionNotFoundError):
        async with store.session("chat-42"):
            pass
    assert await rows(store, "SELECT user_id, version FROM agent_sessions") == [("u1", 1)]


async def test_a_session_bound_to_an_agent_cannot_be_opened_by_another(store: Store, agent: Agent) -> None:
    async with store.session("private", user_id="u", agent_id="translator") as session:
        await agent.run("hi", session=session)
    for other in ("summarizer", None):
        with pytest.raises(SessionNotFoundError):
            await store.load("private", user_id="u", agent_id=other)
    run = await store.load("private", user_id="u", agent_id="translator")
    assert len(run.session.state["in_memory"]["messages"]) == 2


@pytest.mark.parametrize("service_id", ["resp_123", {"conversation_id": "conv_9", "kind": "x"}])
async def test_service_session_id_persists(store: Store, service_id: object) -> None:
    async with store.session("s", user_id="u") as session:
        session.service_session_id = service_id  # type: ignore[assignment]
    async with store.session("s", user_id="u") as session:
        assert session.service_session_id == service_id


async def test_no_connection_is_held_while_the_agent_runs(url: str, agent: Agent) -> None:
    """Two sessions whose model calls overlap complete on a pool of ONE connection."""
    async with Store.from_url(url, pool_size=1, max_overflow=0, pool_timeout=5) as store:
        await store.migrate()
        a_inside, b_inside = asyncio.Event(), asyncio.Event()

        async def run(session_id: str, mine: asyncio.Event, other: asyncio.Event) -> None:
            async with store.session(session_id, user_id="u") as session:
                mine.set()
                await asyncio.wait_for(other.wait(), 5)  # the "model" thinks while the other one loads
                await agent.run("hi", session=session)

        await asyncio.gather(run("a", a_inside, b_inside), run("b", b_inside, a_inside))
        async with store.session("c", user_id="u") as session:
            assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
            await agent.run("hi", session=session)
        assert await rows(
            store, "SELECT session_id, count(*) FROM agent_messages GROUP BY session_id ORDER BY session_id"
        ) == [("a", 2), ("b", 2), ("c", 2)]


async def test_tables_are_readable_with_orm_rows(store: Store, agent: Agent) -> None:
    async with store.session("s", user_id="u") as session:
        await agent.run("我叫李明", session=session)
        session.state["k"] = {"a": 1}
    async with store.engine.connect() as conn:
        session_row = (await conn.execute(select(sessions_t))).one()
        assert session_row.created_at.tzinfo is not None and session_row.version == 1
        rows = (await conn.execute(select(messages_t).order_by(messages_t.c.seq))).all()
        assert (rows[0].role, rows[0].text) == ("user", "我叫李明")
        # The body leaves out what the columns hold: a plain text message is the text column, nothing more.
        assert rows[0].body == {"$text": 1}
        assert (await conn.execute(select(state_t.c.value))).scalar_one() == {"a": 1}
        assert (await conn.execute(select(func.count()).select_from(runs_t))).scalar_one() == 1


class ReversingCipher:
    """A test double with the cipher's shape (the Security example in docs/reliability.md uses Fernet)."""

    def encrypt(self, plaintext: str) -> str:
        return plaintext[::-1]

    def decrypt(self, token: str) -> str:
        return token[::-1]


async def test_message_content_can_be_encrypted_at_rest(url: str, agent: Agent) -> None:
    async with Store.from_url(url, message_cipher=ReversingCipher()) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            await agent.run("我叫李明", session=session)
        assert await rows(store, "SELECT count(*) FROM agent_messages WHERE CAST(body AS TEXT) LIKE '%李明%'") == [(0,)]
        assert await rows(store, "SELECT text, role FROM agent_messages ORDER BY seq") == [
            ("", "user"),
            ("", "assistant"),
        ]
        assert (await store.messages("s", user_id="u"))[0].body["contents"][0]["text"] == "我叫李明"
        async with store.session("s", user_id="u") as session:
            assert (await agent.run("我叫什么名字？", session=session)).text == "你叫李明。"
    async with Store.from_url(url) as without_key:
        with pytest.raises(InvalidValueError, match="message_cipher"):
            await without_key.load("s", user_id="u")


async def test_an_old_message_re_added_to_a_windowed_history_is_refused_not_duplicated(
    store: Store, agent: Agent
) -> None:
    async with store.session("s", user_id="u") as session:
        await agent.run("first", session=session)
        old = session.state["in_memory"]["messages"][0]
        await agent.run("second", session=session)
    with pytest.raises(InvalidValueError, match="already stored") as refused:
        async with store.session("s", user_id="u", history_limit=2) as session:
            session.state["in_memory"]["messages"].append(old)  # outside the window, so not recognised as loaded
    assert f"message id {message_rows.store_id(old)!r} of this run is already stored" in str(refused.value)  # named
    assert await rows(
        store, "SELECT count(*), max(version) FROM agent_messages JOIN agent_sessions ON id = session_id"
    ) == [(4, 1)]


# Two different ids with one MD5 (Marc Stevens' published collision pair): PostgreSQL's id index keys the MD5.
COLLIDING_IDS = ("TEXTCOLLBYfGiJUETHQ4hAcKSMd5zYpgqf1YRDhkmxHkhPWptrkoyz28wnI9V0aHeAuaKnak",
                 "TEXTCOLLBYfGiJUETHQ4hEcKSMd5zYpgqf1YRDhkmxHkhPWptrkoyz28wnI9V0aHeAuaKnak")  # fmt: skip


@pytest.mark.parametrize("run_id", [None, "key"])  # the one call / hop, and the checked path
async def test_ids_sharing_an_md5_are_refused_by_name_on_postgresql_and_kept_apart_on_sqlite(
    store: Store, run_id: str | None
) -> None:
    from agent_store.db.statements import id_hash

    assert id_hash(COLLIDING_IDS[0]) == id_hash(COLLIDING_IDS[1])
    run = await store.load("s", user_id="u", run_id=run_id)
    for message_id in COLLIDING_IDS:
        message = Message(role="user", contents=[message_id[-4:]])
        message.additional_properties["agent_store_id"] = message_id
        run.history.append(message)
    if store.engine.dialect.name == "postgresql":
        with pytest.raises(InvalidValueError, match="share an MD5, so the second is taken as already stored"):
            await run.commit()
        assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
    else:  # SQLite's index keys the id itself
        await run.commit()
        assert await rows(store, "SELECT count(*) FROM agent_messages") == [(2,)]


async def test_the_ids_the_store_makes_are_short_and_a_sessions_runs_sort_by_time(store: Store) -> None:
    """A run's id and a message's own id are 20 characters of one sortable alphabet (not a UUID's 32 hex digits:
    both are in every message row, issue 43), and a session's run ids sort in the order its runs committed."""
    import re

    for n in range(5):
        run = await store.load("s", user_id="u")
        run.history.append(Message(role="user", contents=[f"turn {n}"]))
        await run.commit()
        await asyncio.sleep(0.002)  # a millisecond apart at least: the id's time is in milliseconds
    logged = await rows(store, "SELECT run_id FROM agent_runs WHERE session_id = 's' ORDER BY version")
    stored = await rows(store, "SELECT message_id, run_id FROM agent_messages WHERE session_id = 's' ORDER BY seq")
    run_ids = [r for (r,) in logged]
    assert len(run_ids) == 5 and run_ids == sorted(run_ids) and len(set(run_ids)) == 5
    assert all(re.fullmatch(r"[0-9a-hjkmnp-tv-z]{20}", r) for r in run_ids), run_ids
    assert [r for _m, r in stored] == run_ids
    assert all(re.fullmatch(r"~[0-9a-hjkmnp-tv-z]{20}", m) for m, _r in stored), stored


async def test_runs_a_session_store_commits_under_response_ids_get_the_stores_ids(store: Store) -> None:
    """The hosting path (StoreSessionStore.set under a response id) names its runs with the store's own ids too."""
    import re

    from agent_framework import AgentSession

    from agent_store.agent_framework import StoreSessionStore

    sessions = StoreSessionStore(store)
    for n in range(4):
        session = await sessions.get("conv") or AgentSession(session_id="conv")
        session.state.setdefault("in_memory", {}).setdefault("messages", []).append(Message("user", [f"t{n}"]))
        await sessions.set(f"resp{n}", session)
        await asyncio.sleep(0.002)
    logged = [r for (r,) in await rows(store, "SELECT run_id FROM agent_runs ORDER BY committed_at")]
    assert len(logged) == 4 and logged == sorted(logged), logged
    assert all(re.fullmatch(r"[0-9a-hjkmnp-tv-z]{20}", r) for r in logged), logged
