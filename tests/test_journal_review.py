"""What an outside review of the journal (issue 39) confirmed, each a test now: a cancel racing the commit; a hard
cancel while the run's last batch is in flight; a batch too big for one PostgreSQL statement; two AG-UI runs on
one thread; a cancelled AG-UI run's end; cancel routes given a bad id."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from agent_framework import Agent, tool
from agent_framework_ag_ui import AgentFrameworkAgent
from fastapi import FastAPI
from sqlalchemy import text
from test_agui_resume import frames

import agent_store.journal.writer as writer_module
from agent_store import Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.agent_framework.ag_ui_resume import add_resumable_agui_routes
from agent_store.agent_framework.responses_background import add_background_responses_routes
from agent_store.db.statements import USER_LOCK
from agent_store.journal import start_detached
from agent_store.offline import OfflineChatClient


@tool
async def slow_lookup() -> str:
    """A tool that takes a while."""
    await asyncio.sleep(1.0)
    return "北京，晴"


def apps(store: Store) -> FastAPI:
    app = FastAPI()
    agent = Agent(client=OfflineChatClient(), name="Assistant", tools=[slow_lookup])
    user_of: Any = lambda request: request.headers.get("x-user")  # noqa: E731
    add_background_responses_routes(app, agent, store, user_of=user_of)
    add_resumable_agui_routes(app, AgentFrameworkAgent(agent=agent), store, path="/agent", user_of=user_of)
    return app


def client(store: Store) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=apps(store)), base_url="http://t",
                             headers={"x-user": "u"})  # fmt: skip


async def test_a_cancel_while_the_turn_commits_ends_it_completed_with_its_turn(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
    async with Store.from_url(pg_url) as store, Store.from_url(pg_url) as other, client(store) as web, \
            client(other) as far:  # fmt: skip
        body = {"model": "offline", "input": "call slow_lookup", "background": True}
        response_id = (await web.post("/responses", json=body)).json()["id"]
        await asyncio.sleep(0.3)  # inside the tool: the commit comes next, and waits for this lock
        async with other.engine.connect() as holder:
            transaction = await holder.begin()
            await holder.execute(text("SELECT pg_advisory_xact_lock(:k, hashtext('u'))"), {"k": USER_LOCK})
            for _ in range(200):  # until the run's commit waits on it
                waiting = (await holder.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND pid <> pg_backend_pid()"
                ))).scalar()  # fmt: skip
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting, "the commit never waited on the lock"
            await far.post(f"/responses/{response_id}/cancel")
            await asyncio.sleep(2.5)  # past the run's grace_s (2 s): a hard cancel would have come by now
            await transaction.commit()
        journal = other.journal()
        async def to_the_end() -> None:
            async for _ in journal.follow(response_id, user_id="u"):
                pass

        await asyncio.wait_for(to_the_end(), 30)
        events, info = await journal.read(response_id, user_id="u")
        kept = await StoreSessionStore(other, user_id="u").get(response_id)
        # one outcome or the other, never both: here the commit won, so completed, with its turn
        assert info["status"] == "completed" and events[-1].event["type"] == "response.completed"
        assert kept is not None and (await far.get(f"/responses/{response_id}")).json()["status"] == "completed"
        await journal.close()


async def test_a_hard_cancel_during_the_last_batch_still_ends_the_run_with_every_event(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
    async with Store.from_url(pg_url) as store, Store.from_url(pg_url) as other:
        journal, far = store.journal(lease_s=2), other.journal()
        async with other.engine.connect() as holder:

            async def events() -> Any:
                yield {"n": 1}
                await asyncio.sleep(0.5)
                transaction = await holder.begin()  # the run's row held a while: its last batch waits
                await holder.execute(text("SELECT 1 FROM agent_streams WHERE stream_id = 'r1' FOR UPDATE"))
                asyncio.get_running_loop().call_later(1.5, lambda: asyncio.ensure_future(transaction.commit()))
                yield {"n": 2}
                yield {"n": 3}

            task = await start_detached(journal, "r1", user_id="u", events=events, grace_s=0.6)
            await asyncio.sleep(0.2)
            assert await far.cancel("r1", user_id="u")
            assert await asyncio.wait_for(task, 30) == "cancelled"
        got, info = await far.read("r1", user_id="u")
        assert (info["status"], [e.event for e in got]) == ("cancelled", [{"n": 1}, {"n": 2}])
        await journal.close()
        await far.close()


async def test_a_batch_over_the_statement_limit_goes_as_several(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "BATCH_BYTES", 2**20)  # 1 MiB: a 64-event batch of 100 kB is 7 statements
    journal = store.journal(batch_events=64, batch_ms=60_000)
    async with await journal.start("big", user_id="u") as writer:
        for n in range(64):
            await writer.append({"n": n, "pad": "字" * 33_000})
    events, info = await journal.read("big", user_id="u")
    assert info["status"] == "completed" and [e.event["n"] for e in events] == list(range(64))
    assert [e.seq for e in events] == list(range(1, 65))
    await journal.close()


def run_request(run_id: str, text_: str = "call slow_lookup") -> dict[str, Any]:
    return {"threadId": "thread-1", "runId": run_id, "messages": [{"id": f"m-{run_id}", "role": "user",
                                                                  "content": text_}]}  # fmt: skip


async def test_an_agui_thread_runs_one_at_a_time_from_any_worker(store: Store, url: str) -> None:
    async with Store.from_url(url) as other, client(store) as web, client(other) as far:
        first = asyncio.create_task(web.post("/agent", json=run_request("A")))
        for _ in range(200):
            if await other.journal().live_run("thread-1", user_id="u") == "A":
                break
            await asyncio.sleep(0.02)
        second = await far.post("/agent", json=run_request("B", "我叫李明"))  # another worker, the same thread
        assert second.status_code == 409 and second.json()["detail"]["runId"] == "A"
        elsewhere = await far.post("/agent", json={**run_request("C", "hi"), "threadId": "thread-2"})
        assert elsewhere.status_code == 200  # another thread is free
        assert frames((await asyncio.wait_for(first, 30)).text)[-1][1]["type"] == "RUN_FINISHED"
        third = await far.post("/agent", json=run_request("D", "我叫李明"))  # once it has ended: free again
        assert third.status_code == 200 and frames(third.text)[-1][1]["type"] == "RUN_FINISHED"


async def test_a_cancelled_agui_run_ends_with_a_run_error(store: Store, url: str) -> None:
    async with Store.from_url(url) as other, client(store) as web, client(other) as far:
        live = asyncio.create_task(web.post("/agent", json=run_request("R")))
        for _ in range(200):
            if (await far.post("/agent/runs/R/cancel")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        own = (await asyncio.wait_for(live, 30)).text
        resumed = (await far.get("/agent/runs/R", params={"after": 0})).text
    for body in (own, resumed):  # the live stream's end, and a reader's later: a RUN_ERROR with no id (not journaled)
        end = body.strip().split("\n\n")[-1]
        assert end.startswith("data: ") and '"code": "CANCELLED"' in end and '"RUN_ERROR"' in end
        assert "RUN_FINISHED" not in body and body.count("RUN_ERROR") == 1


@pytest.mark.parametrize("path", ["/agent/runs/{}/cancel", "/responses/{}/cancel"])
async def test_cancel_routes_answer_a_bad_id_with_400(store: Store, path: str) -> None:
    async with client(store) as web:
        for bad in ("x" * 300, "a%00b"):
            assert (await web.post(path.format(bad))).status_code == 400
