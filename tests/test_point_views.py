"""A point's model view never changes (issue 58, "what must be true" 1), tried with random operations.

A random tree of served requests (previous_response_id chains and branches) under a compaction strategy, shared
forks at random messages, and between them, in random order, every operation that changes a base: truncate,
delete of a key, delete of a session, expiry and purge, restart of an expired session. Each point's model view (the
request the model gets when a turn continues from it) is recorded when the point is made; after every step each
point reads that same request, byte for byte, or is gone (a key deleted, or its history cut or deleted, where the
operation says so), and a point once gone stays gone.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from agent_framework import Message
from agent_framework_hosting import AgentState
from differential import STRATEGIES, Scenario, _agent
from helpers import expire_now, rows

from agent_store import Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.errors import AgentStoreError

PROBE = "where were we?"


async def model_view(sessions: StoreSessionStore, scenario: Scenario, key: str) -> list[Any] | None:
    """The request a model gets for a turn continuing from ``key``, or None if ``key`` names nothing (the probe's
    turn is never stored)."""
    session = await sessions.get(key)
    if session is None or not session.state.get("in_memory", {}).get("messages"):
        return None  # (empty reads as absent: tests/test_point_model.py says why)
    requests: list[Any] = []
    await _agent(scenario, requests).run(PROBE, session=session)
    return requests[0]


async def serve(sessions: StoreSessionStore, scenario: Scenario, words: str, previous: str | None, key: str) -> None:
    """One request of the hosting route (tests/hosting_route.py, agent-framework-hosting's own ``AgentState``):
    from ``previous`` (a previous_response_id), stored under the response id ``key``."""
    state = AgentState(_agent(scenario, []), session_store=sessions)
    session = await state.get_or_create_session(previous or key)
    await (await state.get_target()).run(words, session=session)
    await state.set_session(key, session)


async def stored_sessions(store: Store) -> list[str]:
    return [sid for (sid,) in await rows(store, "SELECT id FROM agent_sessions ORDER BY id")]


async def step(store: Store, sessions: StoreSessionStore, scenario: Scenario, r: random.Random, n: int,
               views: dict[str, list[Any] | None]) -> str:  # fmt: skip
    """One random operation; a point it makes is recorded in ``views``. Returns what it did (for the failure)."""
    live = [key for key, seen in views.items() if seen is not None and not key.startswith("fork")]
    kind = r.choices(["request", "fork", "truncate", "forget", "delete", "expire", "restart"],
                     weights=[8, 2, 2, 2, 1, 1, 1])[0]  # fmt: skip
    session_ids = await stored_sessions(store)
    if kind == "request" or not session_ids:
        previous = r.choice(live) if live and r.random() < 0.85 else None
        await serve(sessions, scenario, f"{r.choice(['hello', 'call weather', 'tell me more', 'why?'])} #{n}",
                    previous, f"resp_{n}")  # fmt: skip
        views[f"resp_{n}"] = await model_view(sessions, scenario, f"resp_{n}")
        return f"request resp_{n} from {previous}"
    target = r.choice(session_ids)
    try:
        if kind == "fork":
            count = (await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = :s", s=target))[0][0]
            new_id = await store.fork(target, user_id="u", at_seq=r.randint(0, max(count - 1, 0)), share=True,
                                      new_id=f"fork{n}")  # fmt: skip
            views[new_id] = await model_view(sessions, scenario, new_id)
        elif kind == "truncate":
            await store.truncate(target, r.randint(-1, 8), user_id="u")
        elif kind == "forget" and live:
            target = r.choice(live)
            await sessions.delete(target)
            views[target] = None  # the framework's store: that key goes, and only it
        elif kind == "delete":
            await store.delete(target, user_id="u")
        elif kind == "expire":
            await expire_now(store, target)
            await store.purge_expired()
        elif kind == "restart":
            await expire_now(store, target)
            await (await store.load(target, user_id="u", if_expired="restart")).discard()
    except AgentStoreError as refused:  # a refusal (typed) changes nothing: the checks below say so
        return f"{kind} {target}: refused ({type(refused).__name__})"
    return f"{kind} {target}"


@pytest.mark.parametrize("seed", range(10))
async def test_every_point_keeps_its_model_view_under_random_operations(url: str, seed: int) -> None:
    r = random.Random(seed)
    scenario = Scenario.draw(seed)
    scenario.strategy = r.choice(["none", "sliding_window", "summarization", "truncation", "tool_result"])
    scenario.phase, scenario.reused_ids, scenario.race_at = "after", False, None
    assert scenario.strategy in STRATEGIES
    async with Store.from_url(url) as store:
        await store.migrate()
        # A sliding window of the history a model is given, or none (the hosting route's history_limit)
        sessions = StoreSessionStore(store, user_id="u", history_limit=r.choice([None, None, 2, 3, 5]))
        views: dict[str, list[Any] | None] = {}
        gone: set[str] = set()
        done: list[str] = []
        for n in range(14):
            done.append(await step(store, sessions, scenario, r, n, views))
            for key, seen in views.items():
                now = await model_view(sessions, scenario, key)
                assert now is None or (key not in gone and now == seen), (seed, scenario.strategy, key, done)
                if now is None:
                    gone.add(key)


def plain() -> Scenario:
    """A scenario with no compaction and no race, for the named cases."""
    scenario = Scenario.draw(0)
    scenario.strategy, scenario.race_at = "none", None
    return scenario


async def test_a_chains_first_response_id_is_a_point_before_anything_continues_from_it(url: str) -> None:
    """Finding 6: the first request of a chain is stored under its response id as a session's own id. No request
    continued from it yet, and the session is rewound, then a turn lands on its head: the id names what its
    model saw, or nothing once cut, never the rewound history nor the head's later turns."""
    scenario = plain()
    async with Store.from_url(url) as store:
        await store.migrate()
        sessions = StoreSessionStore(store, user_id="u")
        await serve(sessions, scenario, "hello #0", None, "resp_0")
        seen = await model_view(sessions, scenario, "resp_0")
        run = await store.load("resp_0", user_id="u")  # a turn on the head, outside the route
        run.history.append(Message(role="user", contents=["a turn on the head"]))
        assert (await run.commit()).messages_written == 1
        assert await model_view(sessions, scenario, "resp_0") == seen is not None
        assert await store.truncate("resp_0", 0, user_id="u") > 0
        assert await model_view(sessions, scenario, "resp_0") is None


async def test_a_key_never_reads_a_session_that_took_its_id(url: str) -> None:
    """A response id whose session expired reads as nothing; a request continuing from it starts a session under
    that id (the route names it so): the id still reads nothing, not that new session's turns."""
    scenario = plain()
    async with Store.from_url(url) as store:
        await store.migrate()
        sessions = StoreSessionStore(store, user_id="u")
        await serve(sessions, scenario, "hello #0", None, "resp_0")
        await serve(sessions, scenario, "why? #1", "resp_0", "resp_1")
        await serve(sessions, scenario, "so? #2", "resp_0", "resp_2")  # a branch: resp_1's session is kept for it
        await expire_now(store, "resp_0")
        assert await model_view(sessions, scenario, "resp_1") is None
        await serve(sessions, scenario, "tell me more #3", "resp_1", "resp_3")
        assert await model_view(sessions, scenario, "resp_1") is None
        asked = [text for role, text, _ in await model_view(sessions, scenario, "resp_3") or [] if role == "user"]
        assert asked == ["tell me more #3", PROBE]
