"""Issue 12: AG-UI thread snapshots in the store's database (the ``ag-ui`` extra), on both backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from agent_framework_ag_ui import AGUIThreadSnapshot, AGUIThreadSnapshotStore
from helpers import rows

from agent_store import InvalidValueError, Store
from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore


def snapshot(text: str) -> AGUIThreadSnapshot:
    return AGUIThreadSnapshot(
        messages=[{"id": "m1", "role": "user", "content": text}],
        state={"步骤": 2, "done": False, "nothing": None},
        interrupt=[{"id": "i1", "value": {"question": "继续吗？"}}],
        session_state={"in_memory": {"messages": []}},
    )


async def test_snapshots_are_saved_replaced_and_read_back_whole(store: Store) -> None:
    snapshots = StoreThreadSnapshotStore(store)
    assert isinstance(snapshots, AGUIThreadSnapshotStore)  # the package's runtime-checkable protocol
    assert await snapshots.get(scope="ann", thread_id="t1") is None
    await snapshots.save(scope="ann", thread_id="t1", snapshot=snapshot("我叫李明"))
    assert await snapshots.get(scope="ann", thread_id="t1") == snapshot("我叫李明")
    await snapshots.save(scope="ann", thread_id="t1", snapshot=AGUIThreadSnapshot(messages=[]))  # the latest wins
    assert await snapshots.get(scope="ann", thread_id="t1") == AGUIThreadSnapshot()
    assert await rows(store, "SELECT scope, thread_id FROM agent_ui_snapshots") == [("ann", "t1")]


async def test_a_scope_never_sees_another_s_threads(store: Store) -> None:
    snapshots = StoreThreadSnapshotStore(store)
    for scope in ("ann", "bob"):
        for thread in ("t1", "t2"):
            await snapshots.save(scope=scope, thread_id=thread, snapshot=snapshot(f"{scope}-{thread}"))
    got = await snapshots.get(scope="bob", thread_id="t1")
    assert got is not None and got.messages[0]["content"] == "bob-t1"
    assert await snapshots.delete(scope="bob", thread_id="t1") is True
    assert await snapshots.delete(scope="bob", thread_id="t1") is False
    assert await snapshots.get(scope="ann", thread_id="t1") is not None  # ann's thread of the same id stays
    await snapshots.clear(scope="ann")
    assert await rows(store, "SELECT scope, thread_id FROM agent_ui_snapshots") == [("bob", "t2")]
    await snapshots.save(scope="carol", thread_id="t9", snapshot=snapshot("x"))
    await store.erase_user("carol")  # the scope is the user id: erased with the user
    assert await rows(store, "SELECT scope FROM agent_ui_snapshots") == [("bob",)]
    await snapshots.clear()
    assert await rows(store, "SELECT count(*) FROM agent_ui_snapshots") == [(0,)]


async def test_bad_keys_and_values_are_refused_with_nothing_written(store: Store) -> None:
    snapshots = StoreThreadSnapshotStore(store)
    with pytest.raises(TypeError):
        await snapshots.save(scope=1, thread_id="t", snapshot=snapshot("x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError):
        await snapshots.get(scope="", thread_id="t")
    with pytest.raises(InvalidValueError, match="NUL"):
        await snapshots.save(scope="ann", thread_id="t", snapshot=snapshot("a\x00b"))
    with pytest.raises(InvalidValueError):
        await snapshots.save(scope="ann", thread_id="t", snapshot=AGUIThreadSnapshot(state={"x": float("nan")}))
    assert await rows(store, "SELECT count(*) FROM agent_ui_snapshots") == [(0,)]


def test_without_the_extra_the_store_still_imports_and_the_class_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['agent_framework_ag_ui'] = None\n"
        "import agent_store, agent_store.agent_framework.ag_ui\n"
        "try:\n"
        "    agent_store.agent_framework.ag_ui.StoreThreadSnapshotStore(agent_store.Store.from_url('sqlite+aiosqlite:///x.db'))\n"
        "except agent_store.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 'pip install "agent-store[ag-ui]"' in done.stdout
