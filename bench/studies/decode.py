"""A whole-history load of 5,000 plain text messages: where the time goes between the rows and the Messages.

Prints, per backend, the median of ``--reps`` loads (each after a full garbage collection, so one load's
garbage is not another's pause) of:

- rows only: the load's own statement's rows fetched with the raw driver (aiosqlite / asyncpg), nothing built;
- rows + Message(): the same, and a ``Message`` with one text ``Content`` per row by the framework's constructors
  (the floor of rows plus framework objects);
- ``store.load`` with the plain-text fast path (db/message_decode.py), and with every row through the
  framework's ``Message.from_dict`` (as before it), alternated in one process;
- a cache's floor: copies of the 5,000 messages a previous load built, one new ``Message`` and ``Content`` each
  by copying attribute dicts (the cheapest copy there is). A cache of the previous turn's messages would have to
  hand out copies: the framework changes loaded messages in place (its compaction annotates and excludes them).

    python bench/studies/decode.py --reps 21
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite
import asyncpg
from agent_framework import Content, Message
from sqlalchemy.engine import make_url

from agent_store import Store
from agent_store.db import message_decode, message_rows

SQL = "SELECT seq, role, author_name, text, body, marks FROM agent_messages WHERE session_id = 'big' ORDER BY seq"
FAST = message_decode.message_from_row


def generic(body: Any, cipher: Any, *, identity: str, role: str, author_name: str | None, text: str,
            marks: Any = None) -> Message:  # fmt: skip
    body = {message_rows.TEXT_FROM_COLUMN: 1} if body is None else body  # the statement's NULL for plain text
    full = message_rows.full_body(body, cipher, message_id=identity, role=role, author_name=author_name, text=text)
    message = Message.from_dict(dict(message_rows.with_marks(full, marks)))
    message.additional_properties[message_rows.STORE_ID] = identity
    if message.message_id is None:
        message.id = identity  # type: ignore[attr-defined]
    return message


def copy_of(content: Content) -> Content:
    copied = object.__new__(Content)
    copied.__dict__.update(content.__dict__)
    return copied


async def timed(work: Callable[[], Awaitable[Any]]) -> float:
    gc.collect()
    started = time.perf_counter()
    await work()
    return (time.perf_counter() - started) * 1e3


async def measure(url: str, reps: int) -> dict[str, float]:
    async with Store.from_url(url) as store:
        await store.migrate()
        if not (await store.list_sessions(user_id="u")).items:
            async with store.session("big", user_id="u") as session:
                for i in range(2500):
                    session.state["in_memory"]["messages"] += [
                        Message(role="user", contents=[f"question {i} about the weather in 上海 today"]),
                        Message(
                            role="assistant", contents=[f"answer {i}: sunny and warm, 晴天 " * 3], author_name="Bot"
                        ),
                    ]

        async def load() -> None:
            await (await store.load("big", user_id="u")).discard()

        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            raw: Any = await aiosqlite.connect(parsed.database or "")
            fetch = raw.execute_fetchall
        else:
            raw = await asyncpg.connect(parsed.set(drivername="postgresql").render_as_string(hide_password=False))
            fetch = raw.fetch

        async def rows_and_objects() -> None:
            # The cheapest public way to the framework's objects: its own constructors, one text content each.
            [Message(role, [Content("text", text=text)], author_name=author) for _s, role, author, text, *_ in
             await fetch(SQL)]  # fmt: skip

        run = await store.load("big", user_id="u")
        held = list(run.history)
        await run.discard()

        async def copies() -> None:
            made = []
            for message in held:
                copied = object.__new__(Message)
                copied.__dict__.update(message.__dict__)
                copied.contents = [copy_of(content) for content in message.contents]
                copied.additional_properties = dict(message.additional_properties)
                made.append(copied)

        figures: dict[str, list[float]] = {
            "rows only": [], "rows + Message()": [], "load, fast path": [], "load, from_dict": [],
            "a cache's copies": [],
        }  # fmt: skip
        for _ in range(reps):
            figures["rows only"].append(await timed(lambda: fetch(SQL)))
            figures["rows + Message()"].append(await timed(rows_and_objects))
            message_decode.message_from_row = FAST
            figures["load, fast path"].append(await timed(load))
            message_decode.message_from_row = generic
            figures["load, from_dict"].append(await timed(load))
            figures["a cache's copies"].append(await timed(copies))
        message_decode.message_from_row = FAST
        await raw.close()
    return {name: statistics.median(values) for name, values in figures.items()}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/agent_store_bench_decode")
    args = parser.parse_args()
    results = {
        "SQLite": await measure("sqlite+aiosqlite:///agent_store_bench_decode.db", args.reps),
        "PostgreSQL": await measure(args.pg_url, args.reps),
    }
    print(f"| 5,000 text messages, median of {args.reps} | SQLite ms | ratio | PostgreSQL ms | ratio |")
    print("|---|---|---|---|---|")
    for name in results["SQLite"]:
        cells = [f"{results[b][name]:.1f} | {results[b][name] / results[b]['rows only']:.2f}x" for b in results]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    asyncio.run(main())
