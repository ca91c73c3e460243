"""A worker running one detached run with per-service-call persistence, to be SIGKILLed mid-run
(tests/test_detached_runs.py).

``python tests/detached_worker.py URL WORKER STREAM SESSION``: the run asks for a tool; the tool finishes and
prints "tool done"; the model call its result goes to never answers (it prints "model waiting" and waits)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from agent_framework import Agent, AgentSession, Message, tool

from agent_store import Store
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.journal import start_detached
from agent_store.offline import OfflineChatClient


@tool
async def book_flight() -> str:
    """Book the flight (a step whose work must not be lost)."""
    print("tool done", flush=True)
    return "CA1501 已订"


class StallsAfterTools(OfflineChatClient):
    """The model service hangs on the call that carries a tool's result (the worker is killed there)."""

    def _inner_get_response(self, *, messages: Sequence[Message], options: Mapping[str, Any], **kwargs: Any) -> Any:
        if messages and messages[-1].role == "tool":
            print("model waiting", flush=True)

            async def never() -> AsyncIterator[Any]:
                await asyncio.Event().wait()
                yield  # never reached: an update stream that never sends one

            return self._build_response_stream(never())
        return super()._inner_get_response(messages=messages, options=options, **kwargs)


async def main(url: str, worker: str, stream: str, session_id: str) -> None:
    async with Store.from_url(url) as store:
        journal = store.journal(worker_id=worker, lease_s=1.5)
        agent = Agent(client=StallsAfterTools(), name="Booker", tools=[book_flight],
                      context_providers=[StoreHistoryProvider(store, user_id="u")],
                      require_per_service_call_history_persistence=True)  # fmt: skip
        session = AgentSession(session_id=session_id)
        task = await start_detached(
            journal, stream, user_id="u", conversation_id=session_id,
            events=lambda: agent.run("call book_flight", session=session, stream=True),
        )  # fmt: skip
        await task


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
