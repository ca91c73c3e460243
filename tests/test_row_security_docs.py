"""docs/row-security.md's set-up, run as written (role and database names made the test's own): the superuser's
roles, the operator's migration, switch and grants, then the application's runs held to the policies and the
operator's cross-user view. Not in the PgBouncer pass: its roles are not in that pass's user list."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
from cli_support import cli, ok
from helpers import doc_block, raw_connect
from sqlalchemy.engine import make_url
from test_hybrid_search import EMBEDDER
from test_row_security import talk

from agent_store import Store

PAGE = "docs/row-security.md"


async def test_the_documented_set_up_holds_the_application_to_the_policies(pg_url: str, tmp_path: Path) -> None:
    database = make_url(pg_url).database
    assert database is not None
    operator, app = f"op_{database}", f"app_{database}"  # cluster-wide names: the test's own, dropped after

    def ours(sql: str) -> str:
        return (sql.replace("agent_store_operator", operator).replace("agent_store_app", app)
                .replace("DATABASE agents", f'DATABASE "{database}"'))  # fmt: skip

    admin = await raw_connect(pg_url)
    try:
        await admin.execute(ours(doc_block(PAGE, "rls-roles", "pgsql")))
        operator_url = make_url(pg_url).set(username=operator).render_as_string(hide_password=False)
        app_url = make_url(pg_url).set(username=app).render_as_string(hide_password=False)
        ok(cli("upgrade", url=operator_url, cwd=tmp_path))
        assert "on (forced); 23 tables" in ok(cli("rls", "on", url=operator_url, cwd=tmp_path))
        as_operator = await raw_connect(operator_url)
        try:
            await as_operator.execute(ours(doc_block(PAGE, "rls-grants", "pgsql")))
        finally:
            await as_operator.close()
        async with Store.from_url(app_url) as store:
            assert "Ann" in (await talk(store, "s1", "alice", "my name is Ann", "what is my name?"))[-1]
            await talk(store, "s2", "bob", "my name is Bob")
            assert [s.id for s in (await store.list_sessions(user_id="alice")).items] == ["s1"]
            await talk(store, "s3", "alice", "the lighthouse keeper's name is Ann")
        async with Store.from_url(operator_url, operator=True, embedder=EMBEDDER) as everyone:
            assert await everyone.embeddings.backfill() > 0  # every user's: the operator's work
        async with Store.from_url(app_url, embedder=EMBEDDER) as store:
            page = await store.search("lighthouse", user_id="alice", ranking="vector")
            found = {hit.session_id for hit in page.items}
            assert "s3" in found and found <= {"s1", "s3"}  # alice's own, by meaning, under the application's role
        plain = await raw_connect(app_url)
        try:
            assert await plain.fetchval("SELECT count(*) FROM agent_transcript") == 0  # no name, nothing
            assert await plain.fetchval("SHOW plan_cache_mode") == "force_generic_plan"  # the role's own setting
            # The tables every user shares, which no policy covers: a cascade from a profile would take every
            # user's vectors; prices are every user's costs; the schema's rows stop every store.
            await plain.execute("INSERT INTO agent_embedding_profiles (id, name, model, dimensions, version, "
                                "created_at) VALUES (7, 'new', 'm', 8, '1', now()) ON CONFLICT DO NOTHING")  # a new one
            for shared in ("DELETE FROM agent_embedding_profiles", "UPDATE agent_embedding_profiles SET version = 'x'",
                           "DELETE FROM agent_usage_prices", "INSERT INTO agent_usage_prices (model) VALUES ('m')",
                           "DELETE FROM alembic_version", "DELETE FROM agent_schema_compat"):  # fmt: skip
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await plain.execute(shared)
        finally:
            await plain.close()
        async with Store.from_url(operator_url, operator=True) as everyone:
            assert {s.id for s in (await everyone.list_sessions(all_users=True)).items} == {"s1", "s2", "s3"}
        assert f"role {operator} bypasses it" in ok(cli("rls", "status", url=operator_url, cwd=tmp_path))
        await erasure_log_is_the_operators(app_url, operator_url, pg_url, tmp_path)
    finally:
        try:
            await admin.execute(f'ALTER DATABASE "{database}" OWNER TO CURRENT_USER')
            in_database = await raw_connect(pg_url)
            try:
                await in_database.execute(f"REASSIGN OWNED BY {operator} TO CURRENT_USER")
                await in_database.execute(f"DROP OWNED BY {operator}")  # its default privileges for the app
                await in_database.execute(f"DROP OWNED BY {app}")
            finally:
                await in_database.close()
            await admin.execute(f"DROP ROLE IF EXISTS {operator}; DROP ROLE IF EXISTS {app}")
        finally:
            await admin.close()


async def erasure_log_is_the_operators(app_url: str, operator_url: str, pg_url: str, tmp_path: Path) -> None:
    """The application erases a user, and its role can then neither delete, back-date nor rewrite that erasure in
    plain SQL (acting for the user, whose line the policy admits); a restore of a backup taken before the erasure
    still erases the user again."""
    backup = tmp_path / "before.backup"
    ok(cli("backup", "-o", str(backup), url=operator_url, cwd=tmp_path))
    async with Store.from_url(app_url) as store:
        assert (await store.erase_user("bob")).sessions == 1  # the fence through agent_store_erasure_fence()
    plain = await raw_connect(app_url)
    try:
        async with plain.transaction():
            await plain.execute("SELECT set_config('agent_store.user_id', 'bob', true)")
            assert await plain.fetchval("SELECT count(*) FROM agent_erasures") == 1  # bob's own line, readable
            for rewrite in ("DELETE FROM agent_erasures",
                            "UPDATE agent_erasures SET erased_at = erased_at - interval '1 year'",
                            "INSERT INTO agent_erasures (user_key, erased_at) VALUES "
                            "(encode(sha256(convert_to('bob', 'UTF8')), 'hex'), now() - interval '1 year') "
                            "ON CONFLICT (user_key) DO UPDATE SET erased_at = EXCLUDED.erased_at"):  # fmt: skip
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    async with plain.transaction():  # (a savepoint: the next rewrite is tried too)
                        await plain.execute(rewrite)
            before = await plain.fetchval("SELECT erased_at FROM agent_erasures")
            again = await plain.fetchval("SELECT agent_store_erasure_fence('bob')")
            assert again >= before  # the one write it has only moves the fence forward
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="fences only the user it names"):
                async with plain.transaction():  # bob named: carol is not bob's to fence
                    await plain.execute("SELECT agent_store_erasure_fence('carol')")
            # A caller's temporary table named like the log is not where the definer's function writes.
            async with plain.transaction():
                await plain.execute("CREATE TEMP TABLE agent_erasures (user_key text PRIMARY KEY, erased_at "
                                    "timestamptz)")  # fmt: skip
                await plain.execute("SELECT agent_store_erasure_fence('bob')")
                assert await plain.fetchval("SELECT count(*) FROM pg_temp.agent_erasures") == 0
                await plain.execute("DROP TABLE pg_temp.agent_erasures")
    finally:
        await plain.close()
    superuser = operator_url.replace(f"{make_url(operator_url).username}@", "postgres@")  # in the test's database
    stranger = await raw_connect(superuser)
    role = f"nogrant_{make_url(operator_url).database}"[:63]  # cluster-wide: the test's own name
    try:  # a role with no grant may not call it at all
        await stranger.execute(f'DROP ROLE IF EXISTS "{role}"; CREATE ROLE "{role}"')
        async with stranger.transaction():
            await stranger.execute(f'SET LOCAL ROLE "{role}"')
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await stranger.execute("SELECT agent_store_erasure_fence('bob')")
    finally:
        await stranger.execute(f'DROP ROLE IF EXISTS "{role}"')
        await stranger.close()
    log = tmp_path / "erasures.jsonl"
    ok(cli("erasures", "-o", str(log), url=operator_url, cwd=tmp_path))
    database = make_url(operator_url).database
    target = make_url(operator_url).set(database=f"{database}_r")
    admin = await raw_connect(pg_url)
    try:
        await admin.execute(f'CREATE DATABASE "{target.database}" OWNER "{make_url(operator_url).username}"')
    finally:
        await admin.close()
    restored_url = target.render_as_string(hide_password=False)
    try:
        said = ok(cli("restore", str(backup), "--erasures-from", str(log), url=restored_url, cwd=tmp_path))
        assert said.strip().endswith("1 users erased since the backup were erased again"), said
        async with Store.from_url(restored_url, operator=True) as restored:
            assert {s.id for s in (await restored.list_sessions(all_users=True)).items} == {"s1", "s3"}
    finally:
        admin = await raw_connect(pg_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{target.database}" WITH (FORCE)')
        finally:
            await admin.close()
