"""Random request sequences through the hosting route, on StoreSessionStore and on the framework's in-memory
``SessionStore`` side by side (issue 58): after every request and every delete, every key ever used must read the
same conversation on both, or be absent on both.

A step is one of: a request that starts a conversation (stored under its response id), one that continues from an
earlier response id (any: live, deleted, or never used), a turn of a stable conversation id, or a delete of any key.
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
    drawn: list[tuple[str, ...]] = []
    for n in range(count):
        words = f"{r.choice(WORDS)} #{n}"
        kind = r.choices(["start", "continue", "conversation", "delete"], weights=[2, 5, 2, 2])[0]
        if kind == "continue" and responses:
            previous = r.choice([*responses, "never_used"])  # (a conversation id is no response id: not one)
            drawn.append(("continue", words, previous, f"resp_{n}"))
            responses.append(f"resp_{n}")
        elif kind == "conversation":
            conversation = r.choice(conversations) if conversations and r.random() < 0.7 else f"conv_{n}"
            conversations.append(conversation)
            drawn.append(("conversation", words, conversation, f"resp_{n}"))
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
        with pytest.raises(InvalidValueError, match="was deleted while responses continued from it remain"):
            await side.request("again", previous=None, conversation="resp_1", response_id="resp_4")


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
