"""OpenTelemetry spans and metrics, observed with the real SDK in a clean process (global providers are set once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import asyncio, json, sys
from datetime import UTC, datetime, timedelta
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text

from agent_store import ConflictError, Store

spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
if sys.argv[2] == "sdk":
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


async def main() -> None:
    async with Store.from_url(sys.argv[1]) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state.update(a=1, b=2)
        first, second = await store.load("s", user_id="u"), await store.load("s", user_id="u")
        first.session.state["a"] = second.session.state["a"] = 3
        await first.commit()
        try:
            await second.commit()
        except ConflictError:
            pass
        async with store.engine.begin() as conn:
            past = datetime.now(UTC) - timedelta(1)
            await conn.execute(text("UPDATE agent_sessions SET expires_at = :t"), {"t": past})
        await store.purge_expired()
    data = reader.get_metrics_data() if sys.argv[2] == "sdk" else None
    figures = {}
    for rm in (data.resource_metrics if data else []):
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    key = metric.name + "|" + ",".join(f"{k}={v}" for k, v in sorted(point.attributes.items()))
                    figures[key] = getattr(point, "value", None) if hasattr(point, "value") else point.count
    finished = spans.get_finished_spans()
    commits = [dict(s.attributes) for s in finished if s.name.endswith("commit")]
    print(json.dumps({"spans": [s.name for s in finished], "metrics": figures, "attributes": commits}))


asyncio.run(main())
"""


def probe(url: str, tmp_path: Path, mode: str) -> dict[str, object]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), url, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_spans_and_metrics_for_load_commit_conflict_and_purge(url: str, tmp_path: Path) -> None:
    seen = probe(url, tmp_path, "sdk")
    spans = seen["spans"]
    assert isinstance(spans, list)
    assert spans.count("agent_store.load") == 3 and spans.count("agent_store.commit") == 3
    assert spans.count("agent_store.purge") == 1
    metrics = seen["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["agent_store.conflicts|"] == 1
    assert metrics["agent_store.operation.errors|error=ConflictError,operation=commit"] == 1  # by type: alertable
    assert metrics["agent_store.state_keys.written|"] == 3  # a and b, then a
    assert metrics["agent_store.sessions.purged|"] == 1
    assert metrics["agent_store.operation.duration|operation=commit"] == 3
    assert {"session_id": "s", "messages": 0, "state_keys": 2} in seen["attributes"]  # type: ignore[operator]


def test_without_an_sdk_nothing_is_recorded(url: str, tmp_path: Path) -> None:
    seen = probe(url, tmp_path, "none")
    assert seen["spans"] == [] and seen["metrics"] == {}
