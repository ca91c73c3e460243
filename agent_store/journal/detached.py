"""A run that goes on without its client (issue 39): started in the background, journaled, cancellable from any
worker. The request that starts it returns at once (or follows the journal itself); any client reads the events
with ``journal.follow``, and ``journal.cancel`` stops it wherever it runs.

    task = await start_detached(journal, run_id, user_id="u1", events=lambda: produce(...))

``events`` makes the run's event stream (an agent's ``run(..., stream=True)``, mapped to what the client
reads); the run's own commit stays inside it (``store.session(...)``: one transaction at its end). Events are
kept as JSON: a dict as it is, ``to_dict()`` (the framework's updates), ``model_dump(mode="json", by_alias=True,
exclude_none=True)`` (pydantic models: AG-UI events).

A cancel is one outcome or the other, never both: the stream is stopped at its next event, which is not kept
(nothing after it is committed: the stream is closed there), or, if it sends none for ``grace_s``, the task is
cancelled where it waits, unless it is inside ``uncancellable()`` (a commit): a cancel then waits, and once the
block has committed the run ends ``completed`` whatever cancel comes (a block that raised lets the waiting cancel
go ahead). A stream that has ended ends ``completed`` too. ``Journal.close()`` stops its runs ``incomplete``, but
gives one that has committed ``grace_s`` to send its last events (then ``completed``; else ``incomplete``, its
turn stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from agent_store.errors import InvalidValueError
from agent_store.journal.facade import Journal
from agent_store.journal.writer import StreamWriter

__all__ = ["as_json", "journal_point", "start_detached", "uncancellable"]
log = logging.getLogger("agent_store.journal")
_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("agent_store_detached_run", default=None)


def as_json(event: Any) -> Any:
    """An event as the JSON document the journal keeps."""
    if isinstance(event, dict):
        return event
    if hasattr(event, "model_dump"):
        return event.model_dump(mode="json", by_alias=True, exclude_none=True)
    if hasattr(event, "to_dict"):
        return event.to_dict()
    raise InvalidValueError(f"a journal event is a dict, a pydantic model or has to_dict(), not {type(event).__name__}")


class _Run:
    def __init__(self, writer: StreamWriter, grace_s: float) -> None:
        self.writer, self.grace_s = writer, grace_s
        self.task: asyncio.Task[str] | None = None
        self.done = False  # the stream ended, or its end is being written: no cancel reaches it
        self.committed = False  # it left uncancellable() normally: its commit is done
        self.shielded = 0  # inside uncancellable()
        self.due = False  # a hard cancel waits for the shield to drop
        self.ending = "cancelled"  # what a hard cancel ends it as ("incomplete": its journal closed)

    def asked(self) -> None:  # the writer heard a cancel: the stream stops at its next event, or after grace_s
        if not self.committed:
            asyncio.get_running_loop().call_later(self.grace_s, self.hard)

    def hard(self, ending: str = "cancelled") -> None:
        """Cancel the task where it waits; inside a commit, once it is out. A cancel never reaches a run that
        has committed; a close (``incomplete``) gives it ``grace_s`` to send the rest first."""
        if self.done or self.task is None or self.task.done():
            return
        if self.committed:
            if ending == "incomplete":
                asyncio.get_running_loop().call_later(self.grace_s, self._cut, ending)
            return
        self.ending = ending
        if self.shielded:
            self.due = True
        else:
            self.task.cancel()

    def _cut(self, ending: str) -> None:
        if not self.done and self.task is not None and not self.task.done():
            self.ending = ending
            self.task.cancel()

    def shield_dropped(self, committed: bool) -> None:
        """Out of the outermost ``uncancellable()``: committed, or (it raised) a waiting cancel goes ahead, from
        the loop (the exception first reaches the run's own handler, which ends it failed)."""
        if committed:
            self.committed = True
            if self.due and self.ending == "incomplete":  # its journal is closing: the rest, within grace_s
                self.hard("incomplete")
        elif self.due:
            asyncio.get_running_loop().call_soon(self.hard, self.ending)


def journal_point() -> tuple[str, int] | None:
    """Inside a detached run: its stream id and the last sequence number its events have reached (a state saved
    now reflects those events: what came after it is in the journal after that number). Elsewhere None."""
    run = _RUN.get()
    return None if run is None else (run.writer.stream_id, run.writer.last_seq)


@contextlib.contextmanager
def uncancellable() -> Iterator[None]:
    """Around a detached run's commit: a cancel that comes meanwhile waits until it is done (then the run, which
    has committed, ends completed unless it sends more events)."""
    run = _RUN.get()
    if run is None:
        yield
        return
    run.shielded += 1
    try:
        yield
    except BaseException:  # no commit
        run.shielded -= 1
        if not run.shielded:
            run.shield_dropped(committed=False)
        raise
    run.shielded -= 1
    if not run.shielded:
        run.shield_dropped(committed=True)  # whatever cancel came or comes: the run ends completed


async def start_detached(
    journal: Journal, stream_id: str, *, user_id: str | None, events: Callable[[], AsyncIterator[Any]],
    kind: str = "updates", conversation_id: str | None = None, grace_s: float = 2.0,
    on_error: Callable[[BaseException], Any] | None = None,
) -> asyncio.Task[str]:  # fmt: skip
    """Start the run in a task of its own; it returns the run's final status ("completed" or "cancelled"; a failure
    raises). The stream's row is made before this returns (a client may follow at once). ``on_error(exc)``: the
    last event of a failed run (an AG-UI ``RUN_ERROR``, say), or None."""
    writer = await journal.start(stream_id, user_id=user_id, kind=kind, conversation_id=conversation_id)
    run = _Run(writer, grace_s)
    writer.on_cancel = run.asked
    loop = asyncio.get_running_loop()
    run.task = loop.create_task(_drive(run, events, on_error), name=f"agent_store run {stream_id}")
    journal.detached.add(run)
    run.task.add_done_callback(lambda task: _ended(journal, run, task))
    if not journal.wakeups.live:  # no NOTIFY to hear a cancel by (SQLite, PgBouncer): ask the row now and then
        watch = loop.create_task(_watch(journal, run, user_id or "", stream_id))
        run.task.add_done_callback(lambda _: watch.cancel())
    return run.task


def _ended(journal: Journal, run: _Run, task: asyncio.Task[str]) -> None:
    journal.detached.discard(run)
    if not task.cancelled() and (exc := task.exception()) is not None:  # in its journal too; said here, once
        log.error("detached run %r failed", run.writer.stream_id, exc_info=exc)


async def _watch(journal: Journal, run: _Run, user: str, stream_id: str) -> None:
    """A cancel asked on another worker, where no NOTIFY brings it: the row's flag, read every ``poll_s`` * 3."""
    while not run.done and not run.writer.cancel_requested:
        await asyncio.sleep(journal.poll_s * 3)
        if await journal.cancel_asked(stream_id, user_id=user):
            run.writer.cancel_seen()


async def _drive(run: _Run, events: Callable[[], AsyncIterator[Any]], on_error: Any) -> str:
    _RUN.set(run)
    writer, stream = run.writer, events()
    try:
        async for event in stream:
            # Looked at before the event is kept, never after: a cancel heard by now stops the run without it
            # (readers never see a RUN_FINISHED of a run that ends cancelled); one heard later, at the next event.
            if writer.cancel_requested and not run.committed:  # what it had not done is never done
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
                run.done = True  # no hard cancel may cut the end short
                await asyncio.shield(writer.finish("cancelled"))
                return "cancelled"
            await writer.append(as_json(event))
        run.done = True  # its commit is done: it ends completed, whatever cancel comes now
    except asyncio.CancelledError:
        run.done = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(writer.finish(run.ending))
        return run.ending
    except Exception as exc:  # the run failed: said in the journal, and raised to whoever awaits the task
        run.done = True
        last = on_error(exc) if on_error is not None else None
        if last is not None:
            await writer.append(as_json(last))
        await asyncio.shield(writer.finish("failed", error=type(exc).__name__))
        raise
    await asyncio.shield(writer.finish("completed"))
    return "completed"
