"""Per-user keys and erasure by shredding (issue 41 points 4 and 6), on both backends: a user's messages and state
are sealed with the user's own key (an agent still remembers; plain SQL reads no content); content moved to
another row, key or user, or altered, does not open; ``erase_user`` destroys the key, so a backup taken before the
erasure and restored (without re-applying the erasure) yields nothing of that user, and the key is gone from the
key file's bytes; no run loaded before the erasure writes the user back; forks and branches still read; a failing
key provider is a typed error that writes nothing."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_framework import Agent, Message
from cli_support import cli, ok
from conftest import fresh_database
from helpers import rows, without_tokens
from sqlalchemy import text

from agent_store import (
    ConfigurationError,
    ContentSealedError,
    InvalidValueError,
    KeyFile,
    SessionNotFoundError,
    Store,
)
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.offline import OfflineChatClient


@pytest.fixture
async def keyed(url: str, tmp_path: Path) -> AsyncIterator[Store]:
    async with Store.from_url(url, keys=KeyFile(tmp_path / "keys.db")) as store:
        await store.migrate()
        yield store


async def talk(store: Store, sid: str, user: str, *turns: str) -> list[str]:
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[StoreHistoryProvider(store)])
    replies = []
    for turn in turns:
        async with store.session(sid, user_id=user) as session:
            replies.append((await agent.run(turn, session=session)).text)
            session.state["turns"] = session.state.get("turns", 0) + 1
            session.state["mood"] = f"felt {turn}"
            session.state["user:last"] = turn
            session.state["app:greeting"] = "welcome"
    return replies


async def stored_text(store: Store) -> str:
    """Everything plain SQL reads of messages and state, as one string."""
    found = await rows(store, "SELECT text, body FROM agent_messages")
    found += await rows(store, "SELECT key, value FROM agent_state")
    found += await rows(store, "SELECT key, value FROM agent_user_state")
    return without_tokens(json.dumps([[str(v) for v in row] for row in found], ensure_ascii=False))


async def test_a_users_content_is_sealed_and_the_agent_still_remembers(keyed: Store) -> None:
    replies = await talk(keyed, "c1", "alice", "my name is Ann", "what is my name?")
    assert "Ann" in replies[-1]
    raw = await stored_text(keyed)
    assert "Ann" not in raw and "my name" not in raw and "felt" not in raw  # no content in clear
    index = [t for (t,) in await rows(keyed, "SELECT text FROM agent_messages")]  # the blind index: tokens only
    assert index and all(re.fullmatch(r"[0-9a-f]{12}( [0-9a-f]{12})*", t) for t in index), index
    assert "k1." in raw and "$sealed" in raw
    app = await rows(keyed, "SELECT value FROM agent_app_state")
    assert "welcome" in str(app)  # an application's state is not a user's: in clear, said in the README
    run = await keyed.load("c1", user_id="alice")
    assert run.session.state["turns"] == 2 and run.session.state["user:last"] == "what is my name?"
    assert run.history[0].text == "my name is Ann"
    await run.discard()
    page = await keyed.messages("c1", user_id="alice")
    assert page[0].text == "my name is Ann" and "my name is Ann" in json.dumps(page[0].body)  # opened


async def test_content_moved_to_another_row_key_or_user_or_altered_does_not_open(keyed: Store) -> None:
    await talk(keyed, "a1", "alice", "my name is Ann", "I like tea")
    await talk(keyed, "b1", "bob", "my name is Bob")
    ids = [
        r[0] for r in await rows(keyed, "SELECT message_id FROM agent_messages WHERE session_id = 'a1' ORDER BY seq")
    ]
    bobs = (await rows(keyed, "SELECT message_id FROM agent_messages WHERE session_id = 'b1' ORDER BY seq"))[0][0]
    before = await rows(keyed, "SELECT message_id, body FROM agent_messages WHERE session_id = 'a1'")

    async def refused(change: str, **params: str) -> None:
        async with keyed.engine.begin() as conn:
            await conn.execute(text(change), params)
        with pytest.raises(ContentSealedError):
            await keyed.load("a1", user_id="alice")
        async with keyed.engine.begin() as conn:  # put back what was moved
            for message_id, body in before:
                as_text = body if isinstance(body, str) else json.dumps(body)
                await conn.execute(text("UPDATE agent_messages SET body = :b WHERE message_id = :m"),
                                   {"b": as_text, "m": message_id})  # fmt: skip
        run = await keyed.load("a1", user_id="alice")  # whole again
        await run.discard()

    move = (
        "UPDATE agent_messages SET body = (SELECT body FROM agent_messages WHERE message_id = :src) "
        "WHERE message_id = :dst"
    )
    await refused(move, src=ids[0], dst=ids[2])  # another message of hers: bound to its id
    await refused(move, src=bobs, dst=ids[0])  # bob's: a key she does not have
    tampered = await rows(keyed, "SELECT body FROM agent_messages WHERE message_id = :m", m=ids[0])
    body = tampered[0][0] if isinstance(tampered[0][0], dict) else json.loads(tampered[0][0])
    token = body["$encrypted"]
    body["$encrypted"] = token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:]
    await refused("UPDATE agent_messages SET body = :b WHERE message_id = :m", b=json.dumps(body), m=ids[0])
    async with keyed.engine.begin() as conn:  # a state value moved to another key of the same session
        await conn.execute(
            text(
                "UPDATE agent_state SET value = (SELECT value FROM agent_state s2 WHERE "
                "s2.session_id = 'a1' AND s2.key = 'turns') WHERE session_id = 'a1' AND key = 'mood'"
            )
        )
    with pytest.raises(ContentSealedError):
        await keyed.load("a1", user_id="alice")


async def test_erasure_shreds_the_key_so_a_restored_backup_yields_nothing_of_the_user(
    keyed: Store, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "keys.db"
    await talk(keyed, "a1", "alice", "my name is Ann")
    await talk(keyed, "b1", "bob", "my name is Bob")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    alices = await KeyFile(key_file).keys("alice")
    assert len(alices) == 1 and b"alice" not in key_file.read_bytes()  # owners by SHA-256, not by id
    backup = tmp_path / "before.backup"
    ok(cli("backup", "-o", str(backup), url=url, cwd=tmp_path))

    monkeypatch.setenv("AGENT_STORE_KEYS", str(key_file))  # the CLI's key file
    said = ok(cli("erase-user", "alice", "--yes", url=url, cwd=tmp_path))
    assert said.strip().endswith("1 keys destroyed"), said
    left = key_file.read_bytes()
    assert not any(key in left for key in alices.values())  # secure_delete: the bytes themselves are gone
    owner = hashlib.sha256(b"alice").hexdigest()
    assert sqlite3.connect(key_file).execute("SELECT count(*) FROM agent_store_keys WHERE owner = ?",
                                             (owner,)).fetchone() == (0,)  # fmt: skip

    async with fresh_database(keyed.db.dialect, tmp_path / "r") as target:
        (tmp_path / "r").mkdir(exist_ok=True)
        ok(cli("restore", str(backup), url=target, cwd=tmp_path))  # no --erasures-from: the rows come back
        async with Store.from_url(target, keys=KeyFile(key_file)) as restored:
            assert await rows(restored, "SELECT count(*) FROM agent_messages WHERE session_id = 'a1'") == [(2,)]
            with pytest.raises(ContentSealedError):
                await restored.load("a1", user_id="alice")
            with pytest.raises(ContentSealedError):
                await restored.messages("a1", user_id="alice")
            assert "Ann" not in await stored_text(restored)
            assert "Bob" in (await talk(restored, "b1", "bob", "what is my name?"))[-1]  # bob's is whole


async def test_no_run_loaded_before_the_erasure_writes_the_user_back(keyed: Store) -> None:
    await talk(keyed, "a1", "alice", "my name is Ann")
    early = await keyed.load("a1", user_id="alice")
    report = await keyed.erase_user("alice")
    assert report.keys_destroyed == 1 and report.sessions == 1
    early.history.append(Message(role="user", contents=["I am back"]))
    with pytest.raises(SessionNotFoundError):
        await early.commit()
    assert await rows(keyed, "SELECT count(*) FROM agent_sessions") == [(0,)]
    assert await KeyFile(Path(keyed.db.settings.keys.path)).keys("alice") == {}


async def test_forks_and_branches_read_under_the_users_keys(keyed: Store) -> None:
    from test_conversation_trees import _tree

    await talk(keyed, "c1", "alice", "my name is Ann", "I like tea")
    forked = await keyed.fork("c1", user_id="alice")
    assert "Ann" in (await talk(keyed, forked, "alice", "what is my name?"))[-1]
    sessions = await _tree(keyed)  # user "u": a branch b1 from r2
    b1 = await sessions.get("b1")
    assert b1 is not None and [m.text for m in b1.state["in_memory"]["messages"]] == ["to r1", "to r2", "to b1"]
    assert "to b1" not in await stored_text(keyed)


class FailingKeys(KeyFile):
    def __init__(self, path: Path, failing: str) -> None:
        super().__init__(path)
        self.failing = failing

    async def keys(self, user_id: str) -> dict[str, bytes]:
        if self.failing == "keys":
            raise OSError("the key service is down")
        return await super().keys(user_id)

    async def new_key(self, user_id: str) -> tuple[str, bytes]:
        if self.failing == "new_key":
            raise OSError("the key service is down")
        return await super().new_key(user_id)


async def test_a_failing_key_provider_is_a_typed_error_and_writes_nothing(url: str, tmp_path: Path) -> None:
    for failing in ("keys", "new_key"):
        async with Store.from_url(url, keys=FailingKeys(tmp_path / f"{failing}.db", failing)) as store:
            await store.migrate()
            with pytest.raises(ConfigurationError, match="key provider failed: OSError: the key service is down"):
                await talk(store, "c1", "alice", "my name is Ann")
            assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
    with pytest.raises(ConfigurationError, match="KeyProvider"):
        Store.from_url(url, keys="keys.db")
    with pytest.raises(ConfigurationError, match="not with a message_cipher"):
        Store.from_url(url, keys=KeyFile(tmp_path / "k.db"), message_cipher=object())
    async with Store.from_url(url, keys=KeyFile(tmp_path / "k.db"), embedder="wordllama") as store:
        await store.migrate()
        with pytest.raises(ConfigurationError, match="keeps no text to embed"):
            await store.embeddings.backfill()


async def test_exact_terms_are_found_through_the_users_blind_index(
    keyed: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Search on sealed messages: words (any case), Chinese pairs and single characters, phrases in order, OR and
    exclusions; only the user's own; snippets opened with the user's keys; a term no stored message holds finds
    nothing, and a longer word is not its prefix (exact terms)."""
    await talk(keyed, "a1", "alice", "我订了去北京的机票", "I booked a FLIGHT to Beijing")
    await talk(keyed, "b1", "bob", "my flight to Beijing too")

    async def found(query: str) -> list[tuple[str, int]]:
        page = await keyed.search(query, user_id="alice", ranking="keyword")
        return [(h.session_id, h.seq) for h in page.items if h.role == "user"]  # (the replies echo some)

    chinese, english = ("a1", 0), ("a1", 2)
    assert await found("北京") == [chinese] and await found("京") == [chinese] and await found("机票") == [chinese]
    assert await found("flight") == [english] and await found("beijing") == [english]
    assert await found('"booked a flight"') == [english] and await found('"flight booked"') == []
    assert sorted(await found("北京 OR flight")) == [chinese, english]
    assert await found("beijing -booked") == [] and await found("flights") == [] and await found("上海") == []
    page = await keyed.search("北京", user_id="alice", ranking="keyword")
    assert "北京" in page.items[0].snippet and page.items[0].marks  # opened, and marked, with her keys
    assert {h.session_id for h in (await keyed.search("flight", user_id="bob")).items} == {"b1"}
    assert (await keyed.search("flight", user_id="carol")).items == []  # no keys at all: nothing
    with pytest.raises(InvalidValueError, match="one user's messages at a time"):
        await keyed.search("flight", all_users=True)
    monkeypatch.setenv("AGENT_STORE_KEYS", str(tmp_path / "keys.db"))
    shown = ok(cli("search", "北京", "--user", "alice", url=str(keyed.url.render_as_string(hide_password=False)),
                   cwd=tmp_path))  # fmt: skip
    assert "机票" in shown


