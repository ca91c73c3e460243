"""A background response whose worker died reads ``incomplete`` once its lease has passed, on GET as on the stream,
never ``in_progress`` until the journal's time-to-live (issue 58 finding 7), on both backends."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import test_responses_background as served
from helpers import until
from sqlalchemy import text

from agent_store import Store


async def test_a_dead_workers_background_response_reads_incomplete(store: Store, url: str) -> None:
    served.GO_ON["tool"] = asyncio.Event()
    web = httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app_on(store)), base_url="http://localhost")
    async with web:
        slow = (await web.post("/responses", json={"model": "offline", "input": "call slow_lookup",
                                                   "background": True}, headers={"x-user": "u"})).json()  # fmt: skip
        async with Store.from_url(url) as other:
            elsewhere = httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app_on(other)),
                                          base_url="http://localhost")  # fmt: skip
            async with elsewhere:

                async def running() -> bool:
                    found = (await elsewhere.get(f"/responses/{slow['id']}", headers={"x-user": "u"})).json()
                    return bool(found["status"] == "in_progress")

                await until(running, "the response to be in progress")
                # Its worker dies: it renews its lease no more (another owner's row to it), and the lease is past.
                past = datetime.now(UTC) - timedelta(seconds=5)
                async with store.engine.begin() as conn:
                    await conn.execute(text("UPDATE agent_streams SET owner = 'a worker that died', lease_until = "
                                            ":past WHERE stream_id = :sid"),
                                       {"past": past.replace(tzinfo=None) if conn.dialect.name == "sqlite" else past,
                                        "sid": slow["id"]})  # fmt: skip
                got = (await elsewhere.get(f"/responses/{slow['id']}", headers={"x-user": "u"})).json()
                streamed = served.events_of((await elsewhere.get(f"/responses/{slow['id']}", params={"stream": "true"},
                                                                 headers={"x-user": "u"})).text)  # fmt: skip
                served.GO_ON["tool"].set()  # the stranded task may end (its writes are refused: not its row now)
                for journal in served.JOURNALS:
                    await journal.close()
    assert got["status"] == "incomplete", got
    assert streamed[0]["type"] == "response.created" and streamed[-1]["type"] == "response.incomplete"
