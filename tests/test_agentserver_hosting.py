"""A self-hosted Responses server on the store (issue 38, point 5): agent-framework-foundry-hosting's
ResponsesHostServer with StoreResponseProvider, StoreSessionStoreProvider and StoreCheckpointStoreProvider, the real
Agent on the offline client, each request a new Store (another worker), some in a process of their own; both
history sources (the response store's items, or the agent session's messages), both backends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_framework import WorkflowCheckpoint
from agentserver_route import ask, text_of
from azure.ai.agentserver.core import AgentConfig, FoundryAgentRequestContext
from helpers import rows

from agent_store import InvalidValueError, Store
from agent_store.agentserver.foundry import StoreCheckpointStoreProvider

HERE = Path(__file__).resolve().parent
NAME = "我叫什么名字？"


@pytest.fixture(params=["agent_server", "agent"])
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_chains_branches_users_and_a_conversation(store: Store, url: str, source: str) -> None:
    first = await ask(url, "u", {"input": "我叫李明"}, source)
    renamed = await ask(url, "u", {"input": "我叫王芳", "previous_response_id": first["id"]}, source)
    assert text_of(await ask(url, "u", {"input": NAME, "previous_response_id": first["id"]}, source)) == "你叫李明。"
    assert text_of(await ask(url, "u", {"input": NAME, "previous_response_id": renamed["id"]}, source)) == "你叫王芳。"
    theirs = await ask(url, "v", {"input": NAME, "previous_response_id": renamed["id"]}, source)
    assert "王芳" not in json.dumps(theirs, ensure_ascii=False) and theirs.get("error"), theirs  # not found
    turns = [("我叫张伟", "你好，张伟！很高兴认识你。"), (NAME, "你叫张伟。")]
    turns += [("我叫赵敏", "你好，赵敏！很高兴认识你。"), (NAME, "你叫赵敏。")]
    for words, expected in turns:
        said = await ask(url, "u", {"input": words, "conversation": "conv_1"}, source)
        assert text_of(said) == expected and not said.get("error"), said
    assert text_of(await ask(url, "v", {"input": NAME, "conversation": "conv_1"}, source)) != "你叫赵敏。"
    # The conversation's id moves with its head; the response ids it made stay points.
    moving = await rows(store, "SELECT response_id, user_id FROM agent_responses WHERE moves AND response_id NOT LIKE "
                               "'served:%' ORDER BY user_id")  # (served:...: the transcript's own keys)
    assert moving == [("conv_1", "u"), ("conv_1", "v")]


async def test_two_workers_advancing_one_conversation_lose_no_turn(store: Store, url: str, source: str) -> None:
    """Requests on one conversation at once, each its own worker: every turn the caller was told succeeded is in
    the conversation afterwards, and a failed one wrote nothing to the session."""
    await ask(url, "u", {"input": "我叫张伟", "conversation": "conv_2"}, source)
    answers = await asyncio.gather(*(ask(url, "u", {"input": f"第{n}句", "conversation": "conv_2"}, source)
                                     for n in range(4)))  # fmt: skip
    won = [n for n, a in enumerate(answers) if not a.get("error")]
    assert won, answers  # a loser is failed by the host (its conflict, or its generic error after the output)
    last = await ask(url, "u", {"input": "hello", "conversation": "conv_2"}, source)
    # The offline client counts the user messages it is given: the first turn, each winner, and this one from the
    # session's messages; the server's own history holds every request's input (the host keeps a failed response
    # in its conversation, whatever its store).
    count = len(won) + 2 if source == "agent" else 6
    assert text_of(last) == f"收到：hello（第 {count} 条用户消息）", (won, last)


def test_each_request_in_a_process_of_its_own(url: str, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "agent_store", "upgrade", "--url", url], check=True, capture_output=True)

    def request(body: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run([sys.executable, str(HERE / "agentserver_route.py"), url, "u", json.dumps(body),
                               "agent_server"], capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return dict(json.loads(done.stdout))

    first = request({"input": "我叫李明"})
    branch = request({"input": "我叫王芳", "previous_response_id": first["id"]})
    assert text_of(request({"input": NAME, "previous_response_id": first["id"]})) == "你叫李明。"
    assert text_of(request({"input": NAME, "previous_response_id": branch["id"]})) == "你叫王芳。"


async def test_checkpoints_are_one_collection_per_user_and_context(store: Store) -> None:
    config = AgentConfig(agent_name="a", agent_version="1", agent_id="a", is_hosted=False, project_endpoint="",
                         project_id="", session_id="", port=0, appinsights_connection_string="", otlp_endpoint="",
                         sse_keepalive_interval=0)  # fmt: skip
    provider = StoreCheckpointStoreProvider(store)

    def storage(user: str, context: str) -> Any:
        return provider.get_store(config=config, context_id=context,
                                  platform_context=FoundryAgentRequestContext(user_id=user))  # fmt: skip

    for user, context in (("u", "c1"), ("u", "c2"), ("v", "c1")):
        await storage(user, context).save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g",
                                                             checkpoint_id=f"{user}-{context}"))  # fmt: skip
    for user, context in (("u", "c1"), ("u", "c2"), ("v", "c1")):
        latest = await storage(user, context).get_latest(workflow_name="wf")
        assert latest is not None and latest.checkpoint_id == f"{user}-{context}"
        assert [c.checkpoint_id for c in await storage(user, context).list_checkpoints(workflow_name="wf")] == [
            f"{user}-{context}"]  # fmt: skip
    # No user id can spell another user's collection, or one that only looks like it: the separator is refused
    from agent_store.agent_framework import StoreCheckpointStorage
    from agent_store.db.hosted_tables import CHECKPOINT_CONTEXT

    for lookalike in (f"u{CHECKPOINT_CONTEXT}{'0' * 24}x", f"u{CHECKPOINT_CONTEXT}{'0' * 23}", "u\x1f"):
        with pytest.raises(InvalidValueError, match="x1f"):
            StoreCheckpointStorage(store, user_id=lookalike)
        with pytest.raises(InvalidValueError, match="x1f"):
            async with store.session("s", user_id=lookalike):
                pass
    with pytest.raises(InvalidValueError):  # a request's user id can never spell a collection of another user
        storage("u\x1fcontext:abc", "c1")
    report = await store.erase_user("u")
    assert report.checkpoints == 2
    assert await storage("u", "c1").get_latest(workflow_name="wf") is None
    assert (await storage("v", "c1").get_latest(workflow_name="wf")) is not None


async def test_a_conversation_key_follows_its_head_through_the_operators_commands(store: Store) -> None:
    """The host's conversation key (agent_responses.moves) stays on its session's head through truncate, clear,
    export and import, and is its user's: another user's key of the same name is another conversation."""
    from agent_framework import AgentSession, Message

    from agent_store.agentserver.foundry import ConversationSessionStore

    async def turn(user: str, words: str) -> list[str]:
        sessions = ConversationSessionStore(store, user_id=user)
        session = await sessions.get("conv_9") or AgentSession()
        session.state["_foundry_source_conversation"] = "conv_9"
        session.state.setdefault("in_memory", {}).setdefault("messages", []).append(
            Message(role="user", contents=[words]))  # fmt: skip
        await sessions.set(f"resp-{user}-{words}", session)
        await sessions.set("conv_9", session)
        again = await ConversationSessionStore(store, user_id=user).get("conv_9")
        assert again is not None
        return [m.text for m in again.state["in_memory"]["messages"]]

    assert await turn("u", "a") == ["a"] and await turn("u", "b") == ["a", "b"]
    assert await turn("v", "x") == ["x"]  # v's conv_9 is v's own
    (sid,) = [s for (s,) in await rows(store, "SELECT session_id FROM agent_responses WHERE response_id = 'conv_9' "
                                              "AND user_id = 'u'")]  # fmt: skip
    await store.truncate(sid, 0, user_id="u")
    assert await turn("u", "c") == ["a", "c"]
    lines = [line async for line in store.export(user_id="u")]
    assert await store.delete(sid, user_id="u")
    await store.import_lines(lines)
    assert await turn("u", "d") == ["a", "c", "d"]
    await store.clear(sid, user_id="u")
    assert await turn("u", "e") == ["e"]
