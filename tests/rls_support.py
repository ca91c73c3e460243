"""Row-level security's test bed (issue 41): a database owned by a role that is neither superuser nor BYPASSRLS,
the application's role beside it, one row of each of two users in every table the policies cover, and the
checks that plain SQL makes of them. tests/test_row_security.py runs the checks, and the mutation run."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from helpers import raw_connect
from sqlalchemy import Boolean, DateTime, Integer, LargeBinary, String, Text, insert
from sqlalchemy.engine import make_url

from agent_store import Store
from agent_store.db.engine import make_engine
from agent_store.db.tables import messages_t

OWNER, APP = "agent_store_test_owner", "agent_store_test_app"  # in .ci/run's PgBouncer user list too
USERS = ("alice", "bob", "")  # "": the rows the store keeps for no user (journal runs, checkpoints without one)
# Every table migration 0024 covers, and the column(s) that name whose a row is.
COVERED = ["agent_sessions", "agent_messages", "agent_message_marks", "agent_branch_marks", "agent_runs",
           "agent_state", "agent_state_history", "agent_tool_calls", "agent_message_vectors", "agent_responses",
           "agent_user_state", "agent_app_state", "agent_usage", "agent_usage_budgets", "agent_checkpoints",
           "agent_checkpoint_workflows", "agent_ui_snapshots", "agent_streams", "agent_stream_events",
           "agent_hosted_responses", "agent_hosted_items", "agent_hosted_links", "agent_erasures"]  # fmt: skip
VIEWS = ["agent_transcript", "agent_model_view", "agent_usage_daily"]
ROLES_SQL = f"""DO $$ BEGIN
    CREATE ROLE {OWNER} LOGIN NOSUPERUSER NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
DO $$ BEGIN
    CREATE ROLE {APP} LOGIN NOSUPERUSER NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"""
GRANTS = f"""GRANT USAGE ON SCHEMA public TO {APP};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {APP};
GRANT EXECUTE ON FUNCTION agent_store_erasure_fence(text) TO {APP}"""


@dataclass
class Bed:
    admin_url: str  # the superuser: an operator's role (it bypasses row-level security)
    owner_url: str  # owns the tables, migrated them, switched row-level security on; held to it (FORCE)
    app_url: str  # the application's role: row grants only


def as_role(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


async def make_bed(pg_url: str) -> Bed:
    admin = await raw_connect(pg_url)
    try:
        await admin.execute(ROLES_SQL)
        database = make_url(pg_url).database
        await admin.execute(f'ALTER DATABASE "{database}" OWNER TO {OWNER}')  # a name the fixture made
    finally:
        await admin.close()
    bed = Bed(pg_url, as_role(pg_url, OWNER), as_role(pg_url, APP))
    async with Store.from_url(bed.owner_url) as owner:
        await owner.migrate()
    owner_conn = await raw_connect(bed.owner_url)
    try:
        await owner_conn.execute(GRANTS)
        await owner_conn.execute("SELECT agent_store_row_security(true)")
    finally:
        await owner_conn.close()
    admin = await raw_connect(pg_url)
    try:  # the views owned by a role that bypasses the policies, as the documented operator's role owns them
        for view in VIEWS:
            await admin.execute(f'ALTER VIEW "{view}" OWNER TO CURRENT_USER; GRANT SELECT ON "{view}" TO {OWNER}')
    finally:
        await admin.close()
    return bed


def tenant_values(user: str) -> dict[str, Any]:
    """The values that make a row ``user``'s, by column name (app-level rows: the user's own app)."""
    return {"user_id": user, "session_id": f"s_{user}", "app_id": f"app_{user}" if user else "", "subject": user,
            "scope": "user",
            "user_key": hashlib.sha256(user.encode()).hexdigest(), "id": f"s_{user}"}  # fmt: skip


def _filler(column: Any, table: str) -> Any:
    if column.name == "scope" and table == "agent_ui_snapshots":
        return None  # set from the user below
    if "json" in type(column.type).__name__.lower():
        return "{}"  # the store's JSON columns bind JSON text
    kind = getattr(column.type, "impl", column.type)  # a TypeDecorator's stored type
    if isinstance(kind, Boolean):
        return False
    if isinstance(kind, Integer):
        return 0
    if isinstance(kind, DateTime):
        return datetime(2026, 1, 1, tzinfo=UTC)
    if isinstance(kind, LargeBinary):
        return b"\x00"
    if isinstance(kind, String | Text):
        return "x"
    return "{}"  # the store's JSON columns bind JSON text


async def fill(bed: Bed) -> None:
    """One row per user in every covered table (and an embedding profile), written by the operator (bypassing
    the policies): the smallest row each table's constraints take."""
    metadata = messages_t.metadata
    engine = make_engine(bed.admin_url)  # (takes ?pgbouncer=true, as the stores do)
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(metadata.tables["agent_embedding_profiles"]).values(
                id=0, name="p", model="m", dimensions=8, version="1", created_at=datetime.now(UTC)))  # fmt: skip
            for table in metadata.sorted_tables:
                if table.name not in COVERED:
                    continue
                for user in USERS:
                    mine = tenant_values(user)
                    row = {c.name: _filler(c, table.name) for c in table.columns if not c.nullable or c.primary_key}
                    row.update({k: v for k, v in mine.items() if k in row or k in table.columns})
                    if table.name == "agent_ui_snapshots":
                        row["scope"] = user
                    if table.name == "agent_responses":  # keyed by its own id; its session names the user
                        row["id"], row["response_id"] = USERS.index(user) + 1, f"resp_{user}"
                    if table.name == "agent_app_state" or table.name == "agent_usage":
                        row["app_id"] = mine["app_id"]
                    await conn.execute(insert(table).values(row))
    finally:
        await engine.dispose()


