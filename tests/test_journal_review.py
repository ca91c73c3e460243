"""What an outside review of the journal (issue 39) confirmed, each a test now: a cancel racing the commit; a hard
cancel while the run's last batch is in flight; a batch too big for one PostgreSQL statement; two AG-UI runs on
one thread; a cancelled AG-UI run's end; cancel routes given a bad id. Then a second review's: a commit block that
raises after a cancel; a finish cut short; the database away as a run ends; a dead run holding its thread; a
client replaying its own transcript."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from agent_framework import Agent, tool
from agent_framework_ag_ui import AgentFrameworkAgent
from fastapi import FastAPI
from helpers import dead_run, lock_waits, until
from sqlalchemy import text
from test_agui_resume import frames

import agent_store.journal.writer as writer_module
from agent_store import StorageUnavailableError, Store, StreamBusyError
from agent_store.agent_framework import StoreSessionStore
from agent_store.agent_framework.ag_ui import StoreThreadSnapshotStore
from agent_store.agent_framework.ag_ui_resume import add_resumable_agui_routes
from agent_store.agent_framework.responses_background import add_background_responses_routes
from agent_store.db.statements import USER_LOCK
from agent_store.journal import Journal, start_detached, uncancellable
from agent_store.offline import OfflineChatClient

TOOL: dict[str, asyncio.Event] = {}  # "entered": a run is inside slow_lookup; "go_on": the test lets it return
JOURNALS: list[Journal] = []  # the journals of this test's apps


@pytest.fixture(autouse=True)
def fresh_gates() -> None:
    TOOL.update(entered=asyncio.Event(), go_on=asyncio.Event())
    JOURNALS.clear()


@tool
async def slow_lookup() -> str:
    """A tool that takes a while: until the test lets it go on."""
    TOOL["entered"].set()
    await asyncio.wait_for(TOOL["go_on"].wait(), 60)
    return "北京，晴"


def apps(store: Store) -> FastAPI:
    app = FastAPI()
    agent = Agent(client=OfflineChatClient(), name="Assistant", tools=[slow_lookup])
    user_of: Any = lambda request: request.headers.get("x-user")  # noqa: E731
    JOURNALS.append(add_background_responses_routes(app, agent, store, user_of=user_of))
    JOURNALS.append(add_resumable_agui_routes(app, AgentFrameworkAgent(agent=agent), store, path="/agent",
                                              user_of=user_of))  # fmt: skip
    return app


def a_cancel_heard() -> bool:
    """A run of this test's apps has heard a cancel (its writer has)."""
    return any(writer.cancel_requested for journal in JOURNALS for writer in journal.live)


def a_hard_cancel_held_back() -> bool:
    """A run of this test's apps was to be cancelled where it waits (its grace period is over) but is inside its
    commit: the cancel waits for the commit."""
    return any(run.due for journal in JOURNALS for run in journal.detached)


def client(store: Store) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=apps(store)), base_url="http://t",
                             headers={"x-user": "u"})  # fmt: skip


