"""Alembic is the only schema authority: upgrade/downgrade on both backends, models match head."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Message
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from helpers import rows
from sqlalchemy import inspect, text

from agent_store import (
    InvalidValueError,
    SchemaOutOfDateError,
    SchemaTooNewError,
    StorageUnavailableError,
    Store,
)
from agent_store.db.engine import migrations_dir
from agent_store.db.history_tables import PG_ID_INDEX, PG_KEY_INDEX, SQLITE_KEY_INDEX, SQLITE_SESSION_INDEX
from agent_store.db.tables import SCHEMA_REVISION, Base
from agent_store.errors import DatabaseError

ROOT = Path(__file__).resolve().parent.parent
TABLES = set(Base.metadata.tables)
# Search's objects (migration 0007) that the ORM does not model: SQLite's FTS5 table and its shadow tables,
# PostgreSQL's trigram and full-text indexes.
SEARCH_OBJECTS = ("agent_messages_fts", "ix_agent_messages_text_")
MESSAGE_ID_INDEX = "ix_agent_messages_session_id_message_id"
SCHEMA_REVISION_BEFORE_HEAD = "0016"  # the code needs 0017's base_id: on 0016 a load fails


async def table_names(store: Store) -> set[str]:
    async with store.engine.connect() as conn:
        names = set(await conn.run_sync(lambda c: inspect(c).get_table_names())) - {"alembic_version"}
    return {n for n in names if not n.startswith(SEARCH_OBJECTS)}


def modelled(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    return not (name or "").startswith(SEARCH_OBJECTS)


def test_the_code_expects_the_scripts_head() -> None:
    assert ScriptDirectory(str(migrations_dir())).get_current_head() == SCHEMA_REVISION


async def test_upgrade_downgrade_upgrade(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        assert await table_names(store) == TABLES
        await store.downgrade("base")
        assert await table_names(store) == set()
        await store.migrate()
        assert await table_names(store) == TABLES
        async with store.session("s", user_id="u") as session:
            session.state["ok"] = True


async def test_the_orm_models_match_the_head_schema(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        postgres = store.engine.dialect.name == "postgresql"

        def compared(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
            # PostgreSQL keys the message id's unique index by its MD5 (0011); a response key's index is a hash
            # index there and an index of key_hash on SQLite, and a response's primary key differs (0021): checked
            # below, not by the ORM.
            dialects_own = (MESSAGE_ID_INDEX, SQLITE_KEY_INDEX, SQLITE_SESSION_INDEX) if postgres else (
                PG_KEY_INDEX, PG_ID_INDEX)
            return modelled(obj, name, type_, reflected, compare_to) and name not in dialects_own

        def diff(sync_conn: Any) -> list[Any]:
            context = MigrationContext.configure(sync_conn, opts={"compare_type": True, "include_object": compared})
            return list(compare_metadata(context, Base.metadata))

        async with store.engine.connect() as conn:
            assert await conn.run_sync(diff) == []
        if postgres:
            query = "SELECT indexdef FROM pg_indexes WHERE indexname = :n"
            assert await rows(store, query, n=MESSAGE_ID_INDEX) == [(
                "CREATE UNIQUE INDEX ix_agent_messages_session_id_message_id ON public.agent_messages USING btree "
                "(session_id, ((md5((message_id)::text))::uuid))",
            )]  # fmt: skip
            assert await rows(store, query, n="ix_agent_responses_response_id") == [(
                "CREATE INDEX ix_agent_responses_response_id ON public.agent_responses USING hash (response_id)",)]
            assert await rows(store, query, n="pk_agent_responses") == [(
                "CREATE UNIQUE INDEX pk_agent_responses ON public.agent_responses USING btree (session_id, id)",)]
            assert await rows(store, query, n=PG_ID_INDEX) == [(
                "CREATE INDEX ix_agent_responses_id ON public.agent_responses USING btree (id)",)]
        else:
            query = "SELECT sql FROM sqlite_master WHERE tbl_name = 'agent_responses' AND type = 'index'"
            assert sorted(await rows(store, query)) == [
                ("CREATE INDEX ix_agent_responses_key_hash ON agent_responses (key_hash)",),
                ("CREATE INDEX ix_agent_responses_session_id ON agent_responses (session_id)",),
            ]
            table = (await rows(store, "SELECT sql FROM sqlite_master WHERE name = 'agent_responses'"))[0][0]
            assert "id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT," in table  # the rowid, never reused


async def test_alembic_upgrade_head_from_the_repo_root(url: str) -> None:
    env = {**os.environ, "AGENT_STORE_URL": url}
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    async with Store.from_url(url) as store:
        assert await table_names(store) == TABLES
        async with store.session("s", user_id="u") as session:
            session.state["ok"] = True


async def test_a_store_on_an_empty_database_says_how_to_upgrade(url: str) -> None:
    async with Store.from_url(url) as store:
        with pytest.raises(SchemaOutOfDateError, match="agent-store upgrade"):
            async with store.session("s"):
                pass


def older_revisions() -> list[str]:
    script = ScriptDirectory(str(migrations_dir()))
    return ["base", *(r.revision for r in script.walk_revisions() if r.revision != SCHEMA_REVISION)]


@pytest.mark.parametrize("revision", older_revisions())
async def test_a_database_behind_head_says_how_to_upgrade(url: str, revision: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        await store.downgrade(revision)
    async with Store.from_url(url) as store:
        with pytest.raises(SchemaOutOfDateError, match="agent-store upgrade"):
            async with store.session("s"):
                pass


async def test_a_store_opened_without_the_check_stays_so_after_migrating(url: str) -> None:
    """``check_schema=False`` (the CLI's): a migration to an older revision does not turn the check back on.

    The code reads 0017's branch column: on an older schema a load fails on the database's own error, not on the
    schema check, and a migration back to head brings it back."""
    async with Store.from_url(url, check_schema=False) as store:
        await store.migrate()
        await store.downgrade(SCHEMA_REVISION_BEFORE_HEAD)
        with pytest.raises((DatabaseError, StorageUnavailableError), match="base_id"):
            await store.load("s", user_id="u")
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["ok"] = True
        assert (await store.load("s", user_id="u")).session.state["ok"] is True


async def test_deletes_and_a_re_stored_id_behave_alike_on_heads_commit_paths(url: str) -> None:
    """0012's function skips the state deletes when the call says ``no_deletes`` and leaves a stored id to the
    unique index. (The code no longer runs on 0011's function: it reads 0013's columns.)"""
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state.update({"gone": 1, "kept": 2, "user:gone": 3})
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["first"]))
            first = session.state["in_memory"]["messages"][0]
        async with store.session("s", user_id="u") as session:
            del session.state["gone"], session.state["user:gone"]
            session.state["new"] = 4
        async with store.session("s", user_id="u") as session:
            session.state["kept"] = 5  # deletes nothing: the flag is sent
        state = (await store.load("s", user_id="u")).session.state
        assert {k: v for k, v in state.items() if k != "in_memory"} == {"kept": 5, "new": 4}
        with pytest.raises(InvalidValueError, match="already stored"):
            async with store.session("s", user_id="u", history_limit=0) as session:
                session.state["in_memory"]["messages"].append(first)  # outside the window: not known as loaded
        assert await rows(store, "SELECT count(*), max(version) FROM agent_messages, agent_sessions") == [(1, 3)]


async def test_a_database_ahead_of_the_code_is_refused(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
            await conn.execute(text("UPDATE agent_schema_compat SET oldest_code = '9999'"))  # it breaks this code
    async with Store.from_url(url) as store:
        with pytest.raises(SchemaTooNewError, match=r"revision 9999, which this agent_store does not know.*upgrade "
                                                    r"the agent-store package"):  # fmt: skip
            async with store.session("s"):
                pass


def test_the_wheel_ships_the_migrations(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("agent_store-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "agent_store/migrations/env.py",
        "agent_store/migrations/versions/0001_initial.py",
        "agent_store/migrations/script.py.mako",
    } <= names


async def test_data_survives_a_downgrade_and_upgrade_of_the_newest_revision(url: str) -> None:
    """SQLite batch migrations rebuild tables by copy-and-drop; with foreign keys on that would cascade-delete."""
    script = ScriptDirectory(str(migrations_dir()))
    previous = script.get_revision(SCHEMA_REVISION).down_revision
    assert isinstance(previous, str)
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.session("kept", user_id="u") as session:
            session.state["k"] = "v"
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["still here"]))
        run = await store.load("kept", user_id="u")
        run.add_usage({"input_token_count": 12, "output_token_count": 3})  # a run log row and a ledger row
        run.session.state["k"] = "w"
        await run.commit()
        logged = "SELECT * FROM agent_runs ORDER BY version"
        ledger = "SELECT * FROM agent_usage ORDER BY run_id, call_no"
        async with store.engine.connect() as conn:
            before = [(await conn.execute(text(q))).all() for q in (logged, ledger)]
            assert len(before[0]) == 2 and len(before[1]) == 1
        await store.downgrade(previous)
        await store.migrate()
        async with store.engine.connect() as conn:
            assert (await conn.execute(text("SELECT text FROM agent_messages"))).scalars().all() == ["still here"]
            assert (await conn.execute(text("SELECT key FROM agent_state"))).scalars().all() == ["k"]
            assert [(await conn.execute(text(q))).all() for q in (logged, ledger)] == before
            if conn.dialect.name == "sqlite":  # 0022: the run log and the ledger are stored in their keys
                tables = "SELECT sql FROM sqlite_schema WHERE name IN ('agent_runs', 'agent_usage')"
                assert all("WITHOUT ROWID" in sql for sql in (await conn.execute(text(tables))).scalars())


async def test_a_sqlite_upgrade_waits_for_a_writer_instead_of_failing(tmp_path: Path) -> None:
    """A migration takes SQLite's write lock up front: begun deferred, it read first and then could not take the
    lock an app had written past, and failed at once with "database is locked" (found by the review of 0022)."""
    import sqlite3
    import threading

    path = tmp_path / "live.db"
    url = f"sqlite+aiosqlite:///{path}"
    async with Store.from_url(url) as store:
        await store.migrate()
        await store.downgrade(str(ScriptDirectory(str(migrations_dir())).get_revision(SCHEMA_REVISION).down_revision))
    stop, writes = threading.Event(), [0]

    def writer() -> None:  # an app writing all the while, each write its own short transaction
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS app_notes (n INTEGER)")
        while not stop.is_set():
            conn.execute("INSERT INTO app_notes VALUES (1)")
            writes[0] += 1
        conn.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        async with Store.from_url(url) as store:
            for _ in range(5):
                await store.downgrade(str(ScriptDirectory(str(migrations_dir())).get_revision(SCHEMA_REVISION)
                                          .down_revision))  # fmt: skip
                await store.migrate()
            assert await store.db.revision() == SCHEMA_REVISION
    finally:
        stop.set()
        thread.join()
    assert writes[0] > 0
