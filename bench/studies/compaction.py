"""A compacted session against a short one (issue 24), on SQLite and PostgreSQL. Prints a table.

    python bench/studies/compaction.py                      # both backends (PostgreSQL at $AGENT_STORE_BENCH_PG_URL)
    python bench/studies/compaction.py --reps 5 --backends postgresql

- C1: a 5,000-message session that the framework's SummarizationStrategy compacted to one summary plus its last
  20 messages, loaded with ``skip_excluded=True`` (only what the model sees), against a 21-message session that
  was never compacted, loaded whole: time (median of 31 loads per repetition) and the bytes of the message rows
  read (``octet_length`` of body and text). The whole compacted session (originals included) is shown too.
- C2: the commit of a steady-state compacting turn (SlidingWindowStrategy as after_strategy: a few rows'
  marks change each turn) against the commit of a plain turn of the same messages: median of 40 commits.

Every figure is the median of ``--reps`` repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from agent_framework import ChatResponse, Message, SlidingWindowStrategy, SummarizationStrategy, apply_compaction
from sqlalchemy import text

from agent_store import Store


class Summarizer:
    """A summarizer that answers as a model would: a short summary, whatever the length of its input."""

    async def get_response(self, messages: list[Message], **kwargs: Any) -> ChatResponse:
        return ChatResponse(messages=[Message(role="assistant", contents=["The user asked many questions. " * 4])])


def _turn(n: int) -> list[Message]:
    return [Message(role="user", contents=[f"question {n}: " + "words " * 20]),
            Message(role="assistant", contents=[f"answer {n}: " + "reply " * 30])]  # fmt: skip


async def _fill(store: Store, sid: str, messages: int) -> None:
    for start in range(0, messages, 1000):
        run = await store.load(sid, history_limit=0)
        for n in range(start // 2, min(start + 1000, messages) // 2):
            run.history.extend(_turn(n))
        await run.commit()


async def _row_bytes(store: Store, sid: str, included_only: bool) -> int:
    where = " AND NOT excluded" if included_only else ""
    postgresql = store.engine.dialect.name == "postgresql"
    size = "octet_length(CAST({} AS TEXT))" if postgresql else "length(CAST({} AS BLOB))"
    # Built from the constants above only; the session id is a bound parameter.
    sql = f"SELECT coalesce(sum({size.format('body')} + {size.format('text')}), 0) FROM agent_messages "  # noqa: S608
    async with store.engine.connect() as conn:
        return int((await conn.execute(text(sql + f"WHERE session_id = :s{where}"), {"s": sid})).scalar_one())


async def _median_ms(action: Callable[[], Awaitable[Any]], n: int) -> float:
    gc.collect()
    for _ in range(3):
        await action()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


async def one_rep(url: str) -> dict[str, float]:
    big, small, steady, plain = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("big", "small", "steady", "plain"))
    async with Store.from_url(url) as store:
        await store.migrate()
        await _fill(store, big, 5000)
        await _fill(store, small, 21)
        run = await store.load(big)  # the framework's summarizer, as CompactionProvider's after_run applies it
        await apply_compaction(
            run.history,
            strategy=SummarizationStrategy(
                client=Summarizer(), target_count=20, threshold=0, max_summary_input_tokens=None
            ),
        )
        await run.commit()
        figures = {
            "C1 compacted 5000, included only, ms": await _median_ms(lambda: store.load(big, skip_excluded=True), 31),
            "C1 short 21, whole, ms": await _median_ms(lambda: store.load(small), 31),
            "C1 compacted 5000, whole, ms": await _median_ms(lambda: store.load(big), 7),
            "C1 compacted bytes read": float(await _row_bytes(store, big, True)),
            "C1 short bytes read": float(await _row_bytes(store, small, False)),
        }
        strategy = SlidingWindowStrategy(keep_last_groups=6)
        commits: dict[str, list[float]] = {"compacting": [], "plain": []}
        for n in range(40):
            for sid, kind in ((steady, "compacting"), (plain, "plain")):
                run = await store.load(sid)
                if kind == "compacting":
                    await apply_compaction(run.history, strategy=strategy)
                run.history.extend(_turn(n))
                started = time.perf_counter()
                await run.commit()
                commits[kind].append(time.perf_counter() - started)
        figures["C2 compacting turn commit ms"] = statistics.median(commits["compacting"][10:]) * 1e3
        figures["C2 plain turn commit ms"] = statistics.median(commits["plain"][10:]) * 1e3
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    pg = os.environ.get("AGENT_STORE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    for backend in args.backends.split(","):
        reps = []
        for _ in range(args.reps):
            url = pg if backend == "postgresql" else f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
            reps.append(asyncio.run(one_rep(url)))
        med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
        print(f"\n{backend} (median of {args.reps})")
        print(f"| {'figure':<40} | {'value':>10} |\n|{'-' * 42}|{'-' * 12}|")
        for name, value in med.items():
            print(f"| {name:<40} | {value:>10.2f} |")
        load = med["C1 compacted 5000, included only, ms"] / med["C1 short 21, whole, ms"]
        size = med["C1 compacted bytes read"] / med["C1 short bytes read"]
        commit = med["C2 compacting turn commit ms"] / med["C2 plain turn commit ms"]
        print(f"compacted load / short load: time {load:.2f}x (target <= 1.2), bytes {size:.2f}x (target <= 1.2)")
        print(f"compacting commit / plain commit: {commit:.2f}x (target <= 1.5)")


if __name__ == "__main__":
    main()
