"""The usage ledger for operators: reports by user, agent, model or day; budgets; prices (``store.usage``).

Reports read ``agent_usage`` over a period (``called_at`` index range; default: the last 30 days) and join the
operator's ``agent_usage_prices``: a line's cost is given only when every call in it has a price.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import String, case, delete, func, literal_column, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import codec, ledger, tenancy
from agent_store.db.database import Database
from agent_store.db.tables import sessions_t
from agent_store.db.usage_tables import budgets_t, prices_t, usage_t
from agent_store.errors import InvalidValueError
from agent_store.models import BudgetInfo, UsageLine

BY = ("user", "agent", "model", "day", "session")
PERIODS = ("day", "month", "total")
DEFAULT_SPAN = timedelta(days=30)
PRICE_MAX = 1e9  # per million tokens: any real price is far below; inf and NaN are refused
U, P, B = usage_t.c, prices_t.c, budgets_t.c
__all__ = ["BY", "PERIODS", "UsageLedger", "report_statement"]


def _key(by: str, dialect: str) -> Any:
    if by == "day":  # the UTC date, as text
        if dialect == "postgresql":
            return func.to_char(func.timezone("UTC", U.called_at), "YYYY-MM-DD")
        return func.substr(U.called_at, 1, 10)
    if by == "session" and dialect == "sqlite":
        # Unary +: not the primary key's column to SQLite, which would rather walk that whole index (grouped, no
        # sort) than read the period's range of called_at.
        return literal_column("+agent_usage.session_id", String)
    return {"user": U.user_id, "agent": U.agent_name, "model": U.model, "session": U.session_id}[by]


def report_statement(by: str, dialect: str, *, since: datetime, until: datetime | None, user_id: str | None) -> Any:
    """The report's statement (tests EXPLAIN it): one line per key, the most tokens first."""
    if by not in BY:
        raise InvalidValueError(f"usage --by must be one of {', '.join(BY)}, not {by!r}")
    key = _key(by, dialect).label("key")
    total = func.coalesce(U.total_tokens, func.coalesce(U.input_tokens, 0) + func.coalesce(U.output_tokens, 0))
    cached = func.coalesce(U.cache_read_input_tokens, 0)
    cost = (
        (func.coalesce(U.input_tokens, 0) - cached) * P.input_per_million
        + cached * func.coalesce(P.cached_input_per_million, P.input_per_million)
        + func.coalesce(U.output_tokens, 0) * P.output_per_million
    ) / 1_000_000.0
    query = (
        select(
            key,
            func.count().label("calls"),
            func.sum(U.input_tokens).label("input_tokens"),
            func.sum(U.output_tokens).label("output_tokens"),
            func.sum(total).label("total_tokens"),
            func.sum(U.cache_read_input_tokens).label("cache_read_input_tokens"),
            func.sum(U.reasoning_output_tokens).label("reasoning_output_tokens"),
            case((func.count(P.model) == func.count(), func.sum(cost))).label("cost"),
        )
        .select_from(usage_t.outerjoin(prices_t, P.model == U.model))
        .where(U.called_at >= since)
        .group_by(key)
        .order_by(func.sum(total).desc(), key)
    )
    if until is not None:
        query = query.where(U.called_at < until)
    if user_id is not None:
        # The user's sessions (their user index), then their calls (the ledger key's prefix): a call's user is
        # its session's, and the ledger keeps no user index of its own (0015).
        sessions = select(sessions_t.c.id).where(sessions_t.c.user_id == user_id)
        query = query.where(U.session_id.in_(sessions), U.user_id == user_id)
    return query


def _spent(scope: str, subject: str, start: datetime) -> Any:
    """The tokens a budget would have been charged for the calls in the ledger from ``start`` (as a commit
    charges them: the total, else input plus output); a user's through their sessions (the user index)."""
    tokens = func.coalesce(U.total_tokens, func.coalesce(U.input_tokens, 0) + func.coalesce(U.output_tokens, 0))
    query = select(func.coalesce(func.sum(tokens), 0)).where(U.called_at >= start)
    if scope == "user":
        return query.where(U.session_id.in_(select(sessions_t.c.id).where(sessions_t.c.user_id == subject)),
                           U.user_id == subject)  # fmt: skip
    return query.where(U.app_id == subject)


