"""The usage ledger (issue 27): a row per model call, on every commit path, equal to the framework's own metric."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, ChatMiddlewareLayer
from helpers import lose_the_reply, rows

from agent_store import ConflictError, InvalidValueError, SessionClosedError, StorageUnavailableError, Store
from agent_store.agent_framework import MemoryProvider, StoreHistoryProvider, UsageRecorder
from agent_store.offline import OfflineChatClient

PROBE = Path(__file__).resolve().parent / "usage_probe.py"
LEDGER_TOTALS = "SELECT count(*), sum(input_tokens), sum(output_tokens) FROM agent_usage"
RUN_TOTALS = "SELECT sum(input_tokens), sum(output_tokens) FROM agent_runs"
OUTCOMES = """SELECT r.outcome, count(*), sum(u.input_tokens) > 0
FROM agent_runs r JOIN agent_usage u USING (session_id, run_id) GROUP BY r.outcome ORDER BY 1"""


def agent_for(store: Store, **provider: Any) -> Agent:
    return Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store, **provider)])


async def test_the_ledger_equals_the_frameworks_token_metric(url: str) -> None:
    """Chat and Responses clients, streaming and not, tool loops and a summarizer: every call is a row, and the
    sums equal the framework's ``gen_ai.client.token.usage`` metric over the same runs."""
    done = subprocess.run([sys.executable, str(PROBE), url], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    ledger, metric, runs = seen["ledger"], seen["metric"], seen["runs"]
    assert metric["input"] > 0 and metric["output"] > 0
    assert sum(r[4] for r in ledger) == metric["input"] and sum(r[5] for r in ledger) == metric["output"]
    assert sum(r[2] or 0 for r in runs) == metric["input"] and sum(r[3] or 0 for r in runs) == metric["output"]
    by_session: dict[str, list[Any]] = {}
    for row in ledger:
        by_session.setdefault(row[0], []).append(row)
    for kind in ("chat", "chat-stream", "responses", "responses-stream", "compaction"):
        calls = by_session[kind]
        assert len(calls) == 4 + (kind == "compaction")  # three turns, one of them a tool loop of two calls
        assert all(bool(r[3]) == kind.endswith("stream") for r in calls if r[2] == "chat")
    assert [r[2] for r in by_session["compaction"]].count("compaction") == 1  # the summarizer's, marked
    assert {r[6] for r in ledger} <= set(seen["traces"]) and all(len(r[7]) == 16 for r in ledger)


async def test_each_call_is_recorded_once_on_every_commit_path(store: Store) -> None:
    agent = agent_for(store)
    async with store.session("fast", user_id="u") as session:  # the one call (SQLite: one hop)
        await agent.run("你好", session=session)
    async with store.session("keyed", user_id="u", run_id="request-1") as session:  # the checked path
        await agent.run("你好", session=session)
    async with store.session("held", user_id="u", serialized=True) as session:  # a serialized run
        await agent.run("你好", session=session)
    await agent_for(store, user_id="u").run("你好", session=AgentSession(session_id="plain"))  # a provider's save
    run = await store.load("lost", user_id="u")
    await agent.run("你好", session=run.session)
    lose_the_reply(store)
    with pytest.raises(StorageUnavailableError):
        await run.commit()
    await run.commit()  # the retry finds the first attempt landed: nothing twice
    per_run = await rows(store, "SELECT session_id, count(*) FROM agent_usage GROUP BY session_id ORDER BY 1")
    assert per_run == [(s, 1) for s in ("fast", "held", "keyed", "lost", "plain")]
    ((_, input_tokens, output_tokens),) = await rows(store, LEDGER_TOTALS)
    assert await rows(store, RUN_TOTALS) == [(input_tokens, output_tokens)] and input_tokens > 0
    assert await rows(store, "SELECT DISTINCT user_id, agent_name, app_id, purpose, model FROM agent_usage") == [
        ("u", "Bot", "default", "chat", None)  # the offline client names no model
    ]


async def test_a_plain_agent_records_through_the_one_line_middleware(store: Store) -> None:
    plain = Agent(client=OfflineChatClient(), name="Plain", middleware=[UsageRecorder()])
    async with store.session("s", user_id="u") as session:
        await plain.run("你好", session=session)
        await plain.run("再见", session=session)
    assert await rows(store, "SELECT count(*), min(agent_name) FROM agent_usage") == [(2, None)]
    assert await rows(store, "SELECT count(*) FROM agent_runs WHERE input_tokens > 0") == [(1,)]
    await plain.run("no run here", session=AgentSession())  # nothing active: nothing recorded, nothing raised
    assert await rows(store, "SELECT count(*) FROM agent_usage") == [(2,)]


async def test_a_provider_and_an_application_recorder_record_a_call_once(store: Store) -> None:
    agent = Agent(
        client=OfflineChatClient(middleware=[UsageRecorder()]), name="Bot", middleware=[UsageRecorder()],
        context_providers=[StoreHistoryProvider(store)],
    )  # fmt: skip
    async with store.session("s", user_id="u") as session:
        await agent.run("你好", session=session)
    assert await rows(store, "SELECT count(*), min(agent_name) FROM agent_usage") == [(1, "Bot")]


class _NoMiddlewareClient(OfflineChatClient):
    """A client whose calls no chat middleware sees: only the response's total is known."""

    def get_response(self, *args: Any, **kwargs: Any) -> Any:
        return super(ChatMiddlewareLayer, self).get_response(*args, **kwargs)


async def test_without_per_call_usage_the_responses_total_is_recorded(store: Store) -> None:
    agent = Agent(client=_NoMiddlewareClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])
    async with store.session("s", user_id="u") as session:
        reply = await agent.run("你好", session=session)
    usage = reply.usage_details or {}
    assert await rows(store, "SELECT purpose, input_tokens, output_tokens FROM agent_usage") == [
        ("response", usage["input_token_count"], usage["output_token_count"])
    ]


