"""The hosting-responses route, as agent-framework-hosting-responses' README writes it, on StoreSessionStore.

``serve(url, user, body)`` is one request to ``POST /responses``: a new Store (another worker), the package's own
``responses_to_run`` / ``responses_session_id`` / ``create_response_id`` / ``responses_from_run`` (or
``responses_from_streaming_run`` for ``"stream": true``), ``AgentState.get_or_create_session`` and
``set_session``, unchanged. ``python tests/hosting_route.py URL USER BODY_JSON`` serves one request in a process
of its own and prints the response JSON (the streamed events' last ``response`` for a stream).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agent_framework import Agent
from agent_framework_hosting import AgentState
from agent_framework_hosting_responses import (
    create_response_id,
    responses_from_run,
    responses_from_streaming_run,
    responses_session_id,
    responses_to_run,
)

from agent_store import Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.offline import OfflineChatClient


async def serve(url: str, user: str, body: dict[str, Any]) -> dict[str, Any]:
    async with Store.from_url(url) as store:
        agent = Agent(client=OfflineChatClient(), name="Assistant")
        state = AgentState(agent, session_store=StoreSessionStore(store, user_id=user))
        run = responses_to_run(body)
        session_id, is_conversation_id = responses_session_id(body)
        response_id = create_response_id()
        session = await state.get_or_create_session(session_id or response_id)
        target = await state.get_target()
        conversation_id = session_id if is_conversation_id else None
        if run["stream"]:
            stream = target.run(run["messages"], session=session, stream=True)
            events = [event async for event in responses_from_streaming_run(
                stream, response_id=response_id, conversation_id=conversation_id)]  # fmt: skip
            payload = _last_response(events)
        else:
            result = await target.run(run["messages"], session=session)
            payload = responses_from_run(result, response_id=response_id, conversation_id=conversation_id)
        # The app must serialize writers that advance a stable conversation id (the README's words).
        await state.set_session(session_id if is_conversation_id else response_id, session)
        return payload


def _last_response(events: list[str]) -> dict[str, Any]:
    """The ``response`` object of the last SSE event that carries one (response.completed)."""
    found: dict[str, Any] = {}
    for event in events:
        for line in event.splitlines():
            if line.startswith("data:"):
                data = json.loads(line[5:])
                if isinstance(data, dict) and isinstance(data.get("response"), dict):
                    found = data["response"]
    return found


def text_of(payload: dict[str, Any]) -> str:
    """The output text of a Responses payload."""
    parts = [part.get("text", "") for item in payload.get("output", []) for part in item.get("content", []) or []]
    return "".join(parts)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(serve(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))), ensure_ascii=False))
