"""When what a write carries was read: the basis of the erasure fence for seams that read and write apart.

A run loaded by the store knows when it read (run.py). The framework's other seams read with one call and
write with another, with only a key in common: ``SessionStore.get`` then ``set``, an AG-UI snapshot's ``get``
then ``save``, a workflow's checkpoint ``load`` then ``save``. Between them, ``erase_user`` may run; a write
that carries what was read before it must then be refused (``retention.erased_since``).

:class:`ReadTimes` remembers, per key, the reads not yet followed by a write, and hands a write the earliest
of them: two requests that read the same key (a retry, a second tab) each get a time no later than their own
read, so a fence is never dated after what it guards. Bounded: the oldest keys are forgotten first, and a write
with no read on record dates from :data:`UNKNOWN`, before every erasure still on record.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from datetime import UTC, datetime

__all__ = ["UNKNOWN", "ReadTimes"]

UNKNOWN = datetime(2000, 1, 1, tzinfo=UTC)  # before any erasure on record: every one of them fences


class ReadTimes:
    """Per key, the times of reads not yet followed by a write (earliest first)."""

    def __init__(self, keep: int = 10_000) -> None:
        self._keep = keep
        self._reads: OrderedDict[Hashable, list[datetime]] = OrderedDict()

    def read(self, key: Hashable, at: datetime) -> None:
        self._reads.setdefault(key, []).append(at)
        self._reads.move_to_end(key)
        while len(self._reads) > self._keep:
            self._reads.popitem(last=False)

    def earliest(self, key: Hashable) -> datetime | None:
        """When the oldest read of ``key`` not yet written back happened; None if none is on record."""
        reads = self._reads.get(key)
        return reads[0] if reads else None

    def written(self, key: Hashable) -> None:
        """A write of ``key`` ended (stored, or refused for good): its read is used up, the oldest first."""
        reads = self._reads.get(key)
        if reads:
            reads.pop(0)
            if not reads:
                del self._reads[key]
