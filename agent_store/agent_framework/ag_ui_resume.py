"""Resumable AG-UI runs (issue 39, microsoft/agent-framework#7230): a run goes on when its client disconnects, and
any worker replays what the client missed (``pip install "agent-store[ag-ui]"``).

    add_resumable_agui_routes(app, AgentFrameworkAgent(agent=agent), store, path="/agent", user_of=...)

- ``POST {path}``: an AG-UI run (the package's request body). It runs detached (journal/detached.py), its events
  journaled under the request's ``runId`` (one is made if absent); the response streams them as server-sent
  events, each with ``id: <seq>``.
- ``GET {path}/runs/{run_id}?after=N`` (or the ``Last-Event-ID`` header, which a browser's ``EventSource``
  sends when it reconnects): the run's events after N, then live ones, until it ends. From any worker.
- ``POST {path}/runs/{run_id}/cancel``: stop the run, wherever it runs.

``user_of(request)`` names the request's user (the journal's partition: another user's run is not found); it must
come from the app's authentication, never from the body. The events are the AG-UI package's own, as its endpoint
sends them (camelCase JSON).
"""

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from agent_framework_ag_ui import AGUIRequest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from agent_store.errors import InvalidValueError, StreamNotFoundError
from agent_store.journal import Journal, start_detached
from agent_store.store import Store

__all__ = ["add_resumable_agui_routes"]


def _run_error(exc: BaseException) -> dict[str, Any]:
    """A failed run's last event, as the AG-UI package's endpoint ends one (its type only: no internals)."""
    return {"type": "RUN_ERROR", "message": "the run failed", "code": type(exc).__name__}


def add_resumable_agui_routes(
    app: FastAPI, runner: Any, store: Store, *, path: str = "/", user_of: Callable[[Request], str | None],
    journal: Journal | None = None,
) -> Journal:  # fmt: skip
    """Mount the three routes on a FastAPI ``app``; ``runner``: an ``AgentFrameworkAgent`` (or anything whose
    ``run(input)`` yields AG-UI events). Returns the journal the routes use (close it at shutdown)."""
    journal = journal or store.journal()
    base = path.rstrip("/")

    def sse(user: str | None, run_id: str, after: int) -> StreamingResponse:
        async def frames() -> AsyncIterator[str]:
            async for item in journal.follow(run_id, user_id=user, after=after):
                yield f"id: {item.seq}\ndata: {json.dumps(item.event, ensure_ascii=False)}\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post(path or "/")
    async def run(body: AGUIRequest, request: Request) -> StreamingResponse:
        user = user_of(request)
        input_data = body.model_dump(exclude_none=True)
        run_id = input_data.setdefault("run_id", uuid.uuid4().hex)
        try:
            await start_detached(journal, run_id, user_id=user, kind="agui", conversation_id=body.thread_id,
                                 events=lambda: runner.run(input_data), on_error=_run_error)  # fmt: skip
        except InvalidValueError as exc:
            raise HTTPException(status_code=409 if "exists" in str(exc) else 400, detail=str(exc)) from None
        return sse(user, run_id, 0)

    @app.get(f"{base}/runs/{{run_id}}")
    async def resume(run_id: str, request: Request, after: int | None = None) -> StreamingResponse:
        user = user_of(request)
        last_seen = request.headers.get("last-event-id")
        if after is None and last_seen is not None:
            if not (last_seen.isascii() and last_seen.isdigit() and len(last_seen) <= 18):
                raise HTTPException(status_code=400, detail="Last-Event-ID must be an event's sequence number")
            after = int(last_seen)
        if after is not None and not 0 <= after < 2**62:
            raise HTTPException(status_code=400, detail="after must be an event's sequence number, from 0")
        try:
            await journal.read(run_id, user_id=user, limit=1)  # not found: 404 before the stream starts
        except StreamNotFoundError:
            raise HTTPException(status_code=404, detail=f"no run {run_id!r}") from None
        except InvalidValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        return sse(user, run_id, after or 0)

    @app.post(f"{base}/runs/{{run_id}}/cancel")
    async def cancel(run_id: str, request: Request) -> dict[str, bool]:
        try:
            return {"cancelled": await journal.cancel(run_id, user_id=user_of(request))}
        except StreamNotFoundError:
            raise HTTPException(status_code=404, detail=f"no run {run_id!r}") from None

    return journal
