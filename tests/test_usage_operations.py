"""The usage ledger in operations (issue 27): export/import, erasure and retention cover it; the CLI reports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_framework import Agent
from cli_support import cli, ok
from helpers import expire_now, rows

from agent_store import InvalidValueError, Store
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.offline import OfflineChatClient

CALLS = (
    "SELECT session_id, run_id, call_no, user_id, input_tokens, output_tokens, purpose FROM agent_usage ORDER BY 1, 2"
)


async def turns(store: Store, *owners: tuple[str, str]) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])
    for session_id, user_id in owners:
        async with store.session(session_id, user_id=user_id) as session:
            await agent.run(f"hello from {user_id}", session=session)


async def test_export_and_import_carry_the_ledger(store: Store, tmp_path: Path) -> None:
    await turns(store, ("a", "u"), ("a", "u"), ("b", "v"))
    lines = [line async for line in store.export(user_id="u")]
    assert sum('"kind": "usage"' in line for line in lines) == 2
    async with Store.from_url(f"sqlite+aiosqlite:///{tmp_path}/copy.db") as copy:
        await copy.migrate()
        assert (await copy.import_lines(lines)).imported == 1
        assert await rows(copy, CALLS) == [r for r in await rows(store, CALLS) if r[3] == "u"]


async def test_an_import_never_charges_a_call_to_another_user_or_a_missing_run(store: Store, tmp_path: Path) -> None:
    await turns(store, ("a", "u"))
    lines = [line async for line in store.export(user_id="u")]
    at = next(i for i, line in enumerate(lines) if '"kind": "usage"' in line)
    record = json.loads(lines[at])
    hostile = {
        "another user": {**record["row"], "user_id": "v"},
        "a missing run": {**record["row"], "run_id": "no-such-run"},
        "a bad purpose": {**record["row"], "purpose": "free"},
        "a negative call number": {**record["row"], "call_no": -1},
        "text for a count": {**record["row"], "input_tokens": "12"},
        "text for a latency": {**record["row"], "latency_ms": "fast"},
        "a negative count": {**record["row"], "input_tokens": -(10**15)},
        "a count no call reports": {**record["row"], "total_tokens": 2**62},
        "a count the run log does not sum": {**record["row"], "input_tokens": record["row"]["input_tokens"] + 1},
        "an infinite latency": {**record["row"], "latency_ms": float("inf")},
    }
    async with Store.from_url(f"sqlite+aiosqlite:///{tmp_path}/copy.db") as copy:
        await copy.migrate()
        for what, row in hostile.items():
            tampered = [*lines[:at], json.dumps({"kind": "usage", "row": row}), *lines[at + 1 :]]
            with pytest.raises(InvalidValueError):
                await copy.import_lines(tampered)
            assert await rows(copy, "SELECT count(*) FROM agent_sessions") == [(0,)], what  # nothing imported


async def test_erase_user_and_retention_take_the_ledger_and_the_budget(store: Store) -> None:
    await turns(store, ("a", "u"), ("b", "u"), ("c", "v"), ("d", "w"))
    await store.usage.set_budget(10_000, user_id="u")
    report = await store.erase_user("u")
    assert report.usage_calls == 2 and report.sessions == 2
    assert await rows(store, "SELECT DISTINCT user_id FROM agent_usage ORDER BY 1") == [("v",), ("w",)]
    assert await store.usage.budget("u") is None
    await expire_now(store, "c")
    assert await store.purge_expired() == 1
    assert await rows(store, "SELECT DISTINCT user_id FROM agent_usage") == [("w",)]


async def test_the_cli_reports_sets_budgets_and_prices(store: Store, url: str, tmp_path: Path) -> None:
    await turns(store, ("a", "u"), ("b", "u"), ("c", "v"))
    by_user = json.loads(ok(cli("usage", "--by", "user", "--json", url=url, cwd=tmp_path)))
    stored = dict(await rows(store, "SELECT user_id, sum(total_tokens) FROM agent_usage GROUP BY user_id"))
    assert {line["key"]: line["total_tokens"] for line in by_user["lines"]} == stored
    for by in ("agent", "model", "day", "session"):
        lines = json.loads(ok(cli("usage", "--by", by, "--since", "7d", "--json", url=url, cwd=tmp_path)))["lines"]
        assert sum(line["calls"] for line in lines) == 3, by
    table = ok(cli("usage", "--by", "agent", url=url, cwd=tmp_path))
    assert table.splitlines()[0].split()[:3] == ["AGENT", "CALLS", "INPUT"] and "Bot" in table
    future = cli("usage", "--since", "2999-01-01", "--json", url=url, cwd=tmp_path)  # an empty span: said, not shown
    assert future.returncode == 1 and "in the future" in future.stderr
    ok(cli("budget", "set", "5", "--user", "u", "--period", "month", url=url, cwd=tmp_path))
    shown = json.loads(ok(cli("budget", "show", "--user", "u", "--json", url=url, cwd=tmp_path)))
    spent = int(stored["u"])  # a budget set mid-period starts from what the period's calls used
    assert (shown["token_limit"], shown["period"], shown["used"], shown["exceeded"]) == (5, "month", spent, True)
    ok(cli("price", "offline", "--input", "1", "--output", "2", url=url, cwd=tmp_path))
    assert await rows(store, "SELECT model, input_per_million FROM agent_usage_prices") == [("offline", 1.0)]
    assert "removed" in ok(cli("budget", "remove", "--user", "u", url=url, cwd=tmp_path))
    bad = cli("usage", "--since", "yesterday", url=url, cwd=tmp_path)
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "--since" in bad.stderr
