"""Issue 22, items 7 and 8: an imported file is data, never code, and never a session that cannot be loaded.

A JSONL file handed to ``store.import_lines`` may come from anyone. Its checkpoint rows are decoded only when a
caller asks for that checkpoint, and then only as plain data (checkpoint_payloads.py); its session rows are
checked one by one with the API's own rules (import_rows.py), all or nothing.
"""

from __future__ import annotations

import base64
import collections
import copyreg
import enum
import json
import os
import pickle
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, Content, FileCheckpointStorage, Message, WorkflowCheckpoint
from agent_framework import WorkflowCheckpointException as FrameworkCheckpointError
from helpers import rows

from agent_store import CheckpointRefusedError, InvalidValueError, Store
from agent_store.agent_framework import StoreCheckpointStorage

TABLES = ("agent_sessions", "agent_state", "agent_runs", "agent_messages", "agent_tool_calls", "agent_user_state")


class Calls:
    """Pickles as the call ``function(*args)``: what a crafted file holds, never what the framework's encoder
    writes for a checkpoint's values."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.function, self.args


def pickled(value: Any, type_key: str) -> dict[str, str]:
    """A value as the framework's checkpoint encoding stores one that JSON cannot hold."""
    return {"__pickled__": base64.b64encode(pickle.dumps(value, protocol=5)).decode(), "__type__": type_key}


STORAGE = "agent_framework._workflows._checkpoint:FileCheckpointStorage"


def _text(s: str) -> bytes:  # pickle's SHORT_BINUNICODE
    return b"\x8c" + bytes([len(s.encode())]) + s.encode()


# type.__new__(type, "Made", (object,), {}) with ``type`` reached as getattr(int, "__class__"): a class built.
CLASS_MAKER = b"".join([
    b"\x80\x04", _text("builtins"), _text("getattr"), b"\x93", _text("builtins"), _text("int"), b"\x93",
    _text("__class__"), b"\x86R", _text("Made"), _text("builtins"), _text("object"), b"\x93\x85}\x87\x81.",
])  # fmt: skip
CRAFTED = {
    "a framework constructor": lambda target: pickled(Calls(FileCheckpointStorage, target), STORAGE),
    "copyreg's reconstructor": lambda target: pickled(
        Calls(copyreg._reconstructor, FileCheckpointStorage, FileCheckpointStorage, target), STORAGE
    ),  # allowed by the framework's safe set: it runs the named base class's __init__
    "a name outside the allow-list": lambda target: pickled(Calls(os.makedirs, target), "builtins:NoneType"),
    "a class made through getattr": lambda target: {
        "__pickled__": base64.b64encode(CLASS_MAKER).decode(),
        "__type__": "builtins:type",
    },
}


@pytest.mark.parametrize("crafted", list(CRAFTED))
async def test_an_imported_checkpoint_is_listed_without_decoding_and_refused_unbuilt(
    store: Store, tmp_path: Path, crafted: str
) -> None:
    target = tmp_path / "made-by-the-file"
    storage = StoreCheckpointStorage(store, user_id="ann")
    await storage.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", checkpoint_id="cp-1"))
    lines = [line async for line in store.export(user_id="ann")]
    await storage.delete("cp-1")
    records = [json.loads(line) for line in lines]
    for record in records:
        if record["kind"] == "checkpoint":  # the file's author edits the payload the framework wrote
            record["row"]["payload"]["state"] = {"x": CRAFTED[crafted](str(target))}
    assert (await store.import_lines([json.dumps(r) for r in records])).checkpoints == 1

    assert await storage.list_checkpoint_ids(workflow_name="wf") == ["cp-1"]  # listed from its row alone
    assert [r["checkpoint_id"] for r in await storage.describe(workflow_name="wf")] == ["cp-1"]
    assert await storage.list_checkpoints(workflow_name="wf") == []  # asked for: refused, left out
    assert await storage.get_latest(workflow_name="wf") is None
    assert not target.exists()
    with pytest.raises(CheckpointRefusedError, match="workflow checkpoint") as refused:
        await storage.load("cp-1")
    assert isinstance(refused.value, FrameworkCheckpointError)  # what CheckpointStorage.load raises
    assert not target.exists()  # nothing the payload names was ever built


class Mood(enum.Enum):
    CALM = "calm"


async def test_a_checkpoint_of_plain_values_still_round_trips(store: Store) -> None:
    """What the framework's encoder writes for the framework's safe types is read back: nothing over-refused."""
    state = {
        "when": datetime(2025, 1, 2, tzinfo=UTC), "day": date(2025, 1, 2), "price": Decimal("1.50"),
        "seen": {1, 2}, "pair": (1, "二"), "queue": collections.deque([1, 2], maxlen=5),
        "counts": collections.Counter("aab"), "mood": Mood.CALM, "raw": b"\x00\x01",
        "message": Message(role="user", contents=["你好", Content.from_function_call(call_id="c", name="f")]),
    }  # fmt: skip
    storage = StoreCheckpointStorage(store, allowed_checkpoint_types=[f"{__name__}:Mood"])
    await storage.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", checkpoint_id="c", state=state))
    loaded = (await storage.load("c")).state
    assert {k: v for k, v in loaded.items() if k != "message"} == {k: v for k, v in state.items() if k != "message"}
    assert loaded["message"].text == "你好" and loaded["message"].contents[1].call_id == "c"


