"""The usage ledger's rows: a model call as the store records it, the run log's totals, budgets' periods.

A :class:`ModelCall` is made where the framework hands out usage (the store's chat middleware, a response's
total); a commit writes its run's calls as ``agent_usage`` rows in the run's own transaction (commit.py's three
paths: PostgreSQL's one call, SQLite's one hop, the checked path) and charges their tokens to the budgets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.column_types import UTCDateTime
from agent_store.db.usage_tables import usage_t
from agent_store.errors import BudgetExceededError

# UsageDetails' named counts, and the column each is kept in; any other int count goes to ``extra``.
COUNTS = {
    "input_token_count": "input_tokens",
    "output_token_count": "output_tokens",
    "total_token_count": "total_tokens",
    "cache_creation_input_token_count": "cache_creation_input_tokens",
    "cache_read_input_token_count": "cache_read_input_tokens",
    "reasoning_output_token_count": "reasoning_output_tokens",
}
PURPOSES = ("chat", "compaction", "response")
EVER = datetime(1970, 1, 1, tzinfo=UTC)  # the one period of a "total" budget begins here


COUNT_MAX = 2**40  # a count the columns keep: a trillion tokens; beyond it (or below 0) a provider's figure is odd
CHARGE_MAX = 2**50  # one commit's charge to a budget at most (a budget's use stays far inside a bigint)
RUN_LOG_MAX = 2**31 - 1  # the run log's token columns are 32-bit
LABEL_MAX = 255  # a model id, provider, agent name or finish reason: metadata, kept to this many characters


def is_count(value: Any) -> bool:
    # As the framework's add_usage_details: only ints are counts (a bool is not one).
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> int | None:
    """A count the columns keep; another int (negative, or absurdly large) is kept in ``extra`` instead, so a
    provider's odd figure never fails the commit of the run it came with."""
    return value if is_count(value) and 0 <= value < COUNT_MAX else None


def _json_int(value: int) -> int | str:
    if -(2**63) <= value < 2**63:
        return value
    if value.bit_length() > 330:  # more than 100 digits: not written out (Python refuses past 4,300 digits)
        return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"
    return str(value)


def _label(value: str | None) -> str | None:
    """Metadata text as the columns keep it: no NUL (PostgreSQL refuses it) and no lone surrogate (UTF-8 cannot
    hold one), at most LABEL_MAX characters."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return value if len(value) <= LABEL_MAX else value[: LABEL_MAX - 1] + "\u2026"


@dataclass(frozen=True)
class ModelCall:
    """One model call's usage, as the framework reported it, and what the ledger keeps beside it."""

    called_at: datetime
    usage: Mapping[str, Any]  # a UsageDetails
    purpose: str = "chat"
    model: str | None = None
    provider: str | None = None
    agent_name: str | None = None
    latency_ms: float | None = None
    finish_reason: str | None = None
    streamed: bool = False
    trace_id: str | None = None
    span_id: str | None = None

    def counts(self) -> dict[str, int | None]:
        return {column: _count(self.usage.get(key)) for key, column in COUNTS.items()}

    def extra(self) -> str | None:
        """The provider's other counts, as the JSON text the ``extra`` column binds (None: there are none). An int
        outside the 64-bit range is kept as its decimal text (JSON readers would not hold it as a number)."""
        kept = {
            _label(str(k)): _json_int(v)
            for k, v in self.usage.items()
            if is_count(v) and (k not in COUNTS or _count(v) is None)
        }
        return json.dumps(kept, sort_keys=True, ensure_ascii=False) if kept else None

    @property
    def tokens(self) -> int:
        """What a budget counts: the total the provider reported, else input plus output."""
        counts = self.counts()
        total = counts["total_tokens"]
        return total if total is not None else (counts["input_tokens"] or 0) + (counts["output_tokens"] or 0)


def totals(calls: Sequence[ModelCall]) -> dict[str, int]:
    """The run log's input and output counts: the sums of its calls' (absent when no call reported one, or when
    the sum is too large for the run log's columns: the ledger has the calls)."""
    summed: dict[str, int] = {}
    for call in calls:
        for key in ("input_token_count", "output_token_count"):
            if (value := _count(call.usage.get(key))) is not None:
                summed[key] = summed.get(key, 0) + value
    return {key: value for key, value in summed.items() if value <= RUN_LOG_MAX}


def call_rows(calls: Sequence[ModelCall], agent_id: str | None) -> list[dict[str, Any]]:
    """The calls' columns, ``call_no`` from 1 (a run's and user's ids are the commit's to add)."""
    return [
        {
            "call_no": n, "agent_name": _label(call.agent_name or agent_id), "called_at": call.called_at,
            "purpose": call.purpose, "model": _label(call.model), "provider": _label(call.provider), **call.counts(),
            "extra": call.extra(), "latency_ms": call.latency_ms, "finish_reason": _label(call.finish_reason),
            "streamed": call.streamed, "trace_id": call.trace_id, "span_id": call.span_id,
        }
        for n, call in enumerate(calls, 1)
    ]  # fmt: skip


