"""Runs through the store with the framework's own telemetry on, in a clean process (global OpenTelemetry
providers are set once): what the usage ledger stored, beside what the framework's token metric counted.

    python tests/usage_probe.py DB_URL

Turns: Chat Completions and Responses clients against the local fake server, streaming and not, each with a
tool loop; a chat agent whose CompactionProvider summarizes with its own client. Prints JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from agent_framework import Agent, CompactionProvider, SummarizationStrategy, tool
from agent_framework.observability import enable_instrumentation
from agent_framework.openai import OpenAIChatClient, OpenAIChatCompletionClient
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai import FakeOpenAI

from agent_store import Store
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.offline import OfflineChatClient

spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(tracer_provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
enable_instrumentation()


@tool
def weather() -> str:
    """Today's weather."""
    return "晴"


async def turns(store: Store, fake: FakeOpenAI) -> None:
    for kind in ("chat", "chat-stream", "responses", "responses-stream", "compaction"):
        if kind.startswith(("chat", "compaction")):
            client: object = OpenAIChatCompletionClient(model="test-model", api_key="k", base_url=fake.base_url)
        else:
            client = OpenAIChatClient(model="test-model", api_key="k", base_url=fake.base_url)
        provider = StoreHistoryProvider(store, user_id="u")
        providers: list[object] = [provider]
        if kind == "compaction":
            summarizer = SummarizationStrategy(client=OfflineChatClient(), target_count=2, threshold=1)
            providers.append(CompactionProvider(before_strategy=summarizer, history_source_id=provider.source_id))
        agent = Agent(client=client, name="Bot", tools=[weather], context_providers=providers)  # type: ignore[arg-type]
        for words in ("你好", "call weather please", "再说一遍"):
            async with store.session(kind, user_id="u") as session:
                if kind.endswith("stream"):
                    await agent.run(words, session=session, stream=True).get_final_response()
                else:
                    await agent.run(words, session=session)


async def main(url: str) -> None:
    fake = FakeOpenAI().start()
    try:
        async with Store.from_url(url) as store:
            await store.migrate()
            await turns(store, fake)
            async with store.engine.connect() as conn:
                ledger = (await conn.execute(text(
                    "SELECT session_id, run_id, purpose, streamed, input_tokens, output_tokens, trace_id, span_id "
                    "FROM agent_usage ORDER BY session_id, run_id, call_no"
                ))).all()  # fmt: skip
                runs = (await conn.execute(text(
                    "SELECT session_id, run_id, input_tokens, output_tokens FROM agent_runs WHERE outcome = 'committed'"
                ))).all()  # fmt: skip
    finally:
        fake.stop()
    counted = {"input": 0, "output": 0}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "gen_ai.client.token.usage":
                    for point in metric.data.data_points:
                        counted[str(point.attributes["gen_ai.token.type"])] += int(point.sum)
    traces = sorted({format(s.context.trace_id, "032x") for s in spans.get_finished_spans()})
    print(json.dumps({"metric": counted, "ledger": [list(r) for r in ledger], "runs": [list(r) for r in runs],
                      "traces": traces}))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
