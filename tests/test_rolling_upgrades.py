"""Rolling upgrades (issue 42 point 2), on both backends: the schema says which older code runs on it
(``agent_schema_compat.oldest_code``, migration 0020). Code opens a newer schema that keeps it working, and refuses
one that does not, saying which code it needs; and the previous release's code (its own files, from git) runs
its turns on the schema this release migrates to."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from agent_framework import Agent
from agent_framework_hosting import AgentState
from helpers import rows
from sqlalchemy import text

from agent_store import SchemaTooNewError, Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.db.tables import SCHEMA_REVISION
from agent_store.offline import OfflineChatClient

ROOT = Path(__file__).resolve().parent.parent
# The releases before this one: the last landing before migration 0020 (its code is at schema 0019), and the last
# before 0021 (at 0020: the first to read the rule).
PREVIOUS_RELEASE = "73210434cc6202d2e884484c3d4dba39951eda83"
RELEASE_0020 = "42425fe4040503527370dc7fe76fa2429639339f"
FUTURE = f"{int(SCHEMA_REVISION) + 1:04d}"


async def pretend_newer(url: str, oldest: str) -> None:
    """The database as a later release's migrations would leave it: a revision this code does not know."""
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})
            await conn.execute(text("UPDATE agent_schema_compat SET oldest_code = :o"), {"o": oldest})


async def test_a_newer_schema_that_only_added_keeps_this_code_working(url: str) -> None:
    await pretend_newer(url, oldest=SCHEMA_REVISION)
    async with Store.from_url(url) as store:
        await store.warm_up()
        async with store.session("s", user_id="u") as session:
            await Agent(client=OfflineChatClient(), name="Bot").run("我叫李明", session=session)
        assert [m.text for m in await store.messages("s", user_id="u")] == ["我叫李明", "你好，李明！很高兴认识你。"]
        with pytest.raises(SchemaTooNewError, match=f"{FUTURE}.*does not know"):
            await store.migrate()  # migrating is another matter: this code has not the newer revision's scripts


async def test_a_newer_schema_that_breaks_this_code_is_refused_naming_the_code_it_needs(url: str) -> None:
    await pretend_newer(url, oldest=FUTURE)
    async with Store.from_url(url) as store:
        with pytest.raises(SchemaTooNewError, match=f"needs agent_store code at schema {FUTURE} or newer"):
            async with store.session("s", user_id="u"):
                pass
    async with Store.from_url(url) as store:  # a newer schema from before the rule (no table): refused
        async with store.engine.begin() as conn:
            await conn.execute(text("DROP TABLE agent_schema_compat"))
    async with Store.from_url(url) as store:
        with pytest.raises(SchemaTooNewError, match="upgrade the agent-store package"):
            await store.warm_up()


def previous_release(tmp_path: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """A previous release's agent_store package and migrations, as git has them."""
    archive = tmp_path / f"{commit}.tar"
    try:
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), commit, "agent_store", "migrations"],
                       check=True, capture_output=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"git cannot give the previous release {commit[:12]} ({exc}): a clone with history")
    target = tmp_path / commit
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target


OLD_CODE_RUN = """
import asyncio, sys
from agent_framework import Agent
from agent_store import Store
from agent_store.db.tables import SCHEMA_REVISION
from agent_store.offline import OfflineChatClient

async def main(url):
    assert SCHEMA_REVISION == "0019", SCHEMA_REVISION  # the previous release's own code
    agent = Agent(client=OfflineChatClient(), name="Bot")
    async with Store.from_url(url, check_schema=False) as store:  # it does not read the rule (before 0020)
        for sid in ("old-1", "old-2"):
            async with store.session(sid, user_id="u") as session:
                session.state["turns"] = session.state.get("turns", 0) + 1
                await agent.run("我叫李明", session=session)
            async with store.session(sid, user_id="u") as session:
                await agent.run("我叫什么名字？", session=session)
        print([m.text for m in await store.messages("old-1", user_id="u")][-1])
        print(len((await store.list_sessions(user_id="u")).items))
        print(len([line async for line in store.export(user_id="u")]))
        print((await store.search("李明", user_id="u")).items[0].session_id)
        print((await store.erase_user("gone")).sessions, await store.purge_expired())

asyncio.run(main(sys.argv[1]))
"""


