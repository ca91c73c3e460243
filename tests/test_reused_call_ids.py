"""Fork and truncate with reused tool-call ids (issue 37, item 4): some OpenAI-compatible servers send ``call_0``
for every call. A result answers the latest call of its id before it, so a cut at a turn boundary keeps every
turn before it, and a cut inside a call's turn still never separates that call from its result."""

from __future__ import annotations

import pytest
from agent_framework import Content, Message

from agent_store import Store

TURN = 4  # user, assistant's call, tool's result, assistant's answer


def turn(i: int, call_id: str | None) -> list[Message]:
    call = Content.from_function_call(call_id=call_id or "", name="weather", arguments={"day": i})
    result = Content.from_function_result(call_id=call_id or "", result=f"sunny {i}")
    return [
        Message(role="user", contents=[f"q{i}"]),
        Message(role="assistant", contents=[call]),
        Message(role="tool", contents=[result]),
        Message(role="assistant", contents=[f"a{i}"]),
    ]


async def _session(store: Store, ids: str, turns: int = 5) -> None:
    for i in range(turns):
        call_id = {"reused": "call_0", "unique": f"call_{i}", "missing": None}[ids]
        async with store.session("s", user_id="u") as session:
            session.state.setdefault("in_memory", {}).setdefault("messages", []).extend(turn(i, call_id))


def _texts(messages: list[Message]) -> list[str]:
    return [m.text or next((c.call_id or "" for c in m.contents), "") + f"@{m.role}" for m in messages]


@pytest.mark.parametrize("ids", ["reused", "unique", "missing"])
async def test_a_fork_at_each_turn_boundary_keeps_every_turn_before_it(store: Store, ids: str) -> None:
    await _session(store, ids)
    whole = (await store.load("s", user_id="u")).history
    for boundary in range(1, 6):
        last = boundary * TURN - 1
        fork = await store.fork("s", user_id="u", at_seq=last, new_id=f"f{boundary}")
        forked = (await store.load(fork, user_id="u")).history
        assert _texts(forked) == _texts(whole[: last + 1])


@pytest.mark.parametrize("ids", ["reused", "unique"])
async def test_a_cut_between_a_call_and_its_result_goes_back_before_the_call(store: Store, ids: str) -> None:
    await _session(store, ids)
    whole = (await store.load("s", user_id="u")).history
    for boundary in range(5):
        call_seq = boundary * TURN + 1  # the call of turn `boundary`, whose result is the next message
        fork = await store.fork("s", user_id="u", at_seq=call_seq, new_id=f"f{boundary}")
        assert _texts((await store.load(fork, user_id="u")).history) == _texts(whole[:call_seq])


@pytest.mark.parametrize("ids", ["reused", "unique"])
async def test_truncate_at_a_turn_boundary_keeps_every_turn_before_it(store: Store, ids: str) -> None:
    await _session(store, ids)
    whole = (await store.load("s", user_id="u")).history
    removed = await store.truncate("s", 3 * TURN - 1, user_id="u")
    assert removed == 2 * TURN
    assert _texts((await store.load("s", user_id="u")).history) == _texts(whole[: 3 * TURN])


async def test_an_unanswered_call_whose_id_is_reused_later_does_not_pull_the_cut_back(store: Store) -> None:
    """An interrupted call_0 (no result), then a later call_0 answered: a cut after the later pair keeps both."""
    async with store.session("s", user_id="u") as session:
        history = session.state.setdefault("in_memory", {}).setdefault("messages", [])
        history.append(Message(role="user", contents=["q0"]))
        history.append(Message(role="assistant", contents=[Content.from_function_call(call_id="call_0", name="w")]))
        history.append(Message(role="user", contents=["never mind"]))  # the call was interrupted, no result
        history.extend(turn(1, "call_0"))
    fork = await store.fork("s", user_id="u", at_seq=6, new_id="f")
    assert [m.seq for m in await store.messages(fork, user_id="u")] == list(range(7))


async def test_a_stray_result_reusing_an_answered_id_does_not_pull_the_cut_back(store: Store) -> None:
    """A result with no open call (a duplicate, answering ``call_0`` again) answers nothing, as a load pairs them."""
    async with store.session("s", user_id="u") as session:
        history = session.state.setdefault("in_memory", {}).setdefault("messages", [])
        history.extend(turn(0, "call_0"))  # seq 0-3
        history.append(Message(role="user", contents=["q1"]))  # seq 4
        history.append(Message(role="tool", contents=[Content.from_function_result(call_id="call_0", result="again")]))
        history.append(Message(role="assistant", contents=["a1"]))  # seq 6
    for at_seq in (4, 5):
        fork = await store.fork("s", user_id="u", at_seq=at_seq, new_id=f"f{at_seq}")
        assert [m.seq for m in await store.messages(fork, user_id="u")] == list(range(at_seq + 1))
