"""An application's own Alembic migrations beside agent_store's in one database (docs/operations.md, "Beside your
own Alembic migrations"), on both backends: with the documented env.py both upgrade, in either order, each to its
own head; an application that kept its revision in alembic_version is refused in one line that says why, with
nothing changed, and the documented rename lets both live together."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli, ok
from helpers import doc_block, rows

from agent_store import Store
from agent_store.db.tables import SCHEMA_REVISION

ENV = '''import asyncio

from alembic import context
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

target_metadata = MetaData()

{block}

def run(connection):
    configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def main():
    engine = create_async_engine(context.get_x_argument(as_dictionary=True)["url"])
    async with engine.connect() as connection:
        await connection.run_sync(run)
        await connection.commit()
    await engine.dispose()


asyncio.run(main())
'''
ORDERS = '''revision = "a1b2c3d4e5f6"
down_revision = None

from alembic import op
import sqlalchemy as sa


def upgrade():
    op.create_table("app_orders", sa.Column("id", sa.Integer, primary_key=True), sa.Column("item", sa.Text))


def downgrade():
    op.drop_table("app_orders")
'''
RENAME = ["ALTER TABLE alembic_version RENAME TO myapp_alembic_version"]  # the docs' statements
PG_RENAME = "ALTER TABLE myapp_alembic_version RENAME CONSTRAINT alembic_version_pkc TO myapp_alembic_version_pkc"


def test_the_docs_give_these_statements() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    assert all(f"`{statement}`" in page.replace("\n", " ") for statement in [*RENAME, PG_RENAME])


def app_project(where: Path, *, own_table: bool) -> Path:
    """The application's Alembic project: the docs' env.py block (or one without its version table)."""
    block = doc_block("docs/operations.md", "app-env", "py")
    if not own_table:
        block = "\n".join(line for line in block.splitlines() if "version_table=" not in line)
    (where / "versions").mkdir(parents=True)
    (where / "env.py").write_text(ENV.format(block=block), encoding="utf-8")
    (where / "versions" / "a1b2c3d4e5f6_orders.py").write_text(ORDERS, encoding="utf-8")
    ini = where / "alembic.ini"
    ini.write_text(f"[alembic]\nscript_location = {where}\n", encoding="utf-8")
    return ini


def app_upgrade(ini: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alembic", "-c", str(ini), "-x", f"url={url}", "upgrade", "head"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


async def versions(url: str) -> dict[str, object]:
    async with Store.from_url(url, check_schema=False) as store:
        return {"agent_store": await rows(store, "SELECT version_num FROM alembic_version"),
                "app": await rows(store, "SELECT version_num FROM myapp_alembic_version"),
                "orders": await rows(store, "SELECT count(*) FROM app_orders")}  # fmt: skip


@pytest.mark.parametrize("app_first", [pytest.param(True, id="app-first"), pytest.param(False, id="store-first")])
async def test_both_projects_upgrade_in_either_order(url: str, tmp_path: Path, app_first: bool) -> None:
    ini = app_project(tmp_path / "app", own_table=True)
    steps = [lambda: app_upgrade(ini, url), lambda: cli("upgrade", url=url, cwd=tmp_path)]
    for step in steps if app_first else steps[::-1]:
        done = step()
        assert done.returncode == 0, done.stderr
    assert await versions(url) == {"agent_store": [(SCHEMA_REVISION,)], "app": [("a1b2c3d4e5f6",)], "orders": [(0,)]}
    assert "ok" in ok(cli("check", url=url, cwd=tmp_path))
    again = app_upgrade(ini, url)  # nothing left to do for either
    assert again.returncode == 0, again.stderr
    ok(cli("upgrade", url=url, cwd=tmp_path))


async def test_an_app_in_alembic_version_is_refused_then_moved_as_documented(url: str, tmp_path: Path) -> None:
    old = app_project(tmp_path / "old", own_table=False)
    assert app_upgrade(old, url).returncode == 0
    for command in ("upgrade", "check"):
        refused = cli(command, url=url, cwd=tmp_path)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith("Error: SchemaError: ") and "'a1b2c3d4e5f6', which is not agent_store's" \
            in refused.stderr and "Beside your own Alembic migrations" in refused.stderr  # fmt: skip
    async with Store.from_url(url, check_schema=False) as store:  # nothing of agent_store's was made
        assert await rows(store, "SELECT version_num FROM alembic_version") == [("a1b2c3d4e5f6",)]
        async with store.engine.begin() as conn:
            names = await conn.run_sync(lambda c: __import__("sqlalchemy").inspect(c).get_table_names())
        assert not [name for name in names if name.startswith("agent_")]
        async with store.engine.begin() as conn:
            for statement in RENAME + ([PG_RENAME] if store.db.dialect == "postgresql" else []):
                await conn.exec_driver_sql(statement)
    ok(cli("upgrade", url=url, cwd=tmp_path))
    now = app_project(tmp_path / "new", own_table=True)
    assert app_upgrade(now, url).returncode == 0
    assert await versions(url) == {"agent_store": [(SCHEMA_REVISION,)], "app": [("a1b2c3d4e5f6",)], "orders": [(0,)]}
