"""Background responses (issue 39) on both backends, on the framework's own hosting functions with the real Agent
and the offline client: answered at once, read back from another worker from any ``starting_after``, remembered by
``previous_response_id``, cancelled; another user's response is not found."""

from __future__ import annotations

import json
from typing import Any

import httpx
from agent_framework import Agent
from fastapi import FastAPI
from helpers import until
from slow_tool import GO_ON, JOURNALS, fresh_gate, slow_lookup  # noqa: F401 (fresh_gate: autouse)

from agent_store import Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.agent_framework.responses_background import add_background_responses_routes
from agent_store.offline import OfflineChatClient


def app_on(store: Store) -> FastAPI:
    app = FastAPI()
    agent = Agent(client=OfflineChatClient(), name="Assistant", tools=[slow_lookup])
    JOURNALS.append(add_background_responses_routes(app, agent, store,
                                                    user_of=lambda request: request.headers.get("x-user")))
    return app


def heard_or_ended() -> bool:
    """Every run of this test's apps has heard a cancel, or ended."""
    return all(run.writer.cancel_requested for journal in JOURNALS for run in journal.detached)


def events_of(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]


def said(response: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for item in response.get("output", []) for part in item.get("content") or [])


async def finished(web: httpx.AsyncClient, response_id: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        found = (await web.get(f"/responses/{response_id}", headers={"x-user": "u"})).json()
        return None if found["status"] in ("queued", "in_progress") else dict(found)

    return dict(await until(ended, "the background response to finish"))


async def test_a_background_response_answers_at_once_and_any_worker_reads_it(store: Store, url: str) -> None:
    web = httpx.AsyncClient(transport=httpx.ASGITransport(app=app_on(store)), base_url="http://localhost")
    async with Store.from_url(url) as other:
        elsewhere = httpx.AsyncClient(transport=httpx.ASGITransport(app=app_on(other)), base_url="http://localhost")
        async with web, elsewhere:
            queued = (await web.post("/responses", json={"model": "offline", "input": "我叫李明", "background": True},
                                     headers={"x-user": "u"})).json()  # fmt: skip
            assert queued["status"] == "queued" and queued["background"] is True
            done = await finished(elsewhere, queued["id"])
            assert done["status"] == "completed" and said(done) == "你好，李明！很高兴认识你。"
            every = events_of((await elsewhere.get(f"/responses/{queued['id']}", params={"stream": "true"},
                                                   headers={"x-user": "u"})).text)  # fmt: skip
            assert [e["sequence_number"] for e in every] == list(range(len(every)))
            assert every[-1]["type"] == "response.completed"
            rest = events_of((await elsewhere.get(f"/responses/{queued['id']}",
                                                  params={"stream": "true", "starting_after": 3},
                                                  headers={"x-user": "u"})).text)  # fmt: skip
            assert rest == every[4:]
            assert (await elsewhere.get(f"/responses/{queued['id']}", headers={"x-user": "mallory"})).status_code == 404
            follow_up = (await elsewhere.post("/responses", json={"model": "offline", "input": "我叫什么名字？",
                                                                  "previous_response_id": queued["id"]},
                                              headers={"x-user": "u"})).json()  # fmt: skip
            assert said(follow_up) == "你叫李明。"  # the first turn's session was stored before it completed


async def test_a_streamed_response_is_journaled_and_a_cancel_stops_a_background_one(store: Store, url: str) -> None:
    web = httpx.AsyncClient(transport=httpx.ASGITransport(app=app_on(store)), base_url="http://localhost")
    async with web:
        streamed = events_of((await web.post("/responses", json={"model": "offline", "input": "你好", "stream": True},
                                             headers={"x-user": "u"})).text)  # fmt: skip
        assert streamed[0]["type"] == "response.created" and streamed[-1]["type"] == "response.completed"
        slow = (await web.post("/responses", json={"model": "offline", "input": "call slow_lookup",
                                                   "background": True}, headers={"x-user": "u"})).json()  # fmt: skip
        async with Store.from_url(url) as other:
            elsewhere = httpx.AsyncClient(transport=httpx.ASGITransport(app=app_on(other)), base_url="http://localhost")
            async with elsewhere:
                asked = (await elsewhere.post(f"/responses/{slow['id']}/cancel", headers={"x-user": "u"})).json()
                assert asked["status"] in ("queued", "in_progress", "cancelled")  # it stops at its next event
                await until(heard_or_ended, "the run to hear the cancel")
                GO_ON["tool"].set()  # its tool returns: the next event is where it stops
                assert (await finished(elsewhere, slow["id"]))["status"] == "cancelled"
                # Nothing of the cancelled turn was stored under its id (the framework's get_or_create_session
                # stores the empty session it starts with)
                kept = await StoreSessionStore(other, user_id="u").get(slow["id"])
                assert kept is None or not kept.state.get("in_memory", {}).get("messages")
        _, info = await store.journal().read(slow["id"], user_id="u")
        assert info["status"] == "cancelled"
