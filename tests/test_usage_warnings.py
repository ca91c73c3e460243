"""Usage is never silently off (issue 42 point 6), on both backends, each case in a clean process (the warning is
given once per process): a UsageRecorder on a chat client that cannot run chat middleware, and a plain agent
without one, are told once; a recorder that works and a run with no model answer are not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = r"""
import asyncio, json, logging, sys
from agent_framework import Agent, BaseChatClient, ChatResponse, Message, UsageDetails
from sqlalchemy import text
from agent_store import Store
from agent_store.agent_framework import UsageRecorder
from agent_store.offline import OfflineChatClient

class Bare(BaseChatClient):  # a client built on BaseChatClient alone: chat middleware never runs
    def _inner_get_response(self, *, messages, stream, options, **kw):
        async def answer():
            usage = UsageDetails(input_token_count=5, output_token_count=2, total_token_count=7)
            return ChatResponse(messages=[Message(role="assistant", contents=["hi"])], usage_details=usage)
        return answer()

said = []
class Catch(logging.Handler):
    def emit(self, record):
        said.append([record.levelname, record.getMessage()])
logging.getLogger("agent_store.usage").addHandler(Catch())
logging.getLogger("agent_store.usage").setLevel(logging.INFO)

async def main(url, case):
    if case == "two-agents":  # one records, the other does not: its answers go unrecorded
        recorded = Agent(client=OfflineChatClient(), name="A", middleware=[UsageRecorder()])
        plain = Agent(client=OfflineChatClient(), name="B")
    agent = {"bare-recorder": lambda: Agent(client=Bare(), name="A", middleware=[UsageRecorder()]),
             "plain": lambda: Agent(client=OfflineChatClient(), name="A"),
             "recorder": lambda: Agent(client=OfflineChatClient(), name="A", middleware=[UsageRecorder()]),
             "no-answer": lambda: None, "two-agents": lambda: "both",
             "plain-budgeted": lambda: Agent(client=OfflineChatClient(), name="A")}[case]()
    async with Store.from_url(url) as store:
        await store.migrate()
        if case == "plain-budgeted":
            await store.usage.set_budget(1_000_000, user_id="u")
        for sid in ("s1", "s2"):
            async with store.session(sid, user_id="u") as session:
                if agent is None:
                    session.state["k"] = 1  # a run with no model answer
                elif agent == "both":
                    await recorded.run("hello", session=session)
                    await plain.run("hello again", session=session)
                else:
                    await agent.run("hello", session=session)
        async with store.session("s1", user_id="u") as session:
            session.state["k"] = 2  # loads the answer stored before: nothing new
        async with store.engine.connect() as conn:
            rows = (await conn.execute(text("SELECT count(*) FROM agent_usage"))).scalar()
    print(json.dumps({"warnings": said, "usage_rows": rows}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


# A budget that would not count the calls is a warning; without one (a newcomer's first agent), a note at INFO.
@pytest.mark.parametrize(("case", "level", "rows"), [("bare-recorder", "INFO", 0), ("plain", "INFO", 0),
                                                     ("plain-budgeted", "WARNING", 0), ("recorder", None, 2),
                                                     ("no-answer", None, 0), ("two-agents", "INFO", 2)])  # fmt: skip
def test_unrecorded_usage_is_said_once(url: str, tmp_path: Path, case: str, level: str | None, rows: int) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), url, case], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert [said[0] for said in seen["warnings"]] == ([level] if level else []) and seen["usage_rows"] == rows
    if level:
        told = seen["warnings"][0][1]
        assert "UsageRecorder" in told and "ChatMiddlewareLayer" in told
        assert "from agent_store.agent_framework import UsageRecorder" in told
        assert ("budgets do not count them" in told) == (level == "WARNING")