async def named(conn: asyncpg.Connection, user: str | None) -> None:
    """Name the transaction's user (and app), as agent_store does; None names no one."""
    if user is not None:
        await conn.execute("SELECT set_config('agent_store.user_id', $1, true), "
                           "set_config('agent_store.app_id', $2, true)", user, f"app_{user}")  # fmt: skip


async def violations(url: str) -> list[str]:
    """What plain SQL as this role gets wrong, table by table: with no name, any row; named alice, anything but
    her one row; named alice, a row written as bob's that is kept. Empty: the policies hold for this role."""
    found: list[str] = []
    conn = await raw_connect(url)
    try:
        for table in COVERED:
            ident = '"' + table + '"'  # names from the fixed list above
            async with conn.transaction():
                if (n := await conn.fetchval(f"SELECT count(*) FROM {ident}")) != 0:  # noqa: S608 - names from COVERED
                    found.append(f"{table}: {n} rows with no user named")
            async with conn.transaction():  # after a name on this connection: the setting reads "", not missing
                await named(conn, "alice")
            async with conn.transaction():
                if (n := await conn.fetchval(f"SELECT count(*) FROM {ident}")) != 0:  # noqa: S608 - names from COVERED
                    found.append(f"{table}: {n} rows with no user named, on a connection that named one before")
            async with conn.transaction():
                await named(conn, "alice")
                if (n := await conn.fetchval(f"SELECT count(*) FROM {ident}")) != 1:  # noqa: S608 - names from COVERED
                    found.append(f"{table}: {n} rows named alice (her 1 expected)")
            if not await _bobs_row_refused(conn, table, ident):
                found.append(f"{table}: a row of bob's written while alice is named")
        mine_on_his = {**BOBS["agent_usage"], "user_id": "alice", "app_id": "app_alice", "call_no": 1001}
        if not await _refused(conn, '"agent_usage"', mine_on_his):  # the foreign key's check ignores policies
            found.append("agent_usage: a ledger row of alice's written onto bob's run")
        for view in VIEWS:  # read as the one who asks (security invoker): the tables' policies hold
            ident = '"' + view + '"'
            async with conn.transaction():
                if (n := await conn.fetchval(f"SELECT count(*) FROM {ident}")) != 0:  # noqa: S608 - names from VIEWS
                    found.append(f"{view}: {n} rows with no user named")
    finally:
        await conn.close()
    return found


async def _bobs_row_refused(conn: asyncpg.Connection, table: str, ident: str) -> bool:
    """Named alice, insert a copy of bob's row (a new key): the policy's check must refuse it."""
    pk = [c for c in messages_t.metadata.tables[table].primary_key.columns]
    row = dict(BOBS[table])
    for column in pk:  # a new key that still names bob (not the column that names him)
        if column.name in tenant_values("bob") and table != "agent_responses":
            continue
        row[column.name] = row[column.name] + 1000 if isinstance(row[column.name], int) else row[column.name] + "2"
        break
    return await _refused(conn, ident, row)


async def _refused(conn: asyncpg.Connection, ident: str, row: dict[str, Any]) -> bool:
    """Named alice, insert ``row``: whether a policy refused it."""
    names = ", ".join('"' + k + '"' for k in row)
    places = ", ".join(f"${i}" for i in range(1, len(row) + 1))
    try:
        async with conn.transaction():
            await named(conn, "alice")
            await conn.execute(f"INSERT INTO {ident} ({names}) VALUES ({places})", *row.values())  # noqa: S608
            raise _Kept
    except _Kept:
        return False
    except asyncpg.PostgresError as exc:
        return exc.sqlstate == "42501"  # new row violates row-level security policy


class _Kept(Exception):
    pass


BOBS: dict[str, dict[str, Any]] = {}


async def read_bobs_rows(admin_url: str) -> None:
    """Bob's row of each table, as stored (read by the operator), for the write checks."""
    conn = await raw_connect(admin_url)
    try:
        for table in COVERED:
            columns = messages_t.metadata.tables[table].columns
            names = ("session_id", "user_id", "scope", "subject", "app_id", "user_key", "id")
            column = next(k for k in names if k in columns and not (k == "session_id" and table == "agent_sessions"))
            value = {**tenant_values("bob"), "scope": "bob" if table == "agent_ui_snapshots" else "user"}[column]
            if table == "agent_usage_budgets":
                column, value = "subject", "bob"
            row = await conn.fetchrow(f'SELECT * FROM "{table}" WHERE "{column}" = $1', value)  # noqa: S608
            assert row is not None, table
            BOBS[table] = dict(row)
    finally:
        await conn.close()
