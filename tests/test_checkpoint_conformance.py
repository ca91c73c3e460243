"""The storage expectations of Agent Framework's own checkpoint conformance suite, for StoreCheckpointStorage.

The framework checks its in-tree storages for ownership (what is returned is the caller's; what was saved is
a snapshot of the call), name filtering and the unknown-id answers; the same expectations, on both backends.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException, WorkflowEvent, register_checkpoint_type
from agent_framework._workflows._runner_context import WorkflowMessage

from agent_store import Store
from agent_store.agent_framework import StoreCheckpointStorage


@dataclass
class Unclonable:
    """Pickles, but refuses deepcopy: a storage must round-trip through the encoding, not copy objects."""

    value: str

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("no deepcopy")


register_checkpoint_type(Unclonable)


def made(**fields: Any) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(workflow_name=fields.pop("workflow_name", "wf"), graph_signature_hash="h", **fields)


@pytest.fixture
def storage(store: Store) -> StoreCheckpointStorage:
    return StoreCheckpointStorage(store)


async def test_what_is_returned_belongs_to_the_caller(storage: StoreCheckpointStorage) -> None:
    ident = await storage.save(made(state={"key": "original", "nested": {"deep": {"value": "original"}}}))
    first, second = await storage.load(ident), await storage.load(ident)
    first.state["key"] = "mutated"
    first.state["nested"]["deep"]["value"] = "mutated"
    assert second.state["key"] == "original"
    assert (await storage.load(ident)).state == {"key": "original", "nested": {"deep": {"value": "original"}}}
    latest = await storage.get_latest(workflow_name="wf")
    assert latest is not None
    latest.state["key"] = "mutated"
    listed = await storage.list_checkpoints(workflow_name="wf")
    listed[0].state["key"] = "mutated"
    again = await storage.get_latest(workflow_name="wf")
    assert again is not None and again.state["key"] == "original"


async def test_a_save_is_a_snapshot_of_the_call(storage: StoreCheckpointStorage) -> None:
    checkpoint = made(state={"key": "original", "nested": {"deep": {"value": "original"}}})
    assert await storage.save(checkpoint) == checkpoint.checkpoint_id
    checkpoint.state["key"] = "mutated"
    checkpoint.state["nested"]["deep"]["value"] = "mutated"
    assert (await storage.load(checkpoint.checkpoint_id)).state["nested"]["deep"]["value"] == "original"


async def test_messages_events_and_metadata_are_isolated(storage: StoreCheckpointStorage) -> None:
    ident = await storage.save(
        made(
            messages={"executor1": [WorkflowMessage(source_id="a", target_id="b", data="original")]},
            pending_request_info_events={"req1": WorkflowEvent(type="test", data="original")},
            metadata={"nested": {"value": "original"}},
        )
    )
    loaded = await storage.load(ident)
    loaded.messages["executor1"][0].data = "mutated"
    loaded.pending_request_info_events["req1"].data = "mutated"
    loaded.metadata["nested"]["value"] = "mutated"
    reloaded = await storage.load(ident)
    assert reloaded.messages["executor1"][0].data == "original"
    assert reloaded.pending_request_info_events["req1"].data == "original"
    assert reloaded.metadata["nested"]["value"] == "original"


async def test_names_filter_and_unknowns_answer_as_the_protocol_says(storage: StoreCheckpointStorage) -> None:
    for name in ("workflow-1", "workflow-2", "workflow-1"):
        await storage.save(made(workflow_name=name))
    assert [c.workflow_name for c in await storage.list_checkpoints(workflow_name="workflow-1")] == ["workflow-1"] * 2
    assert len(await storage.list_checkpoints(workflow_name="workflow-2")) == 1
    assert await storage.get_latest(workflow_name="unknown-workflow") is None
    with pytest.raises(WorkflowCheckpointException):
        await storage.load("nonexistent-id")


async def test_a_value_that_pickles_but_refuses_deepcopy_round_trips(storage: StoreCheckpointStorage) -> None:
    with pytest.raises(TypeError):
        copy.deepcopy(Unclonable("x"))
    ident = await storage.save(made(state={"custom": Unclonable("test")}))
    loaded = await storage.load(ident)
    assert isinstance(loaded.state["custom"], Unclonable) and loaded.state["custom"].value == "test"
    loaded.state["custom"].value = "mutated"
    assert (await storage.load(ident)).state["custom"].value == "test"
