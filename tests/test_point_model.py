"""Random request sequences through the hosting route, on StoreSessionStore and on the framework's in-memory
``SessionStore`` side by side (issue 58): after every request and every delete, every key ever used must read the
same conversation on both, or be absent on both.

A step is one of: a request that starts a conversation (stored under its response id), one that continues from an
earlier response id (any: live, deleted, never used, or one whose background request still runs), a turn of a
stable conversation id, a background request's start or end, or a delete of any key.
The route is agent-framework-hosting's own ``AgentState`` (``get_or_create_session`` then ``set_session``), as
tests/hosting_route.py drives it; the agent is the offline one, so both sides get the same replies.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, SessionStore
from agent_framework_hosting import AgentState

from agent_store import InvalidValueError, Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.offline import OfflineChatClient
from agent_store.run import points

WORDS = ["hello", "my name is Ann", "what is my name?", "tell me more", "why?", "so?", "and then"]


def view(session: AgentSession | None) -> list[tuple[str, str]] | None:
    """What a model is given of a stored conversation: its messages' roles and texts, in order. An empty one reads
    as absent: ``get_or_create_session`` stores an empty session under a key it did not find, which the in-memory
    store then returns and agent_store need not (a deleted id stays deleted); either way the next request starts
    from nothing."""
    if session is None:
        return None
    history = session.state.get("in_memory", {}).get("messages", [])
    return [(str(m.role), m.text) for m in history] or None


class Side:
    """One session store behind the route, as a web app holds it."""

    def __init__(self, sessions: Any) -> None:
        self.sessions = sessions
        self.state = AgentState(Agent(client=OfflineChatClient(), name="Assistant"), session_store=sessions)
        self.running: dict[str, tuple[str, AgentSession]] = {}  # background requests begun, not finished

    async def begin(self, words: str, response_id: str) -> None:
        """A background request starts a conversation: its session is made now, its turn stored when it ends."""
        self.running[response_id] = (words, await self.state.get_or_create_session(response_id))

    async def finish(self, response_id: str) -> None:
        words, session = self.running.pop(response_id)
        await (await self.state.get_target()).run(words, session=session)
        await self.state.set_session(response_id, session)

    async def request(self, words: str, *, previous: str | None, conversation: str | None, response_id: str) -> None:
        """One ``POST /responses``: previous_response_id, conversation, or neither (as hosting_route.serve)."""
        session = await self.state.get_or_create_session(conversation or previous or response_id)
        await (await self.state.get_target()).run(words, session=session)
        await self.state.set_session(conversation or response_id, session)


def steps(seed: int, count: int) -> list[tuple[str, ...]]:
    """A random sequence: which request, from where, or which key to delete."""
    r = random.Random(seed)
    responses: list[str] = []
    conversations: list[str] = []
    running: list[str] = []
    drawn: list[tuple[str, ...]] = []
    for n in range(count):
        words = f"{r.choice(WORDS)} #{n}"
        kind = r.choices(["start", "continue", "conversation", "delete", "background"], weights=[2, 5, 2, 2, 2])[0]
        if kind == "continue" and responses:
            previous = r.choice([*responses, "never_used"])  # (a conversation id is no response id: not one)
            drawn.append(("continue", words, previous, f"resp_{n}"))
            responses.append(f"resp_{n}")
        elif kind == "conversation":
            conversation = r.choice(conversations) if conversations and r.random() < 0.7 else f"conv_{n}"
            conversations.append(conversation)
            drawn.append(("conversation", words, conversation, f"resp_{n}"))
        elif kind == "background" and not running:
            drawn.append(("begin", words, f"resp_{n}"))
            running.append(f"resp_{n}")
            responses.append(f"resp_{n}")  # continued from while it runs, now and then
        elif kind == "background" or (running and n == count - 1):
            drawn.append(("finish", running.pop()))
        elif kind == "delete" and (responses or conversations):
            drawn.append(("delete", r.choice(responses + conversations + ["never_used"])))
        else:
            drawn.append(("start", words, f"resp_{n}"))
            responses.append(f"resp_{n}")
    return drawn


async def apply(side: Side, step: tuple[str, ...]) -> None:
    match step:
        case ("start", words, key):
            await side.request(words, previous=None, conversation=None, response_id=key)
        case ("continue", words, previous, key):
            await side.request(words, previous=previous, conversation=None, response_id=key)
        case ("conversation", words, conversation, key):
            await side.request(words, previous=None, conversation=conversation, response_id=key)
        case ("delete", key):
            await side.sessions.delete(key)
        case ("begin", words, key):
            await side.begin(words, key)
        case ("finish", key):
            await side.finish(key)


@pytest.mark.parametrize("seed", range(16))
async def test_random_requests_read_as_the_frameworks_in_memory_store(url: str, seed: int) -> None:
    drawn = steps(seed, 16)
    keys = sorted({part for step in drawn for part in step[2:]} | {"never_used"})
    async with Store.from_url(url) as store:
        await store.migrate()
        reference, stored = Side(SessionStore()), Side(StoreSessionStore(store, user_id="u"))
        for number, step in enumerate(drawn):
            await apply(reference, step)
            await apply(stored, step)
            for key in keys:
                expected = view(await reference.sessions.get(key))
                got = view(await stored.sessions.get(key))
                assert got == expected, (seed, number, step, key)


async def test_deleting_an_id_that_named_nothing_keeps_what_continued_from_it(url: str) -> None:
    """A request continued from an id nobody had stored (the route stored an empty session under it first), then
    that id is deleted: in the framework's store only the id goes; before, the session under it went, and with it
    the response continued from it."""
    async with Store.from_url(url) as store:
        await store.migrate()
        side = Side(StoreSessionStore(store, user_id="u"))
        await side.request("my name is Ann", previous="nothing_yet", conversation=None, response_id="resp_1")
        await side.sessions.delete("nothing_yet")
        assert view(await side.sessions.get("resp_1")) == [("user", "my name is Ann"),
                                                           ("assistant", "你好，Ann！很高兴认识你。")]  # fmt: skip
        assert await side.sessions.get("nothing_yet") is None


async def test_a_deleted_id_stays_deleted_when_a_request_continues_from_it(url: str) -> None:
    """Continuing from a deleted response id starts from nothing, and the id does not come back with its history."""
    async with Store.from_url(url) as store:
        await store.migrate()
        side = Side(StoreSessionStore(store, user_id="u"))
        await side.request("my name is Ann", previous=None, conversation=None, response_id="resp_1")
        await side.request("tell me more", previous="resp_1", conversation=None, response_id="resp_2")
        await side.sessions.delete("resp_1")
        await side.request("what is my name?", previous="resp_1", conversation=None, response_id="resp_3")
        assert await side.sessions.get("resp_1") is None
        assert view(await side.sessions.get("resp_3")) == [("user", "what is my name?"),
                                                           ("assistant", "我不知道你叫什么名字。")]  # fmt: skip
        asked = [text for role, text in view(await side.sessions.get("resp_2")) or [] if role == "user"]
        assert asked == ["my name is Ann", "tell me more"]
        # A turn set under it again is a new write (as in the framework's store): it reads that turn alone.
        await side.request("again", previous=None, conversation="resp_1", response_id="resp_4")
        assert [t for role, t in view(await side.sessions.get("resp_1")) or [] if role == "user"] == ["again"]
        # A conversation id (not shaped as a response id) deleted while a response continued from it stays deleted:
        await side.request("hello", previous=None, conversation="conv_1", response_id="resp_5")
        await side.request("go on", previous="conv_1", conversation=None, response_id="resp_6")
        await side.sessions.delete("conv_1")
        with pytest.raises(InvalidValueError, match="was deleted while responses continued from it remain"):
            await side.request("again", previous=None, conversation="conv_1", response_id="resp_7")
        assert [t for role, t in view(await side.sessions.get("resp_6")) or [] if role == "user"] == ["hello", "go on"]


async def test_a_turn_continuing_from_an_id_deleted_meanwhile_lands(url: str) -> None:
    """A request loads r0 (a point the head has moved past), r0 is deleted, then the request's turn is set: in
    the framework's store it lands (the request holds its own copy); before, a ConflictError blamed a truncate."""
    async with Store.from_url(url) as store:
        await store.migrate()
        side = Side(StoreSessionStore(store, user_id="u"))
        await side.request("my name is Ann", previous=None, conversation=None, response_id="resp_0")
        await side.request("tell me more", previous="resp_0", conversation=None, response_id="resp_1")
        session = await side.sessions.get("resp_0")
        assert session is not None
        await side.sessions.delete("resp_0")
        await (await side.state.get_target()).run("what is my name?", session=session)
        await side.sessions.set("resp_2", session)
        asked = [text for role, text in view(await side.sessions.get("resp_2")) or [] if role == "user"]
        assert asked == ["my name is Ann", "what is my name?"]
        assert await side.sessions.get("resp_0") is None


