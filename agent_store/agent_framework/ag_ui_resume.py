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
come from the app's authentication, never from the body. It is also the thread snapshots' scope. The events are
the AG-UI package's own, as its endpoint sends them (camelCase JSON).

No rollback on a reload (microsoft/agent-framework#7215), with a ``StoreThreadSnapshotStore`` on the runner:
- a run keeps the user's new messages in the thread's row as it starts, before the POST is answered (nothing they
  said is lost if the worker dies next, and a reload at once shows them; the snapshot itself is left for the
  package), and the package saves the snapshot at each step
  boundary (a tool result, an approval request) and at the end; each save records how far the run's journal had
  come (ag_ui.py);
- a reload is the package's hydration request (a POST with no messages): answered here, not run, with the stored
  snapshot (and those messages) and, before its ``RUN_FINISHED``, a ``CUSTOM`` event
  ``agent_store.run_in_progress`` whose value ``{"runId", "after"}`` names the thread's run still going and the
  sequence number the snapshot reflects: the client reads ``GET {path}/runs/{runId}?after=...`` and gets every
  event since, once.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from agent_framework_ag_ui import AgentFrameworkWorkflow, AGUIRequest, AGUIThreadSnapshot
from agent_framework_ag_ui._approval_state import _APPROVAL_SCOPE_INPUT_KEY  # the package's endpoint sets both
from agent_framework_ag_ui._run_common import _is_snapshot_hydration_request
from agent_framework_ag_ui._snapshots import _SNAPSHOT_SCOPE_INPUT_KEY
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from agent_store.agent_framework.ag_ui import RunMark, StoreThreadSnapshotStore, served_marks
from agent_store.errors import InvalidValueError, StreamBusyError, StreamNotFoundError
from agent_store.journal import Journal, as_json, start_detached
from agent_store.store import Store

__all__ = ["add_resumable_agui_routes"]


def _run_error(exc: BaseException) -> dict[str, Any]:
    """A failed run's last event, as the AG-UI package's endpoint ends one (its type only: no internals)."""
    return {"type": "RUN_ERROR", "message": "the run failed", "code": type(exc).__name__}


LIVE_EVENT = "agent_store.run_in_progress"
_UNENDED = {"cancelled": ("CANCELLED", "the run was cancelled"),
            "incomplete": ("INCOMPLETE", "the run stopped before it ended (its worker went away)")}  # fmt: skip


async def _unended(journal: Journal, user: str | None, run_id: str) -> dict[str, Any] | None:
    """A run that was cancelled or cut off sent no RUN_FINISHED / RUN_ERROR: the AG-UI end its client needs."""
    _, info = await journal.read(run_id, user_id=user, limit=1)
    if info["status"] not in _UNENDED:
        return None
    last, _ = await journal.read(run_id, user_id=user, after=max(info["last_seq"] - 1, 0), limit=1)
    if last and last[-1].event.get("type") in ("RUN_FINISHED", "RUN_ERROR"):
        return None
    code, message = _UNENDED[info["status"]]
    return {"type": "RUN_ERROR", "message": message, "code": code}


async def _start_saved(snapshots: StoreThreadSnapshotStore, scope: str, thread_id: str, messages: Any) -> None:
    """As the run starts (inside it: the save marks the journal at 0), the request's new user messages (text,
    with an id, not stored yet) go into the thread's row beside its snapshot, which is left as it is: the
    package's merge of the next request reads what it would have read, and a reload shows them (``hydrated``)."""
    stored = await snapshots.get(scope=scope, thread_id=thread_id)
    known = {m.get("id") for m in stored.messages} if stored is not None else set()
    new = [m for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"
           and isinstance(m.get("id"), str) and isinstance(m.get("content"), str) and m["id"] not in known]  # fmt: skip
    if new:
        pending = [{"id": m["id"], "role": "user", "content": m["content"]} for m in new]
        await snapshots.save(scope=scope, thread_id=thread_id, snapshot=stored or AGUIThreadSnapshot(messages=[]),
                             pending=pending)  # fmt: skip


def _with_pending(document: dict[str, Any], pending: list[dict[str, Any]]) -> dict[str, Any]:
    """A hydration's MESSAGES_SNAPSHOT with the run's new user messages its snapshot does not hold yet."""
    shown = list(document.get("messages") or [])
    ids = {m.get("id") for m in shown if isinstance(m, dict)}
    return {**document, "messages": shown + [m for m in pending if m["id"] not in ids]}


async def _live_note(journal: Journal, user: str | None, thread_id: str, mark: RunMark | None) -> Any:
    """The ``CUSTOM`` event naming the thread's run still going and where the served snapshot left it, or None."""
    if mark is not None:
        try:
            after, info = await journal.read(mark[0], user_id=user, after=mark[1], limit=2)
        except StreamNotFoundError:  # purged, or another's: the snapshot is all there is
            after, info = [], None
        # An ended run whose snapshot was read before its last save (or that failed after it) has events the
        # snapshot lacks; one whose last save was read has only its RUN_FINISHED left, nothing to show.
        only_finish = len(after) == 1 and after[0].event.get("type") == "RUN_FINISHED"
        if info is not None and (info["status"] == "in_progress" or (after and not only_finish)):
            return {"type": "CUSTOM", "name": LIVE_EVENT, "value": {"runId": mark[0], "after": mark[1]}}
    live = await journal.live_run(thread_id, user_id=user, kind="agui")
    if live is None or (mark is not None and live == mark[0]):
        return None
    return {"type": "CUSTOM", "name": LIVE_EVENT, "value": {"runId": live, "after": 0}}  # none of it in the snapshot


def _sse(journal: Journal, user: str | None, run_id: str, after: int) -> StreamingResponse:
    """The run's events from ``after``, and how it ended if its worker did not say."""

    async def frames() -> AsyncIterator[str]:
        async for item in journal.follow(run_id, user_id=user, after=after):
            yield f"id: {item.seq}\ndata: {json.dumps(item.event, ensure_ascii=False)}\n\n"
        if (end := await _unended(journal, user, run_id)) is not None:  # no id: not one of the run's events
            yield f"data: {json.dumps(end, ensure_ascii=False)}\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _hydrated(runner: Any, journal: Journal, user: str | None, input_data: dict[str, Any]) -> StreamingResponse:
    """A reload: the stored snapshot (the package's hydration, not a run: nothing journaled), and the run
    still going on the thread, if any, with where the snapshot left it."""

    async def frames() -> AsyncIterator[str]:
        shown = False
        with served_marks() as marks:
            async for event in runner.run(input_data):
                document = as_json(event)
                thread = document.get("threadId") or input_data.get("thread_id") or ""
                mark = marks.get((user or "", thread))
                if document.get("type") == "MESSAGES_SNAPSHOT":
                    shown, document = True, _with_pending(document, mark[2] if mark else [])
                if document.get("type") == "RUN_FINISHED":
                    pending = mark[2] if mark else []
                    extra = [_with_pending({"type": "MESSAGES_SNAPSHOT"}, pending)] if pending and not shown else []
                    note = await _live_note(journal, user, thread, mark)
                    for more in [*extra, *([note] if note is not None else [])]:
                        yield f"data: {json.dumps(more, ensure_ascii=False)}\n\n"
                yield f"data: {json.dumps(document, ensure_ascii=False)}\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def add_resumable_agui_routes(
    app: FastAPI, runner: Any, store: Store, *, path: str = "/", user_of: Callable[[Request], str | None],
    journal: Journal | None = None,
) -> Journal:  # fmt: skip
    """Mount the three routes on a FastAPI ``app``; ``runner``: an ``AgentFrameworkAgent`` (or anything whose
    ``run(input)`` yields AG-UI events). Returns the journal the routes use (close it at shutdown)."""
    journal = journal or store.journal()
    base = path.rstrip("/")
    snapshots = getattr(runner, "snapshot_store", None)
    marked = snapshots if isinstance(snapshots, StoreThreadSnapshotStore) else None

    @app.post(path or "/")
    async def run(body: AGUIRequest, request: Request) -> StreamingResponse:
        user = user_of(request)
        input_data = body.model_dump(exclude_none=True)
        if user:  # the snapshots' scope is the user (as the package's endpoint sets it from its resolver)
            input_data[_SNAPSHOT_SCOPE_INPUT_KEY] = input_data[_APPROVAL_SCOPE_INPUT_KEY] = user
        if snapshots is not None and user and _is_snapshot_hydration_request(
            input_data, snapshot_enabled=True, supports_checkpoint_resume=isinstance(runner, AgentFrameworkWorkflow)
        ):
            return _hydrated(runner, journal, user, input_data)
        run_id = input_data.setdefault("run_id", uuid.uuid4().hex)
        saved = asyncio.Event()

        async def events() -> AsyncIterator[Any]:
            try:
                if marked is not None and user and body.thread_id:
                    await _start_saved(marked, user, body.thread_id, input_data.get("messages"))
            finally:
                saved.set()
            async for event in runner.run(input_data):
                yield event

        try:
            task = await start_detached(journal, run_id, user_id=user, kind="agui", conversation_id=body.thread_id,
                                        events=events, on_error=_run_error)  # fmt: skip
        except StreamBusyError as exc:  # its id is used, or its thread has a run in progress (which to follow)
            raise HTTPException(status_code=409, detail={"message": str(exc), "runId": exc.live_stream_id}) from None
        except InvalidValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        # Answered once the user's new messages are stored (inside the run, so their mark names it): a reload the
        # moment this returns shows them (#7215). A run that fails first says so in its stream.
        stored = asyncio.ensure_future(saved.wait())
        await asyncio.wait({stored, task}, return_when=asyncio.FIRST_COMPLETED)
        stored.cancel()
        return _sse(journal, user, run_id, 0)

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
        return _sse(journal, user, run_id, after or 0)

    @app.post(f"{base}/runs/{{run_id}}/cancel")
    async def cancel(run_id: str, request: Request) -> dict[str, bool]:
        try:
            return {"cancelled": await journal.cancel(run_id, user_id=user_of(request))}
        except StreamNotFoundError:
            raise HTTPException(status_code=404, detail=f"no run {run_id!r}") from None
        except InvalidValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    return journal
