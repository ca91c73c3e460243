"""UsageRecorder: chat middleware that puts each model call in the usage ledger of the store run it belongs to.

Chat middleware runs once per model call, inside the framework's tool loop (``FunctionInvocationLayer`` calls
the ``ChatMiddlewareLayer`` once per step), streaming or not: the one place every call's own usage appears.

- ``StoreHistoryProvider`` and ``MemoryProvider`` add a recorder bound to their run to every turn: the agent's
  calls are recorded with nothing to configure.
- A recorder made by the application (``UsageRecorder()`` in an agent's ``middleware``, or on a client) records
  into the run active in its context: a ``store.session(...)`` block, or a provider's turn. It records only
  calls no bound recorder saw, so one call is never recorded twice.
- The providers also give a summarizing compaction's client (``SummarizationStrategy(client=...)``) a recorder
  with ``purpose="compaction"``: the summarizer's calls belong to the conversation too.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from time import perf_counter
from types import FrameType
from typing import Any
from weakref import WeakKeyDictionary

from agent_framework import AgentSession, ChatContext, ChatMiddleware, ChatResponse, ResponseStream, SessionContext
from opentelemetry import trace

from agent_store.db.ledger import PURPOSES, ModelCall, is_count
from agent_store.errors import InvalidValueError
from agent_store.run.commit import run_of
from agent_store.run.recording import active_calls, start_recording, stop_recording

__all__ = ["UsageRecorder", "begin_turn", "pending_calls", "record_usage"]
_RECORDED = "agent_store.usage_recorded"  # in ChatContext.metadata: a recorder has taken this call
_TURN_ENDED = "agent_store.usage_turn_ended"  # in SessionContext.metadata: the turn's usage is settled
# In a turn's SessionContext.metadata: its bound recorder, and (a plain session) the active-calls token.
_TURN = "agent_store.usage_turn"
# A plain session's calls (no store run holds it): the history provider's next save commits them.
_PENDING: WeakKeyDictionary[AgentSession, list[ModelCall]] = WeakKeyDictionary()


class UsageRecorder(ChatMiddleware):
    """Chat middleware: each model call's usage, model, latency, finish reason and trace, into the usage ledger.

    Args:
        purpose: what the calls are for: ``"chat"`` (the agent's) or ``"compaction"`` (a summarizer's).
        agent_name: the agent the calls are made for (default: the run's ``agent_id``).
        calls: the list to record into (a provider's run); default: the run active in the caller's context.
    """

    def __init__(
        self, *, purpose: str = "chat", agent_name: str | None = None, calls: list[ModelCall] | None = None
    ) -> None:
        if purpose not in PURPOSES:
            raise InvalidValueError(f"purpose must be one of {', '.join(PURPOSES)}, not {purpose!r}")
        self.purpose, self.agent_name, self.calls = purpose, agent_name, calls
        self.recorded = 0  # calls this recorder put in a ledger

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        bound = self.calls is not None
        if bound:
            if context.metadata.get(_RECORDED):  # another bound recorder (two providers) has it
                await call_next()
                return
            context.metadata[_RECORDED] = True
        began, started = datetime.now(UTC), perf_counter()
        span = trace.get_current_span().get_span_context()
        ids = (format(span.trace_id, "032x"), format(span.span_id, "016x")) if span.is_valid else (None, None)
        # What the record needs, taken now: a stream's result hook that held the context would make a cycle
        # (context -> its result, the stream -> the hook -> the context).
        metadata, streamed = context.metadata, context.stream
        asked = _text((context.options or {}).get("model"))
        provider = _text(getattr(context.client, "otel_provider_name", None))

        def record(response: ChatResponse[Any]) -> None:
            calls = self.calls if bound else active_calls()
            if calls is None or (not bound and metadata.get(_RECORDED)):
                return  # no run to record into, or a recorder inside this one took the call
            metadata[_RECORDED] = True
            self.recorded += 1
            reason = response.finish_reason
            calls.append(ModelCall(
                called_at=began, usage=dict(response.usage_details or {}), purpose=self.purpose,
                model=_text(response.model) or asked, provider=provider, agent_name=self.agent_name,
                latency_ms=(perf_counter() - started) * 1000, finish_reason=_text(getattr(reason, "value", reason)),
                streamed=streamed, trace_id=ids[0], span_id=ids[1],
            ))  # fmt: skip

        await call_next()
        _release_pipeline(sys._getframe(1))
        if isinstance(context.result, ResponseStream):
            context.result.with_result_hook(record)  # when the stream is finished
        elif isinstance(context.result, ChatResponse):
            record(context.result)


def _release_pipeline(caller: FrameType) -> None:
    """Let the call's objects go by reference counting, not at the collector's next full pass.

    The framework's chat pipeline (``ChatMiddlewarePipeline.execute``) builds each call's handlers with a local
    ``create_next_handler`` that refers to itself: a reference cycle, which holds the call's ``ChatContext`` and
    with it the session and its whole history until the garbage collector runs. When this middleware is the
    pipeline's first (``index`` 0 in the framework's ``current_handler`` that called it), nothing calls into the
    pipeline after its call returns, so emptying that self-reference ends the cycle. Anything else, or another
    shape of the framework's code: nothing is touched (the collector frees the cycle, as without the store).
    tests/test_garbage.py fails if this stops working.
    """
    if caller.f_code.co_name != "current_handler" or caller.f_locals.get("index") != 0:
        return
    make = caller.f_locals.get("create_next_handler")
    code, closure = getattr(make, "__code__", None), getattr(make, "__closure__", None)
    if code is None or closure is None or "create_next_handler" not in code.co_freevars:
        return
    closure[code.co_freevars.index("create_next_handler")].cell_contents = None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def record_summarizers(agent: Any) -> None:
    """Give each summarizing compaction's client of ``agent`` a recorder (``purpose="compaction"``), once."""
    for client in _summarizer_clients(agent):
        middleware = getattr(client, "chat_middleware", None)
        if isinstance(middleware, list) and not any(isinstance(m, UsageRecorder) for m in middleware):
            middleware.insert(0, UsageRecorder(purpose="compaction"))
            client._cached_chat_middleware_pipeline = None  # the client caches its pipeline


def _summarizer_clients(agent: Any) -> list[Any]:
    found: list[Any] = []
    seen: set[int] = set()

    def walk(strategy: Any) -> None:
        if strategy is None or id(strategy) in seen:
            return
        seen.add(id(strategy))
        if (client := getattr(strategy, "client", None)) is not None and hasattr(strategy, "prompt"):
            found.append(client)  # a SummarizationStrategy (its client and its prompt)
        for inner in getattr(strategy, "strategies", None) or ():
            walk(inner)
        walk(getattr(strategy, "before_strategy", None))
        walk(getattr(strategy, "after_strategy", None))

    walk(getattr(agent, "compaction_strategy", None))
    for provider in getattr(agent, "context_providers", None) or ():
        walk(provider)
    return found


def begin_turn(agent: Any, session: AgentSession, context: SessionContext, source_id: str) -> None:
    """A store provider's ``before_run``: record this turn's calls (once, whichever of the store's providers
    comes first), into the session's run, or for a plain session into the calls its next save commits. The
    turn's recorder is kept in its own SessionContext: two agents' turns on one session do not mix."""
    if _TURN in context.metadata:
        return
    run = run_of(session)
    calls = run.calls if run is not None else _PENDING.setdefault(session, [])
    recorder = UsageRecorder(agent_name=_text(getattr(agent, "name", None)), calls=calls)
    context.extend_middleware(source_id, [recorder])
    context.metadata[_TURN] = (recorder, start_recording(calls) if run is None else None)
    record_summarizers(agent)


def record_usage(session: AgentSession, context: SessionContext) -> None:
    """A store provider's ``after_run``: end the turn (once). If no call was recorded (a client without the chat
    middleware layer, or a turn whose providers' before_run the framework skipped), the response's total usage
    is recorded instead (purpose "response")."""
    if context.metadata.get(_TURN_ENDED):  # another of the store's providers ended it
        return
    context.metadata[_TURN_ENDED] = True
    recorder, token = context.metadata.pop(_TURN, (None, None))
    if token is not None:
        stop_recording(token)
    usage = context.response.usage_details if context.response is not None else None
    if (recorder is not None and recorder.recorded) or not usage or not any(is_count(v) for v in usage.values()):
        return
    total = ModelCall(called_at=datetime.now(UTC), usage=dict(usage), purpose="response")
    run = run_of(session)
    (run.calls if run is not None else _PENDING.setdefault(session, [])).append(total)


def pending_calls(session: AgentSession | None) -> list[ModelCall]:
    """Take a plain session's recorded calls, for the commit of its save."""
    calls = _PENDING.get(session) if session is not None else None
    if not calls:
        return []
    taken = calls[:]
    calls.clear()  # in place: the turn's recorder still appends to this list
    return taken
