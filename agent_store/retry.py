"""Retrying a run that lost a state conflict: reload the session and do the work again."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from agent_framework import AgentSession

from agent_store.errors import ConflictError, InvalidValueError

if TYPE_CHECKING:
    from agent_store.store import Store

T = TypeVar("T")


DEFAULT_ATTEMPTS = 50
MAX_DELAY = 0.25  # seconds: no single wait grows past this, however many attempts


async def retry_on_conflict(
    store: Store,
    session_id: str,
    work: Callable[[AgentSession], Awaitable[T]],
    *,
    user_id: str | None = None,
    agent_id: str | None = None,
    history_limit: int | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    base_delay: float = 0.005,
    max_delay: float = MAX_DELAY,
) -> T:
    """Run ``work(session)`` on a freshly loaded session and commit; on :class:`ConflictError`, start over.

    Each attempt loads the session again, so ``work`` sees the state the winning run committed (a counter it
    increments is never lost). ``work`` runs again on every attempt: if it calls a model, the model is called
    again. Between attempts it waits a random time up to ``min(max_delay, base_delay * 2**attempt)`` ("full
    jitter": contenders spread out instead of colliding again in step). The last attempt's ``ConflictError``
    propagates. Returns what the successful ``work`` returned.
    """
    if type(attempts) is not int or attempts < 1:
        raise InvalidValueError(f"attempts must be a positive int, not {attempts!r}")
    for attempt in range(attempts):
        run = await store.load(session_id, user_id=user_id, agent_id=agent_id, history_limit=history_limit)
        try:
            result = await work(run.session)
        except BaseException:
            await run.discard()
            raise
        try:
            await run.commit()
            return result
        except ConflictError:
            if attempt == attempts - 1:
                raise
        await asyncio.sleep(random.uniform(0, min(max_delay, base_delay * 2**attempt)))
    raise AssertionError("unreachable")
