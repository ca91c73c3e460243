"""The two races at the edges of an AG-UI run (issue 57 item 5), each forced, not timed, on both backends.

- A cancel heard while the run makes its last event is one outcome: the run ends cancelled and no reader sees its
  RUN_FINISHED (the journal keeps an event only if no cancel was heard before it), never both.
- The POST that starts a run is answered only once the user's new messages are stored: a reload the moment the
  answer starts shows them (microsoft/agent-framework#7215), even when storing them is slow.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from agent_framework import Agent
from agent_framework_ag_ui import AgentFrameworkAgent, AGUIThreadSnapshot
from fastapi import FastAPI
from helpers import until
from test_agui_resume import free_port

from agent_store import Store
from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
from agent_store.agent_framework.ag_ui_resume import add_resumable_agui_routes
from agent_store.journal import Journal
from agent_store.offline import OfflineChatClient


def sse(body: str) -> list[dict[str, Any]]:
    return [json.loads(dict(line.split(": ", 1) for line in frame.splitlines())["data"])
            for frame in body.strip().split("\n\n")]  # fmt: skip


class CancelledAtTheEnd:
    """A runner whose run is cancelled (from another worker's journal) just as it makes RUN_FINISHED: the event is
    produced only once the run's own writer has heard the cancel."""

    def __init__(self, asker: Journal) -> None:
        self.asker, self.journal = asker, None  # self.journal: the routes' (set by the test)

    async def run(self, input_data: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        run_id, thread = input_data["run_id"], input_data["thread_id"]
        yield {"type": "RUN_STARTED", "threadId": thread, "runId": run_id}
        assert await self.asker.cancel(run_id, user_id="u")
        assert self.journal is not None
        runs = self.journal.detached

        def heard() -> bool:
            return any(r.writer.stream_id == run_id and r.writer.cancel_requested for r in runs)

        await until(heard, "the run's writer to hear the cancel")
        yield {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id}


async def test_a_cancel_heard_at_the_last_event_is_one_outcome(store: Store, url: str) -> None:
    async with Store.from_url(url) as other:  # the cancel comes from another worker
        asker = other.journal()
        runner = CancelledAtTheEnd(asker)
        app = FastAPI()
        runner.journal = add_resumable_agui_routes(app, runner, store, path="/agent",
                                                   user_of=lambda r: r.headers.get("x-user"))  # fmt: skip
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t", headers={"x-user": "u"}) as web:
                body = (await web.post("/agent", json={"threadId": "t1", "runId": "r1", "messages": []})).text
            events, info = await asker.read("r1", user_id="u")
        finally:
            await runner.journal.close()
            await asker.close()
    kept = [item.event["type"] for item in events]
    streamed = [event["type"] for event in sse(body)]
    assert info["status"] == "cancelled" and "RUN_FINISHED" not in kept, (info["status"], kept)
    assert streamed == ["RUN_STARTED", "RUN_ERROR"] and sse(body)[-1]["code"] == "CANCELLED"


class SlowToStore(StoreThreadSnapshotStore):
    """Storing a run's new user messages waits until a reload has been answered, or 5 s: the window in which a
    200 sent before they are stored would show a reload the conversation without them."""

    reloaded: asyncio.Event

    async def save(self, *, scope: str, thread_id: str, snapshot: AGUIThreadSnapshot, **kwargs: Any) -> None:
        if kwargs.get("pending"):
            try:
                await asyncio.wait_for(self.reloaded.wait(), 5)
            except TimeoutError:  # none came: the POST waits for this save, as it must
                pass
        await super().save(scope=scope, thread_id=thread_id, snapshot=snapshot, **kwargs)


async def test_a_reload_at_the_moment_the_run_is_answered_shows_the_users_message(store: Store) -> None:
    snapshots = SlowToStore(store)
    snapshots.reloaded = asyncio.Event()
    runner = AgentFrameworkAgent(agent=Agent(client=OfflineChatClient(), name="A"), snapshot_store=snapshots)
    app = FastAPI()
    journal = add_resumable_agui_routes(app, runner, store, path="/agent", user_of=lambda r: r.headers.get("x-user"))
    turn = {"threadId": "t2", "runId": "r2", "messages": [{"id": "m1", "role": "user", "content": "批准，开始吧"}]}
    port = free_port()  # a real server: the answer's head reaches the client before its body (ASGITransport waits)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or serving.done(), "the server to listen")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"x-user": "u"}, timeout=60) as web:
            async with web.stream("POST", "/agent", json=turn) as answer:
                assert answer.status_code == 200
                reload = await web.post("/agent", json={"threadId": "t2", "runId": "reload", "messages": []})
                snapshotsent = [e for e in sse(reload.text) if e["type"] == "MESSAGES_SNAPSHOT"]
                snapshots.reloaded.set()
                await answer.aread()
    finally:
        server.should_exit = True
        await serving
        await journal.close()
    shown = [m.get("content") for e in snapshotsent for m in e["messages"]]
    assert "批准，开始吧" in shown, shown
