"""Per-user keys, second review (issue 41): what the outside review of the keys confirmed, each a test that failed
before its fix, on both backends.

- A hosted response that continues a history read before its user's erasure is refused (it would write the erased
  conversation back, sealed under a new key); one that continues nothing is a user coming back, and is stored.
- ``erase_user`` on a store opened without the keys refuses a user whose content is sealed (it would delete the
  rows and leave the keys, so a backup stays readable), and erases nothing; the CLI says so without a traceback.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Message
from cli_support import cli, ok
from conftest import fresh_database
from helpers import rows, without_tokens
from sqlalchemy import text
from test_user_keys import talk

from agent_store import ConfigurationError, ContentSealedError, DatabaseError, KeyFile, SessionNotFoundError, Store


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
        with pytest.raises(ConfigurationError, match="sealed with per-user keys"):  # not an empty page
            await unkeyed.search("Ann", user_id="alice")
        run = await unkeyed.load("c1", user_id="carol")  # a user with nothing sealed ...
        run.session.state["plain"] = 1
        run.history.append(Message(role="user", contents=["plain words"]))
        await run.commit()
        assert (await unkeyed.search("Ann", user_id="carol")).items == []  # ... finds nothing, as before
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


async def everything_of_alices(store: Store) -> Any:
    """A user's content in every sealed table: messages and state (a run), a checkpoint, a hosted response, an
    AG-UI snapshot. Returns the checkpoint storage and its id, to read them back."""
    from agent_framework import WorkflowCheckpoint
    from agent_framework_ag_ui import AGUIThreadSnapshot
    from azure.ai.agentserver.responses import PlatformContext
    from test_hosted_responses import response, said

    from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
    from agent_store.agent_framework.checkpoints import StoreCheckpointStorage
    from agent_store.agentserver.responses import StoreResponseProvider

    await talk(store, "a1", "alice", "my name is Zanzibar")
    checkpoints = StoreCheckpointStorage(store, user_id="alice")
    saved = await checkpoints.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g",
                                                      state={"where": "Zanzibar"}))  # fmt: skip
    await StoreResponseProvider(store).create_response(response("r1", output=["o1"]), [said("i1", "Zanzibar", "user")],
                                                       None, context=PlatformContext(user_id_key="alice"))  # fmt: skip
    snapshot = AGUIThreadSnapshot(messages=[{"text": "Zanzibar"}])
    await StoreThreadSnapshotStore(store).save(scope="alice", thread_id="t1", snapshot=snapshot)
    return checkpoints, saved


async def all_stored(store: Store) -> str:
    tables = ("agent_messages", "agent_state", "agent_user_state", "agent_checkpoints", "agent_hosted_responses",
              "agent_hosted_items", "agent_ui_snapshots")  # fmt: skip
    found = [await rows(store, f"SELECT * FROM {table}") for table in tables]  # noqa: S608
    return without_tokens(json.dumps([[str(v) for v in r] for table in found for r in table], ensure_ascii=False))


async def reads_back(store: Store, checkpoints: Any, saved: str, *, snapshots: bool = True) -> None:
    from azure.ai.agentserver.responses import PlatformContext

    from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
    from agent_store.agentserver.responses import StoreResponseProvider

    reloaded = type(checkpoints)(store, user_id="alice")
    assert (await reloaded.load(saved)).state == {"where": "Zanzibar"}
    hosted = StoreResponseProvider(store)
    assert (await hosted.get_items(["i1"], context=PlatformContext(user_id_key="alice")))[0]["content"][0]["text"] \
        == "Zanzibar"  # fmt: skip
    snapshot = await StoreThreadSnapshotStore(store).get(scope="alice", thread_id="t1")
    assert not snapshots or (snapshot is not None and snapshot.messages == [{"text": "Zanzibar"}])
    assert (await store.search("zanzibar", user_id="alice")).items  # through the blind index
    assert "Zanzibar" in (await talk(store, "a1", "alice", "what is my name?"))[-1]


async def test_turning_keys_on_for_a_store_with_content_refuses_clear_rows_until_sealed(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Store.from_url(url) as plain:
        await plain.migrate()
        checkpoints, saved = await everything_of_alices(plain)
    key_file = tmp_path / "keys.db"
    async with Store.from_url(url, keys=KeyFile(key_file)) as keyed:
        with pytest.raises(ContentSealedError, match="in clear"):  # read in clear: refused, typed, nothing lost
            await keyed.load("a1", user_id="alice")
        monkeypatch.setenv("AGENT_STORE_KEYS", str(key_file))
        said = ok(cli("keys", "seal", "--batch-size", "2", url=url, cwd=tmp_path))  # small batches: several each
        assert said.startswith("sealed ") and "messages" in said and "checkpoints" in said, said
        assert "Zanzibar" not in await all_stored(keyed)
        await reads_back(keyed, checkpoints, saved)
        assert ok(cli("keys", "seal", url=url, cwd=tmp_path)).startswith("nothing in clear")  # resumable: idempotent


async def test_content_put_in_clear_into_a_keyed_store_is_refused(keyed: Store) -> None:
    """Someone with the database but not the keys writes content in clear over a user's: it is never read as hers.
    Each substitution on a user of its own; the others' content still reads."""
    from agent_framework import WorkflowCheckpoint

    from agent_store.agent_framework.checkpoints import StoreCheckpointStorage

    for user in ("u0", "u1", "u2", "u3"):
        await talk(keyed, f"{user}-s", user, "my name is Zanzibar")
    checkpoints = StoreCheckpointStorage(keyed, user_id="u3")
    saved = await checkpoints.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", state={}))
    substitutions = {
        "u0": "UPDATE agent_messages SET body = '{\"$text\": 1}', text = 'pay me' WHERE session_id = 'u0-s'",
        "u1": "UPDATE agent_state SET value = '\"forged\"' WHERE session_id = 'u1-s' AND key = 'mood'",
        "u2": "UPDATE agent_user_state SET value = '\"forged\"' WHERE user_id = 'u2'",
        "u3": "UPDATE agent_checkpoints SET payload = '{\"state\": {}}' WHERE user_id = 'u3'",
    }  # fmt: skip
    async with keyed.engine.begin() as conn:
        for sql in substitutions.values():
            await conn.execute(text(sql))
    for user in ("u0", "u1", "u2"):
        with pytest.raises(ContentSealedError, match="in clear"):
            await keyed.load(f"{user}-s", user_id=user)
    with pytest.raises(ContentSealedError, match="in clear"):  # the transcript too
        await keyed.messages("u0-s", user_id="u0")
    with pytest.raises(ContentSealedError, match="in clear"):
        await checkpoints.load(saved)
    assert (await keyed.load("u3-s", user_id="u3")).session.state["mood"] == "felt my name is Zanzibar"


async def test_an_import_into_a_keyed_store_seals_what_it_imports(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url) as plain:
        await plain.migrate()
        checkpoints, saved = await everything_of_alices(plain)
        lines = [line async for line in plain.export(all_users=True)]
    (tmp_path / "target").mkdir()
    async with fresh_database(plain.db.dialect, tmp_path / "target") as target:
        async with Store.from_url(target, keys=KeyFile(tmp_path / "keys.db")) as keyed:
            await keyed.migrate()
            report = await keyed.import_lines(lines)
            assert report.imported == 2 and report.checkpoints == 1  # her session, and her served response's transcript
            assert "Zanzibar" not in await all_stored(keyed)
            await reads_back(keyed, checkpoints, saved, snapshots=False)  # (AG-UI snapshots are not exported)


async def test_a_body_changed_outside_into_no_framework_message_is_a_typed_error(store: Store) -> None:
    await talk(store, "a1", "alice", "my name is Ann")
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE agent_messages SET body = '{\"foo\": 1}' WHERE seq = 0"))
    with pytest.raises(DatabaseError, match="not an Agent Framework message"):
        await store.load("a1", user_id="alice")
    assert (await store.messages("a1", user_id="alice"))[0].body["foo"] == 1  # the transcript shows it as stored
