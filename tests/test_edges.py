"""Issue 9: the edges. Each test is one sequence of deletes, restarts, retries or races that broke a guarantee."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, Content, Message
from helpers import expire_now, lose_the_reply, rows

from agent_store import (
    AgentStoreError,
    ConflictError,
    InvalidValueError,
    Run,
    SessionNotFoundError,
    StorageUnavailableError,
    Store,
)
from agent_store.agent_framework import StoreHistoryProvider, StoreSessionStore
from agent_store.offline import OfflineChatClient, check_request


async def replace_by_import(store: Store, session_id: str) -> None:
    lines = [line async for line in store.export(user_id="u", session_id=session_id)]
    await store.delete(session_id, user_id="u")
    assert (await store.import_lines(lines)).imported == 1


@pytest.mark.parametrize("how", ["delete-and-recreate", "expire-and-restart", "purge-and-recreate", "import"])
async def test_a_run_from_an_old_incarnation_never_commits_into_the_new_one(store: Store, how: str) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["k"] = "old"
    stale = await store.load("s", user_id="u")
    stale.history.append(Message(role="user", contents=["written to the old conversation"]))
    stale.session.state["other"] = 1  # a key the new conversation never set: no key conflict to hide behind
    if how == "delete-and-recreate":
        await store.delete("s", user_id="u")
        async with store.session("s", user_id="u") as session:
            session.state["k"] = "new"
    elif how in ("expire-and-restart", "purge-and-recreate"):
        await expire_now(store, "s")
        if how == "purge-and-recreate":
            assert await store.purge_expired() == 1
        async with store.session("s", user_id="u", if_expired="restart") as session:
            session.state["k"] = "new"
    else:
        await replace_by_import(store, "s")
    with pytest.raises(ConflictError, match="deleted and created again"):
        await stale.commit()
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
    assert await rows(store, "SELECT key FROM agent_state ORDER BY key") == [("k",)]


async def test_a_run_whose_session_is_gone_finds_nothing_and_writes_nothing(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 1
    stale = await store.load("s", user_id="u")
    stale.session.state["k"] = 2
    await store.erase_user("u")
    with pytest.raises(SessionNotFoundError, match="no session 's' for user 'u'"):
        await stale.commit()
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]


async def test_a_fork_gives_copied_keys_fresh_stamps_so_a_later_write_is_a_conflict(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 0
    await store.fork("s", user_id="u", new_id="f")
    mine, theirs = await store.load("f", user_id="u"), await store.load("f", user_id="u")
    theirs.session.state["k"] = "theirs"
    await theirs.commit()  # the fork's first commit: its stamp must differ from the copied one
    mine.session.state["k"] = "mine"
    with pytest.raises(ConflictError, match=r"\['k'\]"):
        await mine.commit()
    copied = await rows(store, "SELECT session_id, version FROM agent_state ORDER BY session_id")
    assert copied[0][1] != copied[1][1]


async def test_a_retry_after_a_lost_reply_writes_exactly_the_first_delta(store: Store) -> None:
    run = await store.load("s", user_id="u")
    run.history.append(Message(role="user", contents=["first"]))
    run.session.state["a"] = 1
    lose_the_reply(store)
    with pytest.raises(StorageUnavailableError) as lost:
        await run.commit()
    assert lost.value.retryable is True
    run.history.append(Message(role="user", contents=["second"]))  # after the first attempt
    run.session.state["b"] = 2
    retried = await run.commit()
    assert (retried.messages_written, retried.state_keys_written, retried.version) == (1, 1, 1)
    assert await rows(store, "SELECT text FROM agent_messages ORDER BY seq") == [("first",)]
    later = await run.commit()  # the changes made after the first attempt
    assert (later.messages_written, later.state_keys_written, later.version) == (1, 1, 2)
    assert await rows(store, "SELECT text FROM agent_messages ORDER BY seq") == [("first",), ("second",)]


async def test_an_idempotency_key_committed_twice_concurrently_writes_once(store: Store) -> None:
    async def attempt(words: str) -> Any:
        run = await store.load("s", user_id="u", run_id="request-42")
        run.history.append(Message(role="user", contents=[words]))
        run.session.state["answer"] = words
        return await run.commit()

    results = await asyncio.gather(*(attempt(f"attempt {i}") for i in range(4)), return_exceptions=True)
    landed = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    # The first to take the row lock writes; every later one finds the key and reports that first result,
    # except one that loaded before the session existed and collides on a key: a conflict, never a 2nd write.
    assert all(isinstance(r, ConflictError) for r in refused) and landed
    assert {(r.run_id, r.version, r.messages_written) for r in landed} == {("request-42", 1, 1)}
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(1,)]
    assert await rows(store, "SELECT run_id, outcome FROM agent_runs WHERE outcome = 'committed'") == [
        ("request-42", "committed")
    ]
    again = await store.load("s", user_id="u", run_id="request-42")  # a retry from another process, later
    again.history.append(Message(role="user", contents=["retried"]))
    assert (await again.commit()).version == 1
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(1,)]


async def test_a_ttl_set_while_a_run_is_in_flight_survives_its_commit(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 1
    run = await store.load("s", user_id="u")
    await store.update("s", user_id="u", ttl=timedelta(hours=1))
    run.session.state["k"] = 2
    before = datetime.now(UTC)
    await run.commit()
    info = await store.get("s", user_id="u")
    assert info.expires_at is not None
    assert before + timedelta(minutes=59) < info.expires_at <= datetime.now(UTC) + timedelta(hours=1)


async def test_erase_user_racing_commits_leaves_no_row_of_the_user(store: Store) -> None:
    """Runs in flight on existing and on new sessions, writing user: keys, committed while the user is erased."""
    for trial in range(3):
        user = f"u{trial}"
        for n in range(3):
            async with store.session(f"{user}-s{n}", user_id=user) as session:
                session.state["user:fact.name"] = "李明"
        runs = [await store.load(f"{user}-s{n}", user_id=user) for n in range(6)]  # s3..s5 do not exist yet
        for i, run in enumerate(runs):
            run.session.state["user:fact.city"] = f"city {i}"
            run.history.append(Message(role="user", contents=["hi"]))

        async def commit(run: Any) -> Any:
            try:
                return await run.commit()
            except AgentStoreError as exc:
                return exc

        outcomes = await asyncio.gather(store.erase_user(user), *(commit(r) for r in runs))
        for outcome in outcomes[1:]:  # landed before the erasure (and erased), or refused: never a raw error
            refused = (SessionNotFoundError, ConflictError)  # the runs also race each other on user:fact.city
            assert not isinstance(outcome, AgentStoreError) or isinstance(outcome, refused), outcome
        for table in ("agent_sessions", "agent_user_state"):
            assert await rows(store, f"SELECT count(*) FROM {table} WHERE user_id = :u", u=user) == [(0,)]  # noqa: S608
        assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
    await asyncio.sleep(1.1)  # past the erasure fence's clock margin: the user may start afresh
    async with store.session("u0-new", user_id="u0") as session:
        session.state["user:fact.name"] = "again"
    assert await rows(store, "SELECT count(*) FROM agent_user_state WHERE user_id = 'u0'") == [(1,)]


async def test_two_creators_with_different_agents_cannot_share_a_new_id(store: Store) -> None:
    a = await store.load("s", user_id="u", agent_id="agent-a")
    b = await store.load("s", user_id="u", agent_id="agent-b")
    a.history.append(Message(role="user", contents=["for a"]))
    b.history.append(Message(role="user", contents=["for b"]))
    await a.commit()
    with pytest.raises(SessionNotFoundError, match="no session 's' for user 'u'"):
        await b.commit()
    assert await rows(store, "SELECT agent_id, next_seq FROM agent_sessions") == [("agent-a", 1)]


def call(call_id: str) -> Message:
    return Message(role="assistant", contents=[Content.from_function_call(call_id=call_id, name="f", arguments={})])


def result(call_id: str) -> Message:
    return Message(role="tool", contents=[Content.from_function_result(call_id=call_id, result="ok")])


@pytest.mark.parametrize("limit", [None, 1, 2, 3, 4, 5, 6])
async def test_no_window_hands_the_model_a_result_without_its_call(store: Store, limit: int | None) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"].extend(
            [
                Message(role="user", contents=["go"]),
                call("A"),
                call("B"),
                result("A"),
                result("B"),
                Message(role="assistant", contents=["done"]),
            ]
        )
    run = await store.load("s", user_id="u", history_limit=limit)
    check_request(run.history)  # raises on an orphan result or an unanswered call
    assert len(run.history) >= min(limit or 6, 6)


async def load_with_writes_between_reads(
    store: Store, history_limit: int, write: Callable[[int, dict[str, Any]], Awaitable[None]]
) -> tuple[Run, int]:
    """``store.load`` of session "s" with ``write(reads_so_far, params)`` run by "another client" right after
    each of the load's statements; the load and the number of statements it sent."""
    real, reads = store.db.one_statement, 0

    async def then_write(statement: Any, params: Any, **options: Any) -> Any:
        nonlocal reads
        found = await real(statement, params, **options)
        reads += 1
        store.db.one_statement = real  # type: ignore[method-assign]  # the writer's own statements go through
        try:
            await write(reads, params)
        finally:
            store.db.one_statement = then_write  # type: ignore[method-assign]
        return found

    store.db.one_statement = then_write  # type: ignore[method-assign]
    try:
        return await store.load("s", user_id="u", history_limit=history_limit), reads
    finally:
        store.db.one_statement = real  # type: ignore[method-assign]


