"""`agent-store usage` (the ledger's report), `agent-store budget` (token budgets), `agent-store price` (costs)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import click

from agent_store.cli.support import json_option, open_store, print_json, print_table, runs_async, url_option
from agent_store.models import BudgetInfo
from agent_store.operations.usage import BY, PERIODS

_SPAN = re.compile(r"(\d{1,6})([dh])")


def _moment(value: str | None, name: str) -> datetime | None:
    """``7d`` / ``24h`` (that long ago), a date (``2026-11-01``, UTC midnight) or an ISO 8601 timestamp."""
    if value is None:
        return None
    if span := _SPAN.fullmatch(value.strip()):
        amount, unit = int(span[1]), span[2]
        return datetime.now(UTC) - (timedelta(days=amount) if unit == "d" else timedelta(hours=amount))
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give 7d, 24h, a date (2026-11-01) or an ISO timestamp", param_hint=name
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@click.command()
@click.option("--by", type=click.Choice(BY), default="user", show_default=True, help="One line per ...")
@click.option("--since", default=None, help="From (7d, 24h, 2026-11-01 or ISO; default: 30 days ago).")
@click.option("--until", default=None, help="Until, excluded (same forms; default: now).")
@click.option("--user", "user_id", default=None, help="Only this user's calls.")
@url_option
@json_option
@runs_async
async def usage(by: str, since: str | None, until: str | None, user_id: str | None, url: str | None,
                as_json: bool) -> None:  # fmt: skip
    """Tokens spent per user, agent, model, day or session, from the usage ledger (cost where priced)."""
    start, end = _moment(since, "--since"), _moment(until, "--until")
    if start is not None and end is not None and start >= end:
        raise click.UsageError(f"--since ({since}) is not before --until ({until}): the report would be empty")
    if start is not None and start > datetime.now(UTC):
        raise click.UsageError(f"--since ({since}) is in the future: the report would be empty")
    async with open_store(url) as store:
        lines = await store.usage.report(by, since=start, until=end, user_id=user_id)
    if as_json:
        print_json({"by": by, "lines": [line.model_dump(mode="json") for line in lines]})
        return
    rows = [[line.key, line.calls, line.input_tokens, line.output_tokens, line.total_tokens,
             line.cache_read_input_tokens, line.reasoning_output_tokens,
             None if line.cost is None else f"{line.cost:.4f}"] for line in lines]  # fmt: skip
    print_table([by.upper(), "CALLS", "INPUT", "OUTPUT", "TOTAL", "CACHED", "REASONING", "COST"], rows)
    if any(line.cost is not None for line in lines):  # prices are per million tokens, in the unit they were set in
        click.echo("COST: in the currency of the prices set with `agent-store price` (per million tokens)")


@click.group()
@url_option
@json_option
def budget(url: str | None, as_json: bool) -> None:
    """Token budgets per period, for one user (--user) or the whole app: a spent budget refuses new runs."""


def _show(info: BudgetInfo | None, as_json: bool, who: str) -> None:
    if as_json:
        print_json(info.model_dump(mode="json") if info is not None else {"budget": None})
    elif info is None:
        click.echo(f"{who}: no budget")
    else:
        state = "exceeded: new runs are refused" if info.exceeded else "open"
        click.echo(f"{who}: {info.used} of {info.token_limit} tokens per {info.period} ({state})")
        if info.crossed_by_run:
            click.echo(f"reached by run {info.crossed_by_run} at {info.crossed_at:%Y-%m-%d %H:%M:%S} UTC")


@budget.command(name="set")
@click.argument("tokens", type=click.IntRange(0, 2**63 - 1))
@click.option("--period", type=click.Choice(PERIODS), default="day", show_default=True)
@click.option("--user", "user_id", default=None, help="The user (omit: the app as a whole).")
@url_option
@json_option
@runs_async
async def set_budget(tokens: int, period: str, user_id: str | None, url: str | None, as_json: bool) -> None:
    """Allow TOKENS per period (UTC days or months, or in total)."""
    async with open_store(url) as store:
        info = await store.usage.set_budget(tokens, period=period, user_id=user_id)
    _show(info, as_json, f"user {user_id}" if user_id else "the app")


@budget.command(name="show")
@click.option("--user", "user_id", default=None, help="The user (omit: the app as a whole).")
@url_option
@json_option
@runs_async
async def show_budget(user_id: str | None, url: str | None, as_json: bool) -> None:
    """The budget and what the current period has used."""
    async with open_store(url) as store:
        info = await store.usage.budget(user_id)
    _show(info, as_json, f"user {user_id}" if user_id else "the app")


@budget.command(name="remove")
@click.option("--user", "user_id", default=None, help="The user (omit: the app as a whole).")
@url_option
@json_option
@runs_async
async def remove_budget(user_id: str | None, url: str | None, as_json: bool) -> None:
    """Remove the budget: runs are no longer limited."""
    async with open_store(url) as store:
        removed = await store.usage.remove_budget(user_id)
    print_json({"removed": removed}) if as_json else click.echo("removed" if removed else "there was no budget")


@click.command()
@click.argument("model")
@click.option("--input", "input_price", type=click.FloatRange(0, 1e9), required=True, help="Per million input tokens.")
@click.option(
    "--output", "output_price", type=click.FloatRange(0, 1e9), required=True, help="Per million output tokens."
)
@click.option("--cached", "cached_price", type=click.FloatRange(0, 1e9), default=None, help="Per million cached input.")
@url_option
@json_option
@runs_async
async def price(model: str, input_price: float, output_price: float, cached_price: float | None, url: str | None,
                as_json: bool) -> None:  # fmt: skip
    """Set what MODEL's tokens cost (agent_usage_prices): `usage` and agent_usage_daily then show costs."""
    async with open_store(url) as store:
        await store.usage.set_price(model, input_per_million=input_price, output_per_million=output_price,
                                    cached_input_per_million=cached_price)  # fmt: skip
    print_json({"model": model, "ok": True}) if as_json else click.echo(f"{model}: priced")
