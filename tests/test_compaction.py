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

from agent_store import Store
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
            async with store.session("c", skip_excluded=mode == "projection") as session:
                await _agent(history, strategy, phase, requests).run(turn, session=session)
    return requests


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_the_model_sees_what_it_sees_in_memory(url: str, strategy: str, phase: str) -> None:
    reference = await _in_memory(strategy, phase, skip=True)
    async with Store.from_url(url) as store:
        await store.migrate()
    assert await _stored(url, strategy, phase, "in_memory") == reference


@pytest.mark.parametrize("mode", ["provider_in_block", "provider_plain", "projection"])
@pytest.mark.parametrize("strategy", ["sliding_window", "summarization", "tool_result"])
async def test_every_provider_and_session_kind_sees_it_too(url: str, strategy: str, mode: str) -> None:
    reference = await _in_memory(strategy, "after", skip=True)
    async with Store.from_url(url) as store:
        await store.migrate()
    assert await _stored(url, strategy, "after", mode) == reference


@pytest.mark.parametrize("strategy", ["sliding_window", "summarization"])
async def test_without_skip_excluded_the_whole_history_is_handed_over(url: str, strategy: str) -> None:
    reference = await _in_memory(strategy, "after", skip=False)
    async with Store.from_url(url) as store:
        await store.migrate()
    assert await _stored(url, strategy, "after", "in_memory_all") == reference
