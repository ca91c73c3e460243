"""Writing a run's journal: its events numbered 1, 2, 3, ... and sent in batches (journal/statements.py).

The batch rule: a batch goes when it holds ``batch_events`` events, or ``batch_ms`` after its first event, or
when the run ends; with no event for ``heartbeat_s``, an empty batch renews the lease (and brings a cancel asked
elsewhere). One batch is one round trip on PostgreSQL, one transaction on SQLite.

An event stays queued until a batch holding it is known written: a batch that failed, timed out or was cancelled
is sent again, with the same numbers, by the next flush (the timer's, the heartbeat's, the next append's or the
end's), after reading back how much of it landed (a lost reply). So a number ``append`` gave is that event's for
good, and a run never ends ``completed`` without its events. The journal is not the transcript: the run's commit
stays its one transaction, and nothing here waits for it or is waited for by it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from agent_store.db import codec, sealing, tenancy
from agent_store.db.database import Database
from agent_store.db.journal_tables import STATUSES
from agent_store.errors import AgentStoreError, InvalidValueError, StorageUnavailableError, StreamLostError
from agent_store.journal.statements import row_now, send_batch

__all__ = ["StreamWriter"]
log = logging.getLogger("agent_store.journal")
QUEUED_BATCHES = 16  # an append past this many batches' events unsent waits for a batch to go (or raises)
TRIES = 3
# At most this many characters of events (JSON text) in one statement: PostgreSQL's JSONB array of a batch stops at
# 256 MiB, and a character is at most 4 bytes in UTF-8, so 32 Mi characters stay under 128 MiB. A bigger batch goes
# as several, one round trip each, in order.
BATCH_CHARS = 32 * 2**20


class Journal(Protocol):
    """What a writer reads of its journal (facade.py's ``Journal``)."""

    db: Database
    owner: str
    batch_events: int
    batch_ms: float
    lease_s: float
    ttl_s: float
    heartbeat_s: float
    max_event_bytes: int
    live: set[Any]


class StreamWriter:
    """The one writer of a streamed run's journal (``Journal.start`` makes it). ``async with`` ends it: completed;
    cancelled if a cancel was asked (or the block was cancelled); failed if the block raised."""

    def __init__(self, journal: Journal, user: str, stream_id: str) -> None:
        self.journal, self.user, self.stream_id = journal, user, stream_id
        self.last_seq = 0  # the last sequence number given out
        self.cancel_requested = False  # a cancel was asked elsewhere
        self.on_cancel: Callable[[], Any] | None = None  # called once, when a cancel is first seen
        self._sent = 0  # the last sequence number known written; _pending holds _sent + 1 .. last_seq
        self._pending: list[str] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._beat: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lost: StreamLostError | None = None
        self._ended = False

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self._ended:
            return
        if isinstance(exc, asyncio.CancelledError) or (self.cancel_requested and exc is None):
            await asyncio.shield(self.finish("cancelled"))
        elif exc is None:
            await self.finish("completed")
        else:
            await self.finish("failed", error=type(exc).__name__)

    def cancel_seen(self) -> None:
        """A cancel was asked (a batch brought it, or a NOTIFY): ``on_cancel`` is called once."""
        if self.cancel_requested or self._ended:
            return
        self.cancel_requested = True
        if self.on_cancel is not None:
            self.on_cancel()

    def start_heartbeat(self) -> None:
        self.journal.live.add(self)
        self._beat = asyncio.get_running_loop().create_task(self._heartbeat())

    @tenancy.for_its("user")
    async def append(self, event: Any) -> int:
        """Number ``event`` (a JSON document) and queue it; returns its sequence number, which is the event's for
        good. Raises (queueing nothing) when the run was ended elsewhere, or when ``QUEUED_BATCHES`` batches of
        events are waiting and the database still cannot take one."""
        if self._ended:
            raise InvalidValueError(f"stream {self.stream_id!r} has ended: no more events")
        if self._lost is not None:
            raise self._lost
        if isinstance(event, dict) and len(event) == 1 and sealing.SEALED in event:  # a sealed event's own form
            raise InvalidValueError(f"an event may not be a one-key {{{sealing.SEALED!r}: ...}} object: the store "
                                    "keeps sealed events in that form")  # fmt: skip
        text = codec.dumps(event, where=f"stream {self.stream_id!r} event", max_bytes=self.journal.max_event_bytes,
                           sort_keys=False)  # fmt: skip
        if len(self._pending) >= QUEUED_BATCHES * self.journal.batch_events:
            await self.flush()  # the database has been away: this event waits for room, or is refused
        self._pending.append(text)
        self.last_seq += 1
        if len(self._pending) >= self.journal.batch_events:
            await self._flush_or_say()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.journal.batch_ms / 1000, self._due)
        return self.last_seq

    def _due(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = None
        if self._flushing is not None and not self._flushing.done():  # a batch in flight: due again after it
            self._timer = loop.call_later(self.journal.batch_ms / 1000, self._due)
            return
        self._flushing = loop.create_task(self._flush_or_say())

    async def _flush_or_say(self) -> None:
        """A flush whose failure is logged, the events kept queued for the next one; a lost run is kept, and
        the next append or the end raises it."""
        try:
            await self.flush()
        except StreamLostError as exc:
            self._lost = exc
            self._stop.set()
        except AgentStoreError as exc:
            log.warning("stream %r: a journal batch failed (%s); its events stay queued for the next", self.stream_id,
                        exc)  # fmt: skip

    @tenancy.for_its("user")
    async def _heartbeat(self) -> None:
        failing_since: float | None = None
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self.journal.heartbeat_s)
                return
            except TimeoutError:
                pass
            sent = self._sent
            await self._flush_or_say()
            if self._sent == sent and self._pending:  # it failed: after two leases, the run is a reader's to end
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > 2 * self.journal.lease_s:
                    log.warning("stream %r: the journal has failed for two leases; its heartbeat stops", self.stream_id)
                    return
            else:
                failing_since = None

    @tenancy.for_its("user")
    async def flush(self, status: str = "in_progress", error: str | None = None) -> None:
        """Send what is queued (maybe nothing: a heartbeat) as one batch (as several if it holds over
        ``BATCH_CHARS``); ``status`` other than in_progress ends the run with the last. On return every event
        numbered before the call is written."""
        async with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while True:
                n, size = 0, 0
                while n < len(self._pending) and (n == 0 or size + len(self._pending[n]) <= BATCH_CHARS):
                    size += len(self._pending[n])
                    n += 1
                last = n == len(self._pending)
                await self._send(n, status if last else "in_progress", error if last else None)
                if last:
                    return

    async def _send(self, n: int, status: str, error: str | None) -> None:
        """One batch: the first ``n`` queued events, sent until known written (a lost reply: read back)."""
        end = self._sent + n
        for attempt in range(1, TRIES + 2):
            n = end - self._sent  # what of it has not landed yet (an earlier try's part may have)
            try:
                found = await send_batch(self.journal.db, self._params(n, status, error), self._pending[:n])
            except StorageUnavailableError:
                if attempt >= TRIES:
                    raise
                await asyncio.sleep(0.05 * attempt)
            else:
                if found is not None:  # landed whole
                    self._written(n)
                    if found:
                        self.cancel_seen()
                    return
            if await self._reconciled(n, status):  # no match, or no reply: the row says how much landed
                return
        raise StreamLostError(f"stream {self.stream_id!r}: its batches did not land after {TRIES} tries")

    def _params(self, n: int, status: str, error: str | None) -> dict[str, Any]:
        journal, now, final = self.journal, datetime.now(UTC), status != "in_progress"
        return {"user": self.user, "sid": self.stream_id, "owner": journal.owner, "prev": self._sent,
                "last": self._sent + n, "status": status, "error": error,
                "next_owner": None if final else journal.owner,
                "lease": None if final else now + timedelta(seconds=journal.lease_s), "now": now,
                "expires": now + timedelta(seconds=journal.ttl_s)}  # fmt: skip

    def _written(self, n: int) -> None:
        del self._pending[:n]
        self._sent += n

    async def _reconciled(self, n: int, status: str) -> bool:
        """After a batch of ``n`` whose outcome is unknown or which did not match: count what of it landed (an
        earlier try's), and whether all is done (the events, and the final status if this was the end)."""
        row = await row_now(self.journal.db, self.user, self.stream_id)
        if row is not None and status != "in_progress" and (row.status, row.owner) == (status, None):
            if row.last_seq == self._sent + n:  # the end landed, its reply did not
                self._written(n)
                return True
        if row is None or row.status != "in_progress" or row.owner != self.journal.owner \
                or not self._sent <= row.last_seq <= self._sent + n:  # fmt: skip
            raise StreamLostError(f"stream {self.stream_id!r} is no longer this writer's (its lease ran out and it "
                                  "was marked incomplete, or it was ended or erased): nothing more was written")
        before = self._sent
        self._written(row.last_seq - before)  # an earlier try's batch (or its start) is there
        return status == "in_progress" and row.last_seq == before + n  # else the rest (and the end) go again

    async def _final_flush(self, status: str, error: str | None) -> None:
        """The end, sent again while the database is away, for as long as the lease would have held: the run
        stays this writer's until then (a reader ends it ``incomplete`` after)."""
        give_up = time.monotonic() + self.journal.lease_s
        pause = 0.05
        while True:
            try:
                await self.flush(status, error)
                return
            except StorageUnavailableError:
                if time.monotonic() + pause > give_up:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    @tenancy.for_its("user")
    async def finish(self, status: str = "completed", *, error: str | None = None) -> None:
        """Send the rest and end the run with ``status`` (completed, failed, cancelled, incomplete)."""
        if status not in STATUSES or status == "in_progress":
            raise InvalidValueError(f"a run ends {', '.join(STATUSES[1:])}, not {status!r}")
        if self._ended:
            return
        self._stop.set()
        try:
            for task in (self._beat, self._flushing):  # a beat or a timer's batch in flight ends first, never cut
                if task is not None and not task.done():
                    await asyncio.shield(task)  # (this finish cancelled: the batch goes on; a next finish waits)
            if self._lost is not None:
                raise self._lost
            await self._final_flush(status, error)
        except StreamLostError:
            self._ended = True  # the run is no longer this writer's: nothing more to send
            self.journal.live.discard(self)
            raise
        # Cut short (cancelled, or the database away): not ended, so the next finish (a shielded retry, or the
        # journal's close) sends the rest and the end; else the lease runs out and a reader ends it incomplete.
        self._ended = True
        self.journal.live.discard(self)
