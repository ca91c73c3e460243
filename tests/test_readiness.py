"""Readiness and the figures operators alert on (issue 42 point 4), on both backends, through the library and the
CLI: ready on a store at this schema; the purge lag of a session that expired and waits; conflicts of the last
hour; journaled runs whose worker died; not ready (exit 1, one line) on a schema behind."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cli_support import cli, ok
from helpers import dead_run
from sqlalchemy import text

from agent_store import ConflictError, SchemaOutOfDateError, Store


async def test_figures_show_purge_lag_conflicts_and_stuck_runs(store: Store, url: str, tmp_path: Path) -> None:
    quiet = await store.ready(figures=True)
    assert {k: quiet[k] for k in ("ok", "expired_waiting", "purge_lag_s", "runs_last_hour", "conflicts_last_hour",
                                  "stuck_runs")} == {"ok": True, "expired_waiting": 0, "purge_lag_s": 0,
                                                     "runs_last_hour": 0, "conflicts_last_hour": 0, "stuck_runs": 0}
    async with store.session("s", user_id="u") as session:
        session.state["a"] = 1
    first, second = await store.load("s", user_id="u"), await store.load("s", user_id="u")
    first.session.state["a"] = second.session.state["a"] = 2
    await first.commit()
    with pytest.raises(ConflictError):
        await second.commit()
    async with store.engine.begin() as conn:  # it expired an hour ago and no purge has run since
        await conn.execute(text("UPDATE agent_sessions SET expires_at = :t"),
                           {"t": datetime.now(UTC) - timedelta(hours=1)})  # fmt: skip
    await dead_run(store, "r")  # a worker died mid-run
    seen = json.loads(ok(cli("check", "--figures", "--json", url=url, cwd=tmp_path)))
    assert seen["ok"] is True and seen["revision"] == (await store.ready())["revision"]
    assert seen["expired_waiting"] == 1 and 3500 <= seen["purge_lag_s"] <= 3700
    assert (seen["runs_last_hour"], seen["conflicts_last_hour"], seen["stuck_runs"]) == (3, 1, 1)
    human = ok(cli("check", "--figures", url=url, cwd=tmp_path)).splitlines()
    assert human[0].startswith("ok: ") and human[1].startswith("purge lag: ")
    assert human[2].startswith("last hour: 3 runs, 1 conflicts (33.3%); stuck journaled runs: 1")
    await store.purge_expired()
    assert (await store.ready(figures=True))["purge_lag_s"] == 0


async def test_not_ready_on_a_schema_behind(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url) as store:
        await store.migrate("0019")
        with pytest.raises(SchemaOutOfDateError):
            await store.ready()
    behind = cli("check", url=url, cwd=tmp_path)
    assert behind.returncode == 1 and behind.stderr.count("\n") == 1 and "agent-store upgrade --url" in behind.stderr
