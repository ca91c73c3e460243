"""A run's journal (issue 39, migration 0019) on both backends: every event numbered 1, 2, 3, ... with no gap,
read back after any number from another Store (another worker) while it is written, exactly once and in order;
batches (one round trip each on PostgreSQL); a lost batch reply; cancel from anywhere; a failed block; a worker
SIGKILLed mid-run leaves no run in_progress; TTL purge and erasure; bad input is a typed error."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import rows, until
from lost_reply_proxy import LostReplyProxy
from sqlalchemy.engine import make_url

from agent_store import InvalidValueError, StorageUnavailableError, Store, StreamNotFoundError

HERE = Path(__file__).resolve().parent


async def follow_all(url: str, stream: str, after: int = 0, user: str = "u") -> list[tuple[int, Any]]:
    async with Store.from_url(url) as other:
        journal = other.journal()
        try:
            return [(e.seq, e.event) async for e in journal.follow(stream, user_id=user, after=after)]
        finally:
            await journal.close()


async def test_readers_elsewhere_get_every_event_once_in_order(store: Store, url: str) -> None:
    journal = store.journal(batch_events=16, batch_ms=20)
    writer = await journal.start("run-1", user_id="u", kind="agui", conversation_id="chat-1")
    early = asyncio.create_task(follow_all(url, "run-1"))
    async with writer:
        for n in range(1, 301):
            assert await writer.append({"type": "TEXT_MESSAGE_CONTENT", "delta": f"w{n}", "n": n}) == n
            if n % 37 == 0:
                await asyncio.sleep(0.03)  # the time rule sends a part-full batch
    late = await follow_all(url, "run-1", after=250)  # a reader who reconnects after event 250
    everything = await asyncio.wait_for(early, 20)
    assert [seq for seq, _ in everything] == list(range(1, 301))
    assert [event["n"] for _, event in everything] == list(range(1, 301))
    assert [seq for seq, _ in late] == list(range(251, 301))
    events, info = await journal.read("run-1", user_id="u", after=0, limit=5)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5] and info["status"] == "completed"
    assert (info["last_seq"], info["kind"], info["conversation_id"]) == (300, "agui", "chat-1")
    assert await rows(store, "SELECT count(*), min(seq), max(seq) FROM agent_stream_events") == [(300, 1, 300)]
    with pytest.raises(StreamNotFoundError):  # another user's run is not found
        await journal.read("run-1", user_id="mallory")
    await journal.close()


async def test_a_batch_is_one_round_trip_on_postgresql(pg_url: str) -> None:
    proxy = LostReplyProxy("127.0.0.1", make_url(pg_url).port or 5432)
    port = await proxy.start()
    try:
        async with Store.from_url(make_url(pg_url).set(port=port).render_as_string(hide_password=False),
                                  pool_size=1) as store:  # fmt: skip
            await store.migrate()
            journal = store.journal(batch_events=10, batch_ms=60_000, lease_s=600)
            writer = await journal.start("r", user_id="u")
            before = proxy.round_trips
            for n in range(100):
                await writer.append({"n": n})
            assert proxy.round_trips - before == 10  # 10 batches of 10
            before = proxy.round_trips
            await writer.finish()  # nothing queued: the status alone, one more
            assert proxy.round_trips - before == 1
            before = proxy.round_trips
            await (await journal.start("r2", user_id="u")).finish()  # a run's row: one statement; its end: one
            assert proxy.round_trips - before == 2
            await journal.close()
    finally:
        await proxy.stop()


async def test_a_lost_batch_reply_neither_loses_nor_doubles(store: Store, url: str) -> None:
    journal = store.journal(batch_events=5, batch_ms=60_000)
    writer = await journal.start("r", user_id="u")
    db, lost = store.db, {"armed": True}
    real_fetch, real_hop = db.driver.fetch, db.in_sqlite_thread

    async def fetch_then_lose(conn: Any, statement: Any, params: Any, **kw: Any) -> Any:
        result = await real_fetch(conn, statement, params, **kw)
        if lost["armed"] and "agent_stream_events" in str(statement):
            lost["armed"] = False
            raise StorageUnavailableError("writing a run's journal failed: the reply was lost (connection lost)")
        return result

    async def hop_then_lose(work: Any, *, doing: str, committing: Any) -> Any:
        result = await real_hop(work, doing=doing, committing=committing)  # committed ...
        if lost["armed"] and doing == "writing a run's journal":
            lost["armed"] = False
            raise StorageUnavailableError("the reply was lost (connection lost)")  # ... but never heard
        return result

    db.driver.fetch, db.in_sqlite_thread = fetch_then_lose, hop_then_lose  # type: ignore[method-assign]
    try:
        for n in range(12):
            await writer.append({"n": n})
        await writer.finish()
    finally:
        db.driver.fetch, db.in_sqlite_thread = real_fetch, real_hop  # type: ignore[method-assign]
    assert not lost["armed"]
    assert [event["n"] for _, event in await follow_all(url, "r")] == list(range(12))
    await journal.close()


async def test_cancel_from_another_worker_and_a_failed_block(store: Store, url: str) -> None:
    journal = store.journal(batch_events=1, lease_s=3)
    writer = await journal.start("long", user_id="u")
    await writer.append({"step": 1})
    async with Store.from_url(url) as other:
        assert await other.journal().cancel("long", user_id="u") is True
        with pytest.raises(StreamNotFoundError):
            await other.journal().cancel("long", user_id="someone else")
    await until(lambda: writer.cancel_requested, "the cancel")  # the next batch or heartbeat brings it
    await writer.finish("cancelled")
    assert (await journal.read("long", user_id="u"))[1]["status"] == "cancelled"
    assert await journal.cancel("long", user_id="u") is False  # ended: nothing to cancel
    failing = await journal.start("boom", user_id="u")
    with pytest.raises(ZeroDivisionError):
        async with failing:
            await failing.append({"step": 1})
            _ = 1 / 0
    _, info = await journal.read("boom", user_id="u")
    assert (info["status"], info["error"], info["last_seq"]) == ("failed", "ZeroDivisionError", 1)
    assert [seq for seq, _ in await follow_all(url, "boom")] == [1]  # a follower of a failed run ends
    await journal.close()


@pytest.mark.parametrize("found_by", ["a reader, once the lease ran out", "the worker, restarted"])
async def test_a_worker_killed_mid_run_leaves_no_run_in_progress(store: Store, url: str, found_by: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = await asyncio.create_subprocess_exec(sys.executable, str(HERE / "journal_writer.py"), url, "worker-7",
                                                  "doomed", stdout=asyncio.subprocess.PIPE, env=env)  # fmt: skip
    assert writer.stdout is not None
    written = 0
    try:
        while written < 20:
            line = await asyncio.wait_for(writer.stdout.readline(), 30)
            assert line, "the writer stopped by itself"
            written = int(line)
    finally:
        writer.send_signal(signal.SIGKILL)
        await writer.wait()
    if found_by.startswith("a reader"):
        got = await asyncio.wait_for(follow_all(url, "doomed"), 30)  # follows, then finds the lease ran out
    else:
        assert await store.journal(worker_id="worker-7").recover() == 1  # at start-up: its runs are not live
        got = await follow_all(url, "doomed")
    seqs = [seq for seq, _ in got]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= written  # every flushed event is there
    _, info = await store.journal().read("doomed", user_id="u")
    assert info["status"] == "incomplete" and "worker stopped" in info["error"]


async def test_ttl_purge_and_erasure_take_journals(store: Store) -> None:
    journal = store.journal(ttl_s=0.01)
    async with await journal.start("old", user_id="u") as writer:
        await writer.append({"n": 1})
    lasting = store.journal()
    async with await lasting.start("kept", user_id="u") as writer:
        await writer.append({"n": 1})
    async with await lasting.start("theirs", user_id="v") as writer:
        await writer.append({"n": 1})
    await asyncio.sleep(0.05)
    await store.purge_expired()
    assert await rows(store, "SELECT stream_id FROM agent_streams ORDER BY stream_id") == [("kept",), ("theirs",)]
    assert await rows(store, "SELECT count(*) FROM agent_stream_events") == [(2,)]
    await store.erase_user("u")
    assert await rows(store, "SELECT user_id, stream_id FROM agent_streams") == [("v", "theirs")]
    assert await rows(store, "SELECT count(*) FROM agent_stream_events") == [(1,)]


async def test_bad_input_is_a_typed_error_and_writes_nothing(store: Store) -> None:
    journal = store.journal(batch_events=1)
    writer = await journal.start("r", user_id="u")
    for bad in ({"x": float("nan")}, {"x": object()}, {"x": "\x00"}):
        with pytest.raises(InvalidValueError):
            await writer.append(bad)
    assert writer.last_seq == 0
    await writer.append({"ok": True})
    with pytest.raises(InvalidValueError):
        await journal.start("r", user_id="u")  # a stream id is used once
    for stream_id in ("", "x" * 300, None):
        with pytest.raises(InvalidValueError):
            await journal.start(stream_id, user_id="u")  # type: ignore[arg-type]
    await writer.finish()
    with pytest.raises(InvalidValueError):
        await writer.append({"late": True})
    with pytest.raises(InvalidValueError):
        await writer.finish("in_progress")
    assert await rows(store, "SELECT seq FROM agent_stream_events") == [(1,)]
    await journal.close()


async def test_an_end_during_a_heartbeat_keeps_every_event(store: Store) -> None:
    """finish() as the heartbeat sends the queued events (an outside review's case: they were lost)."""
    journal = store.journal(batch_events=1000, batch_ms=60_000, lease_s=0.6)

    async def one(n: int) -> tuple[str, int, int]:
        writer = await journal.start(f"hb-{n}", user_id="u")
        for _ in range(3):
            await writer.append({"n": n})
        await asyncio.sleep(0.19 + n % 5 * 0.005)  # about when the heartbeat (0.2 s) goes
        await writer.finish()
        events, info = await journal.read(f"hb-{n}", user_id="u")
        return info["status"], len(events), info["last_seq"]

    assert set(await asyncio.gather(*(one(n) for n in range(20)))) == {("completed", 3, 3)}
    await journal.close()


async def test_a_flush_cut_short_or_a_database_away_keeps_the_numbers(store: Store, monkeypatch: Any) -> None:
    import agent_store.journal.writer as writer_module

    journal = store.journal(batch_events=2, batch_ms=60_000, lease_s=30)
    writer = await journal.start("r", user_id="u")
    assert [await writer.append({"e": n}) for n in (1, 2, 3)] == [1, 2, 3]
    with pytest.raises(TimeoutError):  # the caller gives up on a flush: its batch stays queued
        await asyncio.wait_for(writer.flush(), 0.0001)
    real, away = writer_module.send_batch, {"tries": 4}

    async def unreachable(*args: Any) -> Any:
        if away["tries"]:
            away["tries"] -= 1
            raise StorageUnavailableError("writing a run's journal failed: connection refused")
        return await real(*args)

    monkeypatch.setattr(writer_module, "send_batch", unreachable)
    assert [await writer.append({"e": n}) for n in (4, 5)] == [4, 5]  # its flush fails: logged, kept queued
    await writer.finish()
    events, info = await journal.read("r", user_id="u")
    assert [(e.seq, e.event["e"]) for e in events] == [(n, n) for n in range(1, 6)] and info["status"] == "completed"
    await journal.close()


async def test_breaking_out_on_a_cancel_ends_the_run_cancelled(store: Store) -> None:
    journal = store.journal(batch_events=1)
    async with await journal.start("c", user_id="u") as writer:
        await journal.cancel("c", user_id="u")
        for n in range(100):
            await writer.append({"n": n})
            if writer.cancel_requested:
                break
    assert (await journal.read("c", user_id="u"))[1]["status"] == "cancelled"
    await journal.close()


async def test_closing_a_journal_ends_a_writer_left_open(store: Store) -> None:
    journal = store.journal(lease_s=0.6)
    writer = await journal.start("left", user_id="u")
    await writer.append({"n": 1})
    await journal.close()
    events, info = await store.journal().read("left", user_id="u")
    assert info["status"] == "incomplete" and [e.seq for e in events] == [1]
    assert writer._beat is not None and writer._beat.done()  # its heartbeat stopped


@pytest.mark.parametrize("options", [{"batch_events": 0}, {"batch_events": "64"}, {"lease_s": 0},
                                     {"lease_s": float("nan")}, {"ttl_s": -1}, {"batch_ms": -1}, {"poll_s": 0},
                                     {"worker_id": ""}])  # fmt: skip
async def test_bad_options_are_typed_errors(store: Store, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidValueError):
        store.journal(**options)
