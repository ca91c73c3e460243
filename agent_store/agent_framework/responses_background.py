"""Background responses (issue 39): the OpenAI Responses ``background: true`` mode on the framework's own hosting
functions (``agent-framework-hosting-responses``; ``pip install "agent-store[hosting]"``), resumable from any worker.

    add_background_responses_routes(app, agent, store, path="/responses", user_of=...)

- ``POST {path}``: the package's route (``responses_to_run`` ... ``responses_from_streaming_run``) run detached,
  its stream events journaled (journal/detached.py) and its session stored through ``StoreSessionStore`` (a
  response id a point, a conversation a head: README, served conversations). With ``background: true`` it answers
  at once (``status: queued``); with ``stream: true`` it streams; else it answers with the finished response.
  The terminal ``response.completed`` is journaled only once the session is stored: a client never sees a
  completed response whose turn is not there.
- ``GET {path}/{id}?stream=true&starting_after=N``: the events whose ``sequence_number`` is after N, then live
  ones, until the response ends; without ``stream``, the response as it stands.
- ``POST {path}/{id}/cancel``: stop it, wherever it runs.

The journal's sequence numbers are the package's ``sequence_number`` plus one (it counts from 0).
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from agent_framework_hosting import AgentState
from agent_framework_hosting_responses import (
    create_response_id,
    responses_from_streaming_run,
    responses_session_id,
    responses_to_run,
)
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agent_store.agent_framework.session_store import StoreSessionStore
from agent_store.errors import InvalidValueError, StreamNotFoundError
from agent_store.journal import Journal, start_detached, uncancellable
from agent_store.store import Store

__all__ = ["add_background_responses_routes"]
_ENDED = {"cancelled": "cancelled", "failed": "failed", "incomplete": "incomplete"}
_TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
_STATUS_OF = {"response.completed": "completed", "response.failed": "failed", "response.incomplete": "incomplete"}


class ResponseNotCompleted(Exception):
    """The hosting package answered with a failed or incomplete response: the run ends failed, nothing stored."""


def _event(frame: str) -> dict[str, Any]:
    """One server-sent event of ``responses_from_streaming_run`` ("event: ...\\ndata: {...}") as its JSON."""
    data = [line[5:].strip() for line in frame.splitlines() if line.startswith("data:")]
    return dict(json.loads("".join(data)))


def _produce(agent: Any, store: Store, body: dict[str, Any], user: str | None, response_id: str) -> Callable[
    [], AsyncIterator[Any]
]:  # fmt: skip
    """The response's run, for the journal to drive: its turn stored before its ``response.completed``."""

    async def events() -> AsyncIterator[Any]:
        state = AgentState(agent, session_store=StoreSessionStore(store, user_id=user))
        run = responses_to_run(body)
        session_id, is_conversation = responses_session_id(body)
        session = await state.get_or_create_session(session_id or response_id)
        stream = (await state.get_target()).run(run["messages"], session=session, stream=True)
        held = None
        async for frame in responses_from_streaming_run(stream, response_id=response_id,
                                                        conversation_id=session_id if is_conversation else None):
            event = _event(frame)
            if event.get("type") == "response.completed":
                held = event  # sent once the turn is stored
                continue
            yield event
            if event.get("type") in ("response.failed", "response.incomplete"):  # nothing of it is stored
                raise ResponseNotCompleted(str(event["type"]))
        with uncancellable():  # a cancel now waits for the commit, and the response ends completed
            await state.set_session(session_id if is_conversation and session_id else response_id, session)
        if held is not None:
            yield held

    return events


