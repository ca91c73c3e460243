"""The migrated schema obeys what a distributed PostgreSQL (Citus) needs to shard by session, as docs/SCALING.md
lays it out. Read from the catalog after ``alembic upgrade head``, so a later migration cannot break it silently.

This checks the rules; it does not run Citus (none is installable here). The rules, from Citus's documentation:
every primary key and unique index of a distributed table includes its distribution column; a foreign key
between distributed tables joins colocated tables on their distribution columns; a foreign key may point from a
distributed table to a reference table, never from a reference table to a distributed one; colocated
distribution columns have one type. Sequences across nodes need coordination, so no distributed table uses one.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ROOT, rows

from agent_store import Store

SCALING = Path(__file__).parent.parent / "docs" / "SCALING.md"
KINDS = ("changes", "inserts")  # agent_state_keep_*: migration 0017
DISTRIBUTE = re.compile(r"create_distributed_table\('(\w+)', '(\w+)'(?:, colocate_with => '(\w+)')?\)")
REFERENCE = re.compile(r"create_reference_table\('(\w+)'\)")


def documented_layout() -> tuple[dict[str, tuple[str, str]], set[str]]:
    """From docs/SCALING.md's DDL: {table: (distribution column, colocation group)} and the reference tables."""
    ddl = SCALING.read_text().split("```sql", 1)[1].split("```", 1)[0]
    distributed: dict[str, tuple[str, str]] = {}
    for table, column, colocate in DISTRIBUTE.findall(ddl):
        group = table if colocate in ("", "none") else distributed[colocate][1]  # a group is named by its first
        distributed[table] = (column, group)
    return distributed, set(REFERENCE.findall(ddl))


async def catalog(store: Store) -> dict[str, list[tuple[object, ...]]]:
    return {
        "tables": await rows(
            store,
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
            " AND relname <> 'alembic_version'",
        ),
        "columns": await rows(
            store,
            "SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity"
            " FROM information_schema.columns WHERE table_schema = 'public'",
        ),
        "unique": await rows(  # primary keys, unique and exclusion indexes: (table, index, [plain key columns])
            store,  # an index on expressions only has no plain column: its list is empty (and it fails the rule)
            "SELECT t.relname, i.relname, array_remove(array_agg(a.attname::text ORDER BY k.ord), NULL) FROM pg_index x"
            " JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid"
            " CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, ord)"
            " LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum"
            " WHERE (x.indisunique OR x.indisexclusion) AND t.relnamespace = 'public'::regnamespace"
            " AND t.relname <> 'alembic_version' GROUP BY t.relname, i.relname",
        ),
        "triggers": await rows(  # Citus runs no triggers on distributed tables (unless unsafely enabled)
            store, "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal"
        ),
        "foreign": await rows(  # (table, [columns], referenced table, [referenced columns])
            store,
            "SELECT c.conrelid::regclass::text,"
            " array(SELECT attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, o)"
            "       JOIN pg_attribute ON attrelid = c.conrelid AND attnum = k.n ORDER BY k.o),"
            " c.confrelid::regclass::text,"
            " array(SELECT attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, o)"
            "       JOIN pg_attribute ON attrelid = c.confrelid AND attnum = k.n ORDER BY k.o)"
            " FROM pg_constraint c WHERE c.contype = 'f' AND c.connamespace = 'public'::regnamespace",
        ),
    }


async def test_the_migrated_schema_can_be_distributed_by_session_as_documented(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
        found = await catalog(store)
    distributed, reference = documented_layout()
    tables = {str(t) for (t,) in found["tables"]}
    columns = {(str(t), str(c)): (dtype, nullable, default, identity) for t, c, dtype, nullable, default, identity
               in found["columns"]}  # fmt: skip
    # Every table has exactly one documented placement, and the document names no table that is not there.
    assert not set(distributed) & reference
    assert set(distributed) | reference == tables, "docs/SCALING.md's DDL and the migrated tables differ"

    # Session-owned tables (a session_id column, and the sessions table itself) shard with their session.
    sessions_group = distributed["agent_sessions"][1]
    assert distributed["agent_sessions"][0] == "id"
    for table in tables - {"agent_sessions"}:
        if (table, "session_id") in columns:
            assert distributed.get(table) == ("session_id", sessions_group), f"{table} is session-owned"

    # The distribution column: present, NOT NULL, one type per colocation group; no sequences anywhere.
    group_types: dict[str, set[object]] = {}
    for table, (column, group) in distributed.items():
        dtype, nullable, _, _ = columns[(table, column)]
        assert nullable == "NO", f"{table}.{column} may be NULL"
        group_types.setdefault(group, set()).add(dtype)
    assert all(len(types) == 1 for types in group_types.values()), group_types
    for (table, column), (_, _, default, identity) in columns.items():
        if (table, column) == ("agent_responses", "id"):  # 0021: a bigint identity, which Citus hands each node a
            assert identity == "YES"  # range of (docs/SCALING.md): no coordination per insert
            continue
        assert identity == "NO" and "nextval" not in str(default or ""), f"{table}.{column} uses a sequence"

    # Every primary key and unique index of a distributed table includes its distribution column; a table
    # sharded by something other than its session starts its primary key with that column (one shard per key).
    for table, index, index_columns in found["unique"]:
        if table in distributed:
            assert distributed[str(table)][0] in index_columns, f"{index} of {table} lacks the distribution column"
    for table, (column, group) in distributed.items():
        if group != sessions_group:
            primary = [cols for t, index, cols in found["unique"] if t == table and str(index).startswith("pk_")]
            assert primary and primary[0][0] == column, f"{table}'s primary key does not start with {column}"

    # The triggers of 0016, 0017 and 0023 and no other: each reads and writes only its own session's rows of
    # colocated tables, which Citus 11+ runs with citus.enable_unsafe_triggers (docs/SCALING.md says so).
    keep_state = [("agent_state", f"agent_state_keep_{kind}") for kind in KINDS]
    # 0023's deletes a message's vectors (colocated: agent_message_vectors is distributed by session too).
    mine = [("agent_messages", "agent_message_text_changed"), ("agent_messages", "agent_messages_keep_marks")]
    assert sorted(found["triggers"]) == [*mine, *keep_state], "a trigger"
    assert "citus.enable_unsafe_triggers" in (ROOT / "docs" / "SCALING.md").read_text()

    # Foreign keys: distributed -> reference, or between colocated tables on their distribution columns.
    assert found["foreign"], "the catalog query found no foreign key at all"
    for table, keys, target, target_keys in found["foreign"]:
        assert table not in reference or target in reference, f"{table} (reference) -> {target} (distributed)"
        if table in distributed and target in distributed:
            (column, group), (target_column, target_group) = distributed[table], distributed[target]
            assert group == target_group, f"{table} -> {target} crosses colocation groups"
            assert column in keys and target_keys[list(keys).index(column)] == target_column, (table, target)