async def test_checkpoints_snapshots_journal_and_hosted_responses_are_sealed_too(keyed: Store) -> None:
    """Every other payload of a user's: sealed at rest, read back by the user, and unreadable once the user's key
    is gone (what a restored pre-erasure backup holds); a sealed item moved to another id does not open."""
    from agent_framework import WorkflowCheckpoint
    from agent_framework_ag_ui import AGUIThreadSnapshot
    from azure.ai.agentserver.responses import PlatformContext
    from test_hosted_responses import response, said

    from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
    from agent_store.agent_framework.checkpoints import StoreCheckpointStorage
    from agent_store.agentserver.responses import StoreResponseProvider

    secret = "Zanzibar"
    checkpoints = StoreCheckpointStorage(keyed, user_id="alice")
    saved = await checkpoints.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g",
                                                      state={"where": secret}))  # fmt: skip
    snapshots = StoreThreadSnapshotStore(keyed)
    await snapshots.save(scope="alice", thread_id="t1", snapshot=AGUIThreadSnapshot(messages=[{"text": secret}]))
    journal = keyed.journal(batch_ms=5)
    try:
        writer = await journal.start("run-1", user_id="alice")
        async with writer:
            await writer.append({"said": secret})
        events, _ = await journal.read("run-1", user_id="alice")
    finally:
        await journal.close()
    hosted, alice = StoreResponseProvider(keyed), PlatformContext(user_id_key="alice")
    await hosted.create_response(response("r1", output=["o1"]), [said("i1", secret, "user")], None, context=alice)

    assert (await checkpoints.load(saved)).state == {"where": secret}
    assert (await snapshots.get(scope="alice", thread_id="t1")).messages == [{"text": secret}]  # type: ignore[union-attr]
    assert [e.event for e in events] == [{"said": secret}]
    assert (await hosted.get_response("r1", context=alice))["output"][0]["id"] == "o1"
    assert (await hosted.get_items(["i1"], context=alice))[0]["content"][0]["text"] == secret
    assert (await hosted.get_input_items("r1", context=alice))[0]["id"] == "i1"
    tables = ("agent_checkpoints", "agent_ui_snapshots", "agent_stream_events", "agent_hosted_responses",
              "agent_hosted_items")  # fmt: skip
    for table in tables:
        dumped = json.dumps([[str(v) for v in r] for r in await rows(keyed, f"SELECT * FROM {table}")])  # noqa: S608
        assert secret not in dumped and "$sealed" in dumped, table

    async with keyed.engine.begin() as conn:  # an item's body moved to another item id of hers: refused
        await conn.execute(text("UPDATE agent_hosted_items SET body = (SELECT body FROM agent_hosted_items "
                                "WHERE item_id = 'i1') WHERE item_id = 'o1'"))  # fmt: skip
    with pytest.raises(ContentSealedError):
        await hosted.get_items(["o1"], context=alice)

    await keyed.db.settings.keys.destroy("alice")  # the rows stay, as in a backup taken before the erasure
    reads = (
        lambda: checkpoints.load(saved),
        lambda: snapshots.get(scope="alice", thread_id="t1"),
        lambda: hosted.get_items(["i1"], context=alice),
        lambda: hosted.get_response("r1", context=alice),
    )
    for read in reads:
        with pytest.raises(ContentSealedError):
            await read()
    assert await checkpoints.list_checkpoints(workflow_name="wf") == []  # skipped, as one that does not decode
    journal = keyed.journal(batch_ms=5)
    try:
        with pytest.raises(ContentSealedError):
            await journal.read("run-1", user_id="alice")
    finally:
        await journal.close()