async def test_a_window_widened_over_two_reads_is_measured_again_if_a_commit_came_between(store: Store) -> None:
    """The window reaches back to a result's call in a second statement; if the session was truncated and
    written between the two, the second read's starting seq belongs to the old history: measured again."""
    texts = [Message(role="user", contents=[f"t{n}"]) for n in range(5)]
    async with store.session("s", user_id="u") as session:  # a window of 2 widens to result B's call, then A's
        session.state["in_memory"]["messages"].extend(
            [call("A"), call("B"), result("A"), *texts, result("B"), texts[0]]
        )

    async def truncate_and_write_once(reads: int, _params: dict[str, Any]) -> None:
        if reads == 1:  # another client rewinds the session and writes one message
            await store.truncate("s", after_seq=0, user_id="u")
            async with store.session("s", user_id="u") as other:
                other.state["in_memory"]["messages"].append(Message(role="user", contents=["new"]))

    run, reads = await load_with_writes_between_reads(store, 2, truncate_and_write_once)
    calm = await store.load("s", user_id="u", history_limit=2)  # the same load with nothing in between
    assert reads == 3 and [m.text for m in calm.history][-1] == "new"
    assert [m.to_dict() for m in run.history] == [m.to_dict() for m in calm.history]
    await run.discard()
    await calm.discard()


