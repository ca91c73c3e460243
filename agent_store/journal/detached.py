"""A run that goes on without its client (issue 39): started in the background, journaled, cancellable from any
worker. The request that starts it returns at once (or follows the journal itself); any client reads the events
with ``journal.follow``, and ``journal.cancel`` stops it wherever it runs.

    task = await start_detached(journal, run_id, user_id="u1", events=lambda: produce(...))

``events`` makes the run's event stream (an agent's ``run(..., stream=True)``, mapped to what the client
reads); the run's own commit stays inside it (``store.session(...)``: one transaction at its end, nothing if
it is cancelled or fails). Events are kept as JSON: a dict as it is, ``to_dict()`` (the framework's updates),
``model_dump(mode="json", by_alias=True, exclude_none=True)`` (pydantic models: AG-UI events).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from agent_store.errors import InvalidValueError
from agent_store.journal.facade import Journal
from agent_store.journal.writer import StreamWriter

__all__ = ["as_json", "start_detached"]


def as_json(event: Any) -> Any:
    """An event as the JSON document the journal keeps."""
    if isinstance(event, dict):
        return event
    if hasattr(event, "model_dump"):
        return event.model_dump(mode="json", by_alias=True, exclude_none=True)
    if hasattr(event, "to_dict"):
        return event.to_dict()
    raise InvalidValueError(f"a journal event is a dict, a pydantic model or has to_dict(), not {type(event).__name__}")


async def start_detached(
    journal: Journal, stream_id: str, *, user_id: str | None, events: Callable[[], AsyncIterator[Any]],
    kind: str = "updates", conversation_id: str | None = None,
) -> asyncio.Task[str]:  # fmt: skip
    """Start the run in a task of its own; it returns the run's final status. The stream's row is made before
    this returns (a client may follow at once); a cancel asked anywhere cancels the task at the writer's next
    batch or heartbeat."""
    writer = await journal.start(stream_id, user_id=user_id, kind=kind, conversation_id=conversation_id)
    task = asyncio.get_running_loop().create_task(_drive(writer, events), name=f"agent_store run {stream_id}")
    writer.on_cancel = task.cancel
    return task


async def _drive(writer: StreamWriter, events: Callable[[], AsyncIterator[Any]]) -> str:
    stream = events()
    try:
        async for event in stream:
            await writer.append(as_json(event))
    except asyncio.CancelledError:
        await asyncio.shield(writer.finish("cancelled"))
        return "cancelled"
    except Exception as exc:  # the run failed: said in the journal, and raised to whoever awaits the task
        await writer.finish("failed", error=type(exc).__name__)
        raise
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    await writer.finish("completed")
    return "completed"