async def test_failed_and_conflicting_runs_keep_the_calls_they_spent(store: Store) -> None:
    agent = agent_for(store)
    async with store.session("s", user_id="u") as session:
        await agent.run("你好", session=session)
    with pytest.raises(RuntimeError):
        async with store.session("s", user_id="u") as session:
            await agent.run("this turn fails", session=session)
            raise RuntimeError("the app failed after the model call")
    first, second = await store.load("s", user_id="u"), await store.load("s", user_id="u")
    for run in (first, second):
        await agent.run("both", session=run.session)
        run.session.state["k"] = id(run)
    await first.commit()
    with pytest.raises(ConflictError):
        await second.commit()
    outcomes = await rows(store, OUTCOMES)
    assert outcomes == [("committed", 2, True), ("conflict", 1, True), ("failed", 1, True)]
    assert (await rows(store, RUN_TOTALS))[0] == tuple((await rows(store, LEDGER_TOTALS))[0][1:])


async def test_recorded_calls_commit_with_the_next_commit_of_a_run(store: Store) -> None:
    run = await store.load("s", user_id="u")
    await agent_for(store).run("你好", session=run.session)
    committed = await run.commit()
    nothing = await run.commit()  # nothing new: nothing written, the calls not again
    assert (nothing.version, nothing.messages_written) == (committed.version, 0)
    assert await rows(store, "SELECT count(*) FROM agent_usage") == [(1,)]
    run.add_usage({"input_token_count": 7, "output_token_count": 3, "provider.extra_count": 2, "note": "x"})
    again = await run.commit()  # a run with only a call to record still commits it
    assert again.version == committed.version + 1
    ((tokens_in, tokens_out, extra),) = await rows(
        store, "SELECT input_tokens, output_tokens, extra FROM agent_usage WHERE run_id = :r", r=again.run_id
    )
    assert (tokens_in, tokens_out) == (7, 3)  # the ints the framework counts; "note" is no count
    assert (json.loads(extra) if isinstance(extra, str) else extra) == {"provider.extra_count": 2}


async def test_concurrent_commits_of_one_user_each_record_their_calls(store: Store) -> None:
    agent = agent_for(store)

    async def turn(n: int) -> None:
        async with store.session(f"s{n}", user_id="u") as session:
            await agent.run(f"turn {n}", session=session)

    await asyncio.gather(*(turn(n) for n in range(8)))
    assert await rows(store, "SELECT count(DISTINCT session_id), count(*) FROM agent_usage") == [(8, 8)]


async def test_odd_usage_from_a_provider_never_fails_the_commit(store: Store) -> None:
    """Counts out of range, text where a count goes, NUL and megabytes in a model id: the run still commits, every
    figure kept (an out-of-range count in ``extra``), the run log's totals left out where they would overflow."""
    run = await store.load("s", user_id="u")
    run.session.state["k"] = 1
    usage = {"input_token_count": 10**30, "output_token_count": -5, "total_token_count": 2**31 + 7,
             "cache_read_input_token_count": "12", "reasoning_output_token_count": True, "x.count": 3}  # fmt: skip
    run.add_usage(usage)
    run.calls.append(
        run.calls.pop().__class__(
            called_at=run.calls[0].called_at if run.calls else datetime.now(UTC),
            usage=usage,
            model="m\x00" + "x" * 3_000_000,
            finish_reason="\x00",
        )
    )
    await run.commit()
    ((tokens, extra, model, reason),) = await rows(
        store, "SELECT input_tokens, extra, model, finish_reason FROM agent_usage"
    )
    assert tokens is None and len(model) == 255 and model.startswith("m\ufffdx") and reason == "\ufffd"
    kept = json.loads(extra) if isinstance(extra, str) else extra
    assert kept == {"input_token_count": str(10**30), "output_token_count": -5, "x.count": 3}  # past 64 bits: text
    assert await rows(store, "SELECT input_tokens, output_tokens FROM agent_runs") == [(None, None)]
    assert await rows(store, "SELECT total_tokens FROM agent_usage") == [(2**31 + 7,)]  # a bigint column