def _sse(journal: Journal, user: str | None, response_id: str, after: int) -> StreamingResponse:
    """The response's events from ``after``, and how it ended if its worker did not say."""

    async def frames() -> AsyncIterator[str]:
        last = None
        async for item in journal.follow(response_id, user_id=user, after=after):
            last = item.event.get("type")
            yield f"event: {last}\ndata: {json.dumps(item.event, ensure_ascii=False)}\n\n"
        if last not in _TERMINAL:  # its worker died (or it failed) before its last event: the stream says so
            found = await _as_it_stands(journal, user, response_id)
            if found["status"] in ("incomplete", "failed"):
                end = {"type": f"response.{found['status']}", "response": found}
                yield f"event: {end['type']}\ndata: {json.dumps(end, ensure_ascii=False)}\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _as_it_stands(journal: Journal, user: str | None, response_id: str) -> dict[str, Any]:
    """The response as a GET answers it: the latest response object it sent, its status as the journal has it."""
    first, info = await journal.read(response_id, user_id=user, after=0, limit=1)  # response.created
    lease = info["lease_until"]
    if info["status"] == "in_progress" and lease is not None and lease < datetime.now(UTC):
        # Its worker died: once its lease has passed it reads incomplete, on GET as on the stream (which ends
        # it so too), never in_progress until the journal's TTL.
        await journal.recover(stream_id=response_id, user_id=user)
        first, info = await journal.read(response_id, user_id=user, after=0, limit=1)
    tail, _ = await journal.read(response_id, user_id=user, after=max(info["last_seq"] - 3, 1), limit=3)
    found: dict[str, Any] = {"id": response_id, "object": "response", "status": "queued", "output": []}
    for item in (*first, *tail):  # the latest response object it sent (its terminal event is its last)
        if isinstance(item.event.get("response"), dict):
            found = dict(item.event["response"])
            found.setdefault("status", _STATUS_OF.get(str(item.event.get("type")), "in_progress"))
    if info["status"] in _ENDED:
        found["status"] = _ENDED[info["status"]]
    return found


def add_background_responses_routes(
    app: FastAPI, agent: Any, store: Store, *, path: str = "/responses", user_of: Callable[[Request], str | None],
    journal: Journal | None = None,
) -> Journal:  # fmt: skip
    """Mount the routes on a FastAPI ``app`` for ``agent``; returns the journal they use (close it at shutdown)."""
    journal = journal or store.journal()

    @app.post(path)
    async def create(request: Request) -> Any:
        body, user = await request.json(), user_of(request)
        if not isinstance(body, dict):
            raise HTTPException(status_code=400, detail="the request body is a JSON object")
        response_id = create_response_id()
        try:
            task = await start_detached(journal, response_id, user_id=user, kind="responses",
                                        events=_produce(agent, store, body, user, response_id))  # fmt: skip
        except InvalidValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        if body.get("background"):
            if body.get("stream"):
                return _sse(journal, user, response_id, 0)
            return JSONResponse({"id": response_id, "object": "response", "status": "queued", "background": True})
        if body.get("stream"):
            return _sse(journal, user, response_id, 0)
        await asyncio.gather(task, return_exceptions=True)  # a failure is in the journal: the response says it
        return JSONResponse(await _as_it_stands(journal, user, response_id))

    @app.get(f"{path}/{{response_id}}")
    async def retrieve(response_id: str, request: Request, stream: bool = False, starting_after: int = -1) -> Any:
        user = user_of(request)
        if not -1 <= starting_after < 2**62:
            raise HTTPException(status_code=400, detail="starting_after must be a sequence number, from -1")
        try:
            if stream:
                await journal.read(response_id, user_id=user, limit=1)  # not found: 404 before the stream
                return _sse(journal, user, response_id, max(starting_after + 1, 0))
            return JSONResponse(await _as_it_stands(journal, user, response_id))
        except StreamNotFoundError:
            raise HTTPException(status_code=404, detail=f"no response {response_id!r}") from None
        except InvalidValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    @app.post(f"{path}/{{response_id}}/cancel")
    async def cancel(response_id: str, request: Request) -> Any:
        user = user_of(request)
        try:
            await journal.cancel(response_id, user_id=user)  # its run stops at its next event, or soon after
            return JSONResponse(await _as_it_stands(journal, user, response_id))
        except StreamNotFoundError:
            raise HTTPException(status_code=404, detail=f"no response {response_id!r}") from None
        except InvalidValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    return journal