def period_starts(now: datetime) -> dict[str, datetime]:
    """Where each kind of budget period that contains ``now`` began (UTC)."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return {"day": day, "month": day.replace(day=1), "ever": EVER}


def refuse_if_spent(budgets: Sequence[Any], now: datetime) -> None:
    """Raise :class:`BudgetExceededError` if a budget's use in the current period has reached its limit.

    ``budgets``: the load's BUDGET rows (key: scope, author: subject, other: period, n1: limit, n2: used,
    t1: period start).
    """
    starts = period_starts(now)
    for row in budgets:
        start = starts[row.other if row.other in ("day", "month") else "ever"]
        used = row.n2 if row.t1 == start else 0  # nothing charged yet in this period: none used (a limit of 0 refuses)
        if used >= row.n1:
            resets = start + timedelta(days=1) if row.other == "day" else None
            if row.other == "month":
                resets = (start + timedelta(days=32)).replace(day=1)
            raise BudgetExceededError(row.key, row.author, int(used), int(row.n1), resets)


# The charge of one commit to one budget row (the checked path and SQLite; PostgreSQL's one call has the same
# statement in agent_store_commit_usage, migration 0014). A new period starts from zero; the first commit to
# reach the limit in a period is kept, and later ones do not replace it. ``used`` stops growing at 2^62 and a
# charge is at most CHARGE_MAX: no sum here leaves a bigint.
CHARGE = """UPDATE agent_usage_budgets SET
    used = CASE WHEN used >= 4611686018427387904 THEN used
        ELSE CASE WHEN period_start = CASE period WHEN 'day' THEN :day WHEN 'month' THEN :month ELSE :ever END
        THEN used ELSE 0 END + :tokens END,
    crossed_by_run = CASE
        WHEN period_start = CASE period WHEN 'day' THEN :day WHEN 'month' THEN :month ELSE :ever END
            AND used >= token_limit THEN crossed_by_run
        WHEN CASE WHEN period_start = CASE period WHEN 'day' THEN :day WHEN 'month' THEN :month ELSE :ever END
            THEN used ELSE 0 END + :tokens >= token_limit THEN :run_id END,
    crossed_at = CASE
        WHEN period_start = CASE period WHEN 'day' THEN :day WHEN 'month' THEN :month ELSE :ever END
            AND used >= token_limit THEN crossed_at
        WHEN CASE WHEN period_start = CASE period WHEN 'day' THEN :day WHEN 'month' THEN :month ELSE :ever END
            THEN used ELSE 0 END + :tokens >= token_limit THEN :now END,
    period_start = CASE period WHEN 'day' THEN :day WHEN 'month' THEN :month ELSE :ever END
WHERE scope = :scope AND subject = :subject"""
_CHARGE = text(CHARGE).bindparams(*(bindparam(n, type_=UTCDateTime()) for n in ("day", "month", "ever", "now")))


def charges(tokens: int, run_id: str, user_id: str | None, app_id: str, now: datetime) -> list[dict[str, Any]]:
    """The CHARGE parameters for one commit: the user's budget, then the app's (the one lock order)."""
    if not tokens:
        return []
    base = {"tokens": min(tokens, CHARGE_MAX), "run_id": run_id, "now": now, **period_starts(now)}
    owners = ([("user", user_id)] if user_id is not None else []) + [("app", app_id)]
    return [{**base, "scope": scope, "subject": subject} for scope, subject in owners]


async def record(
    db: AsyncConnection, ids: Mapping[str, Any], calls: Sequence[ModelCall], *, user_id: str | None,
    agent_id: str | None, app_id: str, now: datetime,
) -> None:  # fmt: skip
    """Write a run's calls and charge their tokens, in the caller's transaction (the checked path)."""
    if not calls:
        return
    owner = {"session_id": ids["session_id"], "run_id": ids["run_id"], "user_id": user_id, "app_id": app_id}
    await db.execute(insert(usage_t), [{**owner, **row} for row in call_rows(calls, agent_id)])
    await charge(db, calls, ids["run_id"], user_id=user_id, app_id=app_id, now=now)


async def charge(
    db: AsyncConnection, calls: Sequence[ModelCall], run_id: str, *, user_id: str | None, app_id: str, now: datetime
) -> None:
    """Charge the calls' tokens to the user's and the app's budgets, in the caller's transaction."""
    for params in charges(sum(c.tokens for c in calls), run_id, user_id, app_id, now):
        await db.execute(_CHARGE, params)
