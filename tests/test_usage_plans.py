"""The usage reports are served by the ledger's indexes (issue 27): EXPLAIN over 100,000 calls in CI.

`bench/studies/usage_ledger.py` runs the same checks, with timings, at 1,000,000 calls (README, "Usage ledger").
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent_store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "studies"))
from usage_ledger import fill_ledger, report_plans


async def test_selective_reports_never_read_the_ledger_whole(store: Store) -> None:
    await fill_ledger(store, calls=100_000)
    lines = await store.usage.report("day", user_id="user-7")
    assert len(lines) == 30 and sum(line.calls for line in lines) > 0  # the fill spans 100 days: a month of them
    plans = await report_plans(store)
    # A day of 100, a week, one user's month: each an index range. (The 30-day report of everyone reads a third of
    # the table; the planner may rightly read it whole.)
    selective = {name: scans for name, (_, scans) in plans.items() if "(30 days, the default)" not in name}
    assert len(selective) == 7 and selective == {name: [] for name in selective}
