"""Compaction, stored faithfully (issue 24): the model's requests with agent_store, each turn a new run (and a
new Store), are exactly those of one in-memory session kept across turns, for every framework strategy, as
before_strategy and after_strategy, with each history provider and session kind."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    CharacterEstimatorTokenizer,
    CompactionProvider,
    ContextWindowCompactionStrategy,
    HistoryProvider,
    InMemoryHistoryProvider,
    SelectiveToolCallCompactionStrategy,
    SlidingWindowStrategy,
    SummarizationStrategy,
    TokenBudgetComposedStrategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
    chat_middleware,
    tool,
)

from agent_store import InvalidValueError, Store
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.offline import OfflineChatClient

TURNS = [
    "my name is Ann", "call weather", "hello there", "call weather", "what is my name?", "tell me more",
    "call weather", "once again", "and then", "what is my name?", "call weather", "the end",
]  # fmt: skip


@tool
def weather() -> str:
    """Today's weather."""
    return "sunny"


STRATEGIES: dict[str, Callable[[], Any]] = {
    "sliding_window": lambda: SlidingWindowStrategy(keep_last_groups=4),
    "truncation": lambda: TruncationStrategy(max_n=8, compact_to=5),
    "selective_tool_call": lambda: SelectiveToolCallCompactionStrategy(keep_last_tool_call_groups=1),
    "tool_result": lambda: ToolResultCompactionStrategy(keep_last_tool_call_groups=1),
    "summarization": lambda: SummarizationStrategy(client=OfflineChatClient(), target_count=4, threshold=2),
    "token_budget": lambda: TokenBudgetComposedStrategy(
        token_budget=120,
        tokenizer=CharacterEstimatorTokenizer(),
        strategies=[
            ToolResultCompactionStrategy(keep_last_tool_call_groups=1),
            SlidingWindowStrategy(keep_last_groups=3),
        ],
    ),
    "context_window": lambda: ContextWindowCompactionStrategy(
        max_context_window_tokens=260, max_output_tokens=60, keep_last_tool_call_groups=1
    ),
}
_CALL_ID = re.compile(r"call_[0-9a-f]+")


def _recorder(requests: list[list[tuple[Any, ...]]]) -> Any:
    @chat_middleware
    async def record(context: Any, call_next: Any) -> None:
        ids: dict[str | None, int] = {}  # call ids are random per run: compared by their pairing, not their value
        requests.append([
            (str(m.role), _CALL_ID.sub("call", m.text or ""),
             tuple((c.type, ids.setdefault(c.call_id, len(ids))) for c in m.contents if c.type.startswith("function")))
            for m in context.messages
        ])  # fmt: skip
        await call_next()

    return record


def _agent(history: HistoryProvider, strategy: str, phase: str, requests: list[Any]) -> Agent:
    strategies = {f"{phase}_strategy": STRATEGIES[strategy]()}
    compaction = CompactionProvider(**strategies, history_source_id=history.source_id)
    return Agent(
        client=OfflineChatClient(), name="Bot", context_providers=[history, compaction],
        middleware=[_recorder(requests)], tools=[weather],
    )  # fmt: skip


async def _in_memory(strategy: str, phase: str, *, skip: bool) -> list[Any]:
    requests: list[Any] = []
    agent = _agent(InMemoryHistoryProvider(skip_excluded=skip), strategy, phase, requests)
    session = AgentSession(session_id="c")
    for turn in TURNS:
        await agent.run(turn, session=session)
    return requests


async def _stored(url: str, strategy: str, phase: str, mode: str) -> list[Any]:
    requests: list[Any] = []
    for turn in TURNS:
        async with Store.from_url(url) as store:  # each turn as a new process would: a new store and agent
            if mode == "provider_plain":  # StoreHistoryProvider on a plain AgentSession: each save commits
                history: HistoryProvider = StoreHistoryProvider(store, skip_excluded=True)
                await _agent(history, strategy, phase, requests).run(turn, session=AgentSession(session_id="c"))
                continue
            if mode == "provider_in_block":
                history = StoreHistoryProvider(store, skip_excluded=True)
            else:
                history = InMemoryHistoryProvider(skip_excluded=mode != "in_memory_all")
            async with store.session("c") as session:
                await _agent(history, strategy, phase, requests).run(turn, session=session)
    return requests


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_the_model_sees_what_it_sees_in_memory(url: str, strategy: str, phase: str) -> None:
    reference = await _in_memory(strategy, phase, skip=True)
    async with Store.from_url(url) as store:
        await store.migrate()
    assert await _stored(url, strategy, phase, "in_memory") == reference


