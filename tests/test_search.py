"""store.search on both backends: Chinese, mixed and short queries, the syntax, scoping, paging, injection,
encryption, the index kept in step with deletes, and the agent's own search tool."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from agent_framework import Agent, Message
from helpers import rows
from sqlalchemy import text

from agent_store import InvalidValueError, Store
from agent_store.agent_framework import SearchHistoryProvider
from agent_store.offline import OfflineChatClient
from agent_store.search.query import parse


async def say(store: Store, session_id: str, *texts: str, user_id: str = "u", agent_id: str | None = None) -> None:
    """Store user messages as written (no agent replies), one run."""
    async with store.session(session_id, user_id=user_id, agent_id=agent_id) as session:
        for words in texts:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=[words]))


async def found(store: Store, query: str, **scope: str) -> list[tuple[str, int]]:
    page = await store.search(query, user_id=scope.pop("user_id", "u"), **scope)
    return sorted((hit.session_id, hit.seq) for hit in page.items)


@pytest.fixture
async def chats(store: Store) -> Store:
    await say(store, "li", "我叫李明", "我的名字很好听", "李明的 password 是 hunter2")
    await say(store, "ai", "AI is said to be great", "Email me at li@example.com", "50% off, use code X_1")
    await say(store, "other", "我叫李明 (another user's)", "AI password", user_id="intruder")
    return store


async def test_chinese_short_and_mixed_queries_find_the_right_messages(chats: Store) -> None:
    assert await found(chats, "李明") == [("li", 0), ("li", 2)]
    assert await found(chats, "名字") == [("li", 1)]
    assert await found(chats, "李") == [("li", 0), ("li", 2)]
    assert await found(chats, "李明 password") == [("li", 2)]
    assert await found(chats, "PASSWORD") == [("li", 2)]  # case-insensitive
    assert await found(chats, "pass") == [("li", 2)]  # a substring: "pass" is in "password"
    assert await found(chats, "AI") == [("ai", 0)]  # a short word matches as a word: not "said", not "hunter2"
    assert await found(chats, "ai") == [("ai", 0)]
    assert await found(chats, "said") == [("ai", 0)]
    assert await found(chats, "example.com") == [("ai", 1)]


async def test_the_syntax_phrases_or_and_exclusion(chats: Store) -> None:
    assert await found(chats, '"is said"') == [("ai", 0)]
    assert await found(chats, '"said is"') == []
    assert await found(chats, "hunter2 OR great") == [("ai", 0), ("li", 2)]
    assert await found(chats, "李明 -password") == [("li", 0)]
    assert await found(chats, '李明 -"hunter2"') == [("li", 0)]
    assert await found(chats, "OR") == []  # a lone OR is a word, found nowhere here
    page = await chats.search("great OR said AI", user_id="u")
    assert [(h.seq, h.rank) for h in page.items] == [(0, 3)]  # both alternatives and AI: rank 3
    page = await chats.search("hunter2 OR 李明", user_id="u")
    assert [(h.session_id, h.seq, h.rank) for h in page.items] == [("li", 2, 2), ("li", 0, 1)]  # more terms first
    with pytest.raises(InvalidValueError, match="at least one term"):
        await chats.search("-password", user_id="u")
    with pytest.raises(InvalidValueError, match="at least one term"):
        await chats.search("   ", user_id="u")
    with pytest.raises(InvalidValueError, match="at most 16 terms"):
        await chats.search(" ".join(f"w{i}" for i in range(17)), user_id="u")


@pytest.mark.parametrize("query", ['"', "*", "NEAR(", "%", "');--", '"unclosed', "a*b", "_", "\\", "^", "''", "AND"])
async def test_query_text_is_data_never_syntax(chats: Store, query: str) -> None:
    hits = await found(chats, query)
    expected = {"%": [("ai", 2)], "_": [("ai", 2)]}.get(query, [])
    assert hits == expected


async def test_hits_never_leave_the_user_and_honour_session_and_agent(chats: Store) -> None:
    assert await found(chats, "李明", user_id="intruder") == [("other", 0)]
    assert await found(chats, "hunter2", user_id="intruder") == []
    assert await found(chats, "李明", session_id="ai") == []
    await say(chats, "bot-chat", "李明 again", agent_id="helper")
    assert await found(chats, "李明", agent_id="helper") == [("bot-chat", 0)]
    page = await chats.search("李明", user_id="u")
    assert {h.title for h in page.items} == {None}
    hit = next(h for h in page.items if h.seq == 2)
    assert hit.snippet == "李明的 password 是 hunter2" and hit.marks == [(0, 2)] and hit.role == "user"


async def test_paging_with_the_cursor_is_exact_while_messages_arrive(store: Store) -> None:
    for i in range(7):
        await say(store, f"s{i}", f"note {i} about the quokka", f"quokka {i} again")
    seen: list[tuple[str, int]] = []
    page = await store.search("quokka", user_id="u", limit=4)
    while True:
        seen += [(h.session_id, h.seq) for h in page.items]
        await say(store, f"late{len(seen)}", "a late quokka")  # newer: ranks above the pages already read
        if page.next_cursor is None:
            break
        page = await store.search("quokka", user_id="u", limit=4, cursor=page.next_cursor)
    assert sorted(seen) == sorted((f"s{i}", seq) for i in range(7) for seq in (0, 1))
    with pytest.raises(InvalidValueError, match="cursor"):
        await store.search("quokka", user_id="u", cursor="not-a-cursor")


async def test_the_index_follows_deletes_truncates_and_erasures(store: Store) -> None:
    await say(store, "a", "alpha quokka", "beta quokka")
    await say(store, "b", "gamma quokka")
    await say(store, "c", "delta quokka", user_id="gone")
    await store.truncate("a", 0, user_id="u")
    await store.delete("b", user_id="u")
    await store.erase_user("gone")
    assert await found(store, "quokka") == [("a", 0)]
    assert await found(store, "quokka", user_id="gone") == []
    await say(store, "a", "epsilon quokka")
    assert await found(store, "quokka") == [("a", 0), ("a", 1)]
    if store.engine.dialect.name == "sqlite":  # FTS5's own consistency check against agent_messages
        async with store.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO agent_messages_fts(agent_messages_fts, rank) VALUES ('integrity-check', 1)")
            )


async def test_encrypted_messages_are_not_indexed(url: str) -> None:
    from test_core import ReversingCipher

    async with Store.from_url(url, message_cipher=ReversingCipher()) as store:
        await store.migrate()
        await say(store, "secret", "我叫李明 and my password")
        assert await found(store, "李明") == []
        assert await found(store, "password") == []
        assert await rows(store, "SELECT text FROM agent_messages") == [("",)]


async def test_the_migration_indexes_messages_written_before_it(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url) as store:
        await store.migrate("0006")
        async with Store.from_url(url, check_schema=False) as old:
            sqlite = old.engine.dialect.name == "sqlite"
            when: object = "2026-01-01 00:00:00" if sqlite else datetime(2026, 1, 1, tzinfo=UTC)
            async with old.engine.begin() as conn:
                session = ("INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at,"
                           " metadata, incarnation) VALUES ('old', 'u', 1, 1, :t, :t, '{}', 1)")  # fmt: skip
                message = ("INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, text, created_at,"
                           " body) VALUES ('old', 0, 'm0', 'r0', 'user', '我叫李明 AI', :t, '{}')")  # fmt: skip
                await conn.execute(text(session), {"t": when})
                await conn.execute(text(message), {"t": when})
        await store.migrate()
        assert await found(store, "李明") == [("old", 0)]
        assert await found(store, "叫李明") == [("old", 0)]  # three characters: served by the index
        assert await found(store, "ai") == [("old", 0)]  # a short word: PostgreSQL's words index (0009's)
        for revision in ("0008", "0006"):  # down across each search migration and back up
            await store.downgrade(revision)
            await store.migrate()
            assert await found(store, "叫李明") == await found(store, "ai") == [("old", 0)]


async def test_the_agent_searches_the_users_past_sessions_with_its_tool(store: Store) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[SearchHistoryProvider()])
    await say(store, "last-week", "我叫李明，住在上海")
    await say(store, "stranger", "我叫李明 too", user_id="someone-else")
    async with store.session("today", user_id="u") as session:
        reply = await agent.run("搜索 李明", session=session)
    assert "[last-week]" in reply.text and "上海" in reply.text
    assert "stranger" not in reply.text and "today" not in reply.text
    async with store.session("today", user_id="u") as session:
        reply = await agent.run("search -nothing", session=session)
    assert "invalid search" in reply.text  # the model's bad query is an answer, not a failed run
    calls = await rows(store, "SELECT count(*) FROM agent_tool_calls WHERE session_id = 'today'")
    assert calls == [(4,)]  # two calls, two results: stored with the transcript


def test_the_parser_keeps_operators_out_of_terms() -> None:
    query = parse('李明 "two words" a OR b -x -"y z" OR')
    assert query.clauses == [["李明"], ["two words"], ["a", "b"], ["OR"]]
    assert query.excluded == ["x", "y z"]


@pytest.mark.parametrize("query", ["\x00", "李\x00", "zz\x00", "ab\udcff", "\ud800"])
async def test_nul_and_lone_surrogates_are_refused_by_name(chats: Store, query: str) -> None:
    with pytest.raises(InvalidValueError, match="NUL or lone surrogate"):
        await chats.search(query, user_id="u")


async def test_short_terms_fold_case_in_any_script_and_words_end_at_any_non_letter(store: Store) -> None:
    await say(store, "s", "CAFÉ NOIR", "café", "Привет МИР", "ΣΟΦΙΑ", "éok", "ok_go", "it's ok", "AIde", "the ai.")
    assert await found(store, "é") == [("s", 0), ("s", 1), ("s", 4)]
    assert await found(store, "пр") == [("s", 2)]
    assert await found(store, "σο") == [("s", 3)]
    assert await found(store, "ok") == [("s", 5), ("s", 6)]  # not inside "éok": é is a letter
    assert await found(store, "ai") == [("s", 8)]
    await say(store, "t", "email ab@x.com now", "version 3.5 out", "path /usr/ab/ok")
    assert await found(store, "ab") == [("t", 0), ("t", 2)]  # a word between any two non-letters, on both backends
    assert await found(store, "5") == [("t", 1)]


async def test_a_long_message_is_stored_and_its_words_found(store: Store) -> None:
    """1.3 MB of distinct words: more than a tsvector can hold, so PostgreSQL's word index covers the first
    100,000 characters; the message is stored whole, and substrings are found anywhere in it."""
    words = " ".join(f"w{i:06d}x" for i in range(150_000))
    await say(store, "long", "ok " + words + " zz tail-marker")
    assert await found(store, "ok") == [("long", 0)]
    assert await found(store, "tail-marker") == [("long", 0)]
    assert await found(store, "w149999x") == [("long", 0)]


async def test_a_tampered_cursor_is_refused(chats: Store) -> None:
    import base64
    import json

    for forged in ([1, "2026-01-01T00:00:00", "li", 0], [1, "2026-01-01T00:00:00+00:00", "li\x00", 0], [1, 2, 3, 4],
                   [2**40, "2026-01-01T00:00:00+00:00", "li", 0], [1, "2026-01-01T00:00:00+00:00", "li", 2**40],
                   [1, "0001-01-01T00:00:00+14:00", "li", 0]):  # fmt: skip
        cursor = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode()
        with pytest.raises(InvalidValueError, match="cursor"):
            await chats.search("李明", user_id="u", cursor=cursor)


async def test_the_tool_sees_only_what_the_sessions_agent_may_open(store: Store) -> None:
    await say(store, "a-private", "whale notes of agent A", agent_id="A")
    await say(store, "shared", "whale notes, unbound")
    agent = Agent(client=OfflineChatClient(), name="Bot", context_providers=[SearchHistoryProvider()])
    async with store.session("b-chat", user_id="u", agent_id="B") as session:
        reply = await agent.run("search whale", session=session)
    assert "[shared]" in reply.text and "a-private" not in reply.text


async def test_every_hit_and_only_hits_against_a_reference_in_python(store: Store) -> None:
    """Random texts over letters of three scripts, digits and separators; for sampled terms of every kind, the
    messages found are exactly those Python says hold the term (a whole short word, else a substring)."""
    import random

    from agent_store.db.text_match import has_word

    rnd = random.Random(11)
    alphabet = [*"abcAB12 ,.-_@李明名字好的。éÉпр", "said", "ok", "李明", " the ai."]
    texts = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 25))) for _ in range(120)]
    texts += ["abca cab", "李明名 明名字", "ABCAB"]  # every trigram of "abcab" / "李明名字", the term only in one
    await say(store, "r", *texts)
    terms = [
        "abcab",
        "李明名字",
        "ab",
        "AB",
        "a",
        "1",
        "12",
        "ok",
        "ai",
        "李",
        "李明",
        "名字",
        "é",
        "пр",
        "said",
        "李明名",
        "the ai",
    ]
    terms += [t[i : i + n] for t in rnd.sample(texts, 25) for n in (3, 5) for i in [rnd.randrange(len(t))]]
    for term in dict.fromkeys(t.strip() for t in terms):  # each searched as a phrase: one term, as written
        if not term or '"' in term or term == "OR" or term.startswith("-"):
            continue
        short = len(term) < 3 and term.isascii() and term.isalnum()
        expected = [
            ("r", i) for i, t in enumerate(texts) if (has_word(t, term) if short else term.lower() in t.lower())
        ]
        page = await store.search(f'"{term}"', user_id="u", limit=200)
        assert sorted((h.session_id, h.seq) for h in page.items) == expected, term
