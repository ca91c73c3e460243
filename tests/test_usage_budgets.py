"""Token budgets (issue 27): a spent budget refuses the next run at load; the database orders the last allowance."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from helpers import doc_block, rows
from sqlalchemy import text

from agent_store import BudgetExceededError, InvalidValueError, Store
from agent_store.db.ledger import period_starts

SPEND = {"input_token_count": 30, "output_token_count": 10}  # 40 tokens a run


async def spend(store: Store, session_id: str, user_id: str | None = "u", usage: dict[str, int] = SPEND) -> str:
    run = await store.load(session_id, user_id=user_id)
    run.session.state["turns"] = run.session.state.get("turns", 0) + 1
    run.add_usage(usage)
    return (await run.commit()).run_id


async def move_period_back(store: Store) -> None:
    """The budget's period began yesterday (a day has passed since its last charge)."""
    yesterday = period_starts(datetime.now(UTC))["day"] - timedelta(days=1)
    async with store.engine.begin() as conn:
        value = yesterday.replace(tzinfo=None) if conn.dialect.name == "sqlite" else yesterday
        await conn.execute(text("UPDATE agent_usage_budgets SET period_start = :t"), {"t": value})


async def test_the_commit_that_crosses_is_recorded_and_the_next_run_is_refused(store: Store) -> None:
    await store.usage.set_budget(100, period="day", user_id="u")
    await spend(store, "a")
    await spend(store, "a")
    crossing = await spend(store, "b")  # 80 used: allowed to start; it ends at 120
    info = await store.usage.budget("u")
    assert info is not None and (info.used, info.exceeded, info.crossed_by_run) == (120, True, crossing)
    messages_before = await rows(store, "SELECT count(*) FROM agent_runs")
    with pytest.raises(BudgetExceededError) as refused:
        async with store.session("c", user_id="u") as session:
            session.state["never"] = True
    assert (refused.value.scope, refused.value.subject, refused.value.used, refused.value.limit) == (
        "user",
        "u",
        120,
        100,
    )
    assert refused.value.resets_at == period_starts(datetime.now(UTC))["day"] + timedelta(days=1)
    assert await rows(store, "SELECT count(*) FROM agent_runs") == messages_before  # nothing written
    assert await rows(store, "SELECT count(*) FROM agent_sessions WHERE id = 'c'") == [(0,)]
    await spend(store, "other", user_id="v")  # another user is not limited
    await move_period_back(store)  # a new day: the count starts again
    await spend(store, "a")
    info = await store.usage.budget("u")
    assert info is not None and (info.used, info.exceeded, info.crossed_by_run) == (40, False, None)


async def test_the_apps_budget_limits_every_user_and_a_total_budget_never_resets(store: Store) -> None:
    await store.usage.set_budget(50, period="total")
    await spend(store, "a", user_id="u")
    await spend(store, "b", user_id=None)
    for user in ("u", "v", None):
        with pytest.raises(BudgetExceededError, match="does not reset"):
            await store.load("c", user_id=user)
    assert (await store.usage.budget()).period_start == datetime(1970, 1, 1, tzinfo=UTC)  # type: ignore[union-attr]
    await store.usage.set_budget(500, period="total")  # a new limit keeps what was used
    assert (await store.usage.budget()).used == 80  # type: ignore[union-attr]
    await store.load("c", user_id="u")
    assert await store.usage.remove_budget() is True and await store.usage.budget() is None


async def test_two_concurrent_runs_cannot_both_pass_the_last_allowance_unseen(store: Store) -> None:
    """Both started under the limit, so both ran: both are recorded, the database orders their charges, the
    first to reach the limit is named, and the next run is refused."""
    await store.usage.set_budget(100, period="month", user_id="u")
    await spend(store, "warm")  # 40 used: each of the next two may start, together they cross
    first, second = await store.load("x", user_id="u"), await store.load("y", user_id="u")
    for run in (first, second):
        run.session.state["k"] = 1
        run.add_usage(SPEND)
    results = await asyncio.gather(first.commit(), second.commit())
    info = await store.usage.budget("u")
    assert info is not None and info.used == 120 and info.crossed_by_run in {r.run_id for r in results}
    assert await rows(store, "SELECT count(*), sum(input_tokens + output_tokens) FROM agent_usage") == [(3, 120)]
    with pytest.raises(BudgetExceededError):
        await store.load("z", user_id="u")


async def test_budgets_refuse_bad_settings_with_a_clear_error(store: Store) -> None:
    for tokens, period in ((-1, "day"), (10, "week"), (True, "day"), (1.5, "day")):
        with pytest.raises(InvalidValueError):
            await store.usage.set_budget(tokens, period=period, user_id="u")  # type: ignore[arg-type]
    assert await store.usage.budget("u") is None
    for price in (-1, float("nan"), float("inf"), 1e308, True, None):
        with pytest.raises(InvalidValueError):
            await store.usage.set_price("m", input_per_million=price, output_per_million=1)
    assert await rows(store, "SELECT count(*) FROM agent_usage_prices") == [(0,)]
    with pytest.raises(InvalidValueError):
        await store.usage.report("week")


async def test_reports_by_user_agent_model_and_day_with_costs(store: Store) -> None:
    await spend(store, "a", user_id="u", usage={"input_token_count": 1_000_000, "output_token_count": 2_000_000})
    await spend(store, "b", user_id="v", usage={"input_token_count": 10, "output_token_count": 5})
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE agent_usage SET model = 'm1' WHERE user_id = 'u'"))
    by_user = await store.usage.report("user")
    assert [(line.key, line.calls, line.total_tokens, line.cost) for line in by_user] == [
        ("u", 1, 3_000_000, None), ("v", 1, 15, None)  # no prices yet
    ]  # fmt: skip
    await store.usage.set_price("m1", input_per_million=2.0, output_per_million=8.0)
    (model,) = [line for line in await store.usage.report("model") if line.key == "m1"]
    assert model.cost == pytest.approx(2.0 + 16.0)
    (day,) = await store.usage.report("day")
    assert day.key == datetime.now(UTC).date().isoformat() and day.calls == 2 and day.cost is None  # v unpriced
    daily = await rows(store, doc_block("docs/usage.md", "usage-daily").strip().rstrip(";"))
    today = datetime.now(UTC).date()
    assert [(str(d), u, m, c, t) for d, u, m, c, t, _ in daily] == [
        (str(today), "u", "m1", 1, 3_000_000), (str(today), "v", None, 1, 15)
    ]  # fmt: skip
    assert float(daily[0][5]) == pytest.approx(18.0) and daily[1][5] is None
    per_run = (
        doc_block("docs/usage.md", "usage-per-run").strip().rstrip(";").replace("'chat-1'", "'a'")
    )  # the doc's session: this test's "a"
    assert [(outcome, n, model) for _, outcome, n, _, model, *_ in await rows(store, per_run)] == [
        ("committed", 1, "m1")
    ]
    assert await store.usage.report("user", since=datetime.now(UTC) + timedelta(hours=1)) == []
    assert [line.key for line in await store.usage.report("user", user_id="v")] == ["v"]
