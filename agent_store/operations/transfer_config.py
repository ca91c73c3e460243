"""The whole store's own rows in a whole-store export (``export --all-users``): ``app:`` keys, token budgets and
prices. Owned by no user, they come after every owner's lines (transfer_all.py); an import adds them where the
store has none (a key, a budget or a price that exists is kept: the store's own is newer than a file's).
AG-UI thread snapshots and run journals are not exported: a snapshot is rebuilt by the thread's next run and a
journal lives a day; ``agent-store backup`` copies everything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import codec
from agent_store.db.database import Database, Settings
from agent_store.db.statements import new_stamp
from agent_store.db.tables import app_state_t, budgets_t, prices_t
from agent_store.errors import InvalidValueError
from agent_store.operations import import_rows

__all__ = ["KINDS", "add", "export"]
KINDS: dict[str, Table] = {"app_state": app_state_t, "budget": budgets_t, "price": prices_t}


async def export(db: Database, line: Callable[[str, Table, Any], str]) -> AsyncIterator[str]:
    """Each kind's rows in key order (small tables: one read each)."""
    for kind, table in KINDS.items():
        async with db.transaction(write=False, replica=True, doing=f"exporting {table.name}") as conn:
            found = (await conn.execute(select(table).order_by(*table.primary_key.columns))).all()
        for row in found:
            yield line(kind, table, row)


async def add(conn: AsyncConnection, kind: str, row: dict[str, Any], settings: Settings) -> None:
    """Check one exported row as the API writes such rows, and insert it unless its key exists."""
    values = import_rows.columns(KINDS[kind], row, {"version"} if kind == "app_state" else set())
    if kind == "app_state":
        codec.check_id(values["app_id"], "app_state.app_id", required=True)
        codec.check_id(values["key"], "app_state.key", required=True)
        import_rows.check_state_value(row.get("value"), values["key"], settings.max_value_bytes)
        values["version"] = new_stamp()
    elif kind == "budget":
        codec.check_id(values["subject"], "budget.subject", required=True)
        if values["scope"] not in ("user", "app") or values["period"] not in ("day", "month", "total"):
            raise InvalidValueError(f"budget: scope user|app and period day|month|total, not {values['scope']!r}, "
                                    f"{values['period']!r}"[:200])  # fmt: skip
        for name in ("token_limit", "used"):
            codec.check_int(values.get(name, 0), f"budget.{name}", low=0, high=codec.INT64)
    else:
        codec.check_id(values["model"], "price.model", required=True)
        if any((values.get(name) or 0) < 0 for name in ("input_per_million", "output_per_million",
                                                          "cached_input_per_million")):  # fmt: skip
            raise InvalidValueError(f"price of {values['model']!r}: a negative price")
    insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(KINDS[kind])
    await conn.execute(insert.on_conflict_do_nothing(), values)
