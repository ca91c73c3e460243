"""A two-executor workflow that pauses for a human: an agent drafts (offline client), a reviewer asks a person.

Run as a script, one step per process, as a deployment would: ``start URL USER TOPIC`` runs until the workflow
waits for the human and prints the pending request ids; ``resume URL USER ANSWER`` lists the checkpoints,
resumes from the latest with the human's answer and prints the output; ``flood URL USER N`` saves N checkpoints.
Each prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

from agent_framework import (
    Agent,
    Executor,
    WorkflowBuilder,
    WorkflowCheckpoint,
    WorkflowContext,
    handler,
    response_handler,
)

from agent_store import Store
from agent_store.agent_framework import StoreCheckpointStorage
from agent_store.offline import OfflineChatClient

NAME = "review"


@dataclass
class Verdict:
    """An application type in the workflow's state: checkpoints hold it only if the storage allows it."""

    reviewer: str
    approved: bool


class Drafter(Executor):
    def __init__(self) -> None:
        super().__init__(id="drafter")
        self.agent = Agent(client=OfflineChatClient(), name="Drafter")

    @handler
    async def draft(self, topic: str, ctx: WorkflowContext[str]) -> None:
        reply = await self.agent.run(topic)
        await ctx.send_message(f"draft: {reply.text}")


class Reviewer(Executor):
    def __init__(self) -> None:
        super().__init__(id="reviewer")

    @handler
    async def review(self, draft: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("verdict", Verdict(reviewer="pending", approved=False))
        await ctx.request_info(draft, str)  # the workflow pauses here, checkpointed, until a person answers

    @response_handler
    async def answered(self, draft: str, answer: str, ctx: WorkflowContext[str, str]) -> None:
        await ctx.yield_output(f"{draft} | human: {answer}")


def build(storage: StoreCheckpointStorage) -> Any:
    drafter, reviewer = Drafter(), Reviewer()
    return WorkflowBuilder(name=NAME, start_executor=drafter, checkpoint_storage=storage).add_edge(drafter, reviewer)


ALLOWED = [f"{__name__}:Verdict"]


async def main(step: str, url: str, user: str, text: str) -> dict[str, Any]:
    async with Store.from_url(url) as store:
        storage = StoreCheckpointStorage(store, user_id=user, allowed_checkpoint_types=ALLOWED)
        workflow = build(storage).build()
        if step == "flood":  # many saves of one workflow, racing another process doing the same
            for n in range(int(text)):
                await storage.save(WorkflowCheckpoint(workflow_name=NAME, graph_signature_hash="g", iteration_count=n))
            return {"saved": int(text)}
        if step == "start":
            result = await workflow.run(text)
            return {"requests": [e.request_id for e in result.get_request_info_events()]}
        ids = await storage.list_checkpoint_ids(workflow_name=NAME)
        latest = await storage.get_latest(workflow_name=NAME)
        assert latest is not None
        pending = list(latest.pending_request_info_events)
        result = await workflow.run(checkpoint_id=latest.checkpoint_id, responses={pending[0]: text})
        return {"checkpoints": ids, "latest": latest.checkpoint_id, "outputs": result.get_outputs()}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:5])), ensure_ascii=False))