async def test_a_window_with_commits_between_all_its_reads_is_read_whole_at_last(store: Store) -> None:
    """Commits keep coming between the window's reads: after a few re-measures the load reads the whole history
    in one statement (one snapshot) and takes its pair-safe tail, never a window measured on another version."""
    from agent_store.run.load import MAX_REMEASURES

    def block(n: int) -> list[Message]:
        # A window of 1 widens to this block's user message and to call a, before it: a second read, which
        # widens to the user message before that, and so on back to the first block.
        user = Message(role="user", contents=[f"turn {n}"])
        return [call(f"a{n}"), user, call(f"b{n}"), result(f"a{n}"), result(f"b{n}")]

    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"].extend([Message(role="user", contents=["start"]), *block(0)])

    async def append_after_windowed_reads(reads: int, params: dict[str, Any]) -> None:
        if "limit" in params or "start" in params:  # not after a read of the whole history
            async with store.session("s", user_id="u") as other:
                other.state["in_memory"]["messages"].extend(block(reads))

    run, reads = await load_with_writes_between_reads(store, 1, append_after_windowed_reads)
    calm = await store.load("s", user_id="u", history_limit=1)
    assert reads == 2 * MAX_REMEASURES + 1 and len(calm.history) == 1 + 5 * reads  # a block per windowed read
    assert [m.to_dict() for m in run.history] == [m.to_dict() for m in calm.history]
    check_request(run.history)
    await run.discard()
    await calm.discard()