async def test_a_background_response_continued_from_while_it_runs_keeps_its_own_turn(url: str) -> None:
    """Finding 3: request A (background) makes its session, request B continues from A's id while A runs, then A
    ends. A's id names A's turn alone, as its model saw it; B's names B's turn on the empty session it found."""
    async with Store.from_url(url) as store:
        await store.migrate()
        side = Side(StoreSessionStore(store, user_id="u"))
        await side.begin("A: my name is Ann", "resp_1")
        await side.request("B: tell me more", previous="resp_1", conversation=None, response_id="resp_2")
        await side.finish("resp_1")
        asked = {key: [t for role, t in view(await side.sessions.get(key)) or [] if role == "user"]
                 for key in ("resp_1", "resp_2")}  # fmt: skip
        assert asked == {"resp_1": ["A: my name is Ann"], "resp_2": ["B: tell me more"]}
        await side.sessions.delete("resp_1")
        assert await side.sessions.get("resp_1") is None
        assert [t for role, t in view(await side.sessions.get("resp_2")) or [] if role == "user"] == ["B: tell me more"]


async def test_an_export_with_a_deleted_key_imports_and_every_key_reads_the_same(url: str, tmp_path: Any) -> None:
    """Found by an outside review: a deleted chain-start id is kept as naming nothing (-1), which the import's
    range check refused, so that user's export could never be restored."""
    async with Store.from_url(url) as store:
        await store.migrate()
        side = Side(StoreSessionStore(store, user_id="u"))
        await side.request("my name is Ann", previous=None, conversation=None, response_id="resp_1")
        await side.request("what is my name?", previous="resp_1", conversation=None, response_id="resp_2")
        await side.sessions.delete("resp_1")
        before = {key: view(await side.sessions.get(key)) for key in ("resp_1", "resp_2")}
        lines = [line async for line in store.export(user_id="u")]
    async with Store.from_url(f"sqlite+aiosqlite:///{tmp_path}/restored.db") as fresh:
        await fresh.migrate()
        await fresh.import_lines(lines)
        restored = StoreSessionStore(fresh, user_id="u")
        assert {key: view(await restored.get(key)) for key in ("resp_1", "resp_2")} == before
        assert before["resp_1"] is None and before["resp_2"] is not None


async def test_a_branch_cannot_be_cleared_under_its_inherited_history(url: str) -> None:
    """Found by an outside review: clearing a branch set its next seq to 0, below its base_seq, where no read
    looks: a turn set afterwards vanished. Refused now, nothing deleted."""
    async with Store.from_url(url) as store:
        await store.migrate()
        side = Side(StoreSessionStore(store, user_id="u"))
        await side.request("my name is Ann", previous=None, conversation=None, response_id="resp_0")
        await side.request("tell me more", previous="resp_0", conversation=None, response_id="resp_1")
        await side.request("why?", previous="resp_0", conversation=None, response_id="resp_2")  # a branch
        branch = (await points.resolve(store.db, "resp_2", "u") or pytest.fail("resp_2 names nothing")).session_id
        assert branch != "resp_0"
        with pytest.raises(InvalidValueError, match="is a branch"):
            await store.clear(branch, user_id="u")
        asked = [t for role, t in view(await side.sessions.get("resp_2")) or [] if role == "user"]
        assert asked == ["my name is Ann", "why?"]