async def test_a_commit_refused_for_its_state_or_a_closed_session_keeps_its_calls(store: Store) -> None:
    agent = agent_for(store)
    async with store.session("s", user_id="u") as session:
        await agent.run("你好", session=session)
    run = await store.load("s", user_id="u")
    await agent.run("spent", session=run.session)
    run.session.state["bad"] = object()  # cannot be stored: refused before any SQL
    with pytest.raises(InvalidValueError):
        await run.commit()
    closing = await store.load("s", user_id="u")
    await agent.run("spent too", session=closing.session)
    await store.close_session("s", user_id="u")
    with pytest.raises(SessionClosedError):
        await closing.commit()
    assert await rows(store, OUTCOMES) == [("committed", 1, True), ("failed", 2, True)]


async def test_memory_provider_alone_and_with_the_history_provider_records_each_call_once(store: Store) -> None:
    alone = Agent(client=OfflineChatClient(), name="Mem", context_providers=[MemoryProvider()])
    both = Agent(client=OfflineChatClient(), name="Both",
                 context_providers=[StoreHistoryProvider(store), MemoryProvider()])  # fmt: skip
    for agent, session_id in ((alone, "alone"), (both, "both")):
        async with store.session(session_id, user_id="u") as session:
            await agent.run("我叫李明", session=session)  # the model calls remember(): a tool loop of two calls
    assert await rows(store, "SELECT session_id, count(*), min(agent_name) FROM agent_usage GROUP BY 1 ORDER BY 1") == [
        ("alone", 2, "Mem"), ("both", 2, "Both")
    ]  # fmt: skip
    assert (await rows(store, RUN_TOTALS))[0] == tuple((await rows(store, LEDGER_TOTALS))[0][1:])


async def test_hostile_usage_is_refused_or_kept_and_the_commit_lands(store: Store) -> None:
    run = await store.load("s", user_id="u")
    for bad in ([("input_token_count", 1)], "12", 5):
        with pytest.raises(InvalidValueError):
            run.add_usage(bad)  # type: ignore[arg-type]
    run.add_usage({"input_token_count": True})  # a bool is no count: nothing to record
    run.add_usage({"input_token_count": 5, "output_token_count": 10**5000})  # past what Python writes as text
    for _ in range(1025):  # each within a bigint, together past one: the budget's charge is bounded
        run.add_usage({"total_token_count": 2**53 - 1})
    await store.usage.set_budget(10, user_id="u")
    run.session.state["k"] = 1
    await run.commit()
    assert await rows(store, "SELECT count(*) FROM agent_usage") == [(1026,)]
    ((extra,),) = await rows(store, "SELECT extra FROM agent_usage WHERE call_no = 1")
    kept = json.loads(extra) if isinstance(extra, str) else extra
    assert kept == {"output_token_count": "an integer of 16610 bits"}
    assert (await store.usage.budget("u")).used == 5  # type: ignore[union-attr]  # odd figures charge nothing


async def test_two_agents_at_once_on_one_session_each_record_their_own_call(store: Store) -> None:
    class Slow(OfflineChatClient):
        def __init__(self, delay: float) -> None:
            super().__init__()
            self.delay = delay

        async def _inner_get_response(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(self.delay)
            return await super()._inner_get_response(*args, **kwargs)

    first = Agent(client=Slow(0.3), name="A", context_providers=[StoreHistoryProvider(store)])
    second = Agent(client=Slow(0.0), name="B", context_providers=[StoreHistoryProvider(store)])
    async with store.session("shared", user_id="u") as session:
        await asyncio.gather(first.run("first", session=session), second.run("second", session=session))
    assert await rows(store, "SELECT agent_name, purpose FROM agent_usage ORDER BY agent_name") == [
        ("A", "chat"), ("B", "chat")
    ]  # fmt: skip
    assert (await rows(store, RUN_TOTALS))[0] == tuple((await rows(store, LEDGER_TOTALS))[0][1:])


async def test_a_conflict_creating_a_session_and_a_cancelled_run_keep_their_calls(store: Store) -> None:
    first, second = await store.load("new", user_id="u"), await store.load("new", user_id="u")
    for run in (first, second):
        run.session.state["k"] = id(run)
        run.add_usage({"input_token_count": 100, "output_token_count": 50})
    await first.commit()
    with pytest.raises(ConflictError):
        await second.commit()
    agent = agent_for(store)

    spent = asyncio.Event()

    async def abandoned() -> None:
        async with store.session("new", user_id="u") as session:
            await agent.run("spent", session=session)
            spent.set()
            await asyncio.Event().wait()  # a client gone away: the request's task is cancelled here

    task = asyncio.create_task(abandoned())
    await spent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await rows(store, OUTCOMES) == [("committed", 1, True), ("conflict", 1, True), ("failed", 1, True)]
