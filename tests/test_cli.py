"""The `agent-store` command line, through its real entry point in a subprocess, on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_framework import Agent, tool

from agent_store import Store
from agent_store.offline import OfflineChatClient


def cli(*args: str, url: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENT_STORE_URL": url}
    return subprocess.run([sys.executable, "-m", "agent_store", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress bar or chatter when not on a terminal
    return done.stdout


@tool
def weather() -> str:
    """Today's weather."""
    return "晴"


@pytest.fixture
async def filled(store: Store) -> Store:
    agent = Agent(client=OfflineChatClient(), name="Bot", tools=[weather])
    for sid, user, words in (("chat-1", "li", ["我叫李明", "call weather"]), ("chat-2", "li", ["hi"]),
                             ("chat-3", "wang", ["hello"])):  # fmt: skip
        async with store.session(sid, user_id=user) as session:
            for w in words:
                await agent.run(w, session=session)
    await store.update("chat-1", user_id="li", title="天气", metadata={"topic": "weather"})
    return store


async def test_sessions_lists_a_table_or_json_with_filters(filled: Store, url: str, tmp_path: Path) -> None:
    table = ok(cli("sessions", "--user", "li", url=url, cwd=tmp_path)).splitlines()
    assert table[0].split() == ["ID", "USER", "TITLE", "MESSAGES", "UPDATED", "STATUS"]
    assert [line.split()[0] for line in table[1:]] == ["chat-1", "chat-2"]  # chat-1 was retitled last
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
    assert branch.strip() == "branch"
    assert [m.seq for m in await filled.messages("branch", user_id="li")] == [0, 1]
    assert ok(cli("purge", url=url, cwd=tmp_path)).strip() == "purged 0 expired sessions"
    refused = cli("erase-user", "li", url=url, cwd=tmp_path, stdin="")
    assert refused.returncode != 0 and "--yes" in refused.stderr
    report = json.loads(ok(cli("erase-user", "li", "--yes", "--json", url=url, cwd=tmp_path)))
    assert (report["sessions"], report["messages"]) == (3, 10)
    figures = json.loads(ok(cli("stats", "--json", url=url, cwd=tmp_path)))
    assert figures["rows"]["agent_sessions"] == 1 and figures["busiest"][0]["id"] == "chat-3"
    assert all(size > 0 for size in figures["bytes"].values())
    human = ok(cli("stats", url=url, cwd=tmp_path))
    assert "agent_messages" in human and "busiest sessions:" in human


def test_failures_exit_non_zero_with_one_line(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/empty.db"
    for args in (["sessions"], ["show", "x"], ["fork", "x"], ["export"]):
        done = cli(*args, url=url, cwd=tmp_path)
        assert done.returncode == 1, args
        assert done.stderr.strip().count("\n") == 0 and "SchemaOutOfDateError" in done.stderr, args


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
    }
    demo = json.loads(ok(cli("demo", "--json", url=f"sqlite+aiosqlite:///{tmp_path}/demo.db", cwd=tmp_path)))
    assert demo["ok"] is True and any("李明" in line for line in demo["output"])


def test_an_upgrade_below_the_current_revision_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/at-head.db"
    ok(cli("upgrade", url=url, cwd=tmp_path))
    done = cli("upgrade", "0002", url=url, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    assert "downgrade" in done.stderr and "schema at" not in done.stdout
