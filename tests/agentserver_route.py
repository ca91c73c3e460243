"""agent-framework-foundry-hosting's ResponsesHostServer, self-hosted, on the store: the Agent with the offline
client, StoreResponseProvider for responses, the session and checkpoint providers of agent_store.agentserver.

``ask(url, user, body, source)`` is one ``POST /responses``: a new Store (another worker) and a new host, through
the host's own ASGI app. ``python tests/agentserver_route.py URL USER BODY_JSON SOURCE`` serves one request in a
process of its own and prints the response JSON. The host's own telemetry is off: nothing leaves this machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

os.environ.setdefault("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")  # the Azure exporter's self-report

import httpx
from agent_framework import Agent
from agent_framework_foundry_hosting import ResponsesHostServer

from agent_store import Store
from agent_store.agentserver.foundry import StoreCheckpointStoreProvider, StoreSessionStoreProvider
from agent_store.agentserver.responses import StoreResponseProvider
from agent_store.offline import OfflineChatClient


def host(store: Store, source: str) -> ResponsesHostServer:
    return ResponsesHostServer(
        Agent(client=OfflineChatClient(), name="Assistant"),
        response_store=StoreResponseProvider(store, transcript=source != "agent"),  # ("agent": its sessions hold it)
        agent_session_store_provider=StoreSessionStoreProvider(store),
        checkpoint_store_provider=StoreCheckpointStoreProvider(store),
        history_source=source,  # "agent_server": the response store's items; "agent": the session's messages
        configure_observability=None,
    )


async def ask(url: str, user: str, body: dict[str, Any], source: str = "agent_server") -> dict[str, Any]:
    async with Store.from_url(url) as store:
        transport = httpx.ASGITransport(app=host(store, source))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            answer = await client.post("/responses", json={"model": "offline", **body},
                                       headers={"x-agent-user-id": user}, timeout=60)  # fmt: skip
            return dict(answer.json())


def text_of(response: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for o in response.get("output") or [] for c in o.get("content") or []
                   if c.get("type") == "output_text")  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(asyncio.run(ask(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]))))