async def test_the_previous_release_runs_on_this_release_s_schema(url: str, tmp_path: Path) -> None:
    old = previous_release(tmp_path)
    async with Store.from_url(url) as store:
        await store.migrate()  # this release's migrations
    env = {**os.environ, "PYTHONPATH": str(old)}
    done = subprocess.run([sys.executable, "-c", OLD_CODE_RUN, url], env=env, cwd=old, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.split("\n")
    assert said[:2] == ["你叫李明。", "2"] and int(said[2]) > 8 and said[3].startswith("old-") and said[4] == "0 0"
    async with Store.from_url(url) as store:  # and this release reads what the old code wrote
        assert (await store.load("old-2", user_id="u")).session.state["turns"] == 1
        assert len(await store.messages("old-2", user_id="u")) == 4


OLD_CHAIN_RUN = """
import asyncio, sys
from agent_framework import Agent
from agent_framework_hosting import AgentState
from agent_store import SchemaTooNewError, Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.db.tables import SCHEMA_REVISION
from agent_store.offline import OfflineChatClient

async def main(url):
    assert SCHEMA_REVISION == "0020", SCHEMA_REVISION  # the release before 0021, which reads the rule
    try:
        async with Store.from_url(url) as store:
            await store.warm_up()
    except SchemaTooNewError as exc:
        print("refused:", exc)
    async with Store.from_url(url, check_schema=False) as store:  # an operator's override
        agent = Agent(client=OfflineChatClient(), name="Bot")
        state = AgentState(agent, session_store=StoreSessionStore(store, user_id="u"))
        keys = []
        for n, words in enumerate(("我叫李明", "今天天气很好", "我叫什么名字？")):
            session = await state.get_or_create_session(keys[-1] if keys else "r0")
            await (await state.get_target()).run(words, session=session)
            keys.append(f"r{n}")
            await state.set_session(keys[-1], session)
        print(" ".join(keys))

asyncio.run(main(sys.argv[1]))
"""


async def test_the_release_before_0021_is_refused_and_its_chain_still_reads_back(url: str, tmp_path: Path) -> None:
    """0021 names a parent by its row, which the code before it does not read (it would show and export this
    code's rows without parents): ``oldest_code`` 0021 makes it refuse the schema, naming the code it needs. Run
    anyway (``check_schema=False``, or a worker started before the upgrade), it writes the parent's key, which this
    code reads."""
    old = previous_release(tmp_path, RELEASE_0020)
    async with Store.from_url(url) as store:
        await store.migrate()
    done = subprocess.run([sys.executable, "-c", OLD_CHAIN_RUN, url], env={**os.environ, "PYTHONPATH": str(old)},
                          cwd=old, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.strip().split("\n")
    assert said[0].startswith("refused:") and "needs agent_store code at schema 0021 or newer" in said[0], said
    assert said[1].split() == ["r0", "r1", "r2"]
    async with Store.from_url(url) as store:
        tree = {n.response_id: n.parent_id for n in await store.tree("r0", user_id="u") if n.response_id}
        assert tree == {"r0": None, "r1": "r0", "r2": "r1"}
        parents = await rows(store, "SELECT response_id, parent, parent_id FROM agent_responses ORDER BY id")
        assert parents == [("r0", None, None), ("r1", None, "r0"), ("r2", None, "r1")]  # by key, as it wrote them
        # and this code continues the old code's chain, naming the parent by its row
        state = AgentState(Agent(client=OfflineChatClient(), name="Bot"),
                           session_store=StoreSessionStore(store, user_id="u"))  # fmt: skip
        session = await state.get_or_create_session("r2")
        answer = await (await state.get_target()).run("我叫什么名字？", session=session)
        assert answer.text == "你叫李明。"
        await state.set_session("r3", session)
        (parent,) = (await rows(store, "SELECT parent FROM agent_responses WHERE response_id = 'r3'"))[0]
        assert await rows(store, "SELECT response_id FROM agent_responses WHERE id = :p", p=parent) == [("r2",)]