async def test_a_cancel_while_the_turn_commits_ends_it_completed_with_its_turn(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
    async with Store.from_url(pg_url) as store, Store.from_url(pg_url) as other, client(store) as web, \
            client(other) as far:  # fmt: skip
        body = {"model": "offline", "input": "call slow_lookup", "background": True}
        response_id = (await web.post("/responses", json=body)).json()["id"]
        await asyncio.wait_for(TOOL["entered"].wait(), 60)  # inside the tool: the commit comes next
        async with other.engine.connect() as holder, lock_waits(pg_url) as waiting:
            transaction = await holder.begin()
            await holder.execute(text("SELECT pg_advisory_xact_lock(:k, hashtext('u'))"), {"k": USER_LOCK})
            TOOL["go_on"].set()
            await until(waiting, "the run's commit to wait on the user's lock")
            await far.post(f"/responses/{response_id}/cancel")
            # Its grace_s (2 s) is over: the hard cancel has come, and waits for the commit
            await until(a_hard_cancel_held_back, "the hard cancel")
            await transaction.commit()
        journal = other.journal()
        async def to_the_end() -> None:
            async for _ in journal.follow(response_id, user_id="u"):
                pass

        await asyncio.wait_for(to_the_end(), 30)
        events, info = await journal.read(response_id, user_id="u")
        kept = await StoreSessionStore(other, user_id="u").get(response_id)
        # one outcome or the other, never both: here the commit won, so completed, with its turn
        assert info["status"] == "completed" and events[-1].event["type"] == "response.completed"
        assert kept is not None and (await far.get(f"/responses/{response_id}")).json()["status"] == "completed"
        await journal.close()


async def test_a_hard_cancel_during_the_last_batch_still_ends_the_run_with_every_event(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
    async with Store.from_url(pg_url) as store, Store.from_url(pg_url) as other:
        journal, far = store.journal(lease_s=2), other.journal()
        one_sent, two_kept, heard = asyncio.Event(), asyncio.Event(), asyncio.Event()
        released: list[asyncio.Future[Any]] = []  # the holder's commit: done before the holder is given back
        async with other.engine.connect() as holder:

            async def events() -> Any:
                yield {"n": 1}
                one_sent.set()
                yield {"n": 2}  # kept: no cancel was heard before it
                two_kept.set()
                await asyncio.wait_for(heard.wait(), 60)  # now it is heard (a cancel would wait for the lock below)
                transaction = await holder.begin()  # the run's row held a while: its last batch waits
                await holder.execute(text("SELECT 1 FROM agent_streams WHERE stream_id = 'r1' FOR UPDATE"))
                grace_starts()  # from now: the hard cancel comes (0.6 s) while the last batch waits (1.5 s)
                asyncio.get_running_loop().call_later(1.5, lambda: released.append(asyncio.ensure_future(
                    transaction.commit())))  # fmt: skip
                await asyncio.Event().wait()  # the run waits here: the hard cancel cuts it
                yield {"n": 3}

            task = await start_detached(journal, "r1", user_id="u", events=events, grace_s=0.6)
            (writer,) = journal.live
            grace_starts, writer.on_cancel = writer.on_cancel, heard.set  # the run's grace period, held back
            assert grace_starts is not None
            await asyncio.wait_for(two_kept.wait(), 60)
            assert await far.cancel("r1", user_id="u")
            assert await asyncio.wait_for(task, 30) == "cancelled"
            # (the run may end before the holder lets go: its commit must not race the holder's own rollback)
            await until(lambda: released, "the holder's commit started")
            await asyncio.wait_for(released[0], 30)
        got, info = await far.read("r1", user_id="u")
        assert (info["status"], [e.event for e in got]) == ("cancelled", [{"n": 1}, {"n": 2}])
        await journal.close()
        await far.close()


async def test_a_batch_over_the_statement_limit_goes_as_several(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "BATCH_CHARS", 2**18)  # 64 events of 33,000 characters: 9 statements
    real, sent = writer_module.send_batch, []

    async def counted(db: Any, params: Any, batch: list[str]) -> Any:
        sent.append(sum(len(event) for event in batch))
        return await real(db, params, batch)

    monkeypatch.setattr(writer_module, "send_batch", counted)
    journal = store.journal(batch_events=64, batch_ms=60_000)
    async with await journal.start("big", user_id="u") as writer:
        for n in range(64):
            await writer.append({"n": n, "pad": "字" * 33_000})
    events, info = await journal.read("big", user_id="u")
    assert info["status"] == "completed" and [e.event["n"] for e in events] == list(range(64))
    assert [e.seq for e in events] == list(range(1, 65))
    assert len(sent) >= 9 and max(sent) <= 2**18  # several statements, none over the limit
    await journal.close()


def run_request(run_id: str, text_: str = "call slow_lookup") -> dict[str, Any]:
    return {"threadId": "thread-1", "runId": run_id, "messages": [{"id": f"m-{run_id}", "role": "user",
                                                                  "content": text_}]}  # fmt: skip


async def test_an_agui_thread_runs_one_at_a_time_from_any_worker(store: Store, url: str) -> None:
    async with Store.from_url(url) as other, client(store) as web, client(other) as far:
        first = asyncio.create_task(web.post("/agent", json=run_request("A")))
        reader = other.journal()
        await until(lambda: first.done() or reader.live_run("thread-1", user_id="u"), "run A to start")
        assert await reader.live_run("thread-1", user_id="u") == "A"  # (and its tool waits for this test)
        second = await far.post("/agent", json=run_request("B", "我叫李明"))  # another worker, the same thread
        assert second.status_code == 409 and second.json()["detail"]["runId"] == "A"
        elsewhere = await far.post("/agent", json={**run_request("C", "hi"), "threadId": "thread-2"})
        assert elsewhere.status_code == 200  # another thread is free
        TOOL["go_on"].set()
        assert frames((await asyncio.wait_for(first, 60)).text)[-1][1]["type"] == "RUN_FINISHED"
        third = await far.post("/agent", json=run_request("D", "我叫李明"))  # once it has ended: free again
        assert third.status_code == 200 and frames(third.text)[-1][1]["type"] == "RUN_FINISHED"


async def test_a_cancelled_agui_run_ends_with_a_run_error(store: Store, url: str) -> None:
    async with Store.from_url(url) as other, client(store) as web, client(other) as far:
        live = asyncio.create_task(web.post("/agent", json=run_request("R")))

        async def cancelled() -> bool:  # once the run's row is there
            return live.done() or (await far.post("/agent/runs/R/cancel")).status_code == 200

        await until(cancelled, "the cancel to be taken")
        await until(lambda: live.done() or a_cancel_heard(), "the run to hear the cancel")
        TOOL["go_on"].set()  # its tool returns: the run stops at its next event
        own = (await asyncio.wait_for(live, 60)).text
        resumed = (await far.get("/agent/runs/R", params={"after": 0})).text
    for body in (own, resumed):  # the live stream's end, and a reader's later: a RUN_ERROR with no id (not journaled)
        end = body.strip().split("\n\n")[-1]
        assert end.startswith("data: ") and '"code": "CANCELLED"' in end and '"RUN_ERROR"' in end
        assert "RUN_FINISHED" not in body and body.count("RUN_ERROR") == 1


@pytest.mark.parametrize("path", ["/agent/runs/{}/cancel", "/responses/{}/cancel"])
async def test_cancel_routes_answer_a_bad_id_with_400(store: Store, path: str) -> None:
    async with client(store) as web:
        for bad in ("x" * 300, "a%00b"):
            assert (await web.post(path.format(bad))).status_code == 400


# ---- the second review (helper-8) -----------------------------------------------------------------------------


async def test_a_commit_block_that_raises_after_a_cancel_ends_the_run_failed(store: Store) -> None:
    journal, committing = store.journal(), asyncio.Event()

    async def events() -> Any:
        yield {"type": "a"}
        with uncancellable():  # the commit: a cancel comes and waits; then the block raises
            committing.set()
            await until(lambda: any(run.due for run in journal.detached), "the hard cancel, held back")
            raise RuntimeError("commit failed")
        yield {"type": "never"}

    task = await start_detached(journal, "shield", user_id="u", events=events, grace_s=0.1,
                                on_error=lambda exc: {"type": "RUN_ERROR"})  # fmt: skip
    await asyncio.wait_for(committing.wait(), 60)
    assert await journal.cancel("shield", user_id="u")
    with pytest.raises(RuntimeError, match="commit failed"):
        await asyncio.wait_for(task, 30)
    events_, info = await journal.read("shield", user_id="u")
    assert (info["status"], [e.event["type"] for e in events_]) == ("failed", ["a", "RUN_ERROR"])
    assert not journal.live
    await journal.close()  # nothing left to end, and it does not raise


async def test_a_finish_cut_short_is_ended_by_close(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    real, in_flight = writer_module.send_batch, asyncio.Event()
    slow: dict[str, asyncio.Event | None] = {"until": None}  # while set: a batch waits for that event (slowly)

    async def slowed(*args: Any) -> Any:
        if (answered := slow["until"]) is not None:
            in_flight.set()
            await answered.wait()
        return await real(*args)

    monkeypatch.setattr(writer_module, "send_batch", slowed)
    journal = store.journal(batch_ms=5, lease_s=1.5)  # a heartbeat every 0.5 s
    writer = await journal.start("cut", user_id="u")
    for n in range(3):
        await writer.append({"n": n})

    async def three_written() -> bool:  # by the batch timer
        return len((await journal.read("cut", user_id="u"))[0]) == 3

    await until(three_written, "the timer's batch")
    slow["until"] = answered = asyncio.Event()
    await asyncio.wait_for(in_flight.wait(), 60)  # a heartbeat batch in flight, slowly
    ending = asyncio.create_task(writer.finish("completed"))
    await until(lambda: writer._stop.is_set(), "the end to begin")  # it waits for the heartbeat's batch
    ending.cancel()  # the request task that was ending it goes away
    await asyncio.gather(ending, return_exceptions=True)
    slow["until"] = None
    answered.set()
    await journal.close()  # ends what is left, and raises nothing
    events, info = await journal.read("cut", user_id="u")
    assert info["status"] == "incomplete" and [e.event["n"] for e in events] == [0, 1, 2]


async def test_the_end_is_sent_again_while_the_database_is_briefly_away(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, away = writer_module.send_batch, {"until": 0.0}

    async def blinking(*args: Any) -> Any:
        if asyncio.get_running_loop().time() < away["until"]:
            raise StorageUnavailableError("the database is away (a test's blip)")
        return await real(*args)

    monkeypatch.setattr(writer_module, "send_batch", blinking)
    journal = store.journal(batch_ms=5, lease_s=1.5)
    writer = await journal.start("blip", user_id="u")
    for n in range(3):
        await writer.append({"n": n})
    away["until"] = asyncio.get_running_loop().time() + 0.3
    await writer.finish("completed")  # tried again until it lands (within the lease)
    events, info = await journal.read("blip", user_id="u")
    assert info["status"] == "completed" and [e.event["n"] for e in events] == [0, 1, 2]
    await journal.close()


async def test_a_run_whose_worker_died_does_not_hold_its_thread(store: Store) -> None:
    await dead_run(store, "dead", conversation_id="thread-1")  # its worker died mid-run
    journal = store.journal()
    writer = await journal.start("next", user_id="u", kind="agui", conversation_id="thread-1")
    await writer.finish("completed")
    assert (await journal.read("dead", user_id="u"))[1]["status"] == "incomplete"
    with pytest.raises(StreamBusyError, match="exists already") as refused:
        await journal.start("next", user_id="u", kind="agui", conversation_id="thread-1")
    assert refused.value.live_stream_id is None
    await journal.close()


async def test_a_client_replaying_its_own_transcript_sees_each_message_once(store: Store) -> None:
    snapshots = StoreThreadSnapshotStore(store)
    app = FastAPI()
    runner = AgentFrameworkAgent(agent=Agent(client=OfflineChatClient(), name="A"), snapshot_store=snapshots)
    journal = add_resumable_agui_routes(app, runner, store, path="/agent", user_of=lambda request: "ann")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as web:
        async def turn(messages: list[dict[str, Any]]) -> list[str]:
            await web.post("/agent", json={"threadId": "t", "messages": messages})
            saved = await snapshots.get(scope="ann", thread_id="t")
            assert saved is not None
            return [m["content"] for m in saved.messages if m["role"] == "user"]

        assert await turn([{"id": "u1", "role": "user", "content": "first"}]) == ["first"]
        saved = await snapshots.get(scope="ann", thread_id="t")
        assert saved is not None
        second = {"id": "u2", "role": "user", "content": "second"}
        assert await turn([*saved.messages, second]) == ["first", "second"]  # the snapshot's transcript, replayed
        mine = [{"id": "u1", "role": "user", "content": "first"},  # the client's own ids, not the snapshot's
                {"id": "c-a1", "role": "assistant", "content": saved.messages[1]["content"]}, second,
                {"id": "u3", "role": "user", "content": "third"}]  # fmt: skip
        assert await turn(mine) == ["first", "second", "third"]
    await journal.close()


async def test_a_cancel_racing_the_start_is_not_answered_ended(store: Store, url: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """CI's failure (a cancel answered False for a run that had just started): the cancel's update found no row, the
    run's row was written next, and the cancel read it as there and not cancelled. Now it asks again."""
    journal = store.journal()
    async with Store.from_url(url) as other:
        canceller = other.journal()
        real = other.db.transaction
        started: list[Any] = []

        def transaction(*args: Any, **kwargs: Any) -> Any:
            opened = real(*args, **kwargs)
            if kwargs.get("doing") != "cancelling a run" or started:
                return opened

            class ThenStart:  # the run's row is written just after the cancel's first update found none
                async def __aenter__(self) -> Any:
                    return await opened.__aenter__()

                async def __aexit__(self, *exc: Any) -> Any:
                    done = await opened.__aexit__(*exc)
                    started.append(await journal.start("racing", user_id="u"))
                    return done

            return ThenStart()

        monkeypatch.setattr(other.db, "transaction", transaction)
        assert await canceller.cancel("racing", user_id="u") is True
        assert started and (await journal.read("racing", user_id="u"))[1]["status"] == "in_progress"
        await until(lambda: started[0].cancel_requested, "the run to hear the cancel")
        await started[0].finish("cancelled")
        await canceller.close()
    await journal.close()
