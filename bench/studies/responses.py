"""Served conversations (issue 38): what 200 chained responses cost, and what a point costs to read back.

Bytes: the same 200 turns (the hosting-responses route, the offline client, the agent's own messages) stored
three ways, each in a fresh database or directory: one conversation advanced in place (a ``conversation`` id),
200 chained ``previous_response_id``s on StoreSessionStore, and the same chain on core's ``FileSessionStore`` (a
snapshot file per response). agent_store's figure is every table and index (after VACUUM on PostgreSQL; the
file after a checkpoint on SQLite).

Loads: a 200-turn chain, then 0, 10 and 100 branches from its middle; reading a point back (``get``) in the
trunk at its head, in the trunk mid-way (a point the head moved past) and in a branch: median ms and, on
PostgreSQL, round trips (requests a proxy counted); beside the raw driver reading the same rows (the floor).

    .venv/bin/python bench/studies/responses.py [--turns 200] [--url postgresql+asyncpg://postgres@127.0.0.1:5432/bench]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import asyncpg
from agent_framework import Agent, FileSessionStore
from agent_framework_hosting import AgentState
from agent_framework_hosting_responses import (
    create_conversation_id,
    create_response_id,
    responses_session_id,
    responses_to_run,
)
from lost_reply_proxy import LostReplyProxy
from sqlalchemy import text
from sqlalchemy.engine import make_url

from agent_store import Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.offline import OfflineChatClient

AGENT = Agent(client=OfflineChatClient(), name="Assistant")


async def turn(state: AgentState[Any], body: dict[str, Any]) -> str:
    """The hosting-responses route (tests/hosting_route.py), without the payload it returns: the new key."""
    run = responses_to_run(body)
    session_id, is_conversation_id = responses_session_id(body)
    response_id = create_response_id()
    session = await state.get_or_create_session(session_id or response_id)
    await (await state.get_target()).run(run["messages"], session=session)
    key = session_id if is_conversation_id else response_id
    await state.set_session(key, session)
    return key


async def chain(state: AgentState[Any], turns: int, *, conversation: bool) -> list[str]:
    keys: list[str] = []
    conversation_id = create_conversation_id()  # as long as a response id: the rows repeat it either way
    for n in range(turns):
        body: dict[str, Any] = {"model": "offline", "input": f"turn {n}: 我叫李明，今天想聊聊天气和旅行计划。"}
        if conversation:
            body["conversation"] = conversation_id
        elif keys:
            body["previous_response_id"] = keys[-1]
        keys.append(await turn(state, body))
    return keys


async def store_bytes(store: Store, url: str) -> int:
    if url.startswith("sqlite"):
        async with store.engine.connect() as conn:
            await conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        return os.path.getsize(make_url(url).database or "")  # noqa: ASYNC240
    async with store.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        listed = await conn.execute(text("SELECT tablename FROM pg_tables WHERE tablename LIKE 'agent_%'"))
        tables = [t for (t,) in listed]
        for table in tables:
            await conn.exec_driver_sql("VACUUM " + table)  # the store's own table names
        sizes = [await conn.execute(text("SELECT pg_total_relation_size(:t)"), {"t": t}) for t in tables]
        return sum(int(s.scalar_one()) for s in sizes)


async def fresh(base_url: str, name: str) -> str:
    if base_url.startswith("sqlite"):
        return f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/{name}.db"
    admin = await asyncpg.connect(make_url(base_url).set(drivername="postgresql", database="postgres")
                                  .render_as_string(hide_password=False))  # fmt: skip
    database = f"bench_responses_{name}"
    await admin.execute(f'DROP DATABASE IF EXISTS "{database}"')
    await admin.execute(f'CREATE DATABASE "{database}"')
    await admin.close()
    return make_url(base_url).set(database=database).render_as_string(hide_password=False)


async def bytes_table(base_url: str, turns: int, rounds: int = 3) -> None:
    """Median of ``rounds`` (each in fresh databases): a B-tree page more or less is 2% of this bench's figure, and
    which page splits, with random ids, moves from one round to the next."""
    runs: dict[str, list[int]] = {"linear": [], "chained": []}
    for _ in range(rounds):
        for name, conversation in (("linear", True), ("chained", False)):
            url = await fresh(base_url, name)
            async with Store.from_url(url) as store:
                await store.migrate()
                empty = await store_bytes(store, url)
                await chain(AgentState(AGENT, session_store=StoreSessionStore(store, user_id="u")), turns,
                            conversation=conversation)  # fmt: skip
                runs[name].append(await store_bytes(store, url) - empty)
    ratios = sorted(c / line for c, line in zip(runs["chained"], runs["linear"], strict=True))
    figures = {name: int(statistics.median(values)) for name, values in runs.items()}
    folder = Path(tempfile.mkdtemp())
    await chain(AgentState(AGENT, session_store=FileSessionStore(folder)), turns, conversation=False)
    files = [f for f in folder.rglob("*") if f.is_file()]  # noqa: ASYNC240 - once, after the chain
    file_bytes = sum(f.stat().st_size for f in files)
    backend = "PostgreSQL" if base_url.startswith("postgresql") else "SQLite"
    print(f"\n{turns} turns, {backend}: bytes (what the turns added; medians of {rounds} rounds)\n")
    print("| stored as | bytes | per turn | x linear |\n|---|---|---|---|")
    print(f"| one conversation, advanced in place | {figures['linear']:,} | {figures['linear'] / turns:,.0f} | 1.00 |")
    print(f"| {turns} chained response ids (StoreSessionStore) | {figures['chained']:,} | "
          f"{figures['chained'] / turns:,.0f} | {statistics.median(ratios):.2f} "
          f"({ratios[0]:.2f}-{ratios[-1]:.2f}) |")  # fmt: skip
    print(f"| {turns} chained response ids (core's FileSessionStore, {len(files)} files) | {file_bytes:,} | "
          f"{file_bytes / turns:,.0f} | {file_bytes / figures['linear']:.2f} |")  # fmt: skip


async def loads_table(base_url: str, turns: int, reps: int) -> None:
    url = await fresh(base_url, "loads")
    proxy = port = None
    if url.startswith("postgresql"):
        proxy = LostReplyProxy("127.0.0.1", make_url(url).port or 5432)
        port = await proxy.start()
        url = make_url(url).set(port=port).render_as_string(hide_password=False)
    backend = "PostgreSQL" if url.startswith("postgresql") else "SQLite"
    print(f"\n{backend}: reading a point back (median of {reps}), a {turns}-turn chain\n")
    print("| branches from the middle | point | get() ms | round trips | floor ms | x floor |")
    print("|---|---|---|---|---|---|")
    async with Store.from_url(url) as store:
        await store.migrate()
        sessions = StoreSessionStore(store, user_id="u")
        state = AgentState(AGENT, session_store=sessions)
        keys = await chain(state, turns, conversation=False)
        middle, made = keys[turns // 2], 0
        branch_key = ""
        for branches in (0, 10, 100):
            while made < branches:
                branch_key = await turn(state, {"model": "offline", "input": f"branch {made}",
                                                "previous_response_id": middle})  # fmt: skip
                made += 1
            points = {"trunk head": keys[-1], "trunk, mid-way": middle, **({"a branch": branch_key} if made else {})}
            for label, key in points.items():
                times, trips = [], []
                for _ in range(reps):
                    before = proxy.round_trips if proxy else 0
                    started = time.perf_counter()
                    session = await sessions.get(key)
                    times.append((time.perf_counter() - started) * 1000)
                    trips.append((proxy.round_trips if proxy else 0) - before)
                    assert session is not None
                floor = await floor_ms(store, key, reps)
                ms = statistics.median(times)
                print(f"| {branches} | {label} | {ms:.2f} | {statistics.median(trips) if proxy else '-'} | "
                      f"{floor:.2f} | {ms / floor:.1f} |")  # fmt: skip
    if proxy is not None:
        await proxy.stop()


async def floor_ms(store: Store, key: str, reps: int) -> float:
    """The raw driver reading the same messages: the point's rows by session and seq range, one statement."""
    async with store.engine.connect() as conn:
        found = (await conn.execute(text("SELECT session_id, seq_end FROM agent_responses WHERE response_id = :k"),
                                    {"k": key})).first()  # fmt: skip
        base = (await conn.execute(text("SELECT base_id, base_seq FROM agent_sessions WHERE id = :s"),
                                   {"s": found[0]})).first()  # fmt: skip
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            if store.engine.dialect.name == "postgresql":
                rows = await driver.fetch(
                    "SELECT body, text FROM agent_messages WHERE (session_id = $1 AND seq < $2) OR (session_id = $3 "
                    "AND seq < $4) ORDER BY seq", found[0], found[1], base[0] or "", base[1] or 0)  # fmt: skip
            else:
                cursor = await driver.execute(
                    "SELECT body, text FROM agent_messages WHERE (session_id = ? AND seq < ?) OR (session_id = ? "
                    "AND seq < ?) ORDER BY seq", (found[0], found[1], base[0] or "", base[1] or 0))  # fmt: skip
                rows = await cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
            assert rows
    return statistics.median(times)


async def main(args: argparse.Namespace) -> None:
    await bytes_table(args.url, args.turns)
    await loads_table(args.url, args.turns, args.reps)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--url", default="sqlite+aiosqlite:///bench_responses.db")
    asyncio.run(main(parser.parse_args()))
