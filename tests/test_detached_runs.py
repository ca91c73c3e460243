"""Runs that go on without their client (issue 39), on both backends: started in the background with the real
Agent, followed from another Store, cancelled from another Store mid-run, failed; the run's transcript is its own
one commit (nothing of a cancelled or failed run)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, AgentSession
from helpers import until

from agent_store import Store, StreamNotFoundError
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.journal import start_detached
from agent_store.offline import OfflineChatClient


async def follow(url: str, stream: str) -> list[Any]:
    async with Store.from_url(url) as other:
        journal = other.journal()
        try:
            return [e.event async for e in journal.follow(stream, user_id="u")]
        finally:
            await journal.close()


async def test_a_detached_run_goes_on_and_any_client_reads_it(store: Store, url: str) -> None:
    agent = Agent(client=OfflineChatClient(), name="Assistant")

    async def events() -> AsyncIterator[Any]:
        async with store.session("chat", user_id="u") as session:
            async for update in agent.run("我叫李明", session=session, stream=True):
                yield update

    journal = store.journal(batch_ms=10)
    task = await start_detached(journal, "run-1", user_id="u", events=events, conversation_id="chat")
    seen = await asyncio.wait_for(follow(url, "run-1"), 20)  # a client elsewhere, from the start
    assert await task == "completed"
    assert "".join(c["text"] for e in seen for c in e["contents"]) == "你好，李明！很高兴认识你。"
    run = await store.load("chat", user_id="u")  # the transcript: the run's own commit
    assert [m.text for m in run.history] == ["我叫李明", "你好，李明！很高兴认识你。"]
    await run.discard()
    await journal.close()


async def test_a_cancel_from_another_worker_stops_the_run_and_commits_nothing(store: Store, url: str) -> None:
    reached = asyncio.Event()

    async def events() -> AsyncIterator[Any]:
        async with store.session("slow", user_id="u") as session:
            session.state["steps"] = 0
            for step in range(1000):
                session.state["steps"] = step
                yield {"type": "step", "n": step}
                if step == 3:
                    reached.set()
                await asyncio.sleep(0.05)  # a long tool loop

    journal = store.journal(batch_events=1, lease_s=1.5)
    task = await start_detached(journal, "slow-run", user_id="u", events=events)
    await asyncio.wait_for(reached.wait(), 10)
    async with Store.from_url(url) as other:
        assert await other.journal().cancel("slow-run", user_id="u")
    assert await asyncio.wait_for(task, 10) == "cancelled"
    events_seen, info = await journal.read("slow-run", user_id="u")
    assert info["status"] == "cancelled" and len(events_seen) < 1000
    assert [e.seq for e in events_seen] == list(range(1, len(events_seen) + 1))
    with pytest.raises(LookupError):  # nothing of the cancelled run was committed: no session
        await _must_exist(store, "slow")
    await journal.close()


async def _must_exist(store: Store, session_id: str) -> None:
    run = await store.load(session_id, user_id="u")
    exists = run.exists
    await run.discard()
    if not exists:
        raise LookupError(session_id)


async def test_a_failing_run_is_failed_in_the_journal(store: Store, url: str) -> None:
    async def events() -> AsyncIterator[Any]:
        yield {"type": "step", "n": 1}
        raise RuntimeError("the model service said no")

    journal = store.journal(batch_ms=10)
    task = await start_detached(journal, "bad", user_id="u", events=events)
    with pytest.raises(RuntimeError):
        await task
    assert await follow(url, "bad") == [{"type": "step", "n": 1}]
    _, info = await journal.read("bad", user_id="u")
    assert (info["status"], info["error"]) == ("failed", "RuntimeError")
    with pytest.raises(StreamNotFoundError):
        await journal.read("bad", user_id="someone else")
    await journal.close()


async def test_a_worker_killed_mid_run_keeps_every_finished_tool_result(store: Store, url: str) -> None:
    """SIGKILL while the model call after a tool runs: on restart the run is incomplete, never in_progress, and
    with per-service-call persistence the tool's result is stored (the framework alone stores it only with the
    answer of that call, which never came), so the session goes on with it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).parent / "detached_worker.py"), url, "worker-3", "booking", "trip",
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert worker.stdout is not None
    journal = store.journal(worker_id="worker-3")  # (what the worker restarted opens; nothing is done with it yet)

    async def result_journaled() -> bool:  # the journal's batch timer (50 ms) has sent the tool's result event
        events, _ = await journal.read("booking", user_id="u")
        return any(c.get("type") == "function_result" for e in events for c in e.event.get("contents", []))

    try:
        said = [(await asyncio.wait_for(worker.stdout.readline(), 60)).decode().strip() for _ in range(2)]
        assert said == ["tool done", "model waiting"]
        await until(result_journaled, "the tool's result in the journal")
    finally:
        if worker.returncode is None:
            worker.send_signal(signal.SIGKILL)
        await worker.wait()
    assert await journal.recover() == 1  # the restarted worker: its run is not live
    events, info = await journal.read("booking", user_id="u")
    assert info["status"] == "incomplete"
    results = [c for e in events for c in e.event.get("contents", []) if c.get("type") == "function_result"]
    assert [r["result"] for r in results] == ["CA1501 已订"]  # in the journal too
    history = (await store.load("trip", user_id="u")).history
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[2].contents[0].result == "CA1501 已订"
    provider = StoreHistoryProvider(store, user_id="u")
    agent = Agent(client=OfflineChatClient(), name="Booker", context_providers=[provider])
    reply = await agent.run("我叫李明", session=AgentSession(session_id="trip"))
    assert reply.text == "你好，李明！很高兴认识你。"  # the history is whole: a hosted API would take it
    await journal.close()
