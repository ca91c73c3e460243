"""Where messages go in the framework's list order when a compaction inserts some in the middle (pure).

A stored message's place is ``coalesce(pos, seq << 32)`` (migration 0013): in commit order unless placed. A
summary inserted between two stored messages takes a place between theirs; each message keeps its place unless
the list moved it. Places are spread over the gap (2^32 between two committed in a row); a gap that is used up
(dozens of summaries inserted at one spot) takes in the next stored message, which moves with the inserted ones,
and so on: the fewest rows that keep every message in list order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent_store.errors import InvalidValueError

__all__ = ["Order", "assign", "order_of", "spread"]

# The list from the first message that needs a place: (store id, its stored place, or None: needs one).
Order = list[tuple[str, int | None]]


def order_of(ids: Sequence[str], stored: Mapping[str, int]) -> tuple[Order, int]:
    """The list as (id, place it keeps or None), and how many messages at its end are simply appended.

    A stored message keeps its place while places rise along the list; a new message, or a stored one the list
    moved, needs one. New messages after the last stored one are appended: they take the place of their seq.
    """
    order: Order = []
    last = None
    for identity in ids:
        place = stored.get(identity)
        if place is not None and (last is None or place > last):
            order.append((identity, place))
            last = place
        else:
            order.append((identity, None))
    appended = 0
    for identity, _ in reversed(order):
        if identity in stored:
            break
        appended += 1
    return order[: len(order) - appended], appended


SPACING = 2**20  # between places given together, at most: a gap of 2^32 takes 4,096 summaries inserted one by one


def spread(lo: int, hi: int, n: int) -> list[int] | None:
    """``n`` places strictly between ``lo`` and ``hi``, right below ``hi``, at most ``SPACING`` apart (evenly over
    the gap when it is smaller); None if there is no room.

    Right below hi, not mid-gap: a summarizer inserts each new summary before the last one (after a system
    message, say), so each takes a step of the gap below instead of halving it (dozens, not thousands, then).
    """
    room = hi - lo
    if room <= n:
        return None
    step = min(room // (n + 1), SPACING)
    return [hi - step * (n - i) for i in range(n)]


def assign(order: Order, lows: Mapping[int, int], *, first_low: int, end: int) -> dict[str, int]:
    """New places for the messages of ``order`` that need one (and for stored ones that must make room).

    A run of messages needing places goes between the stored messages around it in ``order``. Where the load
    skipped stored messages (a window, or only the included ones), ``lows`` maps the place of the stored
    message after a run to its stored predecessor's (read in the commit's transaction), and the run goes above
    that. ``first_low``: the place below a run at the very start; ``end``: the place above a run at the end
    (the next seq's place: what the commit appends goes after it).
    """
    placed: dict[str, int] = {}
    lo, i = first_low, 0
    while i < len(order):
        place = order[i][1]
        if place is not None:
            lo, i = place, i + 1
            continue
        run: list[str] = []
        j, floor = i, None
        while True:  # the run, then as many stored messages after it as it takes to make room
            while j < len(order) and order[j][1] is None:
                run.append(order[j][0])
                j += 1
            hi = order[j][1] if j < len(order) else end
            assert hi is not None
            # Above the stored predecessor of what the run precedes when the load skipped some messages (a summary
            # goes right before what it precedes, as in the framework's list); the run keeps that floor when it
            # takes in the stored messages after it.
            floor = max(lo, lows.get(hi, lo)) if floor is None else floor
            if (places := spread(floor, hi, len(run))) is not None:
                placed.update(zip(run, places, strict=True))
                break
            if j >= len(order):
                raise InvalidValueError("no room left to place the compacted history's messages in order")
            run.append(order[j][0])  # it moves with the run
            j += 1
        lo, i = placed[run[-1]], j
    return placed
