"""No rollback on a reload (issue 39 point 4, microsoft/agent-framework#7215), on both backends.

The case from #7215: a user approves a plan, the run that carries it out takes minutes, and the user reloads the
page on the way. Here the reload goes to another worker (another Store, another app) while the run is still going,
first before its first step is done, then after it: the snapshot it is given shows the approval message (and then
the step's result), and the note before its RUN_FINISHED names the live run and the sequence number the snapshot
reflects; reading the run from there gives every later event exactly once. Real AG-UI runner, real Agent, the
offline client (its answer held back by a test gate), real StoreThreadSnapshotStore."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
from agent_framework import Agent, Message, tool
from agent_framework_ag_ui import AgentFrameworkAgent
from fastapi import FastAPI
from helpers import until

from agent_store import Store
from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
from agent_store.agent_framework.ag_ui_resume import LIVE_EVENT, add_resumable_agui_routes
from agent_store.journal import Journal
from agent_store.journal.listen import channel_key
from agent_store.offline import OfflineChatClient

GATES: dict[str, asyncio.Event] = {}
JOURNALS: dict[int, Journal] = {}  # each app's journal, by id(store)
APPROVAL = "计划可以，开始执行吧：call execute_plan"


@tool
async def execute_plan() -> str:
    """Carry out the approved plan (a long step: it waits for the test's gate)."""
    await GATES["step"].wait()
    return "第一步完成：机票已订"


class HeldModel(OfflineChatClient):
    """The offline client, whose answer after a tool result waits for the test's gate (a long model call)."""

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        if not (stream and messages and messages[-1].role == "tool"):
            return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)
        reply = self._reply(messages, options)

        async def later() -> AsyncIterator[Any]:
            await GATES["answer"].wait()
            async for update in self._stream(reply):
                yield update

        return self._build_response_stream(later())


def app_on(store: Store) -> FastAPI:
    agent = Agent(client=HeldModel(), name="Planner", tools=[execute_plan])
    runner = AgentFrameworkAgent(agent=agent, snapshot_store=StoreThreadSnapshotStore(store))
    app = FastAPI()
    JOURNALS[id(store)] = add_resumable_agui_routes(app, runner, store, path="/agent",
                                                    user_of=lambda r: r.headers.get("x-user"))  # fmt: skip
    return app


def sse(body: str) -> list[tuple[int | None, dict[str, Any]]]:
    out: list[tuple[int | None, dict[str, Any]]] = []
    for frame in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((int(lines["id"]) if "id" in lines else None, json.loads(lines["data"])))
    return out


def turn(run_id: str, message_id: str, text: str) -> dict[str, Any]:
    return {"threadId": "plan-thread", "runId": run_id,
            "messages": [{"id": message_id, "role": "user", "content": text}]}  # fmt: skip


async def reload(web: httpx.AsyncClient, user: str = "ann") -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A reload: the hydration request (no messages). The snapshot's messages and the live-run note, if any."""
    events = [e for _, e in sse((await web.post("/agent", json={"threadId": "plan-thread", "messages": []},
                                                headers={"x-user": user})).text)]  # fmt: skip
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    shown = next((e["messages"] for e in events if e["type"] == "MESSAGES_SNAPSHOT"), [])
    notes = [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == LIVE_EVENT]
    assert len(notes) <= 1 and (not notes or events[-2]["type"] == "CUSTOM")  # just before RUN_FINISHED
    return shown, notes[0] if notes else None


async def test_a_reload_mid_run_shows_the_approval_and_resumes_the_rest_once(store: Store, url: str) -> None:
    GATES.update(step=asyncio.Event(), answer=asyncio.Event())
    first = httpx.AsyncClient(transport=httpx.ASGITransport(app=app_on(store)), base_url="http://t",
                              headers={"x-user": "ann"})  # fmt: skip
    async with first, Store.from_url(url) as other:
        planned = sse((await first.post("/agent", json=turn("plan", "u1", "帮我订去北京的机票"))).text)
        assert planned[-1][1]["type"] == "RUN_FINISHED"
        carrying_out = asyncio.create_task(first.post("/agent", json=turn("execute", "u2", APPROVAL)))
        snapshots = StoreThreadSnapshotStore(other)

        async def tool_running() -> bool:  # the run is in its long step (its start was saved before its events)
            if await other.journal().live_run("plan-thread", user_id="ann") != "execute":
                return False
            events, _ = await other.journal().read("execute", user_id="ann")
            return any(e.event.get("type") == "TOOL_CALL_START" for e in events)

        await until(tool_running, "the run to start")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_on(other)), base_url="http://t") as web:
            # Before the first step is done: the approval is there, and the whole run is to be read.
            shown, note = await reload(web)
            assert [m["content"] for m in shown if m["role"] == "user"] == ["帮我订去北京的机票", APPROVAL]
            assert note == {"runId": "execute", "after": 0}
            GATES["step"].set()

            async def step_saved() -> bool:
                saved = await snapshots.get(scope="ann", thread_id="plan-thread")
                return saved is not None and any(m["role"] == "tool" for m in saved.messages)

            await until(step_saved, "the step boundary's snapshot")
            shown, note = await reload(web)  # the step's result is shown; the run goes on
            assert [m["role"] for m in shown][-3:] == ["user", "assistant", "tool"]
            assert shown[-1]["content"] == "第一步完成：机票已订" and APPROVAL in json.dumps(shown, ensure_ascii=False)
            assert note is not None and note["runId"] == "execute" and note["after"] > 0
            assert (await reload(web, user="mallory")) == ([], None)  # another user: no thread, no run
            rest = asyncio.create_task(web.get("/agent/runs/execute", params={"after": note["after"]},
                                               headers={"x-user": "ann"}))  # fmt: skip
            following = JOURNALS[id(other)].wakeups.waiting
            await until(lambda: rest.done() or following.get(channel_key("ann", "execute")), "the rest's reader")
            GATES["answer"].set()
            resumed = sse((await asyncio.wait_for(rest, 30)).text)
            whole = sse((await asyncio.wait_for(carrying_out, 30)).text)
            shown_after, note_after = await reload(web)
    # What the reloaded client has: the events the snapshot reflects, then the rest, each once, in order.
    assert [seq for seq, _ in resumed] == list(range(note["after"] + 1, len(whole) + 1))
    assert [e for _, e in resumed] == [e for _, e in whole][note["after"]:]
    before = [e["type"] for _, e in whole][: note["after"]]
    assert "TOOL_CALL_RESULT" in before and "TOOL_CALL_RESULT" not in [e["type"] for _, e in resumed]
    assert [e["type"] for _, e in resumed][-1] == "RUN_FINISHED"
    assert "工具结果：第一步完成：机票已订" in "".join(e.get("delta", "") for _, e in resumed)
    # Once it is over: the final conversation, each message once, and no note (nothing left to read).
    assert note_after is None
    assert [m["content"] for m in shown_after if m["role"] == "user"] == ["帮我订去北京的机票", APPROVAL]
    assert shown_after[-1] == {**shown_after[-1], "role": "assistant", "content": "工具结果：第一步完成：机票已订"}
    async with store.db.transaction(write=False, doing="test") as conn:
        from sqlalchemy import text

        kinds = (await conn.execute(text("SELECT stream_id, status FROM agent_streams ORDER BY stream_id"))).all()
    assert [tuple(k) for k in kinds] == [("execute", "completed"), ("plan", "completed")]  # reloads are not runs
