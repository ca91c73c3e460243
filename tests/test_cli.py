"""The `agent-store` command line, through its real entry point in a subprocess, on both backends."""

from __future__ import annotations

import json
from pathlib import Path

from cli_support import cli, ok
from helpers import rows

from agent_store import Store

_TABLES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'agent%' AND name NOT LIKE '%fts%'",
    "postgresql": "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
}


async def test_sessions_lists_a_table_or_json_with_filters(filled: Store, url: str, tmp_path: Path) -> None:
    table = ok(cli("sessions", "--user", "li", url=url, cwd=tmp_path)).splitlines()
    assert table[0].split() == ["ID", "USER", "AGENT", "TITLE", "MESSAGES", "UPDATED", "(UTC)", "STATUS"]
    assert [line.split()[0] for line in table[1:]] == ["chat-1", "chat-2"]  # chat-1 was retitled last
    assert [line.split()[-1] for line in table[1:]] == ["active", "active"]
    page = json.loads(ok(cli("sessions", "--user", "li", "--meta", "topic=weather", "--json", url=url, cwd=tmp_path)))
    assert [(s["id"], s["title"], s["message_count"]) for s in page["items"]] == [("chat-1", "天气", 6)]
    everyone = json.loads(ok(cli("sessions", "--all-users", "--json", url=url, cwd=tmp_path)))
    assert len(everyone["items"]) == 3


async def test_show_prints_roles_authors_and_tool_calls(filled: Store, url: str, tmp_path: Path) -> None:
    out = ok(cli("show", "chat-1", "--user", "li", url=url, cwd=tmp_path))
    assert "title: 天气" in out
    assert "assistant (Bot)" in out and "你好，李明！很高兴认识你。" in out
    assert "-> call weather({})" in out and "<- result [" in out and "]: 晴" in out
    transcript = json.loads(ok(cli("show", "chat-1", "--user", "li", "--json", url=url, cwd=tmp_path)))
    assert [m["seq"] for m in transcript["messages"]] == list(range(6))
    for command in (["show", "chat-1"], ["fork", "chat-1"], ["export", "--session", "chat-1"]):
        other = cli(*command, "--user", "wang", url=url, cwd=tmp_path)  # another user's session
        assert other.returncode == 1 and "SessionNotFoundError" in other.stderr and "Traceback" not in other.stderr
    assert (
        json.loads(ok(cli("sessions", "--user", "wang", "--json", url=url, cwd=tmp_path)))["items"][0]["id"] == "chat-3"
    )


async def test_export_then_import_into_another_database(filled: Store, url: str, tmp_path: Path) -> None:
    dump = tmp_path / "li.jsonl"
    ok(cli("export", "--user", "li", "-o", str(dump), url=url, cwd=tmp_path))
    kinds = [json.loads(line)["kind"] for line in dump.read_text(encoding="utf-8").splitlines()]
    assert kinds.count("session") == 2 and kinds[0] == "header"
    target = f"sqlite+aiosqlite:///{tmp_path}/target.db"
    ok(cli("upgrade", url=target, cwd=tmp_path))
    assert ok(cli("import", str(dump), url=target, cwd=tmp_path)).strip() == "imported 2, skipped 0"
    assert ok(cli("import", str(dump), url=target, cwd=tmp_path)).strip() == "imported 0, skipped 2"
    single = ok(cli("export", "--user", "li", "--session", "chat-1", url=target, cwd=tmp_path))
    original = [
        line
        for line in dump.read_text(encoding="utf-8").splitlines()[1:]
        if '"session_id": "chat-1"' in line or ('"kind": "session"' in line and '"id": "chat-1"' in line)
    ]
    # Row for row, except the conflict tokens: an import gets a fresh incarnation and fresh state stamps.
    assert _tokens(single.splitlines()[1:-1]) != _tokens(original)
    assert _without_tokens(single.splitlines()[1:-1]) == _without_tokens(original)
    assert json.loads(single.splitlines()[-1])["kind"] == "trailer"


