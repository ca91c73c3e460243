"""A new session's first commit whose reply is lost on the wire, while the server still holds it (issue 37, item 3).

The proxy forwards the one-round-trip call that creates the session and cuts the client at once; the server is
held (another connection holds the user's lock) and finishes the call only after the client's retry has reached
it. Only an answer from the server proves that nothing landed: the run must come out committed exactly once, never
as a ConflictError against its own first attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from agent_framework import Message
from helpers import lock_waits, lose_the_reply, raw_connect, rows, until
from lost_reply_proxy import LostReplyProxy
from sqlalchemy.engine import make_url

from agent_store import ConflictError, StorageUnavailableError, Store
from agent_store.db.database import USER_LOCK
from agent_store.errors import AgentStoreError

HOLDS = {
    # before the creation: the user's lock, taken exclusively, as erase_user takes it (for a transaction: a
    # session's lock would stay on whichever server connection a pooler such as PgBouncer lent that statement)
    "before": (f"BEGIN; SELECT pg_advisory_xact_lock({USER_LOCK}, hashtext('u'))", "COMMIT"),
    # after it, before COMMIT: the run log's insert waits (a plain read of the table does not)
    "after": ("BEGIN; LOCK TABLE agent_runs IN SHARE MODE", "COMMIT"),
}


@pytest.mark.parametrize(("hold", "user"), [("before", "u"), ("after", "u"), ("after", None)])
@pytest.mark.parametrize("hold_seconds", [0, 1.5])  # how much longer the server holds it once both wait
async def test_a_new_sessions_commit_cut_while_the_server_holds_it_lands_once(
    pg_url: str, hold: str, user: str | None, hold_seconds: float
) -> None:
    proxy = LostReplyProxy("127.0.0.1", make_url(pg_url).port or 5432)
    port = await proxy.start()
    admin = await raw_connect(pg_url)
    try:
        async with Store.from_url(pg_url.replace(f":{make_url(pg_url).port}/", f":{port}/")) as store:
            await store.migrate()
            run = await store.load("new", user_id=user)
            run.history.extend(Message(role="user", contents=[f"m{i}"]) for i in range(2))
            run.session.state["n"] = 1
            # The server holds the creation (HOLDS) while the client's retry reaches it.
            take, release = HOLDS[hold]
            await admin.execute(take)
            proxy.cut_client_at_commit()
            async with lock_waits(pg_url) as waiting:  # (admin may be in a transaction: it sees a snapshot)
                attempt = asyncio.ensure_future(run.commit())

                async def both_wait() -> bool:  # the attempt waits for the hold; the client's retry reached it too
                    return attempt.done() or await waiting() >= 2

                await until(both_wait, "the attempt and its retry to wait for the hold")
                await asyncio.sleep(hold_seconds)  # (the server holds them longer: a wait for the clock alone)
            await admin.execute(release)
            errors: list[AgentStoreError] = []
            try:
                result = await attempt
            except AgentStoreError as exc:  # the outcome may still be unknown: then it must say retry
                errors.append(exc)
                result = None
            for _ in range(20):  # an app's retry loop on what the store calls retryable
                if result is not None:
                    break
                assert isinstance(errors[-1], StorageUnavailableError) and errors[-1].retryable, repr(errors[-1])
                await asyncio.sleep(0.2)
                try:
                    result = await run.commit()
                except AgentStoreError as exc:
                    errors.append(exc)
            assert result is not None, [repr(e) for e in errors]
            assert proxy.drops == 1  # the first attempt was cut, its reply swallowed
            assert (result.version, result.messages_written, result.state_keys_written) == (1, 2, 1)
            assert await rows(store, "SELECT version, next_seq FROM agent_sessions") == [(1, 2)]
            assert await rows(store, "SELECT count(*) FROM agent_runs WHERE outcome = 'committed'") == [(1,)]
            assert await rows(store, "SELECT count(*) FROM agent_runs WHERE outcome <> 'committed'") == [(0,)]
            run.session.state["n"] = 2  # the run goes on in the session it created
            assert (await run.commit()).version == 2
    finally:
        await admin.close()
        await proxy.stop()


@pytest.mark.parametrize("user", ["u", None])
async def test_a_retry_never_writes_into_a_session_created_again_by_another_run(url: str, user: str | None) -> None:
    """The first commit lands, its reply and the store's own retry are lost; the session is deleted and another run
    creates it again. The retry cannot tell "never landed" from "landed and deleted since": ConflictError, nothing
    written into the other run's session."""
    async with Store.from_url(url) as store:
        await store.migrate()
        run = await store.load("new", user_id=user)
        run.history.extend(Message(role="user", contents=[f"first-run m{i}"]) for i in range(2))
        lose_the_reply(store)
        real = store.db.transaction

        @asynccontextmanager
        async def lost_once(**_: Any) -> AsyncIterator[Any]:
            store.db.transaction = real  # type: ignore[method-assign]
            lost = StorageUnavailableError("committing a run failed: connection lost")
            lost.connection_lost = True
            raise lost
            yield

        store.db.transaction = lost_once  # type: ignore[method-assign]
        with pytest.raises(StorageUnavailableError):
            await run.commit()
        store.db.transaction = real  # type: ignore[method-assign]
        assert await store.delete("new", user_id=user)
        async with store.session("new", user_id=user) as other:
            other.state.setdefault("in_memory", {}).setdefault("messages", []).append(
                Message(role="user", contents=["another conversation"])
            )
        with pytest.raises(ConflictError, match="made by another run"):
            await run.commit()
        assert [m.text for m in await store.messages("new", user_id=user)] == ["another conversation"]
