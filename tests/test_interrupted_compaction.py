"""An interrupted tool call under compaction (issue 37, item 6). A load answers a call that never got a result
with a filler result right after it (run/delta.py, close_tool_pairs); the filler carries its call's compaction
marks, so a strategy that excludes the call excludes the filler with it, and every later turn's request stays
valid: no tool result without its call, which hosted models refuse (OfflineChatClient refuses it too)."""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework import (
    Agent,
    CompactionProvider,
    Content,
    InMemoryHistoryProvider,
    Message,
    SlidingWindowStrategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
    chat_middleware,
)

from agent_store import Store
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.offline import OfflineChatClient

STRATEGIES = {
    "sliding_window": lambda: SlidingWindowStrategy(keep_last_groups=3),
    "truncation": lambda: TruncationStrategy(max_n=6, compact_to=4),
    "tool_result": lambda: ToolResultCompactionStrategy(keep_last_tool_call_groups=0),
}


def _agent(strategy: str, requests: list[list[Message]], provider: Any) -> Agent:
    @chat_middleware
    async def record(context: Any, call_next: Any) -> None:
        requests.append(list(context.messages))
        await call_next()

    compaction = CompactionProvider(after_strategy=STRATEGIES[strategy](), history_source_id=provider.source_id)
    return Agent(client=OfflineChatClient(), name="Bot", context_providers=[provider, compaction],
                 middleware=[record])  # fmt: skip


@pytest.mark.parametrize("provider", ["in_memory", "store_provider"])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
async def test_turns_after_an_interrupted_call_is_compacted_away_stay_valid(
    store: Store, strategy: str, provider: str
) -> None:
    async with store.session("c", user_id="u") as session:  # a tool loop that died before the tool answered
        session.state.setdefault("in_memory", {}).setdefault("messages", []).extend([
            Message(role="user", contents=["what's the weather?"]),
            Message(role="assistant", contents=[Content.from_function_call(call_id="call_x", name="weather")]),
        ])  # fmt: skip
    requests: list[list[Message]] = []
    for turn in ["hello", "tell me more", "once again", "and then", "the end", "one more"]:
        history = (InMemoryHistoryProvider(skip_excluded=True) if provider == "in_memory"
                   else StoreHistoryProvider(store, user_id="u", skip_excluded=True))  # fmt: skip
        async with store.session("c", user_id="u") as session:
            await _agent(strategy, requests, history).run(turn, session=session)  # refused if a pair is broken
    last = requests[-1]
    calls = [m for m in last if any(c.type == "function_call" and c.call_id == "call_x" for c in m.contents)]
    results = [m for m in last if any(c.type == "function_result" and c.call_id == "call_x" for c in m.contents)]
    assert len(calls) == len(results) <= 1  # together, or neither
    assert len(last) < 2 * 6 + 2  # the strategy did compact
    stored = await store.messages("c", user_id="u", limit=100)
    assert not any("interrupted" in (m.message_id or "") for m in stored)  # the filler is never stored
