"""Per-user keys, fourth review (issue 41): what the outside review confirmed, each a test that failed before its
fix, on both backends.

- A value shaped like a seal (``{"$sealed": ...}``) is an application's data: stored escaped, sealed by
  ``keys seal`` and by an import into a keyed store, shredded by ``erase_user``. A seal is exactly what
  ``seal_json`` writes (one key, a ``k1.`` token); anything else is content in clear.
- A changed token is ``ContentSealedError``, not another error.
- The browser shows a keyed store's messages and state as the library reads them: opened with the user's keys,
  never the ``text`` column's blind index, never content put there in clear.
- Search without the keys refuses a user with sealed sessions even after a newer session in clear.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import fresh_database
from helpers import rows
from sqlalchemy import text
from test_user_keys import talk
from test_user_keys_review import all_stored

from agent_store import ConfigurationError, ContentSealedError, InvalidValueError, KeyFile, Store
from agent_store.browser.app import create_app

SHAPED = {"diary": {"$sealed": "my diary: Zanzibar"}, "count": {"$sealed": 5},
          "two": {"$sealed": "Zanzibar", "other": 1}, "token": {"$sealed": "k1.Zanzibar"}}  # fmt: skip


@pytest.fixture
async def keyed(url: str, tmp_path: Path) -> AsyncIterator[Store]:
    async with Store.from_url(url, keys=KeyFile(tmp_path / "keys.db")) as store:
        await store.migrate()
        yield store


async def shaped_state(store: Store, sid: str, user: str) -> None:
    await talk(store, sid, user, "hello")
    async with store.session(sid, user_id=user) as session:
        session.state.update(SHAPED)
        session.state["user:note"] = {"$sealed": "Zanzibar note"}


async def loaded(store: Store, sid: str, user: str) -> dict[str, Any]:
    async with store.session(sid, user_id=user) as session:
        return {k: session.state.get(k) for k in [*SHAPED, "user:note"]}


async def test_values_shaped_like_seals_are_sealed_by_keys_seal_and_shredded(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url) as plain:
        await plain.migrate()
        await shaped_state(plain, "c1", "carol")
        assert await loaded(plain, "c1", "carol") == {**SHAPED, "user:note": {"$sealed": "Zanzibar note"}}
        async with plain.db.engine.begin() as conn:  # a row an earlier version stored unescaped
            await conn.execute(text("UPDATE agent_state SET value = :v WHERE key = 'diary'"),
                               {"v": json.dumps({"$sealed": "my diary: Zanzibar"})})  # fmt: skip
    async with Store.from_url(url, keys=KeyFile(tmp_path / "keys.db")) as keyed:
        assert sum((await keyed.seal_clear()).values()) > 0
        assert sum((await keyed.seal_clear()).values()) == 0  # nothing left in clear
        assert "Zanzibar" not in await all_stored(keyed)
        assert await loaded(keyed, "c1", "carol") == {**SHAPED, "user:note": {"$sealed": "Zanzibar note"}}
        await keyed.erase_user("carol")
        assert await keyed.db.settings.keys.keys("carol") == {}


async def test_an_import_of_values_shaped_like_seals_into_a_keyed_store_seals_them(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url) as plain:
        await plain.migrate()
        await shaped_state(plain, "c1", "carol")
        lines = [line async for line in plain.export(all_users=True)]
    # An export edited by hand (or by an older version): the values unescaped, as they look in clear.
    lines = [line.replace('{"$dict": {"$sealed": "my diary: Zanzibar"}}', '{"$sealed": "my diary: Zanzibar"}')
             for line in lines]  # fmt: skip
    (tmp_path / "target").mkdir()
    async with fresh_database(plain.db.dialect, tmp_path / "target") as target:
        async with Store.from_url(target, keys=KeyFile(tmp_path / "keys.db")) as keyed:
            await keyed.migrate()
            assert (await keyed.import_lines(lines)).imported == 1
            assert "Zanzibar" not in await all_stored(keyed)
            assert sum((await keyed.seal_clear()).values()) == 0
            assert (await loaded(keyed, "c1", "carol"))["two"] == SHAPED["two"]


async def test_a_changed_token_is_content_sealed(keyed: Store) -> None:
    await talk(keyed, "a1", "alice", "my name is Ann")
    async with keyed.db.engine.begin() as conn:
        (value,) = (await conn.execute(text("SELECT CAST(value AS TEXT) FROM agent_state WHERE key = 'mood'"))).one()
        await conn.execute(text("UPDATE agent_state SET value = :v WHERE key = 'mood'"),
                           {"v": value.replace('"k1.', '"k2.')})  # fmt: skip
    with pytest.raises(ContentSealedError):
        async with keyed.session("a1", user_id="alice"):
            pass
    async with keyed.db.engine.begin() as conn:
        await conn.execute(text("UPDATE agent_state SET value = :v WHERE key = 'mood'"), {"v": value})
        (body,) = (await conn.execute(text("SELECT CAST(body AS TEXT) FROM agent_messages WHERE seq = 0"))).one()
        await conn.execute(text("UPDATE agent_messages SET body = :v WHERE seq = 0"),
                           {"v": body.replace('"k1.', '"k2.')})  # fmt: skip
    with pytest.raises(ContentSealedError):
        await keyed.messages("a1", user_id="alice")


async def test_the_browser_shows_a_keyed_stores_content_as_the_library_reads_it(keyed: Store) -> None:
    await talk(keyed, "a1", "alice", "my name is Ann")
    await talk(keyed, "b1", "bob", "I feel fine")
    web = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(keyed)), base_url="http://127.0.0.1")
    async with web:
        listing = (await web.get("/sessions")).text
        assert "my name is Ann" in listing  # opened: not the text column's blind index
        (index,) = [r[0] for r in await rows(keyed, "SELECT text FROM agent_messages WHERE seq = 0 AND "
                                                    "session_id = 'a1'")]  # fmt: skip
        assert index.split()[0] not in listing
        async with keyed.db.engine.begin() as conn:  # content put there in clear, by SQL
            await conn.execute(text("UPDATE agent_messages SET text = 'PAY ME AT evil.example' WHERE seq = 0"))
            for table in ("agent_state", "agent_user_state"):
                await conn.execute(text(f"UPDATE {table} SET value = :v"),  # noqa: S608
                                   {"v": json.dumps("FORGED STATE")})  # fmt: skip
        for page in ("/sessions", "/sessions?user=alice", "/session?id=b1&user=bob", "/session?id=a1&user=alice"):
            shown = (await web.get(page)).text
            assert "PAY ME" not in shown and "FORGED" not in shown, page
        assert "(sealed)" in (await web.get("/session?id=b1&user=bob")).text


async def test_search_without_the_keys_refuses_past_a_newer_session_in_clear(keyed: Store, url: str) -> None:
    await talk(keyed, "s1", "alice", "my name is Ann")
    async with Store.from_url(url) as unkeyed:
        await talk(unkeyed, "s2", "alice", "hello there")  # a process without the keys writes in clear
        for scope in ({"user_id": "alice"}, {"user_id": "alice", "session_id": "s1"}, {"all_users": True}):
            with pytest.raises(ConfigurationError, match="sealed with per-user keys"):
                await unkeyed.search("Ann", **scope)


async def test_the_browser_without_the_keys_shows_no_blind_index_and_unreadable_content_as_sealed(
    keyed: Store, url: str
) -> None:
    await talk(keyed, "a1", "alice", "my name is Ann")
    (index,) = [r[0] for r in await rows(keyed, "SELECT text FROM agent_messages WHERE seq = 0")]
    async with Store.from_url(url) as unkeyed:
        web = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(unkeyed)), base_url="http://127.0.0.1")
        async with web:
            for page in ("/session?id=a1&user=alice", "/session.jsonl?id=a1&user=alice", "/sessions"):
                shown = await web.get(page)
                assert shown.status_code == 200 and index.split()[0] not in shown.text, page
    await keyed.db.settings.keys.destroy("alice")  # the key gone (an erasure's first step): nothing opens
    web = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(keyed)), base_url="http://127.0.0.1")
    async with web:
        shown = await web.get("/session.jsonl?id=a1&user=alice")
        assert shown.status_code == 200 and all(json.loads(line)["body"]["encrypted"] is True
                                                for line in shown.text.splitlines())  # fmt: skip


async def test_erasing_without_the_keys_is_refused_when_only_state_history_is_sealed(keyed: Store, url: str) -> None:
    async with keyed.session("a1", user_id="alice") as session:
        session.state["secret"] = "diary one"
    await keyed.fork("a1", new_id="b1", user_id="alice", share=True)  # a1 keeps its keys' history from now on
    for words in ("diary two", "diary three"):
        async with keyed.session("a1", user_id="alice") as session:
            session.state["secret"] = words
    async with keyed.db.engine.begin() as conn:  # what is left sealed: the history alone
        await conn.execute(text("DELETE FROM agent_state"))
        await conn.execute(text("DELETE FROM agent_messages"))
    assert await rows(keyed, "SELECT count(*) FROM agent_state_history") != [(0,)]
    async with Store.from_url(url) as unkeyed:
        with pytest.raises(ConfigurationError, match="sealed with per-user keys"):
            await unkeyed.erase_user("alice")


async def test_a_journal_event_in_a_seals_form_is_refused(store: Store) -> None:
    journal = store.journal(batch_ms=5)
    try:
        writer = await journal.start("run-1", user_id="alice", conversation_id="c1")
        async with writer:
            with pytest.raises(InvalidValueError, match="sealed"):
                await writer.append({"$sealed": "k1.anything"})
            await writer.append({"$sealed": "k1.anything", "and": "more"})  # not the form: stored as it is
        events, _ = await journal.read("run-1", user_id="alice")
        assert [e.event for e in events] == [{"$sealed": "k1.anything", "and": "more"}]
    finally:
        await journal.close()
