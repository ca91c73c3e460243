"""A finished run leaves no cyclic garbage: its loaded messages are freed when the last reference goes, not at the
next garbage collection.

A cycle between a Run and its session kept every loaded message alive until a collection ran; those that a young
collection found still alive were promoted, and the full collections they fed were the long pauses of a service
that loads whole histories (bench/studies/gc_pauses.py: p99 124 ms against 19 ms without the cycle, with gc.freeze()).
Each test runs with the collector off: a message still alive after the run is released is held by a cycle.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, Message

from agent_store import Store
from agent_store.agent_framework import StoreHistoryProvider, StoreSessionStore
from agent_store.offline import OfflineChatClient
from agent_store.run.commit import run_of


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def seeded(store: Store, session_id: str) -> None:
    async with store.session(session_id, user_id="u") as session:
        session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"turn {i}"]) for i in range(50)]
        session.state["counter"] = 1


async def freed(work: Callable[[list[weakref.ref[Message]]], Awaitable[None]]) -> list[weakref.ref[Message]]:
    """The weak references ``work`` took to messages it loaded, once everything it made is released."""
    probes: list[weakref.ref[Message]] = []
    await work(probes)
    return probes


async def test_a_loaded_and_committed_run_frees_its_messages_by_reference_counting(
    store: Store, collector_off: None
) -> None:
    await seeded(store, "s")

    async def work(probes: list[weakref.ref[Message]]) -> None:
        run = await store.load("s", user_id="u")
        probes += [weakref.ref(m) for m in run.history]
        run.history.append(Message(role="assistant", contents=["ok"]))
        run.session.state["counter"] = 2
        await run.commit()

    probes = await freed(work)
    assert len(probes) == 50 and all(p() is None for p in probes)


async def test_a_store_session_block_with_an_agent_frees_its_messages(store: Store, collector_off: None) -> None:
    """The provider's usage recorder is chat middleware: the framework's chat pipeline keeps each call's context
    in a reference cycle, which the recorder ends (usage_recorder._release_pipeline). (A streaming run is left
    out: the framework's own streaming path, RawAgent._parse_streaming_response, keeps the session in a cycle,
    with or without the store.)"""
    await seeded(store, "s")
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])

    async def work(probes: list[weakref.ref[Message]]) -> None:
        async with store.session("s", user_id="u") as session:
            probes += [weakref.ref(m) for m in session.state["in_memory"]["messages"]]
            await agent.run("我叫李明", session=session)

    probes = await freed(work)
    assert len(probes) == 50 and all(p() is None for p in probes)


async def test_a_session_store_session_keeps_its_run_and_frees_both(store: Store, collector_off: None) -> None:
    """StoreSessionStore.get hands out the session alone: its run is found again through it (run_of), and
    committing works, with nothing held after."""
    await seeded(store, "s")
    sessions = StoreSessionStore(store, user_id="u")
    agent = Agent(client=OfflineChatClient(), name="Bot")

    async def work(probes: list[weakref.ref[Message]]) -> None:
        session = await sessions.get("s")
        assert session is not None
        probes += [weakref.ref(m) for m in session.state["in_memory"]["messages"]]
        first = run_of(session)
        assert first is not None and run_of(session) is first  # the same Run while something holds it
        del first
        again = run_of(session)  # none does now: a Run on the same attributes
        assert again is not None and again.session is session and again.exists
        del again
        await agent.run("我叫李明", session=session)
        await sessions.set("s", session)

    probes = await freed(work)
    assert len(probes) == 50 and all(p() is None for p in probes)
    run = await store.load("s", user_id="u")
    assert [m.text for m in run.history[-2:]] == ["我叫李明", "你好，李明！很高兴认识你。"]
    assert len(run.history) == 52
    await run.discard()


async def test_a_plain_session_with_the_history_provider_frees_its_messages(
    store: Store, collector_off: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seeded(store, "s")
    agent = Agent(client=OfflineChatClient(), name="Bot",
                  context_providers=[StoreHistoryProvider(store, user_id="u")])  # fmt: skip
    loaded: list[weakref.ref[Message]] = []
    original = StoreHistoryProvider.get_messages

    async def observed(self: StoreHistoryProvider, *args: Any, **kwargs: Any) -> list[Message]:
        messages = await original(self, *args, **kwargs)  # the provider's own load, observed, not replaced
        loaded.extend(weakref.ref(m) for m in messages)
        return messages

    monkeypatch.setattr(StoreHistoryProvider, "get_messages", observed)
    await agent.run("我叫李明", session=AgentSession(session_id="s"))
    assert len(loaded) >= 50 and all(p() is None for p in loaded)


SERVING = """
import asyncio, sys
from agent_framework import Agent
from agent_store import Store
from agent_store.offline import OfflineChatClient

async def main(url):
    async with Store.from_url(url) as store:
        agent = Agent(client=OfflineChatClient(), name="Bot")
        async with store.session("s", user_id="u") as session:
            await agent.run("我叫李明", session=session)
        print(sorted(name for name in ("alembic", "mako") if name in sys.modules))

asyncio.run(main(sys.argv[1]))
"""


async def test_a_serving_process_never_imports_the_migration_machinery(store: Store, url: str) -> None:
    """A full collection walks every tracked object in the process (issue 43): opening a store on a migrated
    database, checking its schema and running a turn import neither Alembic nor Mako (about 15,000 objects, a
    third of a full pass's time measured in a small service)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SERVING, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


async def test_a_load_lets_each_row_go_once_its_message_is_built(store: Store) -> None:
    """The load's rows are namedtuples, which the collector never untracks: rows held until the whole history is
    decoded were promoted by the young collections that ran mid-decode (about 1.3 per message, issue 43). Counted
    at every collection during a 600-message load: rows and messages alive together stay near one per message."""
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"turn {i}"]) for i in range(600)]
    seen: list[int] = []

    def alive(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            kinds = [type(o) for o in gc.get_objects()]
            seen.append(sum(1 for k in kinds if k is Message or (k.__name__ == "Row" and issubclass(k, tuple))))

    gc.collect()
    before = sum(1 for o in gc.get_objects() if type(o) is Message)
    thresholds = gc.get_threshold()
    gc.set_threshold(200)  # collections every 200 allocations: several land inside the decode
    gc.callbacks.append(alive)
    try:
        run = await store.load("s", user_id="u")
    finally:
        gc.callbacks.remove(alive)
        gc.set_threshold(*thresholds)
    assert len(run.history) == 600
    await run.discard()
    assert len(seen) >= 10, seen  # collections did land inside the load
    assert max(seen) - before <= 600 + 20, (before, seen)


def own_dict(message: Message) -> bool:
    """Whether ``message`` keeps its attributes in a dict of its own (a tracked object) rather than in the object
    (CPython's shared keys: then the collector sees the attribute values themselves, and no dict with a role)."""
    return any(type(r) is dict and "role" in r for r in gc.get_referents(message))


async def test_a_loaded_text_message_keeps_its_attributes_in_the_object(store: Store) -> None:
    """The framework's constructors make four tracked objects per text message (``Message``, its contents list,
    the ``Content`` and its 46-attribute dict); the load's fast decode makes no more, even with the two
    attributes the store adds (give_id) and after the process has made many messages (issue 43)."""
    many = [Message(role="user", contents=[f"turn {i}"]) for i in range(600)]
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"] += many
    run = await store.load("s", user_id="u")
    assert [m.text for m in run.history] == [m.text for m in many]
    assert not any(own_dict(m) for m in run.history)
    vars(run.history[0])  # and the check can fail: asking for the dict makes one
    assert own_dict(run.history[0])
    await run.discard()