@pytest.mark.parametrize("limit", [2**31 - 1, 2**31, 2**63])
async def test_a_history_limit_beyond_any_session_loads_the_whole_history(store: Store, limit: int) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"].extend(Message(role="user", contents=[f"m{n}"]) for n in range(3))
    run = await store.load("s", user_id="u", history_limit=limit)  # the same on both backends, no overflow
    assert [m.text for m in run.history] == ["m0", "m1", "m2"]
    await run.discard()


async def test_an_interrupted_tool_loop_leaves_the_session_usable(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot")
    async with store.session("s", user_id="u") as session:
        await agent.run("hello", session=session)
        session.state["in_memory"]["messages"].append(call("lost"))  # the call was saved, its result never came
    assert await rows(store, "SELECT role FROM agent_messages ORDER BY seq") == [
        ("user",),
        ("assistant",),
        ("assistant",),
    ]
    async with store.session("s", user_id="u") as session:
        reply = await agent.run("still there?", session=session)  # the offline client refuses invalid history
    assert "still there?" in reply.text
    stored = await rows(store, "SELECT role, text FROM agent_messages ORDER BY seq")
    assert [r[0] for r in stored] == ["user", "assistant", "assistant", "user", "assistant"]  # no synthetic row


async def test_identical_turns_in_one_block_are_stored_as_separate_turns(store: Store) -> None:
    plain = Agent(client=OfflineChatClient(), name="Bot")
    provided = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])
    for sid, agent in (("plain", plain), ("provided", provided)):
        async with store.session(sid, user_id="u") as session:
            for _ in range(3):
                await agent.run("same words", session=session)
        async with store.session(sid, user_id="u") as session:
            await agent.run("same words", session=session)
        count = await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = :s", s=sid)
        assert count == [(8,)], sid


async def test_another_users_id_answers_like_an_unknown_id(store: Store) -> None:
    async with store.session("mine", user_id="u1") as session:
        session.state["k"] = 1
    intruder = StoreSessionStore(store, user_id="u2")
    assert await intruder.get("mine") is None
    assert await intruder.get("never-used") is None
    errors = []
    for missing in ("mine", "never-used"):
        with pytest.raises(SessionNotFoundError) as raised:
            await store.get(missing, user_id="u2")
        errors.append(str(raised.value).replace(missing, "ID"))
    assert errors[0] == errors[1]
    async with store.session("other", user_id="u2") as session:
        session.state["k"] = 1
    with pytest.raises(InvalidValueError, match="already in use") as taken:
        await store.fork("other", user_id="u2", new_id="mine")
    assert "INSERT" not in str(taken.value) and "u1" not in str(taken.value)


@pytest.mark.parametrize(
    ("call_name", "kwargs", "message"),
    [
        ("fork", {"at_seq": -5}, "non-negative"),
        ("fork", {"at_seq": 2}, "past the session's last message"),
        ("fork", {"new_id": ""}, "non-empty"),
        ("truncate", {"after_seq": -5}, "non-negative"),
        ("truncate", {"after_seq": 9}, "past the session's last message"),
    ],
)
async def test_fork_and_truncate_refuse_seqs_outside_the_session(
    store: Store, call_name: str, kwargs: dict[str, Any], message: str
) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"].extend(
            [Message(role="user", contents=["a"]), Message(role="user", contents=["b"])]
        )
    with pytest.raises(InvalidValueError, match=message):
        await getattr(store, call_name)("s", user_id="u", **kwargs)
    assert await rows(store, "SELECT count(*), max(next_seq) FROM agent_sessions") == [(1, 2)]
    async with store.session("s", user_id="u") as session:
        assert [m.text for m in session.state["in_memory"]["messages"]] == ["a", "b"]


