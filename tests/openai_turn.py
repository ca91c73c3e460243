"""One turn of a conversation in its own process, with a real OpenAI client of the framework (for the tests).

    python tests/openai_turn.py DB_URL BASE_URL KIND SESSION_ID WORDS [HISTORY_LIMIT]

KIND: chat (Chat Completions), chat-stream, responses (the service keeps the conversation), responses-local
(store=False), responses-stream. Prints {"text": ..., "service_session_id": ...} as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agent_framework import Agent, tool
from agent_framework.openai import OpenAIChatClient, OpenAIChatCompletionClient

from agent_store import Store
from agent_store.agent_framework import StoreHistoryProvider


@tool
def weather() -> str:
    """Today's weather."""
    return "晴"


async def main(db_url: str, base_url: str, kind: str, session_id: str, words: str, limit: int | None) -> None:
    if kind.startswith("chat"):
        client: object = OpenAIChatCompletionClient(model="test-model", api_key="test-key", base_url=base_url)
    else:
        client = OpenAIChatClient(model="test-model", api_key="test-key", base_url=base_url)
    options = {"store": False} if kind == "responses-local" else {}
    async with Store.from_url(db_url) as store:
        provider = StoreHistoryProvider(store, user_id="u", history_limit=limit)
        agent = Agent(client=client, name="Bot", tools=[weather], context_providers=[provider], default_options=options)  # type: ignore[arg-type]
        async with store.session(session_id, user_id="u", history_limit=limit) as session:
            if kind.endswith("stream"):
                reply = await agent.run(words, session=session, stream=True).get_final_response()
            else:
                reply = await agent.run(words, session=session)
            print(json.dumps({"text": reply.text, "service_session_id": session.service_session_id}))


if __name__ == "__main__":
    limit = int(sys.argv[6]) if len(sys.argv) > 6 else None
    asyncio.run(main(*sys.argv[1:6], limit))
