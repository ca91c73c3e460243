"""A fork or a truncation gives each message the compaction marks it had at the cut (issue 37, item 5; migration
0016): a message excluded at the cut and included again by a later commit is excluded again, as the framework's
in-memory session kept at that turn has it. Every later rewrite is forgotten with the branch."""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework import AgentSession, Message
from helpers import rows

from agent_store import Store


def _turn(session: AgentSession, i: int) -> None:
    history = session.state.setdefault("in_memory", {}).setdefault("messages", [])
    history += [Message(role="user", contents=[f"q{i}"]), Message(role="assistant", contents=[f"a{i}"])]


def _mark(session: AgentSession, index: int, excluded: bool) -> None:
    message = session.state["in_memory"]["messages"][index]
    message.additional_properties["_group"] = {"id": f"group_{index}", "kind": "user", "index": index}
    message.additional_properties["_excluded"] = excluded
    if excluded:
        message.additional_properties["_exclude_reason"] = "sliding_window"
    else:
        message.additional_properties.pop("_exclude_reason", None)


def _view(session: AgentSession) -> list[tuple[str, Any]]:
    return [(m.text, m.additional_properties.get("_excluded")) for m in session.state["in_memory"]["messages"]]


@pytest.mark.parametrize("cut", ["truncate", "fork"])
async def test_a_message_excluded_at_the_cut_and_included_later_is_excluded_again(store: Store, cut: str) -> None:
    reference = AgentSession(session_id="ref")  # the framework's own session, kept in memory, copied at the cut
    copies = {}
    steps = [  # per turn: (new messages, (index of a stored message, its new exclusion) or None)
        None,  # turn 0: q0, a0
        (0, True),  # turn 1: q0 excluded
        None,  # turn 2 (the cut is after it): q0 still excluded
        (0, False),  # turn 3: a later compaction includes q0 again
        (1, True),  # turn 4: and excludes a0
    ]
    for i, step in enumerate(steps):
        async with store.session("c", user_id="u") as session:
            for target in (session, reference):
                _turn(target, i)
                if step is not None:
                    _mark(target, *step)
        copies[i] = _view(reference)
    boundary = 2 * 3 - 1  # after turn 2
    if cut == "truncate":
        await store.truncate("c", boundary, user_id="u")
        branch = "c"
    else:
        branch = await store.fork("c", user_id="u", at_seq=boundary, new_id="b")
    run = await store.load(branch, user_id="u")
    assert _view(run.session) == copies[2]
    await run.discard()
    projected = await store.load(branch, user_id="u", skip_excluded=True)  # what the model sees
    assert [m.text for m in projected.history] == [t for t, excluded in copies[2] if not excluded]
    await projected.discard()
    # every later rewrite is forgotten with the branch: a cut further back still finds the earlier values
    await store.truncate(branch, 1, user_id="u")
    again = await store.load(branch, user_id="u")
    assert _view(again.session) == copies[0]
    await again.discard()
    left = await rows(store, "SELECT count(*) FROM agent_message_marks WHERE session_id = :s AND horizon > 1", s=branch)
    assert left == [(0,)]


@pytest.mark.parametrize("cut", ["truncate", "fork"])
async def test_a_load_of_only_the_included_sees_what_the_cut_included_again(store: Store, cut: str) -> None:
    """A message a later compaction excluded is included at the cut: load(skip_excluded=True) must read it, though
    included_from had moved past it (the review's case)."""
    for i in range(3):
        async with store.session("c", user_id="u") as session:
            _turn(session, i)
            if i == 2:  # the last turn excludes the first two messages
                for index in (0, 1):
                    _mark(session, index, True)
    if cut == "truncate":
        await store.truncate("c", 1, user_id="u")
        branch = "c"
    else:
        branch = await store.fork("c", user_id="u", at_seq=1, new_id="b")
    whole = await store.load(branch, user_id="u")
    included = [m.text for m in whole.history if not m.additional_properties.get("_excluded")]
    await whole.discard()
    projected = await store.load(branch, user_id="u", skip_excluded=True)
    assert [m.text for m in projected.history] == included == ["q0", "a0"]
    await projected.discard()
