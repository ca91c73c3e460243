"""Issue 22, item 1: an erasure is final on every seam, whatever the model's latency.

A run that read a user's data before ``erase_user`` may not write it back after: not through ``store.session``,
``store.load``, ``StoreHistoryProvider`` on a plain ``AgentSession``, ``StoreSessionStore`` or ``MemoryProvider``.
Each test lets the model answer well after the erasure (more than ``ERASURE_MARGIN``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, Message
from helpers import rows

from agent_store import SessionNotFoundError, Store
from agent_store.agent_framework import MemoryProvider, StoreHistoryProvider, StoreSessionStore
from agent_store.offline import OfflineChatClient
from agent_store.run.commit import ERASURE_MARGIN

LATE = ERASURE_MARGIN.total_seconds() + 0.3


class GatedClient(OfflineChatClient):
    """The offline model; while ``gate`` is set, each call waits for it (a slow model), telling ``asked``."""

    gate: asyncio.Event | None = None
    asked: asyncio.Event | None = None

    def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, **kwargs: Any) -> Any:
        answer = super()._inner_get_response(messages=messages, stream=False, **kwargs)
        gate, asked = self.gate, self.asked

        async def later() -> Any:
            if gate is not None and asked is not None:
                asked.set()
                await gate.wait()
            return await answer

        return later()


async def erase_while_the_model_thinks(store: Store, client: GatedClient, turn: Any) -> None:
    """Run ``turn`` (a coroutine function) with the model held; erase the user meanwhile; answer late."""
    client.gate, client.asked = asyncio.Event(), asyncio.Event()
    task = asyncio.ensure_future(turn())
    await client.asked.wait()
    await store.erase_user("u")
    await asyncio.sleep(LATE)
    client.gate.set()
    with pytest.raises(SessionNotFoundError):
        await task
    client.gate = client.asked = None


async def assert_nothing_of_the_user(store: Store) -> None:
    assert await rows(store, "SELECT count(*) FROM agent_sessions WHERE user_id = 'u'") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM agent_user_state WHERE user_id = 'u'") == [(0,)]


async def test_history_provider_on_a_plain_session(store: Store) -> None:
    client = GatedClient()
    agent = Agent(client=client, name="a", context_providers=[StoreHistoryProvider(store, user_id="u")])
    session = AgentSession(session_id="plain")
    await agent.run("我叫李明", session=session)
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(2,)]

    await erase_while_the_model_thinks(store, client, lambda: agent.run("我叫什么名字？", session=session))
    await assert_nothing_of_the_user(store)
    reply = await agent.run("我叫什么名字？", session=session)  # a run that reads after the erasure is fine
    assert reply.text == "我不知道你叫什么名字。"


async def test_store_session_and_load_with_memory(store: Store) -> None:
    client = GatedClient()
    agent = Agent(client=client, name="a", context_providers=[MemoryProvider()])
    async with store.session("s", user_id="u") as session:
        MemoryProvider.remember(session, "name", "李明")
        await agent.run("hello", session=session)

    async def turn() -> None:
        async with store.session("s", user_id="u") as session:
            MemoryProvider.remember(session, "city", "上海")
            await agent.run("hello again", session=session)

    await erase_while_the_model_thinks(store, client, turn)
    await assert_nothing_of_the_user(store)

    async def new_session_turn() -> None:  # a first run of a new session, loaded before the erasure
        run = await store.load("new", user_id="u")
        await agent.run("hi", session=run.session)
        await run.commit()

    await erase_while_the_model_thinks(store, client, new_session_turn)
    await assert_nothing_of_the_user(store)


async def test_session_store_get_none_then_set(store: Store) -> None:
    client = GatedClient()
    agent = Agent(client=client, name="a")
    sessions = StoreSessionStore(store, user_id="u")

    async def turn() -> None:
        session = await sessions.get("fresh") or AgentSession(session_id="fresh")
        await agent.run("我叫李明", session=session)
        await sessions.set("fresh", session)

    await erase_while_the_model_thinks(store, client, turn)
    await assert_nothing_of_the_user(store)
    with pytest.raises(SessionNotFoundError):  # an id read before the erasure stays fenced in this process
        await turn()
    session = await sessions.get("new-id") or AgentSession(session_id="new-id")  # a new conversation: stored
    await agent.run("我叫李明", session=session)
    await sessions.set("new-id", session)
    assert await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = 'new-id'") == [(2,)]


async def test_session_store_set_of_a_session_it_never_saw(store: Store) -> None:
    """A session restored from the app's own copy (``to_dict``) made before the erasure: when it was read is
    not known, so an erasure of the user still on record refuses it; a user never erased is not affected."""
    agent = Agent(client=OfflineChatClient(), name="a")
    old = AgentSession(session_id="copy")
    await agent.run("我叫李明", session=old)
    saved = old.to_dict()
    async with store.session("other", user_id="u") as session:
        session.state["n"] = 1
    await store.erase_user("u")
    await asyncio.sleep(LATE)
    with pytest.raises(SessionNotFoundError):
        await StoreSessionStore(store, user_id="u").set("copy", AgentSession.from_dict(saved))
    await assert_nothing_of_the_user(store)
    await StoreSessionStore(store, user_id="v").set("copy", AgentSession.from_dict(saved))
    assert await rows(store, "SELECT user_id, next_seq FROM agent_sessions") == [("v", 2)]


async def test_session_store_two_gets_then_the_older_set(store: Store) -> None:
    """Request A gets nothing and thinks; the user is erased; request B gets nothing too. A set carries only
    the id, so each is dated from the earliest get of it on record: B's and then A's are refused (B's refusal
    does not free A's read)."""
    sessions = StoreSessionStore(store, user_id="u")
    async with store.session("other", user_id="u") as session:
        session.state["n"] = 1
    first = await sessions.get("chat") or AgentSession(session_id="chat")
    first.state["secret"] = "read before the erasure"
    await store.erase_user("u")
    await asyncio.sleep(LATE)
    second = await sessions.get("chat") or AgentSession(session_id="chat")
    second.state["fresh"] = True
    for session in (second, first):
        with pytest.raises(SessionNotFoundError):
            await sessions.set("chat", session)
    await assert_nothing_of_the_user(store)


async def test_ag_ui_snapshot_saved_after_an_erasure_of_its_scope_is_refused(store: Store) -> None:
    from agent_framework_ag_ui import AGUIThreadSnapshot

    from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore

    snapshots = StoreThreadSnapshotStore(store)
    old = AGUIThreadSnapshot(messages=[{"id": "m1", "role": "user", "content": "my SSN is 123"}])
    await snapshots.save(scope="u", thread_id="t", snapshot=old)  # the first save of a new thread: no read
    seen = await snapshots.get(scope="u", thread_id="t")  # the runner reads the thread, the model thinks ...
    assert seen is not None
    await store.erase_user("u")
    await asyncio.sleep(LATE)
    with pytest.raises(SessionNotFoundError):
        await snapshots.save(scope="u", thread_id="t", snapshot=seen)  # ... and its save is refused
    assert await rows(store, "SELECT count(*) FROM agent_ui_snapshots") == [(0,)]
    assert await snapshots.get(scope="u", thread_id="t") is None  # the same thread, read again: still fenced
    with pytest.raises(SessionNotFoundError):
        await snapshots.save(scope="u", thread_id="t", snapshot=AGUIThreadSnapshot(messages=[]))
    assert await snapshots.get(scope="u", thread_id="new") is None  # a new thread after the erasure: saved,
    for _ in range(2):  # each save of its request (the runner's safe points, then the final one)
        await snapshots.save(scope="u", thread_id="new", snapshot=AGUIThreadSnapshot(messages=[]))
    assert await rows(store, "SELECT thread_id FROM agent_ui_snapshots") == [("new",)]


async def test_a_returning_user_is_not_refused(store: Store) -> None:
    """After an erasure, what reads nothing of the old data is not refused: an audit-only history provider
    (``load_messages=False``), and a new workflow on a checkpoint storage made before the erasure. A workflow
    that continues a checkpoint read before the erasure is refused."""
    from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException

    from agent_store.agent_framework import StoreCheckpointStorage

    checkpoints = StoreCheckpointStorage(store, user_id="u")  # made at start-up
    await checkpoints.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", checkpoint_id="c1"))
    resumed = await checkpoints.load("c1")
    await store.erase_user("u")
    await asyncio.sleep(LATE)
    audit_only = StoreHistoryProvider(store, user_id="u", load_messages=False)
    audit = Agent(client=OfflineChatClient(), context_providers=[audit_only])
    await audit.run("hello again", session=AgentSession(session_id="back"))
    assert await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = 'back'") == [(2,)]
    await checkpoints.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", checkpoint_id="n1"))
    continued = WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", checkpoint_id="c2",
                                   previous_checkpoint_id=resumed.checkpoint_id)  # fmt: skip
    with pytest.raises(WorkflowCheckpointException, match="erased"):
        await checkpoints.save(continued)
    assert await rows(store, "SELECT checkpoint_id FROM agent_checkpoints") == [("n1",)]
