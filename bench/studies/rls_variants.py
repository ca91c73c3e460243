"""What row-level security's cost on S1 is made of (issue 41, point 3: within 5% of off), by changing one thing at
a time on the same migrated schema: the policies' forms, which tables carry a real check, and the naming alone.
Prints a table: S1's p50 per variant and its ratio to the switch off.

    python bench/studies/rls_variants.py [--reps 5] [--runs 500] [--variant NAME ...] [--pg-url postgresql+asyncpg://...]

Variants (each on a database of its own, migrated to head, as bench/studies/rls.py's application role; the policies are
changed with ALTER POLICY after the migration, never in the product):
- ``off``: the switch off.
- ``off, named``: the switch off, but the store names its user as it does when on (the load's lateral
  wrapper and the commit's ``_as`` function): the cost of naming alone.
- ``on``: as shipped (migration 0024/0025).
- ``on, direct``: each policy reads its setting directly, ``NULLIF(current_setting(...), '')``, instead of
  through ``(SELECT ...)``: no initplan per statement, the setting read per row (a GUC lookup).
- ``on, direct inside the session-keyed EXISTS only``: only those nine policies' settings read directly.
- ``on, session-keyed admit all (+ direct)``: the nine tables reached through ``agent_sessions`` admit every row:
  the best a ``user_id`` column compared directly on those rows could do.
- ``on, user_id column: ...``: that column added (a default from the transaction's name), compared on read, and
  on write either checked against the session by ``EXISTS`` or compared too; settings read directly.
- ``on, user_id column: every check compared``: the same column, and the ledger's write check without its
  ``EXISTS`` too (a composite foreign key would keep a row's user its session's): no probe left anywhere; and the
  same with each comparison written ``(...) IS TRUE``, which forms no equivalence with the statement's own
  ``user_id = $n`` (no one-time filter, so no Result node, at each scan).
- ``on, the column as built``: the same, with what building it takes: a composite foreign key from each row's
  session and user to ``agent_sessions`` (unique on both), which keeps a row's user its session's and carries a
  session's change of user to its rows, and a trigger filling the column from the session for a writer that
  names no one (an operator); compared, or ``IS TRUE``.
- ``off, named, two plain expressions``: the naming alone, with the commit function naming its user in two
  ``PERFORM set_config(...)`` (each a plain expression to PL/pgSQL, not a query).
- ``on, every policy admits all``: the machinery and the naming, no check at all: the floor of any policy design.
Every variant's store is open at once and S1's runs are interleaved (run n of each, in a rotating order): the
machine's drift falls on all alike. Each figure is a median over repetitions of each variant's p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
from rls import database
from scenarios import store_run, timed

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


def direct(keyed: str, same: str = "{0} = {1}", ledger_probe: bool = True) -> list[str]:
    """Every policy as shipped but reading its settings directly; ``keyed`` is the session-keyed tables' check,
    ``same`` how a comparison is written; ``ledger_probe``: the ledger's write check probes its session too."""
    user, app = (lambda column: same.format(column, USER)), (lambda column: same.format(column, APP))
    ledger = f"{user('user_id')} AND {app('app_id')}"
    probe = f" AND {SESSION_IS_USERS.format(t='agent_usage')}" if ledger_probe else ""
    return [f"ALTER POLICY agent_store_tenant ON {t} USING ({keyed.format(t=t)})" for t in KEYED] + [
        f"ALTER POLICY agent_store_tenant ON {t} USING ({user('user_id')})" for t in BY_USER] + [
        f"ALTER POLICY agent_store_tenant ON agent_app_state USING ({app('app_id')})",
        f"ALTER POLICY agent_store_tenant ON agent_usage USING ({ledger}) WITH CHECK ({ledger}{probe})",
        f"ALTER POLICY agent_store_tenant ON agent_usage_budgets USING ((scope = 'user' AND {user('subject')}) "
        f"OR (scope = 'app' AND {app('subject')}))",
        f"ALTER POLICY agent_store_tenant ON agent_ui_snapshots USING ({user('scope')})",
        f"ALTER POLICY agent_store_tenant ON agent_erasures USING (user_key = encode(sha256(convert_to({USER}, "
        "'UTF8')), 'hex'))"]  # fmt: skip


def compared(same: str = "{0} = {1}", column: list[str] | None = None) -> list[str]:
    """Every policy a comparison of a column with its setting (the session-keyed rows' own ``user_id``), no probe
    (``column``: how that column is made)."""
    return [*(COLUMN if column is None else column), *direct(same.format("user_id", USER), same, ledger_probe=False)]


