"""`agent-store demo`: the source text's scenario, end to end, offline, on the store it is given.

1. turn one ("我叫李明") in this process; a state counter, preferences and a timestamped history list;
2. turn two ("我叫什么名字？") in a *separate process* with its own Store: it answers from the stored history;
3. two agents (translator and summarizer) sharing one session;
4. the transcript read back with plain SQL.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from asyncio.subprocess import PIPE
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agent_framework import Agent
from sqlalchemy import text

from agent_store.agent_framework.usage_recorder import UsageRecorder
from agent_store.db.tables import SCHEMA_REVISION
from agent_store.db.urls import DEFAULT_URL
from agent_store.errors import redact
from agent_store.offline import OfflineChatClient
from agent_store.store import Store

TRANSCRIPT_SQL = "SELECT seq, role, author_name, text FROM agent_messages WHERE session_id = :sid ORDER BY seq"


def count_turn(state: dict[str, Any]) -> int:
    """The seed's per-turn bookkeeping: a counter and a history list with timestamps."""
    turn: int = state.get("turn_count", 0) + 1
    state["turn_count"] = turn
    state.setdefault("history", []).append({"turn": turn, "timestamp": datetime.now(UTC)})
    return turn


async def turn_one(url: str | None, chat_id: str, say: Callable[[str], None]) -> None:
    agent = Agent(client=OfflineChatClient(), name="Assistant", instructions="友好的助手", middleware=[UsageRecorder()])
    async with Store.from_url(url, check_schema=False) as setup:
        # A new database gets the schema; one of an older agent_store is left for `agent-store upgrade` to take.
        if await setup.db.revision() is None:
            await setup.migrate()
    async with Store.from_url(url) as store:
        await store.warm_up(1)  # a schema behind or ahead is said here, never upgraded by a demo
        say(f"database: {redact(store.url)} (schema at {SCHEMA_REVISION})")
        async with store.session(chat_id, user_id="li-ming") as session:
            session.state["preferences"] = {"theme": "dark", "language": "zh"}
            turn = count_turn(session.state)
            reply = await agent.run("我叫李明", session=session)
        say(f"[turn {turn}, process A] user: 我叫李明  ->  {agent.name}: {reply.text}")


async def turn_two(url: str | None, chat_id: str, say: Callable[[str], None]) -> None:
    agent = Agent(client=OfflineChatClient(), name="Assistant", instructions="友好的助手", middleware=[UsageRecorder()])
    async with Store.from_url(url) as store:
        async with store.session(chat_id, user_id="li-ming") as session:
            turn = count_turn(session.state)
            reply = await agent.run("我叫什么名字？", session=session)
            prefs = session.state["preferences"]
        say(f"[turn {turn}, process B] user: 我叫什么名字？  ->  {agent.name}: {reply.text}")
        say(f"  state restored in process B: turn_count={turn}, preferences={_json(prefs)}")


async def shared_session(url: str | None, shared_id: str, say: Callable[[str], None]) -> None:
    client = OfflineChatClient()
    translator = Agent(client=client, name="Translator", instructions="翻译助手", middleware=[UsageRecorder()])
    summarizer = Agent(client=client, name="Summarizer", instructions="摘要助手", middleware=[UsageRecorder()])
    async with Store.from_url(url) as store:
        async with store.session(shared_id, user_id="li-ming") as session:
            translated = await translator.run("Sessions keep state across agent runs.", session=session)
            summary = await summarizer.run(translated.text, session=session)
        say(f"[shared session] Translator: {translated.text}")
        say(f"[shared session] Summarizer: {summary.text}")


async def show_sql(
    store: Store, sql: str, params: dict[str, str], say: Callable[[str], None], json_columns: int = 0
) -> None:
    """Print a query (with its parameters) and its rows: plain SQL over the readable tables. The last
    ``json_columns`` hold JSON: SQLite hands back its text, PostgreSQL the decoded value (with jsonb's key
    order), so both are printed as the same canonical JSON."""
    say(f"\nSQL> {sql}    -- {params}")
    async with store.engine.connect() as conn:
        for row in (await conn.execute(text(sql), params)).all():
            plain, json_values = row[: len(row) - json_columns], row[len(row) - json_columns :]
            cells = ["-" if v is None else str(v) for v in plain] + [_json(v) for v in json_values]
            say("  " + " | ".join(cells))


def _json(value: Any) -> str:
    decoded = json.loads(value) if isinstance(value, str) else value
    return json.dumps(decoded, ensure_ascii=False, sort_keys=True)


async def run_demo(url: str | None, say: Callable[[str], None]) -> str:
    """Run the whole demo; returns the conversation id of the two-turn chat. ``url`` None: ./agent_store.db,
    never $AGENT_STORE_URL (the demo writes only where it was told to)."""
    url = DEFAULT_URL if url is None else url
    chat_id, shared_id = f"demo-chat-{uuid.uuid4().hex[:8]}", f"demo-shared-{uuid.uuid4().hex[:8]}"
    await turn_one(url, chat_id, say)
    command = [sys.executable, "-m", "agent_store", "demo", "--step", "turn-two", "--chat-id", chat_id]
    command += ["--url", url]
    child = await asyncio.create_subprocess_exec(*command, stdout=PIPE, stderr=PIPE)
    out, err = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"turn two (separate process) failed: {err.decode().strip()}")
    say(out.decode().rstrip())
    await shared_session(url, shared_id, say)
    async with Store.from_url(url) as store:
        for sid in (chat_id, shared_id):
            await show_sql(store, TRANSCRIPT_SQL, {"sid": sid}, say)
        await show_sql(
            store, "SELECT key, value FROM agent_state WHERE session_id = :sid ORDER BY key", {"sid": chat_id}, say, 1
        )
    return chat_id