async def exported(store: Store, agent: Agent) -> list[str]:
    """A good file: one session with state, a run and two messages, and the user's shared state; the store is
    emptied afterwards, so the file imports into it as into a new database."""
    async with store.session("s0", user_id="u") as session:
        session.state["plan"] = {"steps": (1, 2), "due": date(2025, 1, 1)}
        session.state["user:city"] = "上海"
        await agent.run("hello", session=session)
    lines = [line async for line in store.export(user_id="u")]
    await store.delete("s0", user_id="u")
    async with store.engine.begin() as conn:
        await conn.exec_driver_sql("DELETE FROM agent_user_state")
    return lines


def edit(kind: str, change: Callable[[dict[str, Any]], object], *, key: str | None = None) -> Callable[..., Any]:
    """A hostile file: the good one with the first ``kind`` row (of state ``key``) changed; returns its line."""

    def apply(lines: list[str]) -> tuple[list[str], int]:
        for number, line in enumerate(lines, start=1):
            record = json.loads(line)
            if record["kind"] == kind and key in (None, record["row"].get("key")):
                change(record["row"])
                return [*lines[: number - 1], json.dumps(record, ensure_ascii=False), *lines[number:]], number
        raise AssertionError(f"no {kind} row")

    return apply


def body(new: Any) -> Callable[[dict[str, Any]], None]:
    return lambda row: row.__setitem__("body", new)


def value(new: Any) -> Callable[[dict[str, Any]], None]:
    return lambda row: row.__setitem__("value", new)


HOSTILE = {
    "a body that is no message dict": edit("message", body(["not", "a", "message"])),
    "contents that are not a list": edit("message", body({"contents": 5})),
    "a content of no framework type": edit("message", body({"contents": [{"type": "rocket", "text": "x"}]})),
    "a text content whose text is a number": edit("message", body({"contents": [{"type": "text", "text": 5}]})),
    "additional_properties that are not a dict": edit("message", body({"$text": 1, "additional_properties": 5})),
    "a role that is a number": edit("message", lambda row: row.__setitem__("role", 5)),
    "a body whose role is a number": edit("message", body({"$text": 1, "role": 7})),
    "an author that is a dict": edit("message", lambda row: row.__setitem__("author_name", {"a": 1})),
    "message text that is a number": edit("message", lambda row: row.__setitem__("text", 5)),
    "a tuple holding an int": edit("state", value({"$tuple": 5}), key="plan"),
    "a datetime that is no date": edit("state", value({"$datetime": "yesterday"}), key="plan"),
    "a $state that is a list": edit("state", value({"$state": [1]}), key="plan"),
    "a message in state without a role": edit("state", value({"$state": {"type": "message"}}), key="plan"),
    "a bad message beside a type this process does not know": edit(
        "state",
        value(
            [
                {"$state": {"type": "app.unknown", "name": "a"}},
                {"$state": {"type": "message", "role": {"evil": 1}, "contents": []}},
            ]
        ),
        key="plan",
    ),
    "a $dict holding a list": edit("user_state", value({"$dict": [1, 2]})),
    "a user: key among a session's rows": edit("state", lambda row: row.__setitem__("key", "user:x"), key="plan"),
    "metadata that is a list": edit("session", lambda row: row.__setitem__("metadata", [1])),
    "a timestamp that is not one": edit("run", lambda row: row.__setitem__("committed_at", "soon")),
}


@pytest.mark.parametrize("hostile", list(HOSTILE))
async def test_a_hostile_row_is_refused_by_its_line_and_nothing_is_written(
    store: Store, agent: Agent, hostile: str
) -> None:
    good = await exported(store, agent)
    lines, number = HOSTILE[hostile](good)
    with pytest.raises(InvalidValueError, match=f"^import: line {number}: .*nothing was imported"):
        await store.import_lines(lines)
    for table in TABLES:
        assert await rows(store, f"SELECT count(*) FROM {table}") == [(0,)], table  # noqa: S608 - our table names
    assert (await store.import_lines(good)).imported == 1  # the good file, into the same store: it loads
    async with store.session("s0", user_id="u") as session:
        assert session.state["plan"] == {"steps": (1, 2), "due": date(2025, 1, 1)}
        assert session.state["user:city"] == "上海"
        assert session.state["in_memory"]["messages"][0].text == "hello"
        await agent.run("again", session=session)


async def test_a_state_value_json_cannot_hold_is_refused_by_line(store: Store, agent: Agent) -> None:
    good = await exported(store, agent)
    number = next(n for n, line in enumerate(good, start=1) if '"kind": "state"' in line)
    record = json.loads(good[number - 1])
    record["row"]["value"] = float("nan")  # Python's json writes (and reads) NaN; the store's JSON never holds it
    lines = [*good[: number - 1], json.dumps(record), *good[number:]]
    with pytest.raises(InvalidValueError, match=f"^import: line {number}: .*NaN"):
        await store.import_lines(lines)
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]


async def test_a_run_of_a_version_its_session_never_had_is_refused(store: Store, agent: Agent) -> None:
    """Each row is valid alone, but the session's export would then be refused for ever: nothing imported."""
    lines, _ = edit("run", lambda row: row.__setitem__("version", 10**6))(await exported(store, agent))
    with pytest.raises(InvalidValueError, match="a run is of a version its session never had"):
        await store.import_lines(lines)
    for table in TABLES:
        assert await rows(store, f"SELECT count(*) FROM {table}") == [(0,)], table  # noqa: S608 (our names)
