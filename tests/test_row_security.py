"""Row-level security (issue 41): plain SQL under the application's role sees only the rows of the user its
transaction names, on every table the policies cover; the library names the user in every transaction, the
one-round-trip commit and the one-statement load included; roles that would bypass the policies are refused at
start-up; and a mutation run shows that every policy, FORCE and the library's naming are each caught when broken.

PostgreSQL only: SQLite has no row-level security (its switch refuses, tested below on SQLite)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
from agent_framework import Agent, AgentSession, Message
from helpers import raw_connect
from rls_support import APP, COVERED, OWNER, VIEWS, Bed, fill, make_bed, named, read_bobs_rows, violations
from sqlalchemy import text

from agent_store import ConfigurationError, SessionNotFoundError, Store
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.db import tenancy
from agent_store.offline import OfflineChatClient


@pytest.fixture
async def bed(pg_url: str) -> AsyncIterator[Bed]:
    yield await make_bed(pg_url)


async def talk(store: Store, session_id: str, user: str, *turns: str) -> list[str]:
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])
    replies = []
    for turn in turns:
        async with store.session(session_id, user_id=user) as session:
            replies.append((await agent.run(turn, session=session)).text)
            session.state["turns"] = session.state.get("turns", 0) + 1
    return replies


async def library_violations(bed: Bed) -> list[str]:
    """What the library gets wrong under the application's role: a user's run that fails or forgets, another
    user's session read or written, or the user's name left on a pooled connection after its transaction.
    (Carol and Dave: the filled tables' alice and bob have budgets of 0 tokens.)"""
    found: list[str] = []
    async with Store.from_url(bed.app_url, pool_size=1, max_overflow=0) as store:
        try:
            replies = await talk(store, "lib_carol", "carol", "my name is Ann", "what is my name?")
            if "Ann" not in replies[-1]:
                found.append(f"carol's session forgot her name: {replies[-1]!r}")
        except Exception as exc:  # a mutant's failure is the finding
            found.append(f"carol's run failed: {type(exc).__name__}: {exc}")
        try:
            if (await store.load("lib_carol", user_id="dave")).history:
                found.append("dave read carol's messages")
            await talk(store, "lib_carol", "dave", "my name is Mallory")
            found.append("dave wrote into carol's session")
        except SessionNotFoundError:
            pass
        except Exception as exc:
            found.append(f"dave's run failed otherwise: {type(exc).__name__}")
        try:  # a commit with no model call: the other commit function
            plain = await store.load("lib_carol_plain", user_id="carol")
            plain.history.append(Message(role="user", contents=["hello"]))
            await plain.commit()
        except Exception as exc:  # a mutant's failure is the finding
            found.append(f"carol's plain commit failed: {type(exc).__name__}: {exc}")
        if [s.id for s in (await store.list_sessions(user_id="dave")).items]:  # a read in BEGIN ... COMMIT
            found.append("dave lists sessions he has none of")
        async with store.engine.connect() as conn:  # the pool's one connection, after the library's transactions
            left = (await conn.execute(text("SELECT current_setting('agent_store.user_id', true)"))).scalar()
        if left:
            found.append(f"the name {left!r} outlived its transaction on a pooled connection")
    return found


async def test_plain_sql_sees_only_the_named_users_rows_on_every_table(bed: Bed) -> None:
    await fill(bed)
    await read_bobs_rows(bed.admin_url)
    admin = await raw_connect(bed.admin_url)
    try:
        for table in COVERED:  # the operator's role bypasses: both users' rows and no user's are there
            assert await admin.fetchval(f'SELECT count(*) FROM "{table}"') == 3, table  # noqa: S608
    finally:
        await admin.close()
    assert await violations(bed.app_url) == []
    assert await violations(bed.owner_url) == []  # the tables' owner too (FORCE)


async def test_an_agent_remembers_under_the_application_role_and_no_one_else_sees_it(bed: Bed) -> None:
    async with Store.from_url(bed.app_url) as store:
        assert store.db.row_security is False  # not known before the first transaction
        replies = await talk(store, "s1", "alice", "my name is Ann", "what is my name?")
        assert "Ann" in replies[-1] and store.db.row_security is True
        await talk(store, "s2", "bob", "my name is Bob")
        loaded = await store.load("s1", user_id="alice")
        assert loaded.session.state["turns"] == 2
        theirs = await store.load("s1", user_id="bob")  # the row is there, but not his: he sees nothing
        assert theirs.history == [] and "turns" not in theirs.session.state
        with pytest.raises(SessionNotFoundError, match="no session 's1' for user 'bob'"):
            await talk(store, "s1", "bob", "my name is Mallory")  # and writes nothing into it
        assert [s.id for s in (await store.list_sessions(user_id="alice")).items] == ["s1"]
        assert [h.session_id for h in (await store.search("Ann", user_id="alice")).items] == ["s1"] * 3
        assert (await store.search("Ann", user_id="bob")).items == []
        assert len(await store.messages("s1", user_id="alice")) == 4
        assert await store.fork("s1", user_id="alice", new_id="s1b") == "s1b"
        assert await store.delete("s1b", user_id="alice")
        with pytest.raises(SessionNotFoundError):
            await store.get("s2", user_id="alice")
    plain = await raw_connect(bed.app_url)
    try:
        assert await plain.fetchval("SELECT count(*) FROM agent_messages") == 0  # no name, no rows
        async with plain.transaction():
            await plain.execute("SELECT set_config('agent_store.user_id', 'bob', true)")
            assert await plain.fetchval("SELECT count(*) FROM agent_messages") == 2
            assert await plain.fetchval("SELECT count(*) FROM agent_sessions") == 1
    finally:
        await plain.close()
    assert await library_violations(bed) == []


async def test_roles_that_would_bypass_the_policies_are_refused_at_start_up(bed: Bed) -> None:
    async with Store.from_url(bed.app_url) as store:
        await talk(store, "s1", "alice", "my name is Ann")
    async with Store.from_url(bed.admin_url) as superuser:  # a superuser, not said to be an operator
        with pytest.raises(ConfigurationError, match="superuser or has BYPASSRLS") as refused:
            await superuser.list_sessions(user_id="alice")
        assert "postgres" in str(refused.value)
    async with Store.from_url(bed.admin_url, operator=True) as operator:  # cross-user work: sees every user
        assert [s.id for s in (await operator.list_sessions(all_users=True)).items] == ["s1"]
    async with Store.from_url(bed.app_url, operator=True) as wrong:
        with pytest.raises(ConfigurationError, match="needs a role with BYPASSRLS"):
            await wrong.list_sessions(all_users=True)


async def test_a_replica_under_the_applications_role_lets_no_superuser_primary_through(bed: Bed) -> None:
    """Each connection's role is checked, not only the first one's: a replica read first, then a run's write."""
    async with Store.from_url(bed.admin_url, replica_url=bed.app_url) as store:
        assert (await store.list_sessions(user_id="alice")).items == []  # the replica's role is held: fine
        with pytest.raises(ConfigurationError, match="superuser or has BYPASSRLS"):
            await talk(store, "s1", "alice", "my name is Ann")
    async with Store.from_url(bed.app_url, replica_url=bed.admin_url) as store:  # and the other way round
        with pytest.raises(ConfigurationError, match="superuser or has BYPASSRLS"):
            await store.list_sessions(user_id="alice")


async def test_the_switch_turned_on_under_a_running_store_is_learned_at_its_first_refused_write(
    bed: Bed, tmp_path: Path
) -> None:
    """A store that started with the switch off names no one: once it is on, its next write is refused (typed,
    nothing kept) and every connection learns again, so the run after it is named; a new connection learns at once."""
    owner = await raw_connect(bed.owner_url)
    try:
        await owner.execute("SELECT agent_store_row_security(false)")
        async with Store.from_url(bed.app_url, pool_size=1, max_overflow=0) as store:
            assert "Ann" in (await talk(store, "s1", "alice", "my name is Ann", "what is my name?"))[-1]
            assert store.db.row_security is False
            await owner.execute("SELECT agent_store_row_security(true)")
            with pytest.raises(ConfigurationError, match="row-level security policy"):
                await talk(store, "s1", "alice", "my name is Mallory")  # read as no one: saw nothing, kept nothing
            assert "Ann" in (await talk(store, "s1", "alice", "what is my name?"))[-1]
            assert store.db.row_security is True
            await owner.execute("SELECT agent_store_row_security(false)")
            await store.engine.dispose()  # a new connection learns the switch off: no name needed, none refused
            assert "Ann" in (await talk(store, "s1", "alice", "what is my name?"))[-1]
            assert store.db.row_security is False
        assert await owner.fetchval("SELECT count(*) FROM agent_messages WHERE text LIKE '%Mallory%'") == 0
    finally:
        await owner.execute("SELECT agent_store_row_security(true)")
        await owner.close()


async def test_the_switch_from_the_command_line(bed: Bed, tmp_path: Path) -> None:
    from cli_support import cli, ok

    assert "on (forced); 23 tables with the policy" in ok(cli("rls", "status", url=bed.owner_url, cwd=tmp_path))
    assert f"role {OWNER} is held to it" in ok(cli("rls", "status", url=bed.owner_url, cwd=tmp_path))
    async with Store.from_url(bed.app_url) as store:
        await talk(store, "s1", "alice", "my name is Ann")
    plain = await raw_connect(bed.app_url)
    try:
        assert "row-level security: off" in ok(cli("rls", "off", url=bed.owner_url, cwd=tmp_path))
        assert await plain.fetchval("SELECT count(*) FROM agent_sessions") == 1  # off: the grants alone
        assert "on (forced)" in ok(cli("rls", "on", url=bed.owner_url, cwd=tmp_path))
        assert await plain.fetchval("SELECT count(*) FROM agent_sessions") == 0
    finally:
        await plain.close()
    refused = cli("rls", "off", url=bed.app_url, cwd=tmp_path)  # not the owner: PostgreSQL refuses
    assert refused.returncode != 0 and "owner" in refused.stderr
    sqlite = cli("rls", "on", url=f"sqlite:///{tmp_path}/s.db", cwd=tmp_path)
    assert sqlite.returncode != 0


def mutants() -> list[tuple[str, str, str]]:
    """(name, SQL that breaks, SQL that mends): each table's policy dropped, admitting every row, writing every
    row, or reading an empty name as a user's; the table's row-level security disabled, or not forced; each view
    reading as its owner."""
    found = []
    for table in COVERED:
        t = '"' + table + '"'
        found += [
            (f"{table}: policy dropped", f"DROP POLICY agent_store_tenant ON {t}", "CREATE POLICY"),
            (f"{table}: policy admits every row", f"ALTER POLICY agent_store_tenant ON {t} USING (true)", "USING"),
            (f"{table}: policy lets any row be written", f"ALTER POLICY agent_store_tenant ON {t} WITH CHECK (true)",
             "WITH CHECK"),
            (f"{table}: row-level security disabled", f"ALTER TABLE {t} DISABLE ROW LEVEL SECURITY",
             f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY"),
            (f"{table}: not forced", f"ALTER TABLE {t} NO FORCE ROW LEVEL SECURITY",
             f"ALTER TABLE {t} FORCE ROW LEVEL SECURITY"),
        ]  # fmt: skip
        if table not in THROUGH_SESSIONS:  # (theirs reads agent_sessions under its own policy: equivalent)
            found.append((f"{table}: an empty name is a user", EMPTY_IS_SOMEONE, "USING"))
    for function, calls in (("agent_store_commit_as", "agent_store_commit"),
                            ("agent_store_commit_usage_as", "agent_store_commit_usage")):  # fmt: skip
        found.append((f"{function}: names the user for the session",
                      COMMIT_AS.format(f=function, calls=calls, local="false"),
                      COMMIT_AS.format(f=function, calls=calls, local="true")))  # fmt: skip
    found.append(("agent_usage: a ledger row may hang on another user's run", USAGE_CHECKS_ONLY_ITS_USER, "WITH CHECK"))
    found += [(f"{view}: reads as its owner", f'ALTER VIEW "{view}" SET (security_invoker = false)',
               f'ALTER VIEW "{view}" SET (security_invoker = true)') for view in VIEWS]  # fmt: skip
    return found


EMPTY_IS_SOMEONE = "(the policy without NULLIF)"
USAGE_CHECKS_ONLY_ITS_USER = "(agent_usage's check without its run's session)"
COMMIT_AS = """CREATE OR REPLACE FUNCTION {f}(u text, a text, p jsonb) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('agent_store.user_id', u, {local}), set_config('agent_store.app_id', a, {local});
    RETURN {calls}(p);
END $$"""
THROUGH_SESSIONS = {
    "agent_messages",
    "agent_message_marks",
    "agent_branch_marks",
    "agent_runs",
    "agent_state",
    "agent_state_history",
    "agent_tool_calls",
    "agent_message_vectors",
    "agent_responses",
}


def _reads_name_the_session(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(tenancy, "LOCAL", "false")
    patch.setattr(tenancy, "_READS", {})


LIBRARY_MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "the library names no user": lambda mp: mp.setattr(tenancy, "named", lambda: {"user": ""}),
    "a one-statement read names the user for the session": _reads_name_the_session,
    "the name is set for the session, not the transaction": lambda mp: mp.setattr(tenancy, "NAME", text(
        "SELECT set_config('agent_store.user_id', :user, false), set_config('agent_store.app_id', :app, false)"))
}  # fmt: skip


async def test_the_mutation_run_catches_every_mutant(bed: Bed, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    await fill(bed)
    await read_bobs_rows(bed.admin_url)

    async def caught() -> list[str]:
        return [*await violations(bed.app_url), *await violations(bed.owner_url), *await library_violations(bed)]

    assert await caught() == []  # unbroken, nothing is found
    owner = await raw_connect(bed.admin_url)  # the superuser: the views are its
    killed, survivors = 0, []
    try:
        for name, breaks, mends in mutants():
            table = name.split(":")[0]
            qual, check = await owner.fetchrow(
                "SELECT qual, with_check FROM pg_policies WHERE policyname = 'agent_store_tenant' AND tablename = $1",
                table,
            ) or (None, None)  # fmt: skip  (a view: none)
            if breaks == EMPTY_IS_SOMEONE:  # the policy as it is, without NULLIF(..., ''): "" names the rows of ""
                loose = qual.replace("NULLIF(current_setting", "(current_setting").replace(", ''::text)", ")")
                assert loose != qual, qual
                breaks = f'ALTER POLICY agent_store_tenant ON "{table}" USING ({loose})'
            if breaks == USAGE_CHECKS_ONLY_ITS_USER:
                assert check and "agent_sessions" in check, check
                breaks = f'ALTER POLICY agent_store_tenant ON "{table}" WITH CHECK ({qual})'
            await owner.execute(breaks)
            found = await caught()
            await owner.execute(_mend(mends, table, qual, check))
            await _fresh_servers(owner, name)
            killed, survivors = (killed + 1, survivors) if found else (killed, [*survivors, name])
        for name, apply in LIBRARY_MUTANTS.items():
            with monkeypatch.context() as patch:
                apply(patch)
                found = await caught()
            await _fresh_servers(owner, name)
            killed, survivors = (killed + 1, survivors) if found else (killed, [*survivors, name])
        assert await caught() == []  # every mutant mended
    finally:
        await owner.close()
    total = len(mutants()) + len(LIBRARY_MUTANTS)
    with capsys.disabled():
        print(f"\nrow-level security mutation run: {killed} of {total} mutants killed")
    assert survivors == [] and killed == total == 138


async def _fresh_servers(owner: asyncpg.Connection, mutant: str) -> None:
    """After a mutant that named a user for the session: end the database's other server connections, which keep
    that name (through PgBouncer in transaction mode, no pool reset clears a server connection's settings)."""
    if "for the session" in mutant:
        await owner.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()")  # fmt: skip


def _mend(mends: str, table: str, qual: str, check: str | None) -> str:
    t = '"' + table + '"'
    # A FOR ALL policy checks writes with USING when it has no WITH CHECK (only agent_usage's has one).
    policy = f"CREATE POLICY agent_store_tenant ON {t} USING ({qual})" + (f" WITH CHECK ({check})" if check else "")
    if mends == "CREATE POLICY":
        return policy
    if mends in ("USING", "WITH CHECK"):
        return f"DROP POLICY agent_store_tenant ON {t}; {policy}"
    return mends


async def test_concurrent_users_never_see_each_others_rows_through_one_pool(bed: Bed) -> None:
    """Two users' runs interleaved on a pool of two connections: each transaction names its own user."""
    async with Store.from_url(bed.app_url, pool_size=2, max_overflow=0) as store:

        async def user(name: str) -> list[Any]:
            return [await talk(store, f"{name}_{i}", name, f"my name is {name.title()}", "what is my name?")
                    for i in range(4)]  # fmt: skip

        alice, bob = await asyncio.gather(user("alice"), user("bob"))
        assert all("Alice" in r[-1] for r in alice) and all("Bob" in r[-1] for r in bob)
        assert {s.id for s in (await store.list_sessions(user_id="bob")).items} == {f"bob_{i}" for i in range(4)}
    assert APP in bed.app_url


def test_every_table_that_names_a_user_or_a_session_is_covered() -> None:
    """A table a later migration adds with a user's rows must get a policy, and be in the switch, too."""
    from agent_store.db.tables import messages_t

    naming = {"user_id", "session_id", "app_id", "user_key", "subject"}
    holding = {t.name for t in messages_t.metadata.sorted_tables if naming & set(t.columns.keys())}
    assert holding | {"agent_ui_snapshots"} == set(COVERED)  # snapshots name their user in "scope"
    source = (Path(__file__).resolve().parent.parent / "migrations/versions/0024_row_security.py").read_text()
    switch = source.split("FOREACH t IN ARRAY ARRAY[")[1].split("]")[0]
    assert sorted(COVERED) == sorted(n.strip().strip("'") for n in switch.replace("\n", " ").split(","))


async def test_every_other_entry_point_names_its_user(bed: Bed) -> None:
    """The run journal, workflow checkpoints, AG-UI snapshots, budgets and the hosted responses under the
    application's role: each works for its user and shows nothing of the other's."""
    from agent_framework import WorkflowCheckpoint
    from agent_framework_ag_ui import AGUIThreadSnapshot
    from azure.ai.agentserver.responses import PlatformContext
    from test_hosted_responses import response, said

    from agent_store import StreamNotFoundError
    from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
    from agent_store.agent_framework.checkpoints import StoreCheckpointStorage
    from agent_store.agentserver.foundry import StoreCheckpointStoreProvider
    from agent_store.agentserver.responses import StoreResponseProvider

    async with Store.from_url(bed.app_url) as store:
        journal = store.journal(batch_ms=5)
        try:
            writer = await journal.start("run-1", user_id="alice", conversation_id="c1")
            async with writer:
                await writer.append({"n": 1})
            events, info = await journal.read("run-1", user_id="alice")
            assert [e.event for e in events] == [{"n": 1}] and info["status"] == "completed"
            with pytest.raises(StreamNotFoundError):
                await journal.read("run-1", user_id="bob")
            assert not await journal.cancel_asked("run-1", user_id="alice")
        finally:
            await journal.close()
        mine, theirs = StoreCheckpointStorage(store, user_id="alice"), StoreCheckpointStorage(store, user_id="bob")
        saved = await mine.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g"))
        assert (await mine.load(saved)).workflow_name == "wf" and await mine.list_checkpoint_ids(workflow_name="wf")
        assert await theirs.list_checkpoint_ids(workflow_name="wf") == []
        hosted_ctx = [StoreCheckpointStoreProvider(store).get_store_for_scope(  # a hosted workflow context: alice's
            scope=SimpleNamespace(user_id=user), context_id="ctx", platform_context=None) for user in ("alice", "bob")]
        saved = await hosted_ctx[0].save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g"))
        assert (await hosted_ctx[0].load(saved)).workflow_name == "wf"
        assert await hosted_ctx[1].list_checkpoint_ids(workflow_name="wf") == []
        snapshots = StoreThreadSnapshotStore(store)
        await snapshots.save(scope="alice", thread_id="t1", snapshot=AGUIThreadSnapshot(messages=[]))
        assert await snapshots.get(scope="alice", thread_id="t1") is not None
        assert await snapshots.get(scope="bob", thread_id="t1") is None
        assert (await store.usage.set_budget(1000, user_id="alice")).token_limit == 1000
        assert await store.usage.budget(user_id="bob") is None
        hosted, alice, bob = StoreResponseProvider(store), PlatformContext(user_id_key="alice"), PlatformContext(
            user_id_key="bob")  # fmt: skip
        await hosted.create_response(response("r1", output=["o1"]), [said("i1")], None, context=alice)
        assert (await hosted.get_response("r1", context=alice))["id"] == "r1"
        with pytest.raises(KeyError):
            await hosted.get_response("r1", context=bob)
        await hosted.create_response(response("r1", output=["o1"]), [said("i1")], None, context=bob)  # his own r1
    admin = await raw_connect(bed.admin_url)
    try:  # what each call wrote is its user's (the operator sees both)
        for user, context_rows in (("alice", 1), ("bob", 0)):  # plain SQL: alice's context is hers, not bob's
            async with admin.transaction():
                await admin.execute(f"SET LOCAL ROLE {APP}")
                await named(admin, user)
                found = await admin.fetchval("SELECT count(*) FROM agent_checkpoints WHERE user_id LIKE '%context:%'")
                assert found == context_rows, (user, found)
        assert await admin.fetchval("SELECT count(*) FROM agent_stream_events WHERE user_id = 'alice'") == 1
        assert await admin.fetchval("SELECT array_agg(user_id ORDER BY user_id) FROM agent_hosted_responses") == [
            "alice", "bob"]  # fmt: skip
    finally:
        await admin.close()


async def test_response_points_and_their_branches_under_the_application_role(bed: Bed) -> None:
    """StoreSessionStore (the hosting packages' seam): points and a branch read back as they were for their user;
    another user resolves none of them, and his own point of the same name is his."""
    from test_conversation_trees import _tree

    from agent_store.agent_framework import StoreSessionStore

    async with Store.from_url(bed.app_url) as store:
        alice = await _tree(store)  # user "u": r0 -> r1 -> r2 -> r3, and b1 from r2
        for key, expected in (
            ("r1", ["to r1"]),
            ("r3", ["to r1", "to r2", "to r3"]),
            ("b1", ["to r1", "to r2", "to b1"]),
        ):
            session = await alice.get(key)
            assert session is not None and [m.text for m in session.state["in_memory"]["messages"]] == expected, key
        bob = StoreSessionStore(store, user_id="bob")
        assert [await bob.get(key) for key in ("r0", "r1", "r3", "b1")] == [None] * 4
        his_own = AgentSession(session_id="r1")
        his_own.state["his"] = True
        await bob.set("r1", his_own)
        his = await bob.get("r1")
        assert his is not None and his.state.get("his") is True
        mine = await alice.get("r1")
        assert mine is not None and "his" not in mine.state


async def test_warm_up_primes_commits_under_the_application_role(bed: Bed, caplog: pytest.LogCaptureFixture) -> None:
    """The warm-up's rolled-back commits name their own user: no "may not write" warning, nothing kept."""
    async with Store.from_url(bed.app_url, pool_size=2, max_overflow=0) as store:
        with caplog.at_level("INFO", logger="agent_store"):
            assert await store.warm_up() == 2
        assert store.db.row_security and "may not write" not in caplog.text
    admin = await raw_connect(bed.admin_url)
    try:
        assert await admin.fetchval("SELECT count(*) FROM agent_sessions") == 0
    finally:
        await admin.close()


async def test_a_failed_runs_tokens_are_charged_to_its_user_under_the_application_role(bed: Bed) -> None:
    """Found by the outside review: a run that failed after its model call logged its calls and charged the
    budget in a transaction that named no one, so under the policies nothing was charged."""
    async with Store.from_url(bed.app_url) as store:
        await store.usage.set_budget(1_000_000, user_id="carol")
        await talk(store, "c1", "carol", "my name is Ann")
        used = (await store.usage.budget(user_id="carol")).used  # type: ignore[union-attr]
        agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])
        with pytest.raises(RuntimeError):
            async with store.session("c1", user_id="carol") as session:
                await agent.run("what is my name?", session=session)
                raise RuntimeError("the app failed after the model call")
        assert used > 0 and (await store.usage.budget(user_id="carol")).used > used  # type: ignore[union-attr]


async def test_the_frameworks_vector_history_provider_under_the_application_role(bed: Bed) -> None:
    """StoreVectorStore (issue 40) under row-level security: its reads, writes, vectors and search name the user."""
    from agent_framework._vectors import VectorStoreHistoryProvider
    from agent_framework_openai import OpenAIEmbeddingClient
    from fake_openai import FakeOpenAI

    from agent_store.agent_framework.vector_history import StoreVectorStore

    server = FakeOpenAI().start()
    try:
        client = OpenAIEmbeddingClient(model="text-embedding-test", api_key="k", base_url=server.base_url)
        async with Store.from_url(bed.app_url) as store:
            def history(user: str) -> VectorStoreHistoryProvider:
                return VectorStoreHistoryProvider(StoreVectorStore(store, user_id=user), application_id="app",
                                                  collection_name="hist", embedding_generator=client,
                                                  embedding_options={"dimensions": 256})  # fmt: skip
            said = [Message("user", ["I booked a flight to Paris"]), Message("user", ["Buy milk"])]
            await history("carol").save_messages("vh", said)
            assert store.db.row_security is True
            assert [m.text for m in await history("carol").get_messages("vh")] == [m.text for m in said]
            scope = history("carol")._scope_filter("vh")
            found = await history("carol")._collection.search("airplane ticket", filter=scope, top=1)
            assert [h["record"]["message"] async for h in found.results] == [said[0].to_json()]
            assert await history("dave").get_messages("vh") == []
            theirs = await history("dave")._collection.search("airplane ticket", filter=scope)
            assert [h async for h in theirs.results] == []
    finally:
        server.stop()