class UsageLedger:
    """``store.usage``: what the ledger says, and the budgets and prices an operator sets."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @tenancy.for_user  # None: every user's lines, an operator's report under row-level security
    async def report(
        self, by: str = "user", *, since: datetime | None = None, until: datetime | None = None,
        user_id: str | None = None,
    ) -> list[UsageLine]:  # fmt: skip
        """Tokens (and cost, where priced) per ``by`` ("user", "agent", "model", "day", "session") for calls made
        from ``since`` (default: 30 days ago) until ``until``, optionally of one user."""
        codec.check_id(user_id, "user_id")
        since = _aware(since, "since") or datetime.now(UTC) - DEFAULT_SPAN
        query = report_statement(by, self.db.dialect, since=since, until=_aware(until, "until"), user_id=user_id)
        async with self.db.transaction(write=False, replica=True, doing="reporting usage") as conn:
            rows = (await conn.execute(query)).all()
        return [UsageLine(**{k: v for k, v in row._mapping.items()}) for row in rows]

    @tenancy.for_user
    async def set_budget(self, tokens: int, *, period: str = "day", user_id: str | None = None) -> BudgetInfo:
        """Limit the tokens of ``user_id`` (None: the whole app) per ``period`` ("day", "month" in UTC, "total").

        A run that would start with the period's use at or over the limit is refused at load
        (:class:`BudgetExceededError`). A new budget, or a new period, starts from what the ledger holds of the
        current period (a budget set at noon counts the morning's calls); changing only the limit keeps the use.
        """
        codec.check_int(tokens, "tokens", low=0, high=codec.INT64)
        if period not in PERIODS:
            raise InvalidValueError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
        scope, subject = self._owner(user_id)
        start = ledger.period_starts(datetime.now(UTC))[period if period in ("day", "month") else "ever"]
        async with self.db.transaction(write=True, doing="setting a budget") as conn:
            spent = min(int((await conn.execute(_spent(scope, subject, start))).scalar_one()), ledger.CHARGE_MAX)
            values = {"scope": scope, "subject": subject, "period": period, "token_limit": tokens, "used": spent,
                      "period_start": start}  # fmt: skip
            insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(budgets_t).values(values)
            same = B.period == insert.excluded.period
            await conn.execute(insert.on_conflict_do_update(
                index_elements=[B.subject, B.scope],
                set_={"token_limit": insert.excluded.token_limit, "period": insert.excluded.period,
                      "used": case((same, B.used), else_=insert.excluded.used),
                      "period_start": case((same, B.period_start), else_=insert.excluded.period_start),
                      "crossed_by_run": None, "crossed_at": None},
            ))  # fmt: skip
            return await self._read(conn, scope, subject)  # type: ignore[return-value]

    @tenancy.for_user
    async def budget(self, user_id: str | None = None) -> BudgetInfo | None:
        """The budget of ``user_id`` (None: the app's), with its use in the current period; None if it has none."""
        scope, subject = self._owner(user_id)
        async with self.db.transaction(write=False, doing="reading a budget") as conn:
            return await self._read(conn, scope, subject)

    @tenancy.for_user
    async def remove_budget(self, user_id: str | None = None) -> bool:
        scope, subject = self._owner(user_id)
        async with self.db.transaction(write=True, doing="removing a budget") as conn:
            gone = await conn.execute(delete(budgets_t).where(B.scope == scope, B.subject == subject))
        return bool(gone.rowcount)

    async def set_price(
        self, model: str, *, input_per_million: float, output_per_million: float,
        cached_input_per_million: float | None = None,
    ) -> None:  # fmt: skip
        """What one model's tokens cost the operator (per million); the reports and ``agent_usage_daily`` use it."""
        codec.check_id(model, "model", required=True)
        prices = {"input_per_million": input_per_million, "output_per_million": output_per_million,
                  "cached_input_per_million": cached_input_per_million}  # fmt: skip
        for name, value in prices.items():
            if value is None and name == "cached_input_per_million":  # None: the input price
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= PRICE_MAX:  # NaN too
                raise InvalidValueError(f"{name} must be a number from 0 to {PRICE_MAX:g}, not {value!r}")
        async with self.db.transaction(write=True, doing="setting a price") as conn:
            insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(prices_t)
            insert = insert.values(model=model, **prices)
            await conn.execute(insert.on_conflict_do_update(index_elements=[P.model], set_=prices))

    def _owner(self, user_id: str | None) -> tuple[str, str]:
        codec.check_id(user_id, "user_id")
        return ("user", user_id) if user_id is not None else ("app", self.db.settings.app_id)

    async def _read(self, conn: AsyncConnection, scope: str, subject: str) -> BudgetInfo | None:
        row = (await conn.execute(select(budgets_t).where(B.scope == scope, B.subject == subject))).first()
        if row is None:
            return None
        start = ledger.period_starts(datetime.now(UTC))[row.period if row.period in ("day", "month") else "ever"]
        used = int(row.used) if row.period_start == start else 0
        return BudgetInfo(
            scope="user" if scope == "user" else "app", subject=subject, period=row.period,
            token_limit=int(row.token_limit), used=used, period_start=start,
            crossed_by_run=row.crossed_by_run if used else None, crossed_at=row.crossed_at if used else None,
        )  # fmt: skip


def _aware(value: datetime | None, name: str) -> datetime | None:
    if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
        raise InvalidValueError(f"{name} must be a timezone-aware datetime, not {value!r}")
    return value