def _tokens(lines: list[str]) -> list[object]:
    records = [json.loads(line) for line in lines]
    return [r["row"].get("incarnation") if r["kind"] == "session" else r["row"]["version"]
            for r in records if r["kind"] in ("session", "state")]  # fmt: skip


def _without_tokens(lines: list[str]) -> list[dict[str, object]]:
    records = [json.loads(line) for line in lines]
    for r in records:
        if r["kind"] == "session":
            del r["row"]["incarnation"]
        elif r["kind"] == "state":
            del r["row"]["version"]
    return records


async def test_fork_purge_erase_and_stats(filled: Store, url: str, tmp_path: Path) -> None:
    branch = ok(cli("fork", "chat-1", "--user", "li", "--at-seq", "1", "--new-id", "branch", url=url, cwd=tmp_path))
    assert branch.strip() == "forked chat-1 into branch (a copy of its messages up to seq 1)"
    assert [m.seq for m in await filled.messages("branch", user_id="li")] == [0, 1]
    assert ok(cli("purge", url=url, cwd=tmp_path)).strip() == "purged 0 expired sessions"
    refused = cli("erase-user", "li", url=url, cwd=tmp_path, stdin="")
    assert refused.returncode != 0 and "--yes" in refused.stderr
    report = json.loads(ok(cli("erase-user", "li", "--yes", "--json", url=url, cwd=tmp_path)))
    assert (report["sessions"], report["messages"]) == (3, 10)
    figures = json.loads(ok(cli("stats", "--json", url=url, cwd=tmp_path)))
    assert figures["rows"]["agent_sessions"] == 1 and figures["busiest"][0]["id"] == "chat-3"
    every_table = await rows(filled, _TABLES[filled.engine.dialect.name])
    assert set(figures["rows"]) == {name for (name,) in every_table} - {"alembic_version"}
    assert figures["rows"]["agent_tool_calls"] == 0 and figures["rows"]["agent_runs"] == 1  # erased with li
    assert set(figures["bytes"]) >= set(figures["rows"]) | {"database"}  # bytes on both backends
    assert figures["bytes"]["agent_messages"] > 0 and figures["bytes"]["database"] >= figures["bytes"]["agent_messages"]
    human = ok(cli("stats", url=url, cwd=tmp_path))
    assert "agent_messages" in human and "agent_ui_snapshots" in human and "busiest sessions:" in human


async def test_every_command_answers_in_json(filled: Store, url: str, tmp_path: Path) -> None:
    dump = tmp_path / "all.jsonl"
    commands = [
        ["check"], ["upgrade"], ["sessions", "--user", "li"], ["show", "chat-1", "--user", "li"],
        ["export", "--user", "li", "-o", str(dump)], ["fork", "chat-1", "--user", "li", "--new-id", "b"],
        ["stats"], ["purge"], ["erase-user", "nobody", "--yes"],
    ]  # fmt: skip
    for command in commands:
        assert isinstance(json.loads(ok(cli(*command, "--json", url=url, cwd=tmp_path))), dict), command
    assert json.loads(ok(cli("import", str(dump), "--json", url=url, cwd=tmp_path))) == {
        "imported": 0,
        "skipped": 2,
        "checkpoints": 0,
        "hosted_responses": 0,
    }
    demo = json.loads(ok(cli("demo", "--json", url=f"sqlite+aiosqlite:///{tmp_path}/demo.db", cwd=tmp_path)))
    assert demo["ok"] is True and any("李明" in line for line in demo["output"])


def test_an_upgrade_below_the_current_revision_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/at-head.db"
    ok(cli("upgrade", url=url, cwd=tmp_path))
    done = cli("upgrade", "0002", url=url, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    assert "downgrade" in done.stderr and "schema at" not in done.stdout