async def test_a_session_store_session_is_a_plain_agent_session(store: Store) -> None:
    sessions = StoreSessionStore(store, user_id="u")
    fresh = AgentSession(session_id="s")
    fresh.state["k"] = 1
    await sessions.set("s", fresh)
    loaded = await sessions.get("s")
    assert loaded is not None and loaded.state["k"] == 1


@pytest.mark.parametrize("then", ["erase", "delete-and-recreate"])
async def test_a_retry_never_resurrects_a_session_removed_after_its_first_attempt(store: Store, then: str) -> None:
    run = await store.load("s", user_id="u")  # a new session
    run.history.append(Message(role="user", contents=["secret"]))
    run.session.state["user:fact.name"] = "Ann"
    lose_the_reply(store)
    with pytest.raises(StorageUnavailableError):
        await run.commit()  # it did land
    if then == "erase":
        await store.erase_user("u")
        with pytest.raises(SessionNotFoundError):
            await run.commit()
        assert await rows(store, "SELECT count(*) FROM agent_user_state") == [(0,)]
        assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]
    else:
        await store.delete("s", user_id="u")
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["other"]))
        with pytest.raises(ConflictError):
            await run.commit()
        assert await rows(store, "SELECT text FROM agent_messages") == [("other",)]


async def test_a_reused_call_id_with_an_interrupted_second_call_still_gives_a_valid_history(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"].extend(
            [Message(role="user", contents=["one"]), call("call_0"), result("call_0"),
             Message(role="assistant", contents=["ok"]), Message(role="user", contents=["two"]), call("call_0")]
        )  # fmt: skip
    for limit in (None, 1, 2, 3, 4, 6):
        check_request((await store.load("s", user_id="u", history_limit=limit)).history)
    agent = Agent(client=OfflineChatClient(), name="Bot")
    async with store.session("s", user_id="u") as session:
        await agent.run("three", session=session)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.messages("s", user_id="u", after_seq=2**70),
        lambda s: s.purge_expired(batch_size=2**40),
        lambda s: s.list_sessions(user_id="u", metadata={"a": 2**70}),
        lambda s: s.list_sessions(user_id="u", agent_id=5),
        lambda s: s.update("s", user_id="u", ttl=60),
        lambda s: s.update("s", user_id="u", ttl=timedelta(seconds=-5)),
        lambda s: s.update("s", user_id="u", ttl=timedelta(days=30000)),
        lambda s: s.migrate(None),
        lambda s: s.import_lines(None),
        lambda s: s.import_lines([1, 2]),
        lambda s: s.fork("s", user_id="u", at_seq=True),
    ],
)
async def test_odd_inputs_are_refused_with_a_typed_error_on_every_backend(store: Store, call: Any) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 1
    with pytest.raises(InvalidValueError) as refused:
        await call(store)
    assert "2**" not in str(refused.value) and "$" not in str(refused.value)
    with pytest.raises(InvalidValueError):
        Store(store.engine, idle_ttl=30)  # type: ignore[arg-type]


async def test_two_runs_moving_the_service_conversation_on_conflict(store: Store) -> None:
    """Issue 10: service_session_id follows the conflict rules; never a silent fork of the conversation."""
    async with store.session("s", user_id="u") as session:
        session.service_session_id = "resp_1"
    tab_a, tab_b = await store.load("s", user_id="u"), await store.load("s", user_id="u")
    tab_a.session.service_session_id, tab_b.session.service_session_id = "resp_a", "resp_b"
    tab_a.history.append(Message(role="user", contents=["from tab a"]))
    tab_b.history.append(Message(role="user", contents=["from tab b"]))
    await tab_a.commit()
    with pytest.raises(ConflictError, match="service_session_id") as lost:
        await tab_b.commit()
    assert lost.value.keys == ["service_session_id"]
    assert await rows(store, "SELECT text FROM agent_messages") == [("from tab a",)]
    local = await store.load("s", user_id="u")  # a run that leaves it alone is no conflict
    local.history.append(Message(role="user", contents=["local"]))
    await store.update("s", user_id="u", title="t")
    await local.commit()
    async with store.session("s", user_id="u") as session:
        assert session.service_session_id == "resp_a"


