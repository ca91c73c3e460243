"""Issue 3: the framework's seams on the store: history provider, session store, streaming, tools, memory."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, ClassVar

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    Message,
    ResponseStream,
    register_state_type,
    tool,
)
from agent_framework._compaction import SlidingWindowStrategy
from helpers import rows
from sqlalchemy import event

from agent_store import ConflictError, SessionNotFoundError, Store
from agent_store.agent_framework import MemoryProvider, StoreHistoryProvider, StoreSessionStore
from agent_store.db import message_rows
from agent_store.offline import OfflineChatClient, answer, check_request


async def transcript(store: Store, session_id: str) -> list[tuple[Any, ...]]:
    return await rows(
        store, "SELECT role, author_name, text FROM agent_messages WHERE session_id = :s ORDER BY seq", s=session_id
    )


@tool
def lookup_weather(city: str = "北京") -> str:
    """Look up the weather."""
    return f"{city}: 晴"


# ---- history provider ----------------------------------------------------------------------------------


async def test_history_provider_inside_a_store_session_joins_the_run(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])
    async with store.session("s", user_id="u") as session:
        await agent.run("我叫李明", session=session)
        assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]  # not yet: one commit at exit
    with pytest.raises(RuntimeError):
        async with store.session("s", user_id="u") as session:
            await agent.run("this turn is lost", session=session)
            raise RuntimeError("app failed after the model call")
    async with store.session("s", user_id="u") as session:
        reply = await agent.run("我叫什么名字？", session=session)
    assert reply.text == "你叫李明。"
    assert [r[2] for r in await transcript(store, "s")] == [
        "我叫李明",
        "你好，李明！很高兴认识你。",
        "我叫什么名字？",
        "你叫李明。",
    ]
    assert await rows(store, "SELECT outcome, count(*) FROM agent_runs GROUP BY outcome ORDER BY outcome") == [
        ("committed", 2), ("failed", 1),  # the failed run wrote nothing but its model call, which was spent
    ]  # fmt: skip
    failed = (
        "SELECT count(*) FROM agent_usage u JOIN agent_runs r USING (session_id, run_id) WHERE r.outcome = 'failed'"
    )
    assert await rows(store, failed) == [(1,)]


async def test_history_provider_on_a_plain_session_commits_each_save(store: Store) -> None:
    def fresh_agent() -> Agent:
        provider = StoreHistoryProvider(store, user_id="u")
        return Agent(client=OfflineChatClient(), name="Bot", context_providers=[provider])

    await fresh_agent().run("我叫李明", session=AgentSession(session_id="plain"))
    assert await rows(store, "SELECT count(*), max(user_id) FROM agent_sessions") == [(1, "u")]
    reply = await fresh_agent().run("我叫什么名字？", session=AgentSession(session_id="plain"))  # "after a restart"
    assert reply.text == "你叫李明。"
    assert len(await transcript(store, "plain")) == 4
    with pytest.raises(SessionNotFoundError):
        await Agent(
            client=OfflineChatClient(), context_providers=[StoreHistoryProvider(store, user_id="intruder")]
        ).run("hi", session=AgentSession(session_id="plain"))


async def test_a_retried_save_stores_nothing_twice_and_reads_only_its_own_length_of_history(store: Store) -> None:
    """A save looks up the ids it carries, and (for the framework's replay rule) the stored tail as long as
    itself: an index range with a LIMIT, never the whole history."""
    provider = StoreHistoryProvider(store, user_id="u")
    old = [Message(role="user", contents=[f"old {i}"]) for i in range(30)]
    await provider.save_messages("s", old)
    batch = [Message(role="user", contents=["same words"]), Message(role="assistant", contents=["ok"])]
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", capture)
    try:
        await provider.save_messages("s", batch)
        await provider.save_messages("s", batch)  # the framework (or the app) retries the same save
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", capture)
    assert await rows(store, "SELECT count(*), max(seq) FROM agent_messages") == [(32, 31)]
    reads = [s.replace("agent_messages.", "") for s in statements if s.lstrip().upper().startswith("SELECT")
             and "agent_messages" in s]  # fmt: skip
    lookups = [s for s in reads if "body" not in s and "message_id IN" in s]
    tails = [s for s in reads if "ORDER BY seq DESC" in s and "LIMIT" in s and "seq <" in s]
    assert lookups and tails and len(lookups) + len(tails) == len(reads)


async def test_the_same_words_twice_are_two_turns(store: Store, agent: Agent) -> None:
    async with store.session("s", user_id="u") as session:
        await agent.run("你好", session=session)
        await agent.run("你好", session=session)
    assert [r[2] for r in await transcript(store, "s") if r[0] == "user"] == ["你好", "你好"]


async def test_audit_only_provider_beside_the_in_memory_one_stores_each_message_once(store: Store) -> None:
    audit = StoreHistoryProvider(store, load_messages=False)
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[audit])
    for words in ("我叫李明", "我叫什么名字？"):
        async with store.session("s", user_id="u") as session:
            reply = await agent.run(words, session=session)
    assert reply.text == "你叫李明。"  # the auto-added in-memory provider loaded the stored history
    assert len(await transcript(store, "s")) == 4


@pytest.mark.parametrize(
    ("options", "roles"),
    [
        pytest.param({"store_inputs": False}, ["assistant"], id="outputs-only"),
        pytest.param({"store_outputs": False}, ["user"], id="inputs-only"),
    ],
)
async def test_store_inputs_and_outputs_flags(store: Store, options: dict[str, bool], roles: list[str]) -> None:
    provider = StoreHistoryProvider(store, user_id="u", **options)
    await Agent(client=OfflineChatClient(), context_providers=[provider]).run(
        "hi", session=AgentSession(session_id="s")
    )
    assert [r[0] for r in await transcript(store, "s")] == roles


EXPECTED_TOOL_LOOP = [
    ("user", "call lookup_weather"),
    ("assistant", ""),
    ("tool", ""),
    ("assistant", "工具结果：北京: 晴"),
]


@pytest.mark.parametrize("inside_run", [True, False], ids=["store-session", "plain-session"])
async def test_per_service_call_persistence_with_a_tool_loop(store: Store, inside_run: bool) -> None:
    agent = Agent(
        client=OfflineChatClient(),
        name="Bot",
        tools=[lookup_weather],
        context_providers=[StoreHistoryProvider(store, user_id="u")],
        require_per_service_call_history_persistence=True,
    )
    for _turn in range(3):  # each turn adds exactly its own four messages: no re-saves, no growth
        if inside_run:
            async with store.session("s", user_id="u") as session:
                await agent.run("call lookup_weather", session=session)
        else:
            await agent.run("call lookup_weather", session=AgentSession(session_id="s"))
    assert [(role, text) for role, _author, text in await transcript(store, "s")] == EXPECTED_TOOL_LOOP * 3
    # one commit per run; or per model call (two a turn: the tool request, then the answer) and one for the tool's
    # result, stored as soon as it is there (before the model call it goes to)
    assert await rows(store, "SELECT count(*) FROM agent_runs") == [(3 if inside_run else 9,)]
    calls = await rows(store, "SELECT seq, kind, tool_name FROM agent_tool_calls ORDER BY seq LIMIT 2")
    assert calls == [(1, "call", "lookup_weather"), (2, "result", "lookup_weather")]
    assert await rows(store, "SELECT count(*) FROM agent_tool_calls WHERE tool_name = 'lookup_weather'") == [(6,)]


class FailsAfterTools(OfflineChatClient):
    """A model service that goes down in the middle of a tool loop: after the tool ran, the next call fails."""

    def _inner_get_response(self, *, messages: Sequence[Message], **kwargs: Any) -> Any:
        if messages and messages[-1].role == "tool":
            raise ConnectionError("the model service went away")
        return super()._inner_get_response(messages=messages, **kwargs)


@pytest.mark.parametrize("inside_run", [True, False], ids=["store-session", "plain-session"])
async def test_a_tool_loop_cut_after_the_tool_ran_keeps_its_result_and_the_session_usable(
    store: Store, inside_run: bool
) -> None:
    provider = StoreHistoryProvider(store, user_id="u")
    options: dict[str, Any] = {"name": "Bot", "tools": [lookup_weather], "context_providers": [provider]}
    broken = Agent(client=FailsAfterTools(), require_per_service_call_history_persistence=True, **options)
    working = Agent(client=OfflineChatClient(), **options)
    if inside_run:
        async with store.session("s", user_id="u") as session:
            with pytest.raises(Exception, match="went away"):  # the app catches it and the block commits
                await broken.run("call lookup_weather", session=session)
    else:
        with pytest.raises(Exception, match="went away"):
            await broken.run("call lookup_weather", session=AgentSession(session_id="s"))
    stored = [(role, text) for role, _author, text in await transcript(store, "s")]
    assert stored == [("user", "call lookup_weather"), ("assistant", ""), ("tool", "")]  # the finished tool's too
    kept = (await store.load("s", user_id="u")).history[2].contents[0]
    assert (kept.type, kept.result) == ("function_result", "北京: 晴")
    if inside_run:
        async with store.session("s", user_id="u") as session:
            reply = await working.run("hello again", session=session)
    else:
        reply = await working.run("hello again", session=AgentSession(session_id="s"))
    assert "hello again" in reply.text  # the client (like a hosted API) refuses a dangling call: it got none
    assert [role for role, _a, _t in await transcript(store, "s")] == ["user", "assistant", "tool", "user", "assistant"]


# ---- tools and windows -----------------------------------------------------------------------------------


async def test_tool_calls_are_columns_and_a_window_never_splits_a_call_from_its_result(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", tools=[lookup_weather])
    async with store.session("s", user_id="u") as session:
        await agent.run("call lookup_weather", session=session)  # seq 0..3
    (call_id,) = await rows(store, "SELECT call_id FROM agent_tool_calls WHERE kind = 'call'")
    assert await rows(
        store, "SELECT seq FROM agent_tool_calls WHERE call_id = :c AND kind = 'result'", c=call_id[0]
    ) == [(2,)]

    for limit in (1, 2, 3, 4):  # every window is the whole turn: it starts at the user message that began it
        run = await store.load("s", user_id="u", history_limit=limit)
        history = run.history
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"], limit
        check_request(history)  # what a hosted API checks: every result has its call, every call a result


async def test_a_windowed_session_still_appends_without_duplicates(store: Store, agent: Agent) -> None:
    for i in range(3):
        async with store.session("s", user_id="u") as session:
            await agent.run(f"turn {i}", session=session)
    async with store.session("s", user_id="u", history_limit=2) as session:
        assert len(session.state["in_memory"]["messages"]) == 2
        await agent.run("turn 3", session=session)
    assert await rows(store, "SELECT count(*), max(seq) FROM agent_messages") == [(8, 7)]


# ---- streaming -----------------------------------------------------------------------------------------


class BrokenStreamClient(OfflineChatClient):
    """Streams one chunk, then the connection to the model breaks."""

    async def _stream(self, reply: Message) -> AsyncIterator[ChatResponseUpdate]:
        yield ChatResponseUpdate(role="assistant", contents=[Content.from_text("半")])
        raise ConnectionError("model stream broke")


async def test_a_fully_consumed_stream_persists_like_a_plain_run(store: Store, agent: Agent) -> None:
    async with store.session("plain", user_id="u") as session:
        await agent.run("我叫李明", session=session)
    async with store.session("streamed", user_id="u") as session:
        chunks = [update.text async for update in agent.run("我叫李明", session=session, stream=True)]
    assert "".join(chunks) == "你好，李明！很高兴认识你。"
    assert await transcript(store, "streamed") == await transcript(store, "plain")


async def test_an_abandoned_stream_persists_nothing_and_the_session_goes_on(store: Store, agent: Agent) -> None:
    async with store.session("s", user_id="u") as session:
        async for _update in agent.run("我叫王五", session=session, stream=True):
            break  # the user closed the tab
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
    async with store.session("s", user_id="u") as session:
        reply = await agent.run("我叫什么名字？", session=session)
    assert reply.text == "我不知道你叫什么名字。"
    assert len(await transcript(store, "s")) == 2


async def test_a_client_that_raises_mid_stream_persists_nothing(store: Store) -> None:
    agent = Agent(client=BrokenStreamClient(), name="Bot")
    with pytest.raises(ConnectionError, match="model stream broke"):
        async with store.session("s", user_id="u") as session:
            async for _update in agent.run("hello", session=session, stream=True):
                pass
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]
    async with store.session("s", user_id="u") as session:
        await Agent(client=OfflineChatClient(), name="Bot").run("hello", session=session)
    assert len(await transcript(store, "s")) == 2


# ---- service-managed threads -----------------------------------------------------------------------------


class ServiceThreadClient(OfflineChatClient):
    """A 'service' that keeps each conversation's history server-side and returns its id."""

    STORES_BY_DEFAULT = True
    threads: ClassVar[dict[str, list[Message]]] = {}  # the "service side", outliving app restarts

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        conversation = str(options.get("conversation_id") or f"conv_{uuid.uuid4().hex[:6]}")
        thread = self.threads.setdefault(conversation, [])
        thread.extend(messages)
        reply = Message(role="assistant", contents=[answer(thread)])
        thread.append(reply)

        async def respond() -> ChatResponse:
            return ChatResponse(messages=[reply], conversation_id=conversation)

        return respond()


async def test_a_service_managed_thread_continues_after_a_restart(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            await Agent(client=ServiceThreadClient()).run("我叫李明", session=session)
        conversation = session.service_session_id
        assert isinstance(conversation, str) and conversation.startswith("conv_")
    async with Store.from_url(url) as restarted:
        async with restarted.session("s", user_id="u") as session:
            assert session.service_session_id == conversation
            reply = await Agent(client=ServiceThreadClient()).run("我叫什么名字？", session=session)
    assert reply.text == "你叫李明。"
    assert len(ServiceThreadClient.threads[conversation]) == 4


# ---- session store -------------------------------------------------------------------------------------


async def test_session_store_get_set_delete_with_conflicts(store: Store, agent: Agent) -> None:
    sessions = StoreSessionStore(store, user_id="u")
    assert await sessions.get("s") is None
    session = AgentSession(session_id="s")
    await agent.run("我叫李明", session=session)
    session.state["prefs"] = {"theme": "dark"}
    await sessions.set("s", session)
    assert await rows(store, "SELECT key FROM agent_state") == [("prefs",)]  # per-key rows, not a blob

    a, b = await sessions.get("s"), await sessions.get("s")
    assert a is not None and b is not None and a is not b
    assert b.state["prefs"] == {"theme": "dark"}
    reply = await agent.run("我叫什么名字？", session=a)
    assert reply.text == "你叫李明。"
    a.state["prefs"]["theme"] = "light"
    b.state["prefs"] = {"theme": "blue"}
    await sessions.set("s", a)
    with pytest.raises(ConflictError, match="prefs"):
        await sessions.set("s", b)
    with pytest.raises(ConflictError):  # a session the store did not hand out cannot overwrite a key
        stranger = AgentSession(session_id="s")
        stranger.state["prefs"] = {}
        await sessions.set("s", stranger)
    reloaded = await sessions.get("s")
    assert reloaded is not None and reloaded.state["prefs"] == {"theme": "light"}
    assert len(reloaded.state["in_memory"]["messages"]) == 4
    await sessions.delete("s")
    assert await sessions.get("s") is None
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


# ---- shared sessions, memory, state types -------------------------------------------------------------


async def test_two_agents_share_a_session_and_the_transcript_names_them(store: Store) -> None:
    client = OfflineChatClient()
    translator = Agent(client=client, name="Translator", instructions="翻译助手")
    summarizer = Agent(client=client, name="Summarizer", instructions="摘要助手")
    async with store.session("shared", user_id="u") as session:
        translated = await translator.run("Sessions keep state.", session=session)
        await summarizer.run(translated.text, session=session)
    assert [(r[0], r[1]) for r in await transcript(store, "shared")] == [
        ("user", None),
        ("assistant", "Translator"),
        ("user", None),
        ("assistant", "Summarizer"),
    ]


async def test_memory_follows_the_user_into_a_new_session_and_no_one_else(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[MemoryProvider()])
    async with store.session("a", user_id="li") as session:
        greeting = await agent.run("我叫李明", session=session)
    assert greeting.text == "你好，李明！很高兴认识你。"
    assert await rows(store, "SELECT user_id, key, value FROM agent_user_state") in (
        [("li", "fact.name", "李明")],
        [("li", "fact.name", '"李明"')],
    )
    async with store.session("b", user_id="li") as session:
        mine = await agent.run("我叫什么名字？", session=session)
    async with store.session("c", user_id="someone-else") as session:
        theirs = await agent.run("我叫什么名字？", session=session)
    assert (mine.text, theirs.text) == ("你叫李明。", "我不知道你叫什么名字。")


async def test_user_and_app_state_are_shared_and_follow_the_conflict_rules(url: str) -> None:
    async with Store.from_url(url, app_id="support") as store:
        await store.migrate()
        async with store.session("a", user_id="li") as session:
            session.state["user:tier"] = "gold"
            session.state["app:greeting"] = "欢迎"
        async with store.session("b", user_id="wang") as session:
            assert "user:tier" not in session.state and session.state["app:greeting"] == "欢迎"
        first, second = await store.load("x", user_id="li"), await store.load("y", user_id="li")
        assert first.session.state["user:tier"] == second.session.state["user:tier"] == "gold"
        first.session.state["user:tier"] = "platinum"
        second.session.state["user:tier"] = "silver"
        second.session.state["user:other"] = 1
        await first.commit()
        with pytest.raises(ConflictError, match="user:tier"):
            await second.commit()
        assert await rows(store, "SELECT key, value FROM agent_user_state WHERE user_id = 'li'") in (
            [("tier", "platinum")],
            [("tier", '"platinum"')],
        )
        assert await rows(store, "SELECT count(*) FROM agent_sessions WHERE id = 'y'") == [(0,)]
    async with Store.from_url(url, app_id="other-app") as store:
        async with store.session("c", user_id="li") as session:
            assert "app:greeting" not in session.state and session.state["user:tier"] == "platinum"


class Badge:
    def __init__(self, label: str) -> None:
        self.label = label

    def to_dict(self) -> dict[str, str]:
        return {"label": self.label}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Badge:
        return cls(data["label"])


register_state_type(Badge, type_id="tests.badge")


async def test_registered_state_types_come_back_as_themselves(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["badges"] = [Badge("早起"), {"type": "tests.badge", "label": "just a dict"}]
    async with store.session("s", user_id="u") as session:
        badge, plain = session.state["badges"]
    assert isinstance(badge, Badge) and badge.label == "早起"
    assert plain == {"type": "tests.badge", "label": "just a dict"}


async def test_compaction_rewrites_what_the_model_sees_never_what_is_stored(store: Store) -> None:
    seen: list[list[str]] = []

    class Spy(OfflineChatClient):
        def _inner_get_response(self, *, messages: Sequence[Message], **kwargs: Any) -> Any:
            seen.append([m.text or "" for m in messages])
            return super()._inner_get_response(messages=messages, **kwargs)

    agent = Agent(client=Spy(compaction_strategy=SlidingWindowStrategy(keep_last_groups=2)), name="Bot")
    for words in ("我叫李明", "a", "b", "我叫什么名字？"):
        async with store.session("s", user_id="u") as session:
            reply = await agent.run(words, session=session)
    assert reply.text == "我不知道你叫什么名字。"  # the window dropped the name before the model saw it
    assert len(seen[-1]) == 2
    stored = await transcript(store, "s")
    assert [r[2] for r in stored if r[0] == "user"] == ["我叫李明", "a", "b", "我叫什么名字？"]
    assert len(stored) == 8
    assert await rows(store, "SELECT count(*) FROM agent_messages WHERE CAST(body AS TEXT) LIKE '%_excluded%'") == [
        (0,)
    ]
    async with store.session("s", user_id="u") as session:
        assert len(session.state["in_memory"]["messages"]) == 8  # the next run gets the full history again


@pytest.mark.parametrize("verdict", ["permit", "deny"])
@pytest.mark.parametrize("inside_run", [True, False], ids=["store-session", "plain-session"])
async def test_a_save_the_framework_defers_or_drops(store: Store, verdict: str, inside_run: bool) -> None:
    """The framework's egress gate (used by its agent-hooks middleware) defers history saves until a verdict.

    The agent-hooks SDK is not installable here, so the gate is driven the way that middleware drives it.
    """
    from agent_framework._sessions import _offer_run_persistence_gate_claim, _RunPersistenceGate

    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store, user_id="u")])

    async def guarded_run(session: AgentSession) -> None:
        gate = _RunPersistenceGate()
        _offer_run_persistence_gate_claim(gate, agent)
        with gate:
            await agent.run("我叫李明", session=session)
        assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]  # held behind the verdict
        if verdict == "permit":
            await gate.flush()
        else:
            gate.drop()

    if inside_run:
        async with store.session("s", user_id="u") as session:
            await guarded_run(session)
    else:
        await guarded_run(AgentSession(session_id="s"))
    stored = [r[2] for r in await transcript(store, "s")]
    assert stored == (["我叫李明", "你好，李明！很高兴认识你。"] if verdict == "permit" else [])
    reply = await agent.run("我叫什么名字？", session=AgentSession(session_id="s"))  # the session goes on
    assert reply.text == ("你叫李明。" if verdict == "permit" else "我不知道你叫什么名字。")


