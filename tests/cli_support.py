"""What the CLI tests share: the real entry point in a subprocess, and a store with a few users' sessions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_framework import Agent, tool

from agent_store import Store
from agent_store.offline import OfflineChatClient


def cli(*args: str, url: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENT_STORE_URL": url}
    return subprocess.run([sys.executable, "-m", "agent_store", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress bar or chatter when not on a terminal
    return done.stdout


@tool
def weather() -> str:
    """Today's weather."""
    return "晴"


@pytest.fixture
async def filled(store: Store) -> Store:
    agent = Agent(client=OfflineChatClient(), name="Bot", tools=[weather])
    for sid, user, words in (("chat-1", "li", ["我叫李明", "call weather"]), ("chat-2", "li", ["hi"]),
                             ("chat-3", "wang", ["hello"])):  # fmt: skip
        async with store.session(sid, user_id=user) as session:
            for w in words:
                await agent.run(w, session=session)
    await store.update("chat-1", user_id="li", title="天气", metadata={"topic": "weather"})
    return store
