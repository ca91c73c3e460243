"""A session's lifecycle from the shell: update, truncate, clear, close, delete, downgrade, cross-user search.

Through the real entry point in a subprocess, on both backends; each command's effect is read back with the
library (or the database), never from the command's own output alone.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from agent_framework import Agent
from cli_support import cli, ok

from agent_store import SessionClosedError, SessionNotFoundError, Store
from agent_store.offline import OfflineChatClient


async def test_update_changes_title_metadata_and_ttl(filled: Store, url: str, tmp_path: Path) -> None:
    changed = json.loads(ok(cli("update", "chat-2", "--user", "li", "--title", "问候", "--meta", "k=v", "--ttl", "3600",
                                "--json", url=url, cwd=tmp_path)))  # fmt: skip
    info = await filled.get("chat-2", user_id="li")
    assert (info.title, info.metadata, changed["title"]) == ("问候", {"k": "v"}, "问候")
    assert info.expires_at is not None and timedelta(minutes=59) < info.expires_at - info.updated_at <= timedelta(
        hours=1
    )
    ok(cli("update", "chat-2", "--user", "li", "--no-title", "--no-ttl", url=url, cwd=tmp_path))
    info = await filled.get("chat-2", user_id="li")
    assert (info.title, info.expires_at, info.metadata) == (None, None, {"k": "v"})
    for bad in (["--title", "a", "--no-title"], [], ["--ttl", "0"]):
        done = cli("update", "chat-2", "--user", "li", *bad, url=url, cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.startswith("Error: UsageError: ") and done.stderr.count("\n") == 1


async def test_truncate_and_clear_drop_messages_and_keep_the_session(filled: Store, url: str, tmp_path: Path) -> None:
    before = [m.seq for m in await filled.messages("chat-1", user_id="li")]
    assert before == list(range(6))
    report = json.loads(ok(cli("truncate", "chat-1", "--user", "li", "--after-seq", "1", "--json", url=url,
                               cwd=tmp_path)))  # fmt: skip
    assert report == {"ok": True, "id": "chat-1", "action": "truncated", "dropped": 4}
    assert [m.seq for m in await filled.messages("chat-1", user_id="li")] == [0, 1]
    assert ok(cli("clear", "chat-1", "--user", "li", url=url, cwd=tmp_path)).strip() == "cleared 2 messages of chat-1"
    assert await filled.messages("chat-1", user_id="li") == []
    assert (await filled.get("chat-1", user_id="li")).title == "天气"  # the session and its details stay


async def test_close_refuses_later_runs_and_delete_removes_everything(filled: Store, url: str, tmp_path: Path) -> None:
    assert ok(cli("close", "chat-2", "--user", "li", url=url, cwd=tmp_path)).strip() == "closed chat-2"
    with pytest.raises(SessionClosedError):
        async with filled.session("chat-2", user_id="li") as session:
            await Agent(client=OfflineChatClient()).run("again", session=session)
    assert "closed" in ok(cli("sessions", "--user", "li", "--status", "closed", url=url, cwd=tmp_path))
    listed = json.loads(ok(cli("--json", "sessions", "--user", "li", "--status", "active", url=url, cwd=tmp_path)))
    assert [s["id"] for s in listed["items"]] == ["chat-1"] and listed["items"][0]["status"] == "active"
    assert json.loads(ok(cli("delete", "chat-2", "--user", "li", "--json", url=url, cwd=tmp_path)))["ok"] is True
    with pytest.raises(SessionNotFoundError):
        await filled.get("chat-2", user_id="li")
    again = cli("delete", "chat-2", "--user", "li", "--json", url=url, cwd=tmp_path)
    assert again.returncode == 1 and json.loads(again.stdout)["error"] == "SessionNotFoundError"
    nobody = cli("delete", "chat-1", url=url, cwd=tmp_path)  # a user's session, without --user: a hint
    assert nobody.returncode == 1 and "--user" in nobody.stderr and nobody.stderr.count("\n") == 1
    assert (await filled.get("chat-1", user_id="li")).message_count == 6


async def test_an_operator_searches_across_users(filled: Store, url: str, tmp_path: Path) -> None:
    everyone = json.loads(ok(cli("search", "hello OR 李明", "--all-users", "--json", url=url, cwd=tmp_path)))
    assert {(h["session_id"], h["user_id"]) for h in everyone["items"]} == {("chat-1", "li"), ("chat-3", "wang")}
    table = ok(cli("search", "hello", "--all-users", url=url, cwd=tmp_path)).splitlines()
    assert table[0].split()[:2] == ["SESSION", "USER"] and table[1].split()[:2] == ["chat-3", "wang"]
    one = json.loads(ok(cli("search", "hello OR 李明", "--user", "li", "--json", url=url, cwd=tmp_path)))
    assert {h["session_id"] for h in one["items"]} == {"chat-1"}
    neither = cli("search", "hello", url=url, cwd=tmp_path)
    assert neither.returncode == 1 and "--all-users" in neither.stderr


def test_downgrade_asks_then_goes_back_and_upgrade_returns(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/d.db"
    ok(cli("upgrade", url=url, cwd=tmp_path))
    refused = cli("downgrade", "0012", url=url, cwd=tmp_path, stdin="")
    assert refused.returncode == 1 and "--yes" in refused.stderr
    assert json.loads(ok(cli("downgrade", "0012", "--yes", "--json", url=url, cwd=tmp_path)))["revision"] == "0012"
    behind = cli("check", "--json", url=url, cwd=tmp_path)
    assert behind.returncode == 1 and json.loads(behind.stdout)["error"] == "SchemaOutOfDateError"
    ok(cli("upgrade", url=url, cwd=tmp_path))
    assert json.loads(ok(cli("check", "--json", url=url, cwd=tmp_path)))["ok"] is True