def result_message(n: int, message_id: str) -> Message:
    return Message(
        role="tool", message_id=message_id, contents=[Content.from_function_result(call_id="c1", result="长" * n)]
    )


async def test_a_tool_result_is_stored_once_and_the_size_limit_is_exact(url: str) -> None:
    """Issue 10: no doubled body; max_value_bytes applies to the stored body, to the byte."""
    from agent_store import InvalidValueError

    big = result_message(2 * 1024 * 1024 // 3, "big")  # 2 MiB of UTF-8 in the result
    body = message_rows.message_record(big, max_bytes=2**62, tool_names={}).columns["body"]
    assert len(body.encode()) < 2 * 1024 * 1024 + 500  # once, not twice
    limit = 256 * 1024
    overhead = len(
        message_rows.message_record(result_message(0, "m1"), max_bytes=2**62, tool_names={}).columns["body"].encode()
    )
    fits = (limit - overhead) // 3  # "长" is 3 bytes of UTF-8
    async with Store.from_url(url, max_value_bytes=limit) as store:
        await store.migrate()
        call = Message(role="assistant", contents=[Content.from_function_call(call_id="c1", name="f", arguments={})])
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"].extend([call, result_message(fits, "m1")])
        with pytest.raises(InvalidValueError, match=rf"message 'm2'.*over the limit of {limit}"):
            async with store.session("s", user_id="u") as session:
                session.state["in_memory"]["messages"].extend([call, result_message(fits + 1, "m2")])
        loaded = (await store.load("s", user_id="u")).history
        expected = result_message(fits, "m1")
        expected.additional_properties[message_rows.STORE_ID] = loaded[1].additional_properties[message_rows.STORE_ID]
        assert loaded[1].to_dict() == expected.to_dict()  # the derived part comes back
        records = await store.messages("s", user_id="u")
        assert records[1].body == expected.to_dict()


@tool
def huge_report() -> str:
    """A tool whose output is bigger than the store keeps in one message."""
    return "长" * (300 * 1024 // 3)


async def test_a_tool_result_over_the_limit_stops_the_run_before_the_model_sees_it(url: str) -> None:
    """Issue 10: refused at the tool, not after the user saw a reply; nothing of the run is stored."""
    from agent_store import InvalidValueError
    from agent_store.agent_framework import ToolResultTooLargeError

    async with Store.from_url(url, max_value_bytes=256 * 1024) as store:
        await store.migrate()
        seen: list[int] = []

        class Counting(OfflineChatClient):
            def _inner_get_response(self, *, messages: Sequence[Message], **kwargs: Any) -> Any:
                seen.append(len(messages))
                return super()._inner_get_response(messages=messages, **kwargs)

        agent = Agent(
            client=Counting(), name="Bot", tools=[huge_report], context_providers=[StoreHistoryProvider(store)]
        )
        with pytest.raises(ToolResultTooLargeError, match=r"tool 'huge_report'.*over the limit of 262144") as refused:
            async with store.session("s", user_id="u") as session:
                await agent.run("call huge_report", session=session)
        assert isinstance(refused.value, InvalidValueError)
        assert seen == [1]  # the model was asked once (it called the tool) and never got the result
        assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


@pytest.mark.parametrize("margin", [-700, -340, -300, -200, -100, -40, 0, 40])
async def test_the_size_guard_never_lets_through_a_result_the_commit_refuses(sqlite_url: str, margin: int) -> None:
    """Near the limit a result is refused at the tool or stored: never refused only after the caller got a reply."""
    from agent_store import InvalidValueError
    from agent_store.agent_framework import ToolResultTooLargeError

    limit = 64 * 1024
    length = (limit + margin) // 3

    @tool
    def sized() -> str:
        """A result of a chosen size."""
        return "长" * length

    async with Store.from_url(sqlite_url, max_value_bytes=limit) as store:
        await store.migrate()
        agent = Agent(
            client=OfflineChatClient(), name="Bot", tools=[sized], context_providers=[StoreHistoryProvider(store)]
        )
        try:
            async with store.session("s", user_id="u") as session:
                await agent.run("call sized", session=session)
        except ToolResultTooLargeError:
            assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
        except InvalidValueError as exc:
            raise AssertionError(f"refused only at commit, after the reply: {exc}") from exc
        else:
            assert await rows(store, "SELECT count(*) FROM agent_messages") == [(4,)]
