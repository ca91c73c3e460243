"""When what a write carries was read: the basis of the erasure fence for seams that read and write apart.

A run loaded by the store knows when it read (commit.py). The framework's other seams read with one call and
write with another, with only a key in common: ``SessionStore.get`` then ``set``, an AG-UI snapshot's ``get``
then one or more ``save``s, a history provider's per-service-call saves. Between them, ``erase_user`` may
run; a write that carries what was read before it must then be refused (``retention.erased_since``).

A write cannot say which read it follows: two requests on one key (a retry, a second tab, the user coming
back) are told apart by nothing. So :class:`ReadTimes` dates every write of a key from the earliest read of
it on record, and a write never uses a read up (a refused write would otherwise free another request's older
read, and an accepted one leave a later save of the same request undated). The cost is strictness: after an
erasure, a key read before it stays refused in this process until that read is older than the fences kept
(``db.erasures.FENCE_KEPT``, 7 days), while a key first read after it is not. Bounded: per key, the earliest
reads only; the oldest keys are forgotten first, and a write with no read on record dates from
:data:`UNKNOWN`, before every erasure still on record.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from datetime import UTC, datetime

from agent_store.db.erasures import FENCE_KEPT

__all__ = ["UNKNOWN", "ReadTimes"]

UNKNOWN = datetime(2000, 1, 1, tzinfo=UTC)  # before any erasure on record: every one of them fences
PER_KEY = 8  # reads kept per key: the earliest (a later one never dates a write earlier)


class ReadTimes:
    """Per key, the earliest reads within ``FENCE_KEPT`` (an older read is past every fence on record)."""

    def __init__(self, keep: int = 10_000) -> None:
        self._keep = keep
        self._reads: OrderedDict[Hashable, list[datetime]] = OrderedDict()

    def read(self, key: Hashable, at: datetime) -> None:
        reads = self._current(key)
        if len(reads) < PER_KEY:
            reads.append(at)
        self._reads[key] = reads
        self._reads.move_to_end(key)
        while len(self._reads) > self._keep:
            self._reads.popitem(last=False)

    def earliest(self, key: Hashable) -> datetime | None:
        """When ``key`` was first read, of the reads on record; None if none is."""
        reads = self._current(key)
        return min(reads) if reads else None

    def _current(self, key: Hashable) -> list[datetime]:
        horizon = datetime.now(UTC) - FENCE_KEPT
        return [at for at in self._reads.get(key, ()) if at >= horizon]
