"""The run whose model calls a recorder made by the application records into (agent_framework/usage_recorder.py).

``store.session(...)`` makes its run's call list active for its block; a history provider makes a plain
session's pending calls active for its turn. A recorder bound to a list (a provider's own) does not look here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar, Token

from agent_framework import Message

from agent_store.db.ledger import ModelCall
from agent_store.db.message_rows import STORE_ID

_ACTIVE: ContextVar[list[ModelCall] | None] = ContextVar("agent_store_active_calls", default=None)
log = logging.getLogger("agent_store.usage")
_TOLD = False  # the warning below is given once per process


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


def say_if_unrecorded(calls: list[ModelCall], history: Sequence[Message], loaded_ids: set[str], *,
                      budgeted: bool) -> None:
    """A ``store.session`` run that adds more model answers than it recorded model calls (a plain agent, or two
    agents of which one records): say so, once per process.

    No store hook sees a plain agent's response (the framework hands it to chat middleware and to history
    providers only): without ``UsageRecorder`` in the agent's middleware, on a client that runs chat middleware
    (the framework's ``ChatMiddlewareLayer``), the ledger gets nothing and budgets never trip."""
    global _TOLD
    if _TOLD:
        return
    answers = 0
    for message in reversed(history):  # the run's new messages are its last: read only those
        if message.additional_properties.get(STORE_ID) in loaded_ids:
            break
        answers += message.role == "assistant"
    if answers <= len(calls):  # each new assistant message came from a model call: fewer calls, some unseen
        return
    _TOLD = True
    # A warning where a budget applies (it would silently not count these calls); else a note, once: a newcomer's
    # first agent, which sets no budget, runs without a warning, and the ledger's emptiness is still said.
    log.log(
        logging.WARNING if budgeted else logging.INFO,
        "agent_store: a run's model calls were not recorded in the usage ledger%s: add "
        "middleware=[UsageRecorder()] to the agent (from agent_store.agent_framework import UsageRecorder; its chat "
        "client must run chat middleware: the framework's ChatMiddlewareLayer), or use StoreHistoryProvider. Said "
        "once per process.", ", so its budgets do not count them" if budgeted else "",
    )
