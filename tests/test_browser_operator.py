"""The browser as an operator uses it: search across users, the typed query kept, statuses and labels as the CLI.

The real app over HTTP (httpx's ASGI transport), on both backends; the browser-in-Chromium walk is
test_browser.py's.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import httpx
import pytest
from agent_framework import Message
from helpers import expire_now
from test_browser import populate

from agent_store import InvalidValueError, Store
from agent_store.browser.app import create_app
from agent_store.db.ledger import ModelCall


def hits(html: str) -> list[tuple[str, str]]:
    """(session, user) of each hit of a cross-user results page."""
    return re.findall(r'<tr class="hit">\s*<td><a href="[^"]*">([^<]*)</a>.*?</td>\s*<td>([^<]*)</td>', html, re.S)


async def test_an_operator_searches_every_user_and_keeps_the_query(url: str) -> None:
    await populate(url)
    async with Store.from_url(url) as store:
        transport = httpx.ASGITransport(app=create_app(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            everyone = (await client.get("/search", params={"q": "我叫", "user": ""})).text
            assert "Messages of every user" in everyone
            found = hits(everyone)
            assert ("other", "wang") in found and ("chat-1", "li") in found
            assert 'href="/session?id=other&amp;user=wang' in everyone  # each hit opens with its own user
            one = (await client.get("/search", params={"q": "我叫", "user": "wang"})).text
            assert "Messages of wang" in one and "chat-1" not in one and "王芳" in one
            refused = await client.get("/search", params={"q": "李明", "cursor": "not-a-cursor"})
            assert refused.status_code == 400
            assert 'value="李明"' in refused.text  # the typed query stays in the box on the error page too
            lines = (await client.get("/search.jsonl", params={"q": "王芳"})).text.splitlines()
            assert {(h["session_id"], h["user_id"]) for h in map(json.loads, lines)} == {("other", "wang")}
            malformed = await client.get("/sessions", params={"meta": "no-equals-sign"})
            assert malformed.status_code == 400 and "key=value" in malformed.text  # as the CLI refuses it


async def test_statuses_and_labels_read_as_the_cli_says_them(url: str) -> None:
    await populate(url)
    async with Store.from_url(url) as store:
        await store.close_session("chat-1-branch", user_id="li")
        await expire_now(store, "other")
        transport = httpx.ASGITransport(app=create_app(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            listing = (await client.get("/sessions")).text
            status = dict(
                re.findall(r">([\w-]+)</a></td>.*?<td>(active|closed|expired)[^<]*</td>\s*</tr>", listing, re.S)
            )
            assert status == {"chat-1": "active", "chat-1-branch": "closed", "other": "expired"}
            page = (await client.get("/session", params={"id": "chat-1", "user": "li"})).text
            assert '<span id="status">active</span>' in page and "agent any" not in page
            assert re.search(r"#\d+ · tool · ", page) and "tool (Bot)" not in page  # a result is the tool's
            assert not re.search(r'class="muted">v\d{6,}<', page)  # no 19-digit state stamps


async def test_a_runs_model_calls_show_with_their_usage_and_trace_link(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        run = await store.load("chat", user_id="li")
        run.session.state["n"] = 1
        trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        call = ModelCall(
            called_at=datetime.now(UTC),
            usage={"input_token_count": 123, "output_token_count": 45},
            model="gpt-test",
            latency_ms=812.4,
            finish_reason="stop",
            trace_id=trace_id,
            span_id=span_id,
        )
        run.calls.append(call)
        run.history.append(Message(role="user", contents=["你好"]))
        await run.commit()
        jaeger = "http://localhost:16686/trace/{trace_id}?uiFind={span_id}"
        transport = httpx.ASGITransport(app=create_app(store, trace_url=jaeger))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            page = (await client.get("/session", params={"id": "chat", "user": "li"})).text
        line = re.search(r'<div class="call-usage muted">(.*?)</div>', page, re.S)
        assert line is not None and "call 1 · chat · gpt-test · in 123 / out 45 · 812 ms · stop" in line[1]
        assert f'href="http://localhost:16686/trace/{trace_id}?uiFind={span_id}"' in line[1]
        plain = httpx.ASGITransport(app=create_app(store))  # no trace viewer: the id as text
        async with httpx.AsyncClient(transport=plain, base_url="http://localhost") as client:
            page = (await client.get("/session", params={"id": "chat", "user": "li"})).text
        assert f'<code class="trace">{trace_id}</code>' in page
        with pytest.raises(InvalidValueError):
            create_app(store, trace_url="javascript:alert(1)//{trace_id}")
