"""Issue 10: the framework's real OpenAI clients against an OpenAI-compatible server the tests start on 127.0.0.1.

Each turn runs in a new process (tests/openai_turn.py): what continues a conversation is only what was stored.
The server refuses what the service refuses (orphan tool results, unanswered calls, unknown previous responses).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from helpers import rows

from agent_store import Store

TURN = str(Path(__file__).with_name("openai_turn.py"))
KINDS = ["chat", "chat-stream", "responses", "responses-local", "responses-stream"]
SERVICE_KEEPS = {"responses", "responses-stream"}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    try:
        yield server
    finally:
        server.stop()


def turn(url: str, fake: FakeOpenAI, kind: str, words: str, limit: int | None = None) -> dict[str, str]:
    args = [sys.executable, TURN, url, fake.base_url, kind, "chat-1", words, *([str(limit)] if limit else [])]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("kind", KINDS)
async def test_every_client_keeps_a_local_transcript_across_processes(url: str, fake: FakeOpenAI, kind: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        assert "李明" in turn(url, fake, kind, "我叫李明")["text"]
        assert turn(url, fake, kind, "call weather")["text"] == "工具结果：晴"
        last = turn(url, fake, kind, "我叫什么名字？")
        assert last["text"] == "你叫李明。"  # the name reached the model: from the service, or from the store
        assert fake.refused == []  # no request the service would refuse
        transcript = await rows(store, "SELECT role, text FROM agent_messages ORDER BY seq")
        assert [r[0] for r in transcript] == ["user", "assistant", "user", "assistant", "tool", "assistant", "user",
                                              "assistant"]  # fmt: skip
        assert transcript[-1] == ("assistant", "你叫李明。")
        usage = await rows(store, "SELECT input_tokens > 0, output_tokens > 0 FROM agent_runs")
        assert len(usage) == 3 and all(bool(a) and bool(b) for a, b in usage)
        if kind in SERVICE_KEEPS:
            assert last["service_session_id"].startswith("resp_")
            third = [r for r in fake.requests if "你叫" not in json.dumps(r)][-1]
            sent = [i for i in third["input"] if i.get("role") == "user"] if isinstance(third["input"], list) else []
            assert third.get("previous_response_id") and len(sent) <= 1  # the history is not sent again
        else:
            assert last["service_session_id"] is None


@pytest.mark.parametrize("kind", sorted(SERVICE_KEEPS))
async def test_a_forgotten_service_conversation_continues_from_the_local_transcript(
    url: str, fake: FakeOpenAI, kind: str
) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        first = turn(url, fake, kind, "我叫李明")["service_session_id"]
        fake.forget()  # stored responses expire at the service
        again = turn(url, fake, kind, "我叫什么名字？")
        assert again["text"] == "你叫李明。"  # the local transcript was sent instead
        assert again["service_session_id"] not in (None, first)  # and a new service conversation started
        assert fake.refused == [f"Previous response with id '{first}' not found."]
        assert turn(url, fake, kind, "我叫什么名字？")["text"] == "你叫李明。"  # it continues on the service
        assert len(await rows(store, "SELECT seq FROM agent_messages")) == 6


@pytest.mark.parametrize("limit", [None, 2])
async def test_a_reused_completion_id_never_drops_or_refuses_a_message(url: str, limit: int | None) -> None:
    fake = FakeOpenAI(same_completion_id=True).start()
    try:
        async with Store.from_url(url) as store:
            await store.migrate()
            for words in ("one", "two", "three"):
                turn(url, fake, "chat-stream", words, limit)
            transcript = await rows(store, "SELECT role, text FROM agent_messages ORDER BY seq")
            assert [t for _, t in transcript] == ["one", "收到：one（第 1 条用户消息）", "two",
                                                  "收到：two（第 2 条用户消息）", "three",
                                                  f"收到：three（第 {2 if limit else 3} 条用户消息）"]  # fmt: skip
            ids = await rows(store, "SELECT count(DISTINCT message_id) FROM agent_messages")
            assert ids == [(6,)]
            async with store.session("chat-1", user_id="u") as session:  # the provider's id is kept as data
                assistants = [m for m in session.state["in_memory"]["messages"] if m.role == "assistant"]
                assert {m.message_id for m in assistants} == {"chatcmpl-same"}
    finally:
        fake.stop()


async def test_a_forgotten_conversation_continues_with_a_pair_safe_window(url: str, fake: FakeOpenAI) -> None:
    """The local transcript sent after the service forgot is windowed like every load: no result without its call."""
    async with Store.from_url(url) as store:
        await store.migrate()
        turn(url, fake, "responses", "我叫李明", limit=2)
        turn(url, fake, "responses", "call weather", limit=2)  # user, call, result, answer
        fake.forget()
        assert turn(url, fake, "responses", "你好", limit=2)["text"].startswith("收到")
        assert turn(url, fake, "responses", "再见", limit=2)["text"].startswith("收到")
        assert [r for r in fake.refused if "not found" not in r] == []  # only the forgotten-response refusal


@pytest.mark.parametrize("kind", sorted(SERVICE_KEEPS))
async def test_a_conversation_forgotten_in_the_middle_of_a_tool_loop_continues(
    url: str, fake: FakeOpenAI, kind: str
) -> None:
    """The service forgets between the tool call and its result: the stored transcript, this run's input and the
    call go with the result, and the run completes with every message stored once."""
    async with Store.from_url(url) as store:
        await store.migrate()
        turn(url, fake, kind, "我叫李明")
        fake.forget_before_tool_results = True
        assert turn(url, fake, kind, "call weather")["text"] == "工具结果：晴"
        assert len(fake.refused) == 1 and "not found" in fake.refused[0]
        assert turn(url, fake, kind, "我叫什么名字？")["text"] == "你叫李明。"  # the new chain has the whole story
        transcript = await rows(store, "SELECT role FROM agent_messages ORDER BY seq")
        assert [r[0] for r in transcript] == ["user", "assistant", "user", "assistant", "tool", "assistant", "user",
                                              "assistant"]  # fmt: skip


async def test_a_session_can_move_between_clients(url: str, fake: FakeOpenAI) -> None:
    """A Chat Completions turn after a Responses turn gets the stored history (its client keeps nothing)."""
    async with Store.from_url(url) as store:
        await store.migrate()
        turn(url, fake, "responses", "我叫李明")
        assert turn(url, fake, "chat", "我叫什么名字？")["text"] == "你叫李明。"
        assert fake.refused == []
