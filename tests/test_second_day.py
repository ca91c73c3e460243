"""An operator's smaller frictions (issue 42 point 7), on both backends: a usage report asked for an empty span
says so; a second user who picks a session id already taken is told ids are shared; a listing with no user says
what it lists; the library creates no SQLite file by reading a path where none is."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_framework import Agent
from cli_support import cli, ok

from agent_store import SchemaOutOfDateError, SessionNotFoundError, Store
from agent_store.offline import OfflineChatClient


async def test_a_usage_report_for_an_empty_span_is_refused(store: Store, url: str, tmp_path: Path) -> None:
    empty = cli("usage", "--since", "7d", "--until", "8d", url=url, cwd=tmp_path)
    assert empty.returncode == 1 and "--since (7d) is not before --until (8d)" in empty.stderr
    assert ok(cli("usage", "--since", "8d", "--until", "7d", url=url, cwd=tmp_path)).startswith("USER")


async def test_a_second_user_who_picks_a_taken_id_is_told_ids_are_shared(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot")
    async with store.session("chat-1", user_id="ann") as session:
        await agent.run("我叫安", session=session)
    with pytest.raises(SessionNotFoundError, match=r"session ids are shared by all users.*UUID"):
        async with store.session("chat-1", user_id="bob"):
            pass
    assert (await store.list_sessions()).items == []  # no user given: the sessions that have no user
    assert [s.id for s in (await store.list_sessions(all_users=True)).items] == ["chat-1"]


async def test_the_library_creates_no_sqlite_file_by_reading(tmp_path: Path) -> None:
    path = tmp_path / "mistyped.db"
    async with Store.from_url(f"sqlite+aiosqlite:///{path}") as store:
        for read in (lambda: store.list_sessions(user_id="u"), store.warm_up, store.ready):
            with pytest.raises(SchemaOutOfDateError, match=r"no SQLite database at .*none was created.*migrate"):
                await read()
        assert not path.exists() and not any(p.name.startswith("mistyped") for p in tmp_path.glob("*"))  # noqa: ASYNC240
        await store.migrate()  # a migration creates it
        assert path.exists() and (await store.list_sessions(user_id="u")).items == []
