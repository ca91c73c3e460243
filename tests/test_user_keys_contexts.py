"""Per-user keys, third review (issue 41): what the outside review confirmed, each a test that failed before its
fix, on both backends.

- A hosted workflow context's checkpoints (owner ``user`` + CHECKPOINT_CONTEXT + a hash) are sealed with their
  user's keys, bound to their context, fenced by their user's erasure: ``erase_user`` shreds them with the user.
- ``erase_user`` without the keys refuses a user whose only sealed content is a hosted response's envelope or a
  context's checkpoint.
- Search without the keys finds a user's sealed messages even when their newest session has none.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException
from helpers import rows
from sqlalchemy import insert, select
from test_user_keys import talk

from agent_store import ConfigurationError, ContentSealedError, KeyFile, Store
from agent_store.agentserver.foundry import StoreCheckpointStoreProvider
from agent_store.db.tables import checkpoints_t


@pytest.fixture
async def keyed(url: str, tmp_path: Path) -> AsyncIterator[Store]:
    async with Store.from_url(url, keys=KeyFile(tmp_path / "keys.db")) as store:
        await store.migrate()
        yield store


def context(store: Store, user: str, context_id: str) -> Any:
    """The checkpoint storage a hosted workflow gets for this user and context."""
    return StoreCheckpointStoreProvider(store).get_store_for_scope(
        scope=SimpleNamespace(user_id=user), context_id=context_id, platform_context=None)  # fmt: skip


def checkpoint(ident: str, previous: str | None = None) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(workflow_name="review", graph_signature_hash="g", checkpoint_id=ident,
                              previous_checkpoint_id=previous, state={"secret": "Ann's passport 12345"})  # fmt: skip


async def restore(store: Store, backup: list[Any]) -> None:
    """Put rows copied before the erasure back, as a restored backup would."""
    async with store.db.engine.begin() as conn:
        await conn.execute(insert(checkpoints_t), [{**row, "payload": json.dumps(row["payload"])} for row in backup])


async def copied(store: Store, *where: Any) -> list[dict[str, Any]]:
    async with store.db.engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(select(checkpoints_t).where(*where))]


async def test_a_hosted_contexts_checkpoints_are_shredded_with_their_user(keyed: Store) -> None:
    await context(keyed, "alice", "ctx-1").save(checkpoint("cp-1"))
    assert (await context(keyed, "alice", "ctx-1").load("cp-1")).state["secret"] == "Ann's passport 12345"
    keys = keyed.db.settings.keys
    assert await keys.keys("alice") != {}  # sealed with alice's own key, not one of the collection's
    (owner,) = {r[0] for r in await rows(keyed, "SELECT user_id FROM agent_checkpoints")}
    assert owner != "alice" and await keys.keys(owner) == {}
    backup = await copied(keyed)
    assert b"passport" not in str(backup).encode()

    report = await keyed.erase_user("alice")
    assert report.checkpoints == 1 and report.keys_destroyed >= 1
    await restore(keyed, backup)  # the pre-erasure backup, restored
    with pytest.raises(ContentSealedError):
        await context(keyed, "alice", "ctx-1").load("cp-1")


async def test_a_checkpoint_moved_to_another_of_its_users_contexts_does_not_open(keyed: Store) -> None:
    await context(keyed, "alice", "ctx-1").save(checkpoint("cp-1"))
    await context(keyed, "alice", "ctx-2").save(checkpoint("cp-other"))
    owners = sorted(r[0] for r in await rows(keyed, "SELECT DISTINCT user_id FROM agent_checkpoints"))
    (one,) = await copied(keyed, checkpoints_t.c.checkpoint_id == "cp-1")
    await restore(keyed, [{**one, "user_id": next(o for o in owners if o != one["user_id"]), "seq": 9}])
    with pytest.raises(ContentSealedError):  # alice's key, but bound to the context it was sealed in
        await context(keyed, "alice", "ctx-2").load("cp-1")
    assert (await context(keyed, "alice", "ctx-1").load("cp-1")).checkpoint_id == "cp-1"


async def test_a_contexts_save_continuing_a_read_from_before_its_users_erasure_is_refused(keyed: Store) -> None:
    storage = context(keyed, "alice", "ctx-1")
    await storage.save(checkpoint("cp-1"))
    await storage.load("cp-1")  # the workflow resumes from it ...
    await keyed.erase_user("alice")  # ... then the user is erased
    with pytest.raises(WorkflowCheckpointException, match="erased"):
        await storage.save(checkpoint("cp-2", previous="cp-1"))
    assert await rows(keyed, "SELECT count(*) FROM agent_checkpoints") == [(0,)]
    assert await keyed.db.settings.keys.keys("alice") == {}  # and no key was made for her again


async def test_erasing_without_the_keys_is_refused_for_sealed_checkpoints_or_envelopes(keyed: Store, url: str) -> None:
    from azure.ai.agentserver.responses import PlatformContext
    from test_hosted_responses import response

    from agent_store.agentserver.responses import StoreResponseProvider

    await context(keyed, "alice", "ctx-1").save(checkpoint("cp-1"))  # alice's only sealed content
    await StoreResponseProvider(keyed).create_response(response("r1", output=[]), [], None,
                                                       context=PlatformContext(user_id_key="bob"))  # fmt: skip
    assert await rows(keyed, "SELECT count(*) FROM agent_hosted_items") == [(0,)]  # bob's: one envelope, no item
    async with Store.from_url(url) as unkeyed:
        for user in ("alice", "bob"):
            with pytest.raises(ConfigurationError, match="sealed with per-user keys"):
                await unkeyed.erase_user(user)
    assert await rows(keyed, "SELECT count(*) FROM agent_checkpoints") == [(1,)]  # nothing erased
    assert await rows(keyed, "SELECT count(*) FROM agent_hosted_responses") == [(1,)]


async def test_search_without_the_keys_is_refused_when_the_newest_session_is_empty(keyed: Store, url: str) -> None:
    await talk(keyed, "a1", "alice", "my name is Ann")
    await talk(keyed, "a2", "alice", "hello")
    await keyed.clear("a2", user_id="alice")  # the newest session, now without a message
    assert await rows(keyed, "SELECT count(*) FROM agent_messages WHERE session_id = 'a2'") == [(0,)]
    async with Store.from_url(url) as unkeyed:
        with pytest.raises(ConfigurationError, match="sealed with per-user keys"):
            await unkeyed.search("Ann", user_id="alice")


async def test_sealing_a_contexts_checkpoints_in_clear_uses_its_users_key(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url) as unkeyed:
        await unkeyed.migrate()
        await context(unkeyed, "alice", "ctx-1").save(checkpoint("cp-1"))  # before keys were turned on
    async with Store.from_url(url, keys=KeyFile(tmp_path / "keys.db")) as keyed:
        assert (await keyed.seal_clear())["checkpoints"] == 1
        (owner,) = {r[0] for r in await rows(keyed, "SELECT user_id FROM agent_checkpoints")}
        assert await keyed.db.settings.keys.keys(owner) == {} and await keyed.db.settings.keys.keys("alice") != {}
        assert (await context(keyed, "alice", "ctx-1").load("cp-1")).state["secret"] == "Ann's passport 12345"
        backup = await copied(keyed)
        await keyed.erase_user("alice")
        await restore(keyed, backup)
        with pytest.raises(ContentSealedError):
            await context(keyed, "alice", "ctx-1").load("cp-1")


async def test_a_users_export_carries_their_hosted_contexts_checkpoints(keyed: Store, tmp_path: Path) -> None:
    from conftest import fresh_database

    await context(keyed, "alice", "ctx-1").save(checkpoint("cp-1"))
    await context(keyed, "bob", "ctx-1").save(checkpoint("cp-bob"))
    lines = [line async for line in keyed.export(user_id="alice")]
    owners = [json.loads(line)["row"]["user_id"] for line in lines if json.loads(line).get("kind") == "checkpoint"]
    assert len(owners) == 1 and owners[0].startswith("alice\x1fcontext:")  # hers, and not bob's
    (tmp_path / "target").mkdir()
    async with fresh_database(keyed.db.dialect, tmp_path / "target") as target:
        async with Store.from_url(target, keys=keyed.db.settings.keys) as moved:
            await moved.migrate()
            assert (await moved.import_lines(lines)).checkpoints == 1
            assert (await context(moved, "alice", "ctx-1").load("cp-1")).state["secret"] == "Ann's passport 12345"
