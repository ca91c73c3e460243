"""Per-user keys, second review (issue 41): what the outside review of the keys confirmed, each a test that failed
before its fix, on both backends.

- A hosted response that continues a history read before its user's erasure is refused (it would write the erased
  conversation back, sealed under a new key); one that continues nothing is a user coming back, and is stored.
- ``erase_user`` on a store opened without the keys refuses a user whose content is sealed (it would delete the
  rows and leave the keys, so a backup stays readable), and erases nothing; the CLI says so without a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_framework import Message
from cli_support import cli
from helpers import rows
from test_user_keys import talk

from agent_store import ConfigurationError, KeyFile, SessionNotFoundError, Store


@pytest.fixture
async def keyed(url: str, tmp_path: Path) -> AsyncIterator[Store]:
    async with Store.from_url(url, keys=KeyFile(tmp_path / "keys.db")) as store:
        await store.migrate()
        yield store


async def test_a_hosted_response_continuing_a_history_read_before_the_erasure_is_refused(keyed: Store) -> None:
    from azure.ai.agentserver.responses import PlatformContext
    from test_hosted_responses import response, said

    from agent_store.agentserver.responses import StoreResponseProvider

    hosted, alice = StoreResponseProvider(keyed), PlatformContext(user_id_key="alice")
    await hosted.create_response(response("r1", output=["o1"]), [said("i1", "my name is Ann", "user")], None,
                                 context=alice)  # fmt: skip
    history = await hosted.get_history_item_ids("r1", None, 100, context=alice)  # the next request reads ...
    assert history == ["i1", "o1"]
    await keyed.erase_user("alice")  # ... then the user is erased, while its agent runs
    late = response("r2", output=["o2"], previous="r1")
    with pytest.raises(SessionNotFoundError, match="erased"):
        await hosted.create_response(late, [said("i2", "and my name was Ann", "user")], history, context=alice)
    with pytest.raises(SessionNotFoundError):  # another process: no read on record, so any erasure on record fences
        await StoreResponseProvider(keyed).create_response(late, [], history, context=alice)
    for table in ("agent_hosted_responses", "agent_hosted_items", "agent_hosted_links"):
        assert await rows(keyed, f"SELECT count(*) FROM {table}") == [(0,)], table  # noqa: S608
    assert await keyed.db.settings.keys.keys("alice") == {}  # nothing was sealed for her again

    await asyncio.sleep(1.1)  # past ERASURE_MARGIN (a second of clock skew between hosts): reads after the erasure
    await hosted.create_response(response("r3", output=["o3"]), [said("i3", "hello again", "user")], None,
                                 context=alice)  # fmt: skip  # a new conversation: she came back
    assert (await hosted.get_items(["i3"], context=alice))[0]["content"][0]["text"] == "hello again"
    await hosted.create_response(response("r4", output=["o4"], previous="r3"), [],
                                 await hosted.get_history_item_ids("r3", None, 100, context=alice),
                                 context=alice)  # fmt: skip  # read after the erasure: continues
    assert [r[0] for r in await rows(keyed, "SELECT response_id FROM agent_hosted_responses ORDER BY 1")] == [
        "r3", "r4"]  # fmt: skip


async def test_erasing_a_keyed_user_without_the_keys_is_refused_and_erases_nothing(
    keyed: Store, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await talk(keyed, "a1", "alice", "my name is Ann")
    async with Store.from_url(url) as unkeyed:
        with pytest.raises(ConfigurationError, match="sealed with per-user keys"):
            await unkeyed.erase_user("alice")
        monkeypatch.delenv("AGENT_STORE_KEYS", raising=False)
        said = cli("erase-user", "alice", "--yes", url=url, cwd=tmp_path)
        assert said.returncode != 0 and "sealed with per-user keys" in said.stderr, said
        assert "Traceback" not in said.stderr
        async with unkeyed.session("c1", user_id="carol") as session:  # a user with nothing sealed ...
            session.state["plain"] = 1
        assert (await unkeyed.erase_user("carol")).sessions == 1  # ... is erased as before
    for table, left in (("agent_sessions", 1), ("agent_messages", 2), ("agent_user_state", 1), ("agent_erasures", 1)):
        assert await rows(keyed, f"SELECT count(*) FROM {table}") == [(left,)], table  # noqa: S608  (carol's fence)
    assert len(await keyed.db.settings.keys.keys("alice")) == 1  # her key is still there: nothing was half done
    assert "Ann" in (await talk(keyed, "a1", "alice", "what is my name?"))[-1]
    assert (await keyed.erase_user("alice")).keys_destroyed == 1


async def test_a_refused_late_write_makes_no_key_for_the_erased_user(keyed: Store) -> None:
    """Each writer that read before an erasure and writes after it is refused, and leaves no new (empty) key of the
    user's in the key file: a run's commit, a checkpoint save, an AG-UI snapshot save, a journal batch."""
    from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException
    from agent_framework_ag_ui import AGUIThreadSnapshot

    from agent_store import StreamLostError
    from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
    from agent_store.agent_framework.checkpoints import StoreCheckpointStorage

    keys = keyed.db.settings.keys
    checkpoints, snapshots = StoreCheckpointStorage(keyed, user_id="alice"), StoreThreadSnapshotStore(keyed)
    first = await checkpoints.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", state={"n": 1}))
    loaded = await checkpoints.load(first)
    await snapshots.save(scope="alice", thread_id="t1", snapshot=AGUIThreadSnapshot(messages=[{"text": "hi"}]))
    assert await snapshots.get(scope="alice", thread_id="t1") is not None
    journal = keyed.journal(batch_events=1)
    writer = await journal.start("run-1", user_id="alice")
    await writer.append({"n": 1})
    run = await keyed.load("a-new-one", user_id="alice")  # a session of hers: loaded, not yet committed
    first_run = await keyed.load("d1", user_id="dora")  # a new user's first run: she has no key yet
    assert len(await keys.keys("alice")) == 1 and await keys.keys("dora") == {}

    await keyed.erase_user("alice")
    await keyed.erase_user("dora")
    assert await keys.keys("alice") == {}
    for late in (run, first_run):
        late.history.append(Message(role="user", contents=["late"]))
        with pytest.raises(SessionNotFoundError):
            await late.commit()
    assert await keys.keys("dora") == {}
    with pytest.raises(WorkflowCheckpointException, match="erased"):
        await checkpoints.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", state={"n": 2},
                                                  previous_checkpoint_id=loaded.checkpoint_id))  # fmt: skip
    with pytest.raises(SessionNotFoundError):
        await snapshots.save(scope="alice", thread_id="t1", snapshot=AGUIThreadSnapshot(messages=[{"text": "late"}]))
    await writer.append({"n": 2})  # its batch is refused: the writer keeps it lost, and says so next
    with pytest.raises(StreamLostError):
        await writer.append({"n": 3})
    await journal.close()
    assert await keys.keys("alice") == {}  # no write made her a key again
    for table in ("agent_sessions", "agent_checkpoints", "agent_ui_snapshots", "agent_streams"):
        assert await rows(keyed, f"SELECT count(*) FROM {table}") == [(0,)], table  # noqa: S608
