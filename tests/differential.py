"""A differential check of agent_store against the framework's in-memory session (issue 37).

One scenario per seed, drawn at random: a compaction strategy (each of the framework's, before or after the model
call), turns (some calling a tool), call ids unique or reused (``call_0`` for every call, as some
OpenAI-compatible servers send), a race of two runs on one session, and at the end a fork or a truncation at a
random earlier turn. The framework's own ``AgentSession`` kept in memory is the reference, copied after each turn;
the store runs each turn as a new process would (a new Store, a new agent). What must match: every request the
model got, and after the fork or truncation the next request, which must be the one the in-memory copy of that
turn makes. Used by tests/test_differential.py (a few hundred seeds in CI) and bench/studies/differential.py (more).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent_framework import (
    Agent,
    AgentSession,
    CharacterEstimatorTokenizer,
    CompactionProvider,
    ContextWindowCompactionStrategy,
    InMemoryHistoryProvider,
    Message,
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
from agent_store.offline import OfflineChatClient

WORDS = ["my name is Ann", "call weather", "hello there", "what is my name?", "tell me more", "once again",
         "and then", "call weather", "the end", "call weather", "why?", "so?"]  # fmt: skip
STRATEGIES: dict[str, Callable[[random.Random], Any]] = {
    "none": lambda r: None,
    "sliding_window": lambda r: SlidingWindowStrategy(keep_last_groups=r.randint(2, 5)),
    "truncation": lambda r: TruncationStrategy(max_n=r.randint(5, 9), compact_to=r.randint(2, 4)),
    "selective_tool_call": lambda r: SelectiveToolCallCompactionStrategy(keep_last_tool_call_groups=r.randint(0, 2)),
    "tool_result": lambda r: ToolResultCompactionStrategy(keep_last_tool_call_groups=r.randint(0, 2)),
    "summarization": lambda r: SummarizationStrategy(
        client=OfflineChatClient(), target_count=r.randint(3, 5), threshold=r.randint(1, 3)
    ),
    "token_budget": lambda r: TokenBudgetComposedStrategy(
        token_budget=r.choice([90, 120, 200]),
        tokenizer=CharacterEstimatorTokenizer(),
        strategies=[
            ToolResultCompactionStrategy(keep_last_tool_call_groups=1),
            SlidingWindowStrategy(keep_last_groups=3),
        ],
    ),
    "context_window": lambda r: ContextWindowCompactionStrategy(
        max_context_window_tokens=r.choice([200, 260, 400]),
        max_output_tokens=60,
        keep_last_tool_call_groups=r.randint(0, 1),
    ),
}
_CALL_ID = re.compile(r"call_[0-9a-f]+")


@tool
def weather() -> str:
    """Today's weather."""
    return "sunny"


class ReusedIdsClient(OfflineChatClient):
    """Every function call it makes has the id ``call_0``."""

    def _reply(self, messages: Any, options: Any) -> Message:
        reply = super()._reply(messages, options)
        for content in reply.contents:
            if content.type == "function_call":
                content.call_id = "call_0"
        return reply


@dataclass
class Scenario:
    seed: int
    strategy: str
    phase: str
    params_seed: int
    turns: list[str]
    reused_ids: bool
    race_at: int | None  # the turn run twice at once on the store (and twice in a row in memory)
    cut: str  # "fork" or "truncate"
    cut_after: int  # the turn (index) the branch keeps

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        r = random.Random(seed)
        # Each turn's words are its own: the framework's in-memory provider drops a turn identical to the one
        # before it (same words, same answer, no ids: filter_new_messages takes it for a replay); the store keeps it.
        turns = [f"{r.choice(WORDS)} #{n}" for n in range(r.randint(3, 10))]
        return cls(seed=seed, strategy=r.choice(list(STRATEGIES)), phase=r.choice(["before", "after"]),
                   params_seed=r.randrange(1 << 30), turns=turns, reused_ids=r.random() < 0.4,
                   race_at=r.randrange(len(turns)) if r.random() < 0.3 else None, cut=r.choice(["fork", "truncate"]),
                   cut_after=r.randrange(len(turns)))  # fmt: skip