COLUMN = [f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS user_id text DEFAULT {USER}" for t in KEYED]
# The column as it would be built: a row's user kept its session's by a composite foreign key (which carries a
# session's change of user to its rows), and filled from the session for a writer that names no one (an operator).
OWN = [t for t in KEYED if t != "agent_responses"]  # a response row has its user already (migration 0018)
BUILT = ["CREATE UNIQUE INDEX agent_sessions_id_user_id ON agent_sessions (id, user_id)",
         "CREATE FUNCTION agent_store_row_user() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
         "SELECT s.user_id INTO NEW.user_id FROM agent_sessions s WHERE s.id = NEW.session_id; RETURN NEW; END $$",
         *(f"ALTER TABLE {t} ADD COLUMN user_id varchar(255) DEFAULT {USER}" for t in OWN),
         *(f"ALTER TABLE {t} ADD CONSTRAINT {t}_user FOREIGN KEY (session_id, user_id) REFERENCES agent_sessions "
           "(id, user_id) ON UPDATE CASCADE ON DELETE CASCADE" for t in OWN),
         *(f"CREATE TRIGGER {t}_user BEFORE INSERT ON {t} FOR EACH ROW WHEN (NEW.user_id IS NULL) "
           "EXECUTE FUNCTION agent_store_row_user()" for t in OWN)]  # fmt: skip
PLAIN_NAMES = ["""CREATE OR REPLACE FUNCTION agent_store_commit_usage_as(u text, a text, p jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('agent_store.user_id', u, true);
    PERFORM set_config('agent_store.app_id', a, true);
    RETURN agent_store_commit_usage(p);
END $$"""]
ALL = [*KEYED, *BY_USER, "agent_app_state", "agent_usage", "agent_usage_budgets", "agent_ui_snapshots",
       "agent_erasures"]
VARIANTS: dict[str, tuple[bool, list[str]]] = {  # name -> (switch on, the policies' changes)
    "off": (False, []),
    "off, named": (False, []),
    "on": (True, []),
    "on, direct": (True, direct(SESSION_IS_USERS)),
    "on, direct inside the session-keyed EXISTS only": (True, [
        f"ALTER POLICY agent_store_tenant ON {t} USING ({SESSION_IS_USERS.format(t=t)})" for t in KEYED]),
    "on, session-keyed admit all": (True, [f"ALTER POLICY agent_store_tenant ON {t} USING (true)" for t in KEYED]),
    "on, session-keyed admit all + direct": (True, direct("true")),
    "on, user_id column: read by compare, written by EXISTS": (True, [*COLUMN, *direct(
        "user_id = " + USER), *(f"ALTER POLICY agent_store_tenant ON {t} WITH CHECK (user_id = {USER} AND "
                                f"{SESSION_IS_USERS.format(t=t)})" for t in KEYED)]),
    "on, user_id column: compared both ways": (True, [*COLUMN, *direct("user_id = " + USER)]),
    "on, user_id column: every check compared": (True, compared()),
    "on, the same, each comparison IS TRUE": (True, compared("({0} = {1}) IS TRUE")),
    "on, the column as built, compared": (True, compared(column=BUILT)),
    "on, the column as built, IS TRUE": (True, compared("({0} = {1}) IS TRUE", BUILT)),
    "off, named, two plain expressions": (False, PLAIN_NAMES),
    "on, every policy admits all": (True, [f"ALTER POLICY agent_store_tenant ON {t} USING (true) WITH CHECK (true)"
                                           for t in ALL]),
}  # fmt: skip


async def prepared(admin_url: str, variant: str) -> str:
    """A database for ``variant``: migrated, the switch set, its policies changed; the application's URL."""
    switch, changes = VARIANTS[variant]
    name = "agent_store_bench_rlsv_" + "".join(c if c.isalnum() else "_" for c in variant)
    url = await database(admin_url, name, rls=switch)
    owner = await asyncpg.connect(admin_url.replace("+asyncpg", "").rsplit("/", 1)[0] + "/" + name)
    try:
        for change in changes:
            await owner.execute(change)
    finally:
        await owner.close()
    return url


def naming_anyway(learn: Any, named: list[Any]) -> Any:
    """``tenancy.learn`` for the "off, named..." variants: the stores of ``named`` name their user anyway."""

    async def learn_as(db: Any, conn: Any) -> None:
        await learn(db, conn)
        if any(db is one for one in named):
            db.row_security = True

    return learn_as


async def everything(admin_url: str, reps: int, runs: int) -> dict[str, list[float]]:
    """Each repetition: every variant's store open at once, S1's runs interleaved (run n of every variant, in a
    rotating order, then run n + 1), so the machine's drift falls on all of them alike; each variant's p50."""
    seen: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    learn = tenancy.learn
    for rep in range(reps):
        urls = {variant: await prepared(admin_url, variant) for variant in VARIANTS}
        stores = {variant: Store.from_url(url, pool_size=2, max_overflow=0) for variant, url in urls.items()}

        tenancy.learn = naming_anyway(learn, [s.db for v, s in stores.items() if v.startswith("off, named")])
        try:
            latencies: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
            order = list(VARIANTS)
            for n in range(-50, runs):  # the first 50: warming every store's plans and connections
                order = order[1:] + order[:1]
                for variant in order:
                    took = await timed(lambda s=stores[variant], sid=f"s1-{rep}", n=n: store_run(s, sid, abs(n)))
                    if n >= 0:
                        latencies[variant].append(took)
            for variant, taken in latencies.items():
                seen[variant].append(statistics.median(taken) * 1e3)
        finally:
            tenancy.learn = learn
            for store in stores.values():
                await store.close()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="run only these (repeat it; 'off' is always run, as the ratios' base)")
    parser.add_argument("--pg-url", default=os.environ.get("AGENT_STORE_BENCH_PG_URL",
                                                           "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    if args.variant:
        for variant in set(VARIANTS) - {"off", *args.variant}:
            del VARIANTS[variant]
    seen = asyncio.run(everything(args.pg_url, args.reps, args.runs))
    off = statistics.median(seen["off"])
    print(f"S1 ({args.runs} sequential runs a variant, last 20 messages, the variants interleaved run by run), "
          f"PostgreSQL; medians of {args.reps} repetitions' p50\n")
    print("| variant | S1 p50 ms | / off |\n|---|---|---|")
    for variant, p50s in seen.items():
        print(f"| {variant} | {statistics.median(p50s):.3f} | {statistics.median(p50s) / off:.3f}x |")


if __name__ == "__main__":
    main()
