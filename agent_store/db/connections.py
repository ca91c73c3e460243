"""Connections out of the pool and back: safe when the caller is cancelled, and after a server restart.

Cancellation (a web server cancels the request of a client that went away) must not strand a connection or
leave a transaction, and its locks, open; a pooled connection found dead (there is no pre-ping) is replaced
once, for what is safe to repeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_store.errors import StorageUnavailableError

logger = logging.getLogger("agent_store")
T = TypeVar("T")


async def quietly(action: Any, what: str) -> None:
    """Run a cleanup step whose failure must not replace an exception already on its way to the caller.

    The step runs to its end even if the caller is cancelled (again) meanwhile: a rollback cut short would leave
    a transaction, and its locks, open on a connection nobody holds. The cancellation is re-raised after.
    """
    step = asyncio.ensure_future(action())
    cancelled = False
    while not step.done():
        try:
            await asyncio.shield(step)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            break
    if not step.cancelled() and step.exception() is not None:
        logger.warning("agent_store: %s failed during cleanup", what, exc_info=step.exception())
    if cancelled:
        raise asyncio.CancelledError


async def checkout(engine: AsyncEngine) -> AsyncConnection:
    """A pooled connection. A caller cancelled while the pool hands it over does not strand it: the checkout
    finishes in the background and the connection goes straight back (SQLAlchemy's ``connect()`` alone would
    leave it checked out until garbage collection)."""
    pending = asyncio.ensure_future(engine.connect())
    try:
        return await asyncio.shield(pending)
    except asyncio.CancelledError:
        pending.add_done_callback(_give_back)
        raise


async def once_more_if_dropped(action: Callable[[], Awaitable[T]]) -> T:
    """``action()``, tried once more if it met a pooled connection found dead (a server restart: there is no
    pre-ping, and the pool has by then dropped every connection of that age). Only for what is safe to repeat."""
    try:
        return await action()
    except StorageUnavailableError as exc:
        if not exc.connection_lost:
            raise
    return await action()


def _give_back(pending: asyncio.Future[AsyncConnection]) -> None:
    if not pending.cancelled() and pending.exception() is None:
        closing = asyncio.ensure_future(quietly(pending.result().close, "returning a connection"))
        _BACKGROUND.add(closing)
        closing.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Future[None]] = set()  # give-backs in flight (the loop keeps only weak references)
