"""The run whose model calls a recorder made by the application records into (agent_framework/usage_recorder.py).

``store.session(...)`` makes its run's call list active for its block; a history provider makes a plain
session's pending calls active for its turn. A recorder bound to a list (a provider's own) does not look here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

from agent_store.db.ledger import ModelCall

_ACTIVE: ContextVar[list[ModelCall] | None] = ContextVar("agent_store_active_calls", default=None)


def active_calls() -> list[ModelCall] | None:
    return _ACTIVE.get()


@contextmanager
def recording_into(calls: list[ModelCall]) -> Iterator[None]:
    """Make ``calls`` the list unbound recorders append to, for the block."""
    token = _ACTIVE.set(calls)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def start_recording(calls: list[ModelCall]) -> Token[list[ModelCall] | None]:
    """As :func:`recording_into`, for a turn that begins in one hook and ends in another (a provider's)."""
    return _ACTIVE.set(calls)


def stop_recording(token: Token[list[ModelCall] | None]) -> None:
    try:
        _ACTIVE.reset(token)
    except ValueError:  # the turn ended in another context than it began in: nothing is active there
        _ACTIVE.set(None)
