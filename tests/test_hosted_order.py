"""The database orders a served conversation, not each host's clock (issue 58 finding 8), on both backends: a turn
made on a host whose clock is 30 s behind still comes after the turns before it, in every later request."""

from __future__ import annotations

import time

import pytest
from test_hosted_responses import turn

from agent_store import Store
from agent_store.agentserver import responses as module
from agent_store.agentserver.responses import StoreResponseProvider


async def test_a_host_whose_clock_is_behind_still_appends_its_turn_last(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead, behind = StoreResponseProvider(store), StoreResponseProvider(store)  # two hosts, one database
    await turn(ahead, "r1", None, conversation="c1")
    await turn(ahead, "r2", None, conversation="c1")
    real = time.time_ns
    monkeypatch.setattr(module.time, "time_ns", lambda: real() - 30 * 10**9)  # this host's clock: 30 s behind
    await turn(behind, "r3", None, conversation="c1")
    monkeypatch.setattr(module.time, "time_ns", real)
    history = await turn(ahead, "r4", None, conversation="c1")
    assert history == ["r1-in", "r1-out", "r2-in", "r2-out", "r3-in", "r3-out"]
