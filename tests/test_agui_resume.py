"""Resumable AG-UI runs (issue 39, microsoft/agent-framework#7230) on both backends, with the AG-UI package's own
runner around the real Agent and the offline client: the run streams with event ids; a client that disconnects
mid-run (a real socket closed, on a real server) reconnects to another worker with ``after=`` or
``Last-Event-ID`` and gets every event it missed exactly once; cancel; another user's run is not found."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import uvicorn
from agent_framework import Agent
from agent_framework_ag_ui import AgentFrameworkAgent
from fastapi import FastAPI
from helpers import until
from slow_tool import GO_ON, JOURNALS, fresh_gate, slow_lookup  # noqa: F401 (fresh_gate: autouse)

from agent_store import Store
from agent_store.agent_framework.ag_ui_resume import add_resumable_agui_routes
from agent_store.offline import OfflineChatClient


def app_on(store: Store) -> FastAPI:
    agent = Agent(client=OfflineChatClient(), name="Assistant", tools=[slow_lookup])
    app = FastAPI()
    JOURNALS.append(add_resumable_agui_routes(app, AgentFrameworkAgent(agent=agent), store, path="/agent",
                                              user_of=lambda request: request.headers.get("x-user")))  # fmt: skip
    return app


def frames(body: str) -> list[tuple[int, dict[str, Any]]]:
    """The run's events (each with its id); a frame with no id (the route's own end of a cancelled run) is -1."""
    out = []
    for frame in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((int(lines.get("id", -1)), json.loads(lines["data"])))
    return out


def request(run_id: str, text: str) -> dict[str, Any]:
    return {"threadId": "thread-1", "runId": run_id, "messages": [{"id": f"m-{run_id}", "role": "user",
                                                                  "content": text}]}  # fmt: skip


async def test_a_run_streams_with_ids_and_any_worker_replays_it(store: Store, url: str) -> None:
    transport = httpx.ASGITransport(app=app_on(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost", headers={"x-user": "u"}) as web:
        body = (await web.post("/agent", json=request("run-1", "我叫李明"))).text
    events = frames(body)
    assert [seq for seq, _ in events] == list(range(1, len(events) + 1))
    assert events[0][1]["type"] == "RUN_STARTED" and events[-1][1]["type"] == "RUN_FINISHED"
    said = "".join(e.get("delta", "") for _, e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert said == "你好，李明！很高兴认识你。"
    async with Store.from_url(url) as other:  # another worker
        transport = httpx.ASGITransport(app=app_on(other))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as web:
            after = frames((await web.get("/agent/runs/run-1", params={"after": 2}, headers={"x-user": "u"})).text)
            reconnect = await web.get("/agent/runs/run-1", headers={"x-user": "u", "Last-Event-ID": "3"})
            assert (await web.get("/agent/runs/run-1", headers={"x-user": "mallory"})).status_code == 404
            bad = await web.get("/agent/runs/run-1", headers={"x-user": "u", "Last-Event-ID": "x"})
            assert bad.status_code == 400
            done = await web.post("/agent/runs/run-1/cancel", headers={"x-user": "u"})
            again = await web.post("/agent", json=request("run-1", "again"), headers={"x-user": "u"})
    assert after == events[2:] and frames(reconnect.text) == events[3:]
    assert done.json() == {"cancelled": False} and again.status_code == 409  # a run id is used once


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_client_cut_mid_run_reconnects_elsewhere_and_misses_nothing(store: Store, url: str) -> None:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app_on(store), host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or serving.done(), "the server to listen")
        seen: list[tuple[int, dict[str, Any]]] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"x-user": "u"}) as web:
            async with web.stream("POST", "/agent", json=request("run-2", "call slow_lookup")) as response:
                buffer = ""
                async for chunk in response.aiter_text():
                    buffer += chunk
                    while "\n\n" in buffer:
                        frame, buffer = buffer.split("\n\n", 1)
                        seen += frames(frame)
                    if any(e["type"] == "TOOL_CALL_START" for _, e in seen):
                        break  # the client goes away while the tool runs: the socket is closed
        assert seen and seen[-1][1]["type"] != "RUN_FINISHED"
        GO_ON["tool"].set()  # the run goes on without its client
        async with Store.from_url(url) as other:  # reconnects to another worker, from the last id it saw
            transport = httpx.ASGITransport(app=app_on(other))
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as web:
                resumed = {"x-user": "u", "Last-Event-ID": str(seen[-1][0])}
                rest = frames((await web.get("/agent/runs/run-2", headers=resumed)).text)
        everything = seen + rest
        assert [seq for seq, _ in everything] == list(range(1, len(everything) + 1))  # each once, in order
        types = [e["type"] for _, e in everything]
        assert "TOOL_CALL_RESULT" in types and types[-1] == "RUN_FINISHED"
        assert "北京，晴" in json.dumps([e for _, e in everything], ensure_ascii=False)
    finally:
        server.should_exit = True
        await serving


async def test_cancel_stops_a_run_from_another_worker(store: Store, url: str) -> None:
    transport = httpx.ASGITransport(app=app_on(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost", headers={"x-user": "u"}) as web:
        started = asyncio.create_task(web.post("/agent", json=request("run-3", "call slow_lookup")))
        async with Store.from_url(url) as other:
            other_web = httpx.AsyncClient(transport=httpx.ASGITransport(app=app_on(other)), base_url="http://localhost")
            async with other_web:

                async def cancel() -> httpx.Response | None:  # once the run's row is there
                    answer = await other_web.post("/agent/runs/run-3/cancel", headers={"x-user": "u"})
                    return answer if answer.status_code == 200 else None

                answer = await until(cancel, "the run's row")
                assert answer.json() == {"cancelled": True}
                heard = lambda: any(w.cancel_requested for journal in JOURNALS for w in journal.live)  # noqa: E731
                await until(lambda: started.done() or heard(), "the run to hear the cancel")
                GO_ON["tool"].set()  # its tool returns: the run stops at its next event
        events = frames((await asyncio.wait_for(started, 60)).text)
    assert "RUN_FINISHED" not in [e["type"] for _, e in events]
    assert events[-1] == (-1, {"type": "RUN_ERROR", "message": "the run was cancelled", "code": "CANCELLED"})
    _, info = await store.journal().read("run-3", user_id="u")
    assert info["status"] == "cancelled"
