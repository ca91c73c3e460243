"""A newcomer's first day, tried as one would (issue 57 item 9), on both backends: each friction an outside try
met, now said plainly, lined up, counted or refused."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from agent_framework import Agent, AgentSession
from agent_framework_hosting import AgentState
from cli_support import cli, ok
from helpers import raw_connect, rows
from sqlalchemy.ext.asyncio import create_async_engine
from test_conversation_trees import _tree

from agent_store import BudgetExceededError, StorageUnavailableError, Store
from agent_store.agent_framework import StoreSessionStore, UsageRecorder
from agent_store.offline import OfflineChatClient


def talker() -> Agent:
    return Agent(client=OfflineChatClient(), name="Bot", middleware=[UsageRecorder()])


async def test_an_unknown_id_is_told_how_to_find_ids_and_no_user_is_said_so(filled: Store, url: str,
                                                                           tmp_path: Path) -> None:  # fmt: skip
    for command in (["show", "c-1", "--user", "li"], ["delete", "c-1", "--user", "li", "--yes"]):
        told = cli(*command, url=url, cwd=tmp_path)
        assert told.returncode == 1 and "`agent-store sessions --user ID`" in told.stderr, told.stderr
        assert "to start a session" not in told.stderr
    nobody = cli("show", "c-1", url=url, cwd=tmp_path)
    assert "no session 'c-1' without a user" in nobody.stderr and "None" not in nobody.stderr


async def test_tree_rows_line_up_with_the_header_and_fork_says_what_it_made(store: Store, url: str,
                                                                           tmp_path: Path) -> None:  # fmt: skip
    await _tree(store)
    lines = ok(cli("tree", "r0", "--user", "u", url=url, cwd=tmp_path)).splitlines()
    header = lines[0]
    starts = [header.index(name) for name in ("BASE_SEQ", "SEQ_END", "PARENT")]
    assert len(lines) > 4
    for line in lines[1:]:
        cells = [line[start:].split("  ")[0] for start in starts]  # each column's cell begins under its name
        assert all(cell and not cell.startswith(" ") for cell in cells), (line, cells)
    said = ok(cli("fork", "r0", "--user", "u", url=url, cwd=tmp_path)).strip()
    assert said.startswith("forked r0 into ") and said.endswith("(a copy of its messages)")


async def test_usage_json_has_no_float_noise(store: Store, url: str, tmp_path: Path) -> None:
    async with store.session("s1", user_id="u") as session:
        await talker().run("我叫李明", session=session)
    async with store.engine.begin() as conn:  # the offline client names no model: the calls get one to price
        await conn.exec_driver_sql("UPDATE agent_usage SET model = 'm1'")
    ok(cli("price", "m1", "--input", "2.3", "--output", "0.7", url=url, cwd=tmp_path))
    (line,) = json.loads(ok(cli("usage", "--json", url=url, cwd=tmp_path)))["lines"]
    noisy = (line["input_tokens"] * 2.3 + line["output_tokens"] * 0.7) / 1_000_000.0
    assert repr(noisy) != repr(round(noisy, 9))  # (these prices make noise in floats: the test can fail)
    assert line["cost"] == round(noisy, 9)


async def test_a_budget_set_mid_period_counts_what_the_period_used(store: Store) -> None:
    async with store.session("s1", user_id="u") as session:
        await talker().run("我叫李明", session=session)
    spent = int((await rows(store, "SELECT sum(total_tokens) FROM agent_usage WHERE user_id = 'u'"))[0][0])
    assert spent > 0
    budget = await store.usage.set_budget(spent, user_id="u")  # set after the morning's calls
    assert budget.used == spent
    with pytest.raises(BudgetExceededError):
        async with store.session("s1", user_id="u"):
            pass
    assert (await store.usage.set_budget(spent + 1000, user_id="u")).used == spent  # a new limit keeps the use


async def test_the_hosting_routes_record_usage(store: Store) -> None:
    """AgentState.get_or_create_session, the agent's run and set_session (the hosting routes' own sequence)."""
    agent = talker()
    state = AgentState(agent, session_store=StoreSessionStore(store, user_id="u"))
    for turn, key in (("我叫李明", "r1"), ("我叫什么名字？", "r1")):
        session = await state.get_or_create_session(key)
        await (await state.get_target()).run(turn, session=session)
        await state.set_session(key, session)
    assert await rows(store, "SELECT count(*) FROM agent_usage WHERE user_id = 'u'") == [(2,)]


async def test_check_refuses_a_database_that_takes_no_writes(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
    if url.startswith("sqlite"):  # a read-only file (as a non-root user meets one): SQLite's read-only mode
        path = url.split(":///", 1)[1]
        engine = create_async_engine(f"sqlite+aiosqlite:///file:{path}?mode=ro&uri=true")
        async with Store(engine) as read_only:
            with pytest.raises(StorageUnavailableError, match="read-only"):
                await read_only.ready()
        return
    admin = await raw_connect(url)
    try:
        await admin.execute(f'ALTER DATABASE "{admin._params.database}" SET default_transaction_read_only = on')
    finally:
        await admin.close()
    refused = cli("check", url=url, cwd=tmp_path)
    assert refused.returncode == 1 and "read-only" in refused.stderr, refused.stderr


def test_postgresql_connection_errors_name_the_next_step(pg_url: str, tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port on this machine with nothing listening
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    down = cli("check", "--url", f"postgresql://postgres@127.0.0.1:{closed}/x", url=pg_url, cwd=tmp_path)
    assert "is the database server running" in down.stderr and "pg_isready" in down.stderr, down.stderr
    missing = pg_url.rsplit("/", 1)[0] + "/no_such_database_here"
    told = cli("check", "--url", missing, url=pg_url, cwd=tmp_path)
    assert "does not exist" in told.stderr and "createdb" in told.stderr, told.stderr


def test_erase_user_help_says_what_an_erasure_does(tmp_path: Path) -> None:
    said = ok(cli("erase-user", "--help", url="sqlite+aiosqlite:///unused.db", cwd=tmp_path))
    for part in ("checkpoints", "erasure fence", "restore --erasures-from", "keys are destroyed"):
        assert part in " ".join(said.split()), part


def test_the_demos_summary_ends_between_words(tmp_path: Path) -> None:
    said = ok(cli("demo", url=f"sqlite+aiosqlite:///{tmp_path}/d.db", cwd=tmp_path))
    (line,) = [line for line in said.splitlines() if "Summarizer:" in line]
    assert line.endswith("…") and line[:-1].endswith(("keep", "state", "Sessions", "across"))
    _ = AgentSession  # (the framework's own session type is what every route above stores)
