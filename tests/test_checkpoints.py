"""Issue 12: workflow checkpoints in the store's database (``StoreCheckpointStorage``), on both backends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException
from helpers import rows
from review_workflow import NAME, Verdict
from sqlalchemy import text

from agent_store import InvalidValueError, Store
from agent_store.agent_framework import StoreCheckpointStorage
from agent_store.run.commit import ERASURE_MARGIN

SCRIPT = str(Path(__file__).with_name("review_workflow.py"))


def checkpoint(n: int, *, workflow: str = "wf", **fields: Any) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(
        workflow_name=workflow, graph_signature_hash="g", checkpoint_id=f"cp-{n}", iteration_count=n, **fields
    )


def step(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def in_parallel(args: list[str], *, times: int) -> None:
    procs = [subprocess.Popen([sys.executable, *args], stderr=subprocess.PIPE, text=True) for _ in range(times)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]


async def test_the_protocol_behaves_as_the_framework_s_storages(store: Store) -> None:
    storage = StoreCheckpointStorage(store)
    with pytest.raises(WorkflowCheckpointException, match="No checkpoint found"):
        await storage.load("missing")
    assert await storage.delete("missing") is False
    assert await storage.get_latest(workflow_name="wf") is None
    assert await storage.list_checkpoints(workflow_name="wf") == []
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    # Saved first, but with the newest wall-clock timestamp: "latest" is still the last one saved.
    for n, stamp in ((1, later), (2, None), (3, None)):
        extra = {"timestamp": stamp} if stamp else {}
        assert await storage.save(checkpoint(n, previous_checkpoint_id=f"cp-{n - 1}" if n > 1 else None, **extra)) == (
            f"cp-{n}"
        )
    await storage.save(checkpoint(9, workflow="other"))
    assert await storage.list_checkpoint_ids(workflow_name="wf") == ["cp-1", "cp-2", "cp-3"]
    latest = await storage.get_latest(workflow_name="wf")
    assert latest is not None and latest.checkpoint_id == "cp-3" and latest.previous_checkpoint_id == "cp-2"
    loaded = await storage.load("cp-1")
    assert (loaded.timestamp, loaded.iteration_count, loaded.workflow_name) == (later, 1, "wf")
    await storage.save(checkpoint(1, timestamp=later))  # saved again: replaced, and now the latest
    assert await storage.list_checkpoint_ids(workflow_name="wf") == ["cp-2", "cp-3", "cp-1"]
    assert await storage.delete("cp-1") is True and await storage.delete("cp-1") is False
    latest = await storage.get_latest(workflow_name="wf")
    assert latest is not None and latest.checkpoint_id == "cp-3"
    assert await rows(store, "SELECT count(*) FROM agent_checkpoints") == [(3,)]


async def test_a_checkpoint_that_could_not_be_read_back_is_refused_at_save(store: Store) -> None:
    strict = StoreCheckpointStorage(store)
    verdict = checkpoint(1, state={"verdict": Verdict(reviewer="ann", approved=True)})
    with pytest.raises(WorkflowCheckpointException, match="review_workflow:Verdict"):
        await strict.save(verdict)  # an application type the storage does not allow
    with pytest.raises(WorkflowCheckpointException):
        await strict.save(checkpoint(2, state={"f": lambda: 1}))  # nothing the encoding can write
    with pytest.raises(WorkflowCheckpointException, match="checkpoint_id"):
        await strict.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", checkpoint_id="x" * 300))
    assert await rows(store, "SELECT count(*) FROM agent_checkpoints") == [(0,)]  # nothing written
    trusting = StoreCheckpointStorage(store, allowed_checkpoint_types=["review_workflow:Verdict"])
    await trusting.save(verdict)
    assert (await trusting.load("cp-1")).state["verdict"] == Verdict(reviewer="ann", approved=True)
    with pytest.raises(WorkflowCheckpointException):
        await strict.load("cp-1")  # stored by a more trusting storage: still decoded only by the allow-list
    assert await strict.list_checkpoints(workflow_name="wf") == []  # left out, as FileCheckpointStorage does


async def test_a_user_sees_only_their_own_checkpoints_and_erasure_removes_them(store: Store) -> None:
    ann, bob = StoreCheckpointStorage(store, user_id="ann"), StoreCheckpointStorage(store, user_id="bob")
    for n in (1, 2):
        await ann.save(checkpoint(n))
    with pytest.raises(WorkflowCheckpointException, match="No checkpoint found with ID cp-1"):
        await bob.load("cp-1")  # the same answer as for an id nobody used
    assert await bob.list_checkpoint_ids(workflow_name="wf") == [] and await bob.get_latest(workflow_name="wf") is None
    assert await bob.delete("cp-1") is False
    await bob.save(checkpoint(1))  # the same id: bob's own
    assert await ann.list_checkpoint_ids(workflow_name="wf") == ["cp-1", "cp-2"]
    report = await store.erase_user("ann")
    assert report.checkpoints == 2
    assert await ann.list_checkpoint_ids(workflow_name="wf") == []
    assert await bob.list_checkpoint_ids(workflow_name="wf") == ["cp-1"]
    assert await rows(store, "SELECT user_id, count(*) FROM agent_checkpoints GROUP BY user_id") == [("bob", 1)]


async def test_a_paused_workflow_resumes_in_another_process(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        started = step("start", url, "ann", "写一份周报")
        assert len(started["requests"]) == 1  # paused, waiting for the human
        resumed = step("resume", url, "ann", "同意")
        assert resumed["outputs"] and resumed["outputs"][0].endswith("| human: 同意")
        assert resumed["latest"] == resumed["checkpoints"][-1]
        # The chain, with plain SQL: each checkpoint names the one before it.
        chain = await rows(
            store,
            "SELECT checkpoint_id, previous_checkpoint_id FROM agent_checkpoints "
            "WHERE user_id = 'ann' AND workflow_name = :w ORDER BY seq",
            w=NAME,
        )
        assert len(chain) >= 3 and chain[0][1] is None
        assert [prev for _, prev in chain[1:]] == [ident for ident, _ in chain[:-1]]
        assert await StoreCheckpointStorage(store, user_id="bob").list_checkpoints(workflow_name=NAME) == []


async def test_two_processes_saving_one_workflow_lose_none_and_order_them(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        in_parallel([SCRIPT, "flood", url, "ann", "40"], times=2)
        seqs = await rows(store, "SELECT seq FROM agent_checkpoints WHERE workflow_name = :w ORDER BY seq", w=NAME)
        assert [s for (s,) in seqs] == list(range(1, 81))  # distinct, gap-free, one per save
        storage = StoreCheckpointStorage(store, user_id="ann", allowed_checkpoint_types=["review_workflow:Verdict"])
        latest = await storage.get_latest(workflow_name=NAME)
        last = await rows(
            store, "SELECT checkpoint_id FROM agent_checkpoints WHERE seq = 80 AND workflow_name = :w", w=NAME
        )
        assert latest is not None and [(latest.checkpoint_id,)] == last


async def test_old_checkpoints_are_purged_but_each_workflow_keeps_its_latest(store: Store) -> None:
    storage = StoreCheckpointStorage(store, user_id="ann")
    for n in range(5):
        await storage.save(checkpoint(n))
    await storage.save(checkpoint(10, workflow="paused"))  # a workflow waiting for a human: one checkpoint
    await storage.save(checkpoint(5))  # recent: younger than the cut
    month_ago = datetime.now(UTC) - timedelta(days=30)
    value = month_ago.replace(tzinfo=None) if store.engine.dialect.name == "sqlite" else month_ago
    async with store.engine.begin() as conn:
        await conn.execute(
            text("UPDATE agent_checkpoints SET saved_at = :t WHERE checkpoint_id <> 'cp-5'"), {"t": value}
        )
    assert (await store.stats())["rows"]["agent_checkpoints"] == 7
    assert await store.purge_checkpoints(timedelta(days=7), batch_size=2) == 5  # cp-0..cp-4; cp-10 is a latest
    assert await storage.list_checkpoint_ids(workflow_name="wf") == ["cp-5"]
    assert await storage.list_checkpoint_ids(workflow_name="paused") == ["cp-10"]
    assert await store.purge_checkpoints(timedelta(days=7), keep_latest=False) == 1  # now the paused one too
    assert (await store.stats())["rows"]["agent_checkpoints"] == 1
    with pytest.raises(InvalidValueError):
        await store.purge_checkpoints(-timedelta(days=1))


def test_the_cli_lists_shows_and_deletes_checkpoints(url: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agent_store", *args, "--url", url],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    assert cli("upgrade").returncode == 0
    step("flood", url, "ann", "3")
    listed = cli("checkpoints", "list", NAME, "--user", "ann", "--json")
    assert listed.returncode == 0, listed.stderr
    chain = json.loads(listed.stdout)
    assert [c["seq"] for c in chain] == [1, 2, 3] and [c["iteration_count"] for c in chain] == [0, 1, 2]
    assert json.loads(cli("checkpoints", "list", NAME, "--json").stdout) == []  # not another owner's
    none = cli("checkpoints", "list", NAME)
    assert none.returncode == 0 and "no checkpoints of workflow" in none.stderr and "--user" in none.stderr
    table = cli("checkpoints", "list", NAME, "--user", "ann").stdout.splitlines()
    assert table[0].split() == ["SEQ", "CHECKPOINT_ID", "PREVIOUS", "ITERATION", "TIMESTAMP"] and len(table) == 4
    workflows = json.loads(cli("checkpoints", "list", "--user", "ann", "--json").stdout)  # no name: which there are
    assert [(w["workflow"], w["checkpoints"], w["latest"]) for w in workflows] == [
        (NAME, 3, chain[-1]["checkpoint_id"])
    ]
    shown = cli("checkpoints", "show", chain[0]["checkpoint_id"], "--user", "ann")
    assert json.loads(shown.stdout)["payload"]["workflow_name"] == NAME  # as stored, not decoded
    assert cli("checkpoints", "delete", chain[0]["checkpoint_id"], "--user", "ann").returncode == 0
    gone = cli("checkpoints", "show", chain[0]["checkpoint_id"], "--user", "ann")
    assert gone.returncode == 1 and "no checkpoint" in gone.stderr
    deleted = cli("checkpoints", "delete", chain[1]["checkpoint_id"], "--user", "ann", "--yes")  # scripts use --yes
    assert deleted.returncode == 0, deleted.stderr
    purged = cli("purge", "--checkpoints-older-than", "0", "--json")  # all but each workflow's latest
    assert json.loads(purged.stdout) == {"purged": 0, "checkpoints": 0}


async def test_a_user_s_export_carries_their_checkpoints_and_import_skips_existing_ones(url: str) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        storage = StoreCheckpointStorage(store, user_id="ann", allowed_checkpoint_types=["review_workflow:Verdict"])
        for n in range(3):
            await storage.save(checkpoint(n, state={"v": Verdict(reviewer="李", approved=n == 2)}))
        await StoreCheckpointStorage(store, user_id="bob").save(checkpoint(7))
        lines = [line async for line in store.export(user_id="ann")]
        assert sum('"kind": "checkpoint"' in line for line in lines) == 3  # bob's is not in ann's export
        await store.erase_user("ann")
        await asyncio.sleep(ERASURE_MARGIN.total_seconds() + 0.1)  # a storage made after the erasure may write
        storage = StoreCheckpointStorage(store, user_id="ann", allowed_checkpoint_types=["review_workflow:Verdict"])
        report = await store.import_lines(lines)
        assert report.checkpoints == 3
        assert await storage.list_checkpoint_ids(workflow_name="wf") == ["cp-0", "cp-1", "cp-2"]
        assert (await storage.load("cp-2")).state["v"] == Verdict(reviewer="李", approved=True)
        await storage.save(checkpoint(9))  # the workflow goes on after the restore ...
        await storage.delete("cp-1")
        assert (await store.import_lines(lines)).checkpoints == 0  # ... so a backup never rewinds it
        latest = await storage.get_latest(workflow_name="wf")
        assert latest is not None and latest.checkpoint_id == "cp-9"
        assert (await store.import_lines(lines)).checkpoints == 0  # all there: skipped, never duplicated


async def test_a_checkpoint_comes_back_exactly_as_the_framework_wrote_it(store: Store) -> None:
    storage = StoreCheckpointStorage(store)
    state = {"zeta": 1e20, "alpha": {"b": 1, "a": [1.5, None, "长"]}, "mid": 2**40}
    pending = {"r-zz": 1, "r-aa": 2}  # the framework resumes requests in this dict's order
    await storage.save(checkpoint(1, state=state, metadata=pending))
    loaded = await storage.load("cp-1")
    assert loaded.state == state and list(loaded.state) == ["zeta", "alpha", "mid"]
    assert type(loaded.state["zeta"]) is float and list(loaded.metadata) == ["r-zz", "r-aa"]
    with pytest.raises(WorkflowCheckpointException, match="NaN"):
        await storage.save(checkpoint(2, state={"x": float("nan")}))  # JSON cannot hold it: refused, not lost later
    assert await storage.list_checkpoint_ids(workflow_name="wf") == ["cp-1"]


async def test_odd_ids_get_the_unknown_id_answer(store: Store) -> None:
    storage = StoreCheckpointStorage(store)
    for odd in ("a\x00b", "\ud800", "x" * 300, ""):
        with pytest.raises(WorkflowCheckpointException, match="No checkpoint found"):
            await storage.load(odd)
        assert await storage.delete(odd) is False
        assert await storage.get_latest(workflow_name=odd) is None
    with pytest.raises(WorkflowCheckpointException):  # the same refusal on both backends
        await storage.save(WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="g", iteration_count=2**31))


async def test_saves_racing_an_erasure_land_wholly_before_it_or_are_refused(store: Store) -> None:
    """A save takes the user's lock, as erase_user does: none survives the erasure half-counted, and a storage
    made before the erasure cannot write for the user after it; one made after can, from seq 1."""
    before = StoreCheckpointStorage(store, user_id="ann")
    refused, erased, saving = 0, asyncio.Event(), asyncio.Event()

    async def saver(k: int) -> None:
        nonlocal refused
        after = 0
        for n in range(10_000):  # saves until the erasure is done, and three after it
            if erased.is_set() and (after := after + 1) > 3:
                return
            try:
                await before.save(checkpoint(100_000 * k + n))
                saving.set()
            except WorkflowCheckpointException:
                refused += 1

    async def eraser() -> None:
        await asyncio.wait_for(saving.wait(), 60)  # the erasure races saves under way (some landed already)
        await store.erase_user("ann")
        erased.set()

    await asyncio.gather(*(saver(k) for k in range(3)), eraser())
    assert refused >= 9 and await rows(store, "SELECT count(*) FROM agent_checkpoints") == [(0,)]
    await asyncio.sleep(ERASURE_MARGIN.total_seconds() + 0.1)  # the clock-skew margin runs also use
    after = StoreCheckpointStorage(store, user_id="ann")
    for n in range(3):
        await after.save(checkpoint(n))
    assert await rows(store, "SELECT seq FROM agent_checkpoints ORDER BY seq") == [(1,), (2,), (3,)]


async def test_a_purge_batch_larger_than_a_statement_s_parameter_limit(store: Store) -> None:
    old = datetime.now(UTC) - timedelta(days=60)
    value = old.replace(tzinfo=None) if store.engine.dialect.name == "sqlite" else old
    async with store.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO agent_checkpoints (user_id, checkpoint_id, workflow_name, seq, previous_checkpoint_id, "
                "timestamp, iteration_count, saved_at, payload) "
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40000) "
                "SELECT '', 'cp-' || i, 'wf', i, NULL, 't', 0, :t, '{}' FROM n"
            ),
            {"t": value},
        )
    assert await store.purge_checkpoints(timedelta(days=1), batch_size=100_000) == 39_999  # the latest stays
