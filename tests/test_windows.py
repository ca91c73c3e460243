"""Issue 22, item 13: a ``history_limit`` window starts at the user message that began its turn.

Hosted APIs that require the first message of a request to be the user's (Bedrock does; Anthropic did) refuse
a window that starts with an assistant's reply or tool call. Every window over every shape of history is
checked against an oracle (``pair_safe_tail`` over the whole history) and against the rule itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from agent_framework import Agent, Content, Message

from agent_store import Store
from agent_store.offline import OfflineChatClient
from agent_store.run.delta import pair_safe_tail


def _call(text: str, call_id: str) -> Message:
    return Message(role="assistant", contents=[Content.from_function_call(call_id=call_id, name="t", arguments={})],
                   additional_properties={"label": text})  # fmt: skip


def _result(text: str, call_id: str) -> Message:
    return Message(role="tool", contents=[Content.from_function_result(call_id=call_id, result=text)],
                   additional_properties={"label": text})  # fmt: skip


def _say(role: str, text: str) -> Message:
    return Message(role=role, contents=[text], additional_properties={"label": text})


HISTORIES = {
    "plain chat": [_say(r, f"{r}{i}") for i in range(4) for r in ("user", "assistant")],
    "greeting first": [
        _say("assistant", "hello"),
        _say("user", "u0"),
        _say("assistant", "a0"),
        _say("user", "u1"),
        _say("assistant", "a1"),
    ],
    "tool loops": [
        _say("user", "u0"),
        _call("c1", "x1"),
        _result("r1", "x1"),
        _call("c2", "x2"),
        _result("r2", "x2"),
        _say("assistant", "a0"),
        _say("user", "u1"),
        _say("assistant", "a1"),
        _say("user", "u2"),
        _call("c3", "x3"),
        _call("c4", "x4"),
        _result("r3", "x3"),
        _result("r4", "x4"),
        _say("assistant", "a2"),
    ],
    "reused call ids": [
        m
        for turn in range(4)
        for m in (
            _say("user", f"u{turn}"),
            _call(f"c{turn}", "call_0"),
            _result(f"r{turn}", "call_0"),
            _say("assistant", f"a{turn}"),
        )
    ],
    "system then chat": [
        _say("system", "s"),
        _say("user", "u0"),
        _say("assistant", "a0"),
        _say("user", "u1"),
        _say("assistant", "a1"),
    ],
}


def labels(messages: Sequence[Message]) -> list[str]:
    return [m.additional_properties.get("label", "?") for m in messages]


@pytest.mark.parametrize("shape", list(HISTORIES))
async def test_every_window_starts_at_its_turns_user_message_and_keeps_tool_pairs(store: Store, shape: str) -> None:
    history = HISTORIES[shape]
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"] += [Message.from_dict(m.to_dict()) for m in history]
    assert (await store.load("s", user_id="u", history_limit=0)).history == []  # an empty window stays empty
    for limit in range(1, len(history) + 2):
        loaded = (await store.load("s", user_id="u", history_limit=limit)).history
        expected = pair_safe_tail(history, limit)
        assert labels(loaded) == labels(expected), limit
        assert len(loaded) >= min(limit, len(history))
        users_before = [m for m in history[: len(history) - len(loaded) + 1] if m.role == "user"]
        if users_before:  # a user message at or before the window's start: the window starts with one
            assert loaded[0].role == "user", (limit, labels(loaded))
        else:  # none: the window is the whole history
            assert len(loaded) == len(history)


class RecordingClient(OfflineChatClient):
    """The offline model, checking what a strict hosted API checks of each request's first message."""

    requests: list[list[str]]

    def _inner_get_response(self, *, messages: Sequence[Message], **kwargs: Any) -> Any:
        roles = [str(m.role) for m in messages if m.role != "system"]
        self.requests.append(roles)
        if roles and roles[0] != "user":
            raise ValueError(f"first message must use the user role, got {roles[0]}")
        return super()._inner_get_response(messages=messages, **kwargs)


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_a_strict_model_accepts_every_windowed_request(store: Store, limit: int) -> None:
    client = RecordingClient()
    client.requests = []
    agent = Agent(client=client, name="a")
    for turn in range(5):
        async with store.session("s", user_id="u", history_limit=limit) as session:
            await agent.run(f"turn {turn}", session=session)
    assert len(client.requests) == 5 and all(roles[0] == "user" for roles in client.requests)
    assert any(len(roles) > 1 for roles in client.requests)  # the window did carry earlier turns
