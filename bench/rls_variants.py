"""What row-level security's cost on S1 is made of (issue 41, point 3: within 5% of off), by changing one thing at
a time on the same migrated schema: the policies' forms, which tables carry a real check, and the naming alone.
Prints a table: S1's p50 per variant and its ratio to the switch off.

    python bench/rls_variants.py [--reps 9] [--pg-url postgresql+asyncpg://postgres@127.0.0.1:5432/test]

Variants (each on a database of its own, migrated to head, as bench/rls.py's application role; the policies are
changed with ALTER POLICY after the migration, never in the product):
- ``off``: the switch off.
- ``off, named``: the switch off, but the store names its user as it does when on (the load's lateral
  wrapper and the commit's ``_as`` function): the cost of naming alone.
- ``on``: as shipped (migration 0024/0025).
- ``on, direct``: each policy reads its setting directly, ``NULLIF(current_setting(...), '')``, instead of
  through ``(SELECT ...)``: no initplan per statement, the setting read per row (a GUC lookup).
- ``on, session-keyed admit all (+ direct)``: the nine tables reached through ``agent_sessions`` admit every row:
  the best a ``user_id`` column compared directly on those rows could do.
- ``on, every policy admits all``: the machinery and the naming, no check at all: the floor of any policy design.
Sides rotate in each repetition (the order reversed every other); every figure is a median of the repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable

import asyncpg
from rls import database
from scenarios import s1, store_run

from agent_store import Store
from agent_store.db import tenancy

KEYED = ["agent_messages", "agent_message_marks", "agent_branch_marks", "agent_runs", "agent_state",
         "agent_state_history", "agent_tool_calls", "agent_message_vectors", "agent_responses"]  # fmt: skip
BY_USER = ["agent_sessions", "agent_user_state", "agent_checkpoints", "agent_checkpoint_workflows", "agent_streams",
           "agent_stream_events", "agent_hosted_responses", "agent_hosted_items", "agent_hosted_links"]  # fmt: skip
USER = "NULLIF(current_setting('agent_store.user_id', true), '')"
APP = "NULLIF(current_setting('agent_store.app_id', true), '')"
# (a bench's own fixed expressions: nothing from input)
SESSION_IS_USERS = "EXISTS (SELECT 1 FROM agent_sessions s WHERE s.id = {t}.session_id AND s.user_id = " + USER + ")"  # noqa: S608


def direct(keyed: str) -> list[str]:
    """Every policy as shipped but reading its settings directly; ``keyed`` is the session-keyed tables' check."""
    return [f"ALTER POLICY agent_store_tenant ON {t} USING ({keyed.format(t=t)})" for t in KEYED] + [
        f"ALTER POLICY agent_store_tenant ON {t} USING (user_id = {USER})" for t in BY_USER] + [
        f"ALTER POLICY agent_store_tenant ON agent_app_state USING (app_id = {APP})",
        f"ALTER POLICY agent_store_tenant ON agent_usage USING (user_id = {USER} AND app_id = {APP}) WITH CHECK "
        f"(user_id = {USER} AND app_id = {APP} AND {SESSION_IS_USERS.format(t='agent_usage')})",
        f"ALTER POLICY agent_store_tenant ON agent_usage_budgets USING ((scope = 'user' AND subject = {USER}) "
        f"OR (scope = 'app' AND subject = {APP}))",
        f"ALTER POLICY agent_store_tenant ON agent_ui_snapshots USING (scope = {USER})",
        f"ALTER POLICY agent_store_tenant ON agent_erasures USING (user_key = encode(sha256(convert_to({USER}, "
        "'UTF8')), 'hex'))"]  # fmt: skip


COLUMN = [f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS user_id text DEFAULT {USER}" for t in KEYED]
ALL = [*KEYED, *BY_USER, "agent_app_state", "agent_usage", "agent_usage_budgets", "agent_ui_snapshots",
       "agent_erasures"]
VARIANTS: dict[str, tuple[bool, list[str]]] = {  # name -> (switch on, the policies' changes)
    "off": (False, []),
    "off, named": (False, []),
    "on": (True, []),
    "on, direct": (True, direct(SESSION_IS_USERS)),
    "on, session-keyed admit all": (True, [f"ALTER POLICY agent_store_tenant ON {t} USING (true)" for t in KEYED]),
    "on, session-keyed admit all + direct": (True, direct("true")),
    "on, user_id column: read by compare, written by EXISTS": (True, [*COLUMN, *direct(
        "user_id = " + USER), *(f"ALTER POLICY agent_store_tenant ON {t} WITH CHECK (user_id = {USER} AND "
                                f"{SESSION_IS_USERS.format(t=t)})" for t in KEYED)]),
    "on, user_id column: compared both ways": (True, [*COLUMN, *direct("user_id = " + USER)]),
    "on, every policy admits all": (True, [f"ALTER POLICY agent_store_tenant ON {t} USING (true) WITH CHECK (true)"
                                           for t in ALL]),
}  # fmt: skip


async def one_side(admin_url: str, variant: str, rep: int) -> float:
    switch, changes = VARIANTS[variant]
    name = "agent_store_bench_rlsv_" + "".join(c if c.isalnum() else "_" for c in variant)
    url = await database(admin_url, name, rls=switch)
    owner = await asyncpg.connect(admin_url.replace("+asyncpg", "").rsplit("/", 1)[0] + "/" + name)
    try:
        for change in changes:
            await owner.execute(change)
    finally:
        await owner.close()
    learn = tenancy.learn
    if variant == "off, named":  # the store names its user although the switch is off

        async def named(db: object, conn: object) -> None:
            await learn(db, conn)
            db.row_security = True  # type: ignore[attr-defined]

        tenancy.learn = named
    try:
        async with Store.from_url(url, pool_size=4, max_overflow=0) as store:
            await store.warm_up()
            run: Callable[[str, int], Awaitable[None]] = lambda sid, n: store_run(store, sid, n)  # noqa: E731
            await s1(run, f"warm-{rep}")
            return (await s1(run, f"s1-{rep}"))["p50 ms"]
    finally:
        tenancy.learn = learn


async def everything(admin_url: str, reps: int) -> dict[str, list[float]]:
    seen: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for rep in range(reps):
        for variant in list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]:
            seen[variant].append(await one_side(admin_url, variant, rep))
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--pg-url", default=os.environ.get("AGENT_STORE_BENCH_PG_URL",
                                                           "postgresql+asyncpg://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    seen = asyncio.run(everything(args.pg_url, args.reps))
    off = statistics.median(seen["off"])
    print(f"S1 (500 sequential runs, last 20 messages), PostgreSQL; medians of {args.reps} repetitions\n")
    print("| variant | S1 p50 ms | / off |\n|---|---|---|")
    for variant, p50s in seen.items():
        print(f"| {variant} | {statistics.median(p50s):.3f} | {statistics.median(p50s) / off:.3f}x |")


if __name__ == "__main__":
    main()