@pytest.mark.parametrize("mode", ["provider_in_block", "provider_plain"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_every_provider_and_session_kind_sees_it_too(url: str, strategy: str, mode: str) -> None:
    reference = await _in_memory(strategy, "after", skip=True)
    async with Store.from_url(url) as store:
        await store.migrate()
    assert await _stored(url, strategy, "after", mode) == reference


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_without_skip_excluded_the_whole_history_is_handed_over(url: str, strategy: str) -> None:
    reference = await _in_memory(strategy, "after", skip=False)
    async with Store.from_url(url) as store:
        await store.migrate()
    assert await _stored(url, strategy, "after", "in_memory_all") == reference


@pytest.mark.parametrize("strategy", ["sliding_window", "summarization", "tool_result"])
async def test_a_load_of_only_the_included_hands_the_model_the_same(url: str, strategy: str) -> None:
    """A run that does not compact (a serving agent over a history compacted by another) may read only what the
    model sees: it gets exactly the included messages of the whole list, in order."""
    async with Store.from_url(url) as store:
        await store.migrate()
    await _stored(url, strategy, "after", "in_memory")
    async with Store.from_url(url) as store:
        whole = await store.load("c")
        included = [_without_links(m.to_dict()) for m in whole.history if not m.additional_properties.get("_excluded")]
        projected = await store.load("c", skip_excluded=True)
        assert [m.to_dict() for m in projected.history] == included  # a summary's links are not read: docs/seams.md
        requests: list[Any] = []
        plain = Agent(client=OfflineChatClient(), name="Bot", middleware=[_recorder(requests)], tools=[weather])
        expected = [_CALL_ID.sub("call", m.text or "") for m in projected.history] + ["and one more"]
        await plain.run("and one more", session=projected.session)
        await projected.commit()
        assert [text for _, text, _ in requests[0]] == expected


def _without_links(body: dict[str, Any]) -> dict[str, Any]:
    group = body.get("additional_properties", {}).get("_group")
    if isinstance(group, dict):
        group.pop("_summary_of_message_ids", None)
        group.pop("_summary_of_group_ids", None)
    return body


@pytest.mark.parametrize("strategy", ["sliding_window", "summarization"])
async def test_a_compaction_on_a_load_of_only_the_included_is_refused(url: str, strategy: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
    await _stored(url, strategy, "after", "in_memory")
    async with Store.from_url(url) as store:
        before = await store.messages("c", limit=1000)
        with pytest.raises(InvalidValueError, match="skip_excluded=True"):
            async with store.session("c", skip_excluded=True) as session:
                for turn in ("one", "two", "three"):  # enough turns for the strategy to change something
                    await _agent(InMemoryHistoryProvider(skip_excluded=True), strategy, "after", []).run(
                        turn, session=session
                    )
        assert await store.messages("c", limit=1000) == before


@pytest.mark.parametrize("strategy", ["sliding_window", "truncation", "context_window", "summarization"])
async def test_a_fork_or_truncation_at_a_turn_gives_the_view_of_that_turn(url: str, strategy: str) -> None:
    """What a compaction excluded after the cut is included again (excluded_at), a summary made after it is
    not kept: the next request is the one the in-memory session made from that turn (kept as a copy)."""
    keep_at = 6
    session, copies = AgentSession(session_id="c"), {}
    agent = _agent(InMemoryHistoryProvider(skip_excluded=True), strategy, "after", [])
    for n, turn in enumerate(TURNS):
        await agent.run(turn, session=session)
        copies[n] = AgentSession.from_dict(session.to_dict())
    reference: list[Any] = []
    await _agent(InMemoryHistoryProvider(skip_excluded=True), strategy, "after", reference).run(
        "where were we?", session=copies[keep_at]
    )
    async with Store.from_url(url) as store:
        await store.migrate()
        boundary = 0
        for n, turn in enumerate(TURNS):
            async with store.session("c") as stored:
                await _agent(InMemoryHistoryProvider(skip_excluded=True), strategy, "after", []).run(
                    turn, session=stored
                )
            if n == keep_at:
                boundary = (await store.get("c")).message_count - 1
        branch = await store.fork("c", at_seq=boundary, new_id="branch")
        await store.truncate("c", boundary)
        for sid in ("c", branch):
            got: list[Any] = []
            async with store.session(sid) as stored:
                await _agent(InMemoryHistoryProvider(skip_excluded=True), strategy, "after", got).run(
                    "where were we?", session=stored
                )
            assert got == reference
