"""A whole-store export (`agent-store export --all-users`), on both backends: every owner's sessions and rows,
those of users with no session too, and of no user, then the store's app: keys, budgets and prices; read back by
`import` into an empty store, row for row; a hostile store row is refused with nothing imported; an export that
finds nothing says so and exits 1 (issue 42 point 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_framework import Agent
from cli_support import cli, ok
from helpers import rows

from agent_store import InvalidValueError, Store
from agent_store.offline import OfflineChatClient

COUNTS = ("SELECT (SELECT count(*) FROM agent_sessions), (SELECT count(*) FROM agent_messages), "
          "(SELECT count(*) FROM agent_user_state), (SELECT count(*) FROM agent_app_state)")  # fmt: skip


async def test_every_owner_s_rows_go_out_and_come_back(filled: Store, url: str, tmp_path: Path) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot")
    async with filled.session("nobody-s", user_id=None) as session:  # a session without a user
        await agent.run("hello", session=session)
    async with filled.session("zhao-1", user_id="zhao") as session:
        session.state["user:city"] = "北京"  # a user: key, kept when the session goes
        await agent.run("hi", session=session)
    await filled.delete("zhao-1", user_id="zhao")  # zhao has no session left, only the key
    async with filled.session("li-app", user_id="li") as session:
        session.state["app:motd"] = "你好"  # the app's own key
    await filled.usage.set_budget(5000, user_id="wang")
    await filled.usage.set_price("gpt-x", input_per_million=2, output_per_million=8)
    dump = tmp_path / "all.jsonl"
    said = json.loads(ok(cli("export", "--all-users", "-o", str(dump), "--json", url=url, cwd=tmp_path)))
    records = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    assert said == {"sessions": 5, "lines": len(records), "file": str(dump)}
    assert records[0]["kind"] == "header" and records[0]["sessions"] == 5 and records[-1]["kind"] == "trailer"
    owners = [r["row"]["user_id"] for r in records if r["kind"] == "session"]
    assert owners == [None, "li", "li", "li", "wang"]  # no owner first, then by user id
    assert [r["kind"] for r in records[-4:-1]] == ["app_state", "budget", "price"]  # the store's own, last
    assert [r["row"]["key"] for r in records if r["kind"] == "user_state"] == ["city"]
    target = f"sqlite+aiosqlite:///{tmp_path}/target.db"
    ok(cli("upgrade", url=target, cwd=tmp_path))
    assert ok(cli("import", str(dump), url=target, cwd=tmp_path)).strip() == "imported 5, skipped 0"
    async with Store.from_url(target) as copy:
        assert await rows(copy, COUNTS) == await rows(filled, COUNTS)
        own = "SELECT (SELECT count(*) FROM agent_usage_budgets), (SELECT count(*) FROM agent_usage_prices)"
        assert await rows(copy, own) == [(1, 1)]
    again = ok(cli("export", "--all-users", url=target, cwd=tmp_path)).splitlines()
    assert [json.loads(line)["kind"] for line in again] == [r["kind"] for r in records]
    mixed = cli("export", "--all-users", "--user", "li", url=url, cwd=tmp_path)
    assert mixed.returncode == 1 and "--all-users" in mixed.stderr


async def test_an_export_that_finds_nothing_says_so_and_exits_1(store: Store, url: str, tmp_path: Path) -> None:
    empty = cli("export", "--all-users", "-o", str(tmp_path / "none.jsonl"), url=url, cwd=tmp_path)
    assert empty.returncode == 1 and "nothing exported: the store holds nothing" in empty.stderr
    assert not list(tmp_path.glob("none.jsonl*"))  # noqa: ASYNC240  (no file for an export that found nothing)
    agent = Agent(client=OfflineChatClient(), name="Bot")
    async with store.session("s1", user_id="ann") as session:
        await agent.run("hello", session=session)
    unowned = cli("export", "-o", str(tmp_path / "unowned.jsonl"), url=url, cwd=tmp_path)
    assert unowned.returncode == 1 and "give --user ID or --all-users" in unowned.stderr
    one = ok(cli("export", "--user", "ann", "-o", str(tmp_path / "ann.jsonl"), url=url, cwd=tmp_path))
    assert one.startswith("exported 1 session (")  # not "1 sessions"
    nobody = cli("export", "--user", "nobody", url=url, cwd=tmp_path)  # a user with nothing: an empty export
    assert nobody.returncode == 0
    assert [json.loads(x)["kind"] for x in nobody.stdout.splitlines()] == ["header", "trailer"]


async def test_a_hostile_store_row_is_refused_and_nothing_is_imported(store: Store) -> None:
    async with store.session("s1", user_id="ann") as session:
        session.state["app:motd"] = "hi"
    await store.usage.set_budget(100, user_id="ann")
    lines = [line async for line in store.export(all_users=True)]
    async with Store.from_url(store.url) as other:  # the same file, into a store that lost everything
        await other.delete("s1", user_id="ann")
    for kind, bad in (("budget", {"scope": "root"}), ("app_state", {"key": "x" * 300}),
                      ("price", {"input_per_million": -1})):  # fmt: skip
        edited = []
        for line in lines:
            record = json.loads(line)
            if record["kind"] == kind or (kind == "price" and record["kind"] == "trailer"):
                if kind == "price":  # no price in this store: add a bad one before the trailer
                    edited.append(json.dumps({"kind": "price", "row": {"model": "m", "input_per_million": -1,
                                                                       "output_per_million": 1}}))  # fmt: skip
                    record["lines"] += 1
                else:
                    record["row"].update(bad)
            edited.append(json.dumps(record))
        with pytest.raises(InvalidValueError, match="nothing was imported"):
            await store.import_lines(edited)
        assert (await store.list_sessions(user_id="ann")).items == []  # the session did not come back either
