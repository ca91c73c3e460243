"""More seeds of the differential check (tests/differential.py) than CI runs: the model's requests with
agent_store against the framework's in-memory session, over random strategies, turns, reused call ids, races,
forks and truncations. Prints a table of outcomes by strategy; exits 1 on any mismatch.

    .venv/bin/python bench/studies/differential.py --seeds 1000 [--first 150] [--url postgresql+asyncpg://...]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from differential import Scenario, in_memory, stored

from agent_store import Store


async def main(first: int, seeds: int, url: str | None) -> int:
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    mismatches = []
    for seed in range(first, first + seeds):
        scenario = Scenario.draw(seed)
        target = url or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/differential.db"
        async with Store.from_url(target) as store:
            await store.migrate()
            for sid in ("c", "branch"):
                await store.delete(sid, user_id="u")
        got = await stored(scenario, target)
        reference = await in_memory(scenario, got.race_order)
        outcome = "same" if (got.requests, got.after_cut) == (reference.requests, reference.after_cut) else "differs"
        table[scenario.strategy][outcome] += 1
        if outcome != "same":
            mismatches.append(scenario)
    print("| strategy | scenarios | same | differs |\n|---|---|---|---|")
    for strategy, counts in sorted(table.items()):
        print(f"| {strategy} | {sum(counts.values())} | {counts['same']} | {counts['differs']} |")
    for scenario in mismatches:
        print("differs:", scenario)
    return 1 if mismatches else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", type=int, default=150, help="the first seed (CI runs 0-149)")
    parser.add_argument("--seeds", type=int, default=500)
    parser.add_argument("--url", default=None, help="a database URL (default: a new SQLite file per scenario)")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.first, args.seeds, args.url)))
