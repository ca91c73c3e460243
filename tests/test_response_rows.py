"""Response rows by number (migration 0021), on both backends: a response names its parent by the parent's row,
the migration numbers existing rows and keeps every parent (by row where its key names one, by key where it names
none), a row older code wrote (its parent by key) still reads back with its parent, an export carries parents by
key and an import into another store resolves them to that store's rows, and the downgrade gives the keys back."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import doc_block, lock_waits, rows, until
from hosting_route import serve
from sqlalchemy import event, text

from agent_store import InvalidValueError, Store
from agent_store.db.history_tables import PG_KEY_INDEX, SQLITE_KEY_INDEX, insert_row
from agent_store.run import points

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "studies"))
from big_tables import reads_sent

TREE = ("SELECT r.response_id, COALESCE(p.response_id, r.parent_id) FROM agent_responses r "
        "LEFT JOIN agent_responses p ON p.id = r.parent ORDER BY r.id")  # fmt: skip


async def chain(url: str, user: str, turns: int) -> list[str]:
    keys: list[str] = []
    for n in range(turns):
        body = {"model": "offline", "input": f"我叫{n}号"}
        if keys:
            body["previous_response_id"] = keys[-1]
        keys.append((await serve(url, user, body))["id"])
    return keys


async def test_a_chain_names_each_parent_by_its_row(url: str, store: Store) -> None:  # store: migrated
    keys = await chain(url, "u1", 4)
    branch = (await serve(url, "u1", {"model": "offline", "input": "分支", "previous_response_id": keys[1]}))["id"]
    async with Store.from_url(url) as store:
        found = dict(await rows(store, TREE))
        assert found == {keys[0]: None, keys[2]: keys[1], keys[3]: keys[2], branch: keys[1], keys[1]: keys[0]}
        # by row, not by key: no row written by this code repeats its parent's key
        assert await rows(store, "SELECT count(*) FROM agent_responses WHERE parent_id IS NOT NULL") == [(0,)]
        ids = [i for (i,) in await rows(store, "SELECT id FROM agent_responses ORDER BY created_at, id")]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)  # numbered in the order they were made
        tree = await store.tree(keys[0], user_id="u1")
        assert {(n.response_id, n.parent_id) for n in tree if n.response_id} == set(found.items())


OLD_ROWS = [  # the 0020 shape: the parent by key; "k9" names no row (kept by key)
    ("s1", "s1", "u", 2, 1, None), ("s1", "k1", "u", 4, 2, "s1"), ("s1", "k2", "u", 6, 3, "k1"),
    ("s1", "k3", "u", 8, 4, "k9"), ("s2", "k1", "v", 2, 1, "s1"),  # v's k1's parent "s1" is u's key: not v's
    ("s3", "k9", "u", 2, 1, None),  # made after k3 in another conversation: never k3's parent
]


async def test_the_migration_numbers_old_rows_and_keeps_every_parent_both_ways(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate("0020")
        async with store.engine.begin() as conn:
            now = datetime.now(UTC)
            for sid, user in (("s1", "u"), ("s2", "v"), ("s3", "u")):
                await conn.execute(text("INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, "
                                        "updated_at, incarnation) VALUES (:s, :u, 5, 9, :t, :t, 1)"),
                                   {"s": sid, "u": user, "t": now})  # fmt: skip
            for n, (sid, key, user, seq_end, version, parent) in enumerate(OLD_ROWS):
                await conn.execute(text("INSERT INTO agent_responses (session_id, response_id, user_id, seq_end, "
                                        "version, parent_id, created_at) VALUES (:s, :k, :u, :e, :v, :p, :t)"),
                                   {"s": sid, "k": key, "u": user, "e": seq_end, "v": version, "p": parent,
                                    "t": now.replace(microsecond=n)})  # fmt: skip
        await store.migrate()
        numbered = await rows(store, "SELECT response_id, user_id, parent, parent_id FROM agent_responses ORDER BY id")
        by_key = {(k, u): i for i, (k, u) in enumerate([(k, u) for k, u, _, _ in numbered])}
        ids = [i for (i,) in await rows(store, "SELECT id FROM agent_responses ORDER BY id")]
        parent_keys = {(k, u): (None if p is None else numbered[ids.index(p)][0], pid) for k, u, p, pid in numbered}
        assert len(by_key) == 6
        assert parent_keys == {
            ("s1", "u"): (None, None), ("k1", "u"): ("s1", None), ("k2", "u"): ("k1", None),
            ("k3", "u"): (None, "k9"), ("k1", "v"): (None, "s1"),  # no earlier row of its user: kept by key
            ("k9", "u"): (None, None),
        }
        assert await rows(store, "SELECT oldest_code FROM agent_schema_compat") == [("0021",)]
        await store.downgrade("0020")
        back = await rows(store, "SELECT session_id, response_id, user_id, seq_end, version, parent_id "
                                 "FROM agent_responses ORDER BY session_id, response_id")  # fmt: skip
        assert back == sorted(OLD_ROWS)
        assert await rows(store, "SELECT oldest_code FROM agent_schema_compat") == [("0019",)]
        await store.migrate()  # and up again


async def test_a_row_older_code_wrote_reads_back_with_its_parent_key(url: str, store: Store) -> None:
    keys = await chain(url, "u1", 2)
    async with Store.from_url(url) as store, store.engine.begin() as conn:
        # what code at 0020 writes during a rolling upgrade: no id (numbered by the database), the parent by key
        session = (await conn.execute(text("SELECT session_id, created_at FROM agent_responses"))).first()
        assert session is not None
        await conn.execute(text("INSERT INTO agent_responses (session_id, response_id, user_id, seq_end, version, "
                                "parent_id, created_at, moves) VALUES (:s, 'old', 'u1', 2, 1, :p, :t, false)"),
                           {"s": session[0], "p": keys[1], "t": session[1]})  # fmt: skip
    async with Store.from_url(url) as store:
        tree = await store.tree(keys[0], user_id="u1")
        assert {n.response_id: n.parent_id for n in tree}["old"] == keys[1]
        lines = [line async for line in store.export(user_id="u1")]
        assert any(f'"parent_id": "{keys[1]}", "response_id": "old"' in line for line in lines)


async def test_an_import_resolves_parent_keys_to_the_new_store_s_rows(url: str, store: Store, tmp_path: Path) -> None:
    keys = await chain(url, "u1", 3)
    await serve(url, "u1", {"model": "offline", "input": "分支", "previous_response_id": keys[0]})
    async with Store.from_url(url) as store:
        lines = [line async for line in store.export(user_id="u1")]
        before = sorted(await rows(store, TREE), key=str)
    other = f"sqlite+aiosqlite:///{tmp_path}/other.db"
    async with Store.from_url(other) as store:
        await store.migrate()
        await store.import_lines(lines)
        assert sorted(await rows(store, TREE), key=str) == before
        assert await rows(store, "SELECT count(*) FROM agent_responses WHERE parent_id IS NOT NULL") == [(0,)]
        answer = await serve(other, "u1", {"model": "offline", "input": "我叫什么名字？",
                                           "previous_response_id": keys[2]})  # fmt: skip
        assert "2号" in str(answer["output"])


async def plan_of(store: Store, statement: str, parameters: Any, *, index_paths: bool = False) -> list[str]:
    """The plan; ``index_paths``: PostgreSQL plans as if tables were big (a small table's scan is cheaper by cost,
    so this shows whether an index can serve each read at all)."""
    async with store.engine.connect() as conn:
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if store.engine.dialect.name == "postgresql":
            async with driver.transaction():
                if index_paths:
                    await driver.execute("SET LOCAL enable_seqscan = off")
                return [r[0] for r in await driver.fetch("EXPLAIN " + statement, *(parameters or ()))]
        cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, parameters or ())
        return [r[3] for r in await cursor.fetchall()]


def reads_responses_whole(plan: list[str]) -> bool:
    return any("Seq Scan on agent_responses" in line or (line.startswith("SCAN") and "USING" not in line
                                                         and "agent_responses" in line) for line in plan)  # fmt: skip


async def many_keys(store: Store) -> datetime:
    """300 sessions of 30 users (no messages) and 3,000 keys, each session's keys a chain (written as a commit
    writes them), then ANALYZE: a table where a read of the whole of it shows in the plan."""
    now = datetime.now(UTC)
    async with store.engine.begin() as conn:
        for s in range(300):
            await conn.execute(text("INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, "
                                    "updated_at, incarnation) VALUES (:s, :u, 10, 0, :t, :t, 1)"),
                               {"s": f"s{s}", "u": f"u{s % 30}", "t": now})  # fmt: skip
        for n in range(3000):
            row = {"session_id": f"s{n % 300}", "response_id": f"resp_{n:06d}", "user_id": f"u{n % 300 % 30}",
                   "seq_end": n % 20, "version": n % 10, "created_at": now, "moves": False}  # fmt: skip
            await insert_row(conn, row, f"resp_{n - 300:06d}" if n >= 300 else None)
        await conn.execute(text("ANALYZE"))
    return now


async def test_a_key_and_a_parent_are_found_by_the_key_s_index_among_many(store: Store) -> None:
    """3,000 keys of 30 users: resolving a key (the hosted get) and naming a parent (the commit's insert) read the
    key's index (a hash index on PostgreSQL, key_hash on SQLite), never the whole table."""
    now = await many_keys(store)
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        sent.append((statement, parameters))

    with reads_sent(store) as reads:
        point = await points.resolve(store.db, "resp_001234", "u4")
    assert point is not None and point.session_id == "s34"
    event.listen(store.engine.sync_engine, "before_cursor_execute", capture)
    try:
        async with store.engine.begin() as conn:
            row = {"session_id": "s34", "response_id": "resp_new", "user_id": "u4", "seq_end": 20, "version": 10,
                   "created_at": now, "moves": False}  # fmt: skip
            await insert_row(conn, row, "resp_001234")
            await conn.rollback()
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", capture)
    inserts = [(s, p) for s, p in sent if s.lstrip().upper().startswith("INSERT")]
    reads = [(s, p) for s, p in reads if "agent_responses" in s]  # (the first statement checks the schema)
    assert len(reads) == 1 and len(inserts) == 1
    for statement, parameters in [*reads, *inserts]:
        plan = await plan_of(store, statement, parameters)
        assert not reads_responses_whole(plan), plan
        assert any(index in " ".join(plan) for index in (PG_KEY_INDEX, SQLITE_KEY_INDEX)), plan


async def test_a_deleted_or_cut_parent_leaves_its_key_with_its_children(url: str, store: Store) -> None:
    """Its row goes (a deleted key names nothing); the responses that continued from it, in its session and in
    branches, keep its key, as the tree and an export show, and no number of theirs names another row."""
    from agent_store.agent_framework import StoreSessionStore

    keys = await chain(url, "u1", 4)
    branch = (await serve(url, "u1", {"model": "offline", "input": "分支", "previous_response_id": keys[1]}))["id"]
    async with Store.from_url(url) as store:
        await StoreSessionStore(store, user_id="u1").delete(keys[1])
        assert dict(await rows(store, TREE))[keys[2]] == keys[1] and dict(await rows(store, TREE))[branch] == keys[1]
        tree = {n.response_id: n.parent_id for n in await store.tree(keys[0], user_id="u1") if n.response_id}
        assert keys[1] not in tree and tree[keys[2]] == keys[1] and tree[branch] == keys[1] and tree[keys[3]] == keys[2]
        await store.truncate(keys[0], 4, user_id="u1")  # keys[2] (seq_end 6) and keys[3] go: keys[3] named keys[2]
        assert keys[2] not in dict(await rows(store, TREE)) and keys[3] not in dict(await rows(store, TREE))
        dangling = "SELECT count(*) FROM agent_responses r WHERE r.parent IS NOT NULL AND NOT EXISTS (" \
                   "SELECT 1 FROM agent_responses p WHERE p.id = r.parent)"  # fmt: skip
        assert await rows(store, dangling) == [(0,)]
        lines = [line async for line in store.export(user_id="u1")]
        assert any(f'"parent_id": "{keys[1]}", "response_id": "{branch}"' in line for line in lines)


async def test_an_import_with_two_points_under_one_key_is_refused_whole(url: str, store: Store) -> None:
    keys = await chain(url, "u1", 3)
    async with Store.from_url(url) as store:
        lines = [line async for line in store.export(user_id="u1")]
    at = next(n for n, line in enumerate(lines) if f'"response_id": "{keys[2]}"' in line)
    twice = [*lines[: at + 1], lines[at].replace('"seq_end": 6', '"seq_end": 4'), *lines[at + 1 :]]
    assert twice[at + 1] != twice[at]
    async with Store.from_url(url.replace("store.db", "other.db")) if url.startswith("sqlite") else \
            Store.from_url(url) as other:  # fmt: skip
        if url.startswith("sqlite"):
            await other.migrate()
        else:
            await other.delete(keys[0], user_id="u1")
        with pytest.raises(InvalidValueError, match="already names a point"):
            await other.import_lines(twice)
        assert await rows(other, "SELECT count(*) FROM agent_responses") == [(0,)]
        assert await rows(other, "SELECT count(*) FROM agent_sessions") == [(0,)]


async def test_the_tree_and_an_export_find_parents_by_an_index_on_the_row_id(store: Store) -> None:
    """The documented tree query and an export's response rows join a parent by its row id: an index (the rowid on
    SQLite, ``ix_agent_responses_id`` on PostgreSQL), never a read of the whole table."""
    await many_keys(store)
    with reads_sent(store) as sent:
        _ = [line async for line in store.export(user_id="u4", session_id="s34")]
    exported = [(s, p) for s, p in sent if "agent_responses" in s]
    assert len(exported) == 1
    documented = doc_block("docs/serving.md", "response-tree").replace("'u1'", "'u4'")
    for statement, parameters in [*exported, (documented.strip().rstrip(";"), None)]:
        plan = await plan_of(store, statement, parameters, index_paths=True)
        assert not reads_responses_whole(plan), plan


async def test_a_delete_racing_a_continuation_leaves_the_parent_s_key(
    url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """A response is deleted while a request continuing from it commits: the commit holds the parent's key shared
    and the delete takes it alone (PostgreSQL; SQLite serializes writers), so the new response ends up naming its
    parent by row (the delete waited, saw it, and left the key with it) or by key (it waited for the delete): never
    a row number of a row deleted meanwhile. The delete's transaction is made slow to open the window."""
    from agent_store.agent_framework import StoreSessionStore
    from agent_store.run import points as points_module

    keys = await chain(url, "u1", 2)
    forget, store_it = points_module.forget_point, StoreSessionStore.set
    forgotten, storing = asyncio.Event(), asyncio.Event()

    async def slow(conn: Any, sid: str, key: str) -> None:
        await forget(conn, sid, key)
        forgotten.set()
        async with lock_waits(url) as waiting:  # its COMMIT comes after the continuation's INSERT has come

            async def inserting() -> bool:  # PostgreSQL: the INSERT waits for this key; SQLite: for the writer
                return continuing.done() or (storing.is_set() and (store.db.dialect == "sqlite" or await waiting() > 0))

            await until(inserting, "the continuation's commit")

    async def storing_then(self: Any, *args: Any, **kwargs: Any) -> Any:
        storing.set()  # it read its parent before the delete committed, and commits now
        return await store_it(self, *args, **kwargs)

    monkeypatch.setattr(points_module, "forget_point", slow)
    monkeypatch.setattr(StoreSessionStore, "set", storing_then)

    async def delete() -> None:
        async with Store.from_url(url) as other:
            await StoreSessionStore(other, user_id="u1").delete(keys[1])

    async def continuation() -> str:
        await forgotten.wait()
        body = {"model": "offline", "input": "接着说", "previous_response_id": keys[1]}
        return str((await serve(url, "u1", body))["id"])

    continuing = asyncio.ensure_future(continuation())
    _, child = await asyncio.gather(delete(), continuing)
    ((parent, parent_key, names),) = await rows(
        store, "SELECT parent, parent_id, (SELECT count(*) FROM agent_responses p WHERE p.id = r.parent) "
               "FROM agent_responses r WHERE response_id = :c", c=child)  # fmt: skip
    assert (parent is None and parent_key == keys[1]) or (parent is not None and names == 1), (parent, parent_key)
    tree = {n.response_id: n.parent_id for n in await store.tree(keys[0], user_id="u1") if n.response_id}
    assert tree[child] == keys[1]


async def test_a_parent_is_found_only_in_the_child_s_session_or_its_base(url: str, store: Store) -> None:
    """An imported response naming a key the user holds in an unrelated conversation does not take that row as its
    parent (that row may be deleted with its conversation, which the child outlives): its parent stays by key."""
    keys = await chain(url, "u1", 2)
    other = await chain(url, "u1", 1)
    async with Store.from_url(url) as source:
        lines = [line async for line in source.export(user_id="u1", session_id=keys[0])]
    at = next(n for n, line in enumerate(lines) if f'"response_id": "{keys[1]}"' in line)
    lines[at] = lines[at].replace(f'"parent_id": "{keys[0]}"', f'"parent_id": "{other[0]}"')
    async with Store.from_url(url) as target:
        await target.delete(keys[0], user_id="u1")
        await target.import_lines(lines)
        found = await rows(target, "SELECT parent, parent_id FROM agent_responses WHERE response_id = :k", k=keys[1])
        assert found == [(None, other[0])]  # by key: the row of other[0] is another conversation's
        await target.delete(other[0], user_id="u1")
        tree = {n.response_id: n.parent_id for n in await target.tree(keys[0], user_id="u1") if n.response_id}
        assert tree[keys[1]] == other[0]