@pytest.mark.parametrize("with_keys", [pytest.param(False, id="no-keys"), pytest.param(True, id="keys")])
async def test_a_restore_re_applies_an_erasure_of_a_keyed_user_with_or_without_the_keys(
    keyed: Store, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_keys: bool
) -> None:
    """docs/operations.md's restore, as written: the erased user's keys went with the erasure, so the re-erasure
    needs none; the restored store keeps nothing of theirs and holds the erasure record (the fence)."""
    key_file = tmp_path / "keys.db"
    await talk(keyed, "a1", "alice", "my name is Ann")
    await talk(keyed, "b1", "bob", "my name is Bob")
    backup, log = tmp_path / "before.backup", tmp_path / "erasures.jsonl"
    ok(cli("backup", "-o", str(backup), url=url, cwd=tmp_path))
    assert (await keyed.erase_user("alice")).keys_destroyed == 1
    ok(cli("erasures", "-o", str(log), url=url, cwd=tmp_path))
    if with_keys:
        monkeypatch.setenv("AGENT_STORE_KEYS", str(key_file))

    async with fresh_database(keyed.db.dialect, tmp_path / "r") as target:
        (tmp_path / "r").mkdir(exist_ok=True)
        said = ok(cli("restore", str(backup), "--erasures-from", str(log), url=target, cwd=tmp_path))
        assert said.strip().endswith("1 users erased since the backup were erased again"), said
        async with Store.from_url(target, keys=KeyFile(key_file)) as restored:
            for count in ("SELECT count(*) FROM agent_sessions WHERE user_id = 'alice'",
                          "SELECT count(*) FROM agent_user_state WHERE user_id = 'alice'",
                          "SELECT count(*) FROM agent_usage WHERE user_id = 'alice'"):  # fmt: skip
                assert await rows(restored, count) == [(0,)]
            assert await rows(restored, "SELECT count(*) FROM agent_messages WHERE session_id = 'a1'") == [(0,)]
            owner = hashlib.sha256(b"alice").hexdigest()
            assert await rows(restored, "SELECT count(*) FROM agent_erasures WHERE user_key = :k", k=owner) == [(1,)]
            with pytest.raises(SessionNotFoundError):
                await restored.messages("a1", user_id="alice")
            assert "Bob" in (await talk(restored, "b1", "bob", "what is my name?"))[-1]  # bob's is whole