async def test_a_resave_reports_only_the_messages_it_wrote(store: Store) -> None:
    """A save of a session it did not load skips what is stored already, and says so in its result."""
    said = [Message(role="user", contents=["a"]), Message(role="assistant", contents=["b"])]
    first = Run.unloaded(store.db, AgentSession(session_id="s"), user_id="u", read_at=None)
    first.add_messages(said)
    again = Run.unloaded(store.db, AgentSession(session_id="s"), user_id="u", read_at=None)
    again.add_messages([*said, Message(role="user", contents=["c"])])
    assert ((await first.commit()).messages_written, (await again.commit()).messages_written) == (2, 1)
    assert await rows(store, "SELECT text FROM agent_messages ORDER BY seq") == [("a",), ("b",), ("c",)]
    assert await rows(store, "SELECT messages_written FROM agent_runs ORDER BY version") == [(2,), (1,)]


async def test_a_service_session_id_that_cannot_be_stored_is_refused_and_the_run_can_go_on(store: Store) -> None:
    """Refused before anything is sent (on PostgreSQL while building the one-round-trip call too), and not kept
    as a pending attempt: once the value is fixed the same run commits."""
    async with store.session("s", user_id="u") as session:
        session.state["k"] = 1
    run = await store.load("s", user_id="u")
    run.session.service_session_id = {"not": {1, 2}}  # a set: not JSON
    run.session.state["k"] = 2
    with pytest.raises(InvalidValueError, match="service_session_id"):
        await run.commit()
    assert (await store.load("s", user_id="u")).session.state["k"] == 1
    run.session.service_session_id = "resp_1"
    assert (await run.commit()).state_keys_written == 1
    stored = (await store.load("s", user_id="u")).session
    assert (stored.state["k"], stored.service_session_id) == (2, "resp_1")


async def test_none_is_a_value_and_deleting_a_key_is_not(store: Store) -> None:
    """A key set to None stays, with the value None, in every scope (the one-round-trip commit reads a JSON null
    as a JSON null, not as a delete); a deleted key is gone."""
    async with store.session("s", user_id="u") as session:
        session.state.update({"own": 1, "user:shared": 1, "app:global": 1, "gone": 1})
    async with store.session("s", user_id="u") as session:
        session.state.update({"own": None, "user:shared": None, "app:global": None})
        del session.state["gone"]
    state = (await store.load("s", user_id="u")).session.state
    assert {k: state[k] for k in ("own", "user:shared", "app:global")} == dict.fromkeys(
        ("own", "user:shared", "app:global")
    )
    assert "gone" not in state


async def test_a_run_creating_a_session_for_a_user_erased_since_it_loaded_creates_nothing(store: Store) -> None:
    """The erasure fence holds for a run's first commit too, though it writes no ``user:`` key: the one call
    (one hop on SQLite) checks it under the user's lock, as the checked path does."""
    async with store.session("old", user_id="u") as session:
        session.state["user:fact"] = "李明"
    run = await store.load("new", user_id="u")
    run.history.append(Message(role="user", contents=["after the erasure"]))
    run.session.state["k"] = 1
    await store.erase_user("u")
    with pytest.raises(SessionNotFoundError):
        await run.commit()
    for table in ("agent_sessions", "agent_messages", "agent_state", "agent_runs"):
        assert await rows(store, f"SELECT count(*) FROM {table}") == [(0,)]  # noqa: S608 - our table names
