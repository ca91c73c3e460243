"""OpenTelemetry spans and metrics. With no OpenTelemetry SDK configured these are the API's no-op objects."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import metrics, trace
from opentelemetry.trace import Span

_tracer = trace.get_tracer("agent_store")
_meter = metrics.get_meter("agent_store")

durations = _meter.create_histogram(
    "agent_store.operation.duration", unit="s", description="Time spent in a store operation, by operation"
)
messages_written = _meter.create_counter("agent_store.messages.written", description="Messages committed")
state_keys_written = _meter.create_counter(
    "agent_store.state_keys.written", description="State keys upserted or deleted"
)
conflicts = _meter.create_counter("agent_store.conflicts", description="Commits refused by a state conflict")
sessions_purged = _meter.create_counter("agent_store.sessions.purged", description="Expired sessions deleted")
errors = _meter.create_counter(
    "agent_store.operation.errors", description="Operations that raised, by operation and error type"
)  # the unavailable rate: error=StorageUnavailableError; budget crossings: error=BudgetExceededError


@contextmanager
def operation(name: str, **attributes: str | int) -> Iterator[Span]:
    """A span named ``agent_store.<name>`` (an exception marks it failed) plus a duration sample."""
    started = time.perf_counter()
    with _tracer.start_as_current_span(f"agent_store.{name}", attributes=attributes) as span:
        try:
            yield span
        except Exception as exc:
            errors.add(1, {"operation": name, "error": type(exc).__name__})
            raise
        finally:
            durations.record(time.perf_counter() - started, {"operation": name})