@dataclass
class Outcome:
    requests: list[Any] = field(default_factory=list)
    after_cut: list[Any] = field(default_factory=list)
    race_order: tuple[str, str] = ("a", "b")  # the order the race's two runs committed in


def _agent(scenario: Scenario, requests: list[Any]) -> Agent:
    @chat_middleware
    async def record(context: Any, call_next: Any) -> None:
        ids: dict[str | None, int] = {}  # call ids compared by their pairing, not their value
        requests.append([
            (str(m.role), _CALL_ID.sub("call", m.text or ""),
             tuple((c.type, ids.setdefault(c.call_id, len(ids))) for c in m.contents if c.type.startswith("function")))
            for m in context.messages
        ])  # fmt: skip
        await call_next()

    providers: list[Any] = [InMemoryHistoryProvider(skip_excluded=True)]
    strategy = STRATEGIES[scenario.strategy](random.Random(scenario.params_seed))
    if strategy is not None:
        providers.append(CompactionProvider(**{f"{scenario.phase}_strategy": strategy}, history_source_id="in_memory"))
    client = ReusedIdsClient() if scenario.reused_ids else OfflineChatClient()
    return Agent(client=client, name="Bot", context_providers=providers, middleware=[record], tools=[weather])


def _turns(scenario: Scenario, race_order: tuple[str, str]) -> list[str]:
    """The turns in the order they commit: a race's two runs in the order the store committed them."""
    out = []
    for n, turn in enumerate(scenario.turns):
        out += [f"{turn} ({side})" for side in race_order] if n == scenario.race_at else [turn]
    return out


async def in_memory(scenario: Scenario, race_order: tuple[str, str] = ("a", "b")) -> Outcome:
    outcome, copies = Outcome(race_order=race_order), {}
    session = AgentSession(session_id="c")
    for n, turn in enumerate(_turns(scenario, race_order)):
        await _agent(scenario, outcome.requests).run(turn, session=session)
        copies[n] = AgentSession.from_dict(session.to_dict())
    await _agent(scenario, outcome.after_cut).run("where were we?", session=copies[_cut_turn(scenario)])
    return outcome


def _cut_turn(scenario: Scenario) -> int:
    """The cut's index among the committed turns (a race's turn counts twice)."""
    extra = 1 if scenario.race_at is not None and scenario.race_at <= scenario.cut_after else 0
    return scenario.cut_after + extra


async def stored(scenario: Scenario, url: str) -> Outcome:
    outcome, boundary = Outcome(), -1
    cut_turn, n = _cut_turn(scenario), 0
    for index, turn in enumerate(scenario.turns):
        async with Store.from_url(url) as store:  # each turn as a new process would: a new store and agent
            if index == scenario.race_at:
                outcome.race_order = await _race(store, scenario, turn, outcome.requests)
                n += 2
            else:
                async with store.session("c", user_id="u") as session:
                    await _agent(scenario, outcome.requests).run(turn, session=session)
                n += 1
            if n - 1 >= cut_turn and boundary < 0:
                boundary = (await store.get("c", user_id="u")).message_count - 1
    async with Store.from_url(url) as store:
        branch = "c"
        if scenario.cut == "fork":
            branch = await store.fork("c", user_id="u", at_seq=boundary, new_id="branch")
        else:
            await store.truncate("c", boundary, user_id="u")
        async with store.session(branch, user_id="u") as session:
            await _agent(scenario, outcome.after_cut).run("where were we?", session=session)
    return outcome


async def _race(store: Store, scenario: Scenario, turn: str, requests: list[Any]) -> tuple[str, str]:
    """Two serialized runs at once: the database's lock orders them, the second sees the first."""
    attempts: dict[str, list[Any]] = {"a": [], "b": []}
    order: list[str] = []

    async def one(side: str) -> None:
        async with store.session("c", user_id="u", serialized=True) as session:
            order.append(side)
            await _agent(scenario, attempts[side]).run(f"{turn} ({side})", session=session)

    await asyncio.gather(one("a"), one("b"))
    requests.extend(attempts[order[0]] + attempts[order[1]])
    return order[0], order[1]
