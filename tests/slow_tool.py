"""A tool that holds a run at one step until the test lets it go on, and the journals of the test's apps: shared by
the resumable AG-UI and background-responses tests. A test module imports ``fresh_gate`` (autouse) with them."""

from __future__ import annotations

import asyncio

import pytest
from agent_framework import tool

from agent_store.journal import Journal

GO_ON: dict[str, asyncio.Event] = {}  # "tool": slow_lookup returns once the test sets it
JOURNALS: list[Journal] = []  # the journals of this test's apps


@pytest.fixture(autouse=True)
def fresh_gate() -> None:
    GO_ON["tool"] = asyncio.Event()
    JOURNALS.clear()


@tool
async def slow_lookup() -> str:
    """A tool that takes a while (a long step of the run): until the test lets it go on."""
    await asyncio.wait_for(GO_ON["tool"].wait(), 60)
    return "北京，晴"
