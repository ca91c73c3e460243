"""Chaos during a soak (issue 28): processes killed at random while workers run turns; nothing lost or doubled.

    python bench/studies/chaos_soak.py --seconds 180 --seed 1

Its own pg_auto_failover formation and PgBouncer (tests/auto_failover.py), 16 workers through PgBouncer as in
failover_soak.py. Every 8-15 s (the seed decides) one of:

- PgBouncer SIGKILLed and started again (every client connection through it dies);
- one of the store's postgres backends on the primary SIGKILLed (the postmaster then restarts every backend:
  a crash and recovery of the whole server);
- a data node's keeper and postgres SIGKILLed: the primary (7 in 10; the monitor fails over) or the secondary
  (the primary goes on alone); the next event instead runs that node's keeper again and waits for it to rejoin.

At the end, on the primary: every session's stored runs, messages and counter agree with the turns acknowledged;
every failed attempt was a retryable ``StorageUnavailableError`` (anything else is printed). Exit status 1 if not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from agent_framework import Agent
from failover_soak import turn, watch
from sqlalchemy import text

from agent_store import StorageUnavailableError, Store
from agent_store.offline import OfflineChatClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from auto_failover import Bouncer, Formation, _env, pg_bin

WORKERS = 16
BACKENDS = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"


def primary(formation: Formation) -> str | None:
    for node, (reported, assigned) in formation.states().items():
        if reported == assigned and reported in ("primary", "wait_primary", "single"):
            return node
    return None


def kill_a_backend(formation: Formation, node: str, rng: random.Random) -> None:
    argv = [
        pg_bin("psql"),
        "-XAtq",
        "-h",
        "127.0.0.1",
        "-p",
        str(formation.ports[node]),
        "-U",
        "postgres",
        "-c",
        BACKENDS,
    ]
    pids = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=10).stdout.split()
    if pids:
        os.kill(int(rng.choice(pids)), signal.SIGKILL)


def restart_bouncer(bouncer: Bouncer) -> None:
    pid_file = bouncer.tmpdir / "pgbouncer.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    time.sleep(0.5)
    pid_file.unlink(missing_ok=True)
    argv = ["pgbouncer", "-d", str(bouncer.tmpdir / "pgbouncer.ini")]
    subprocess.run(["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv, env=_env(), check=True)


async def chaos_soak(seconds: float, seed: int) -> bool:
    rng, agent = random.Random(seed), Agent(client=OfflineChatClient(), name="Chaos")
    acked: dict[str, int] = defaultdict(int)
    failures: list[bool] = []  # whether each failed attempt was retryable
    other: list[str] = []  # errors of any other kind: findings
    events: list[tuple[int, str]] = []
    begin = time.monotonic()
    end = begin + seconds
    with Formation() as formation:
        bouncer = Bouncer(formation.ports["node_1"], pool_size=WORKERS + 8)
        try:
            async with Store.from_url(bouncer.url(), pool_size=WORKERS, max_overflow=0,
                                      connect_args={"timeout": 3}) as store:  # fmt: skip
                await store.migrate()

                async def worker(w: int) -> None:
                    n = 0
                    while time.monotonic() < end:
                        sid, run_id = f"chaos-{w}-{n % 3}", f"w{w}-{n}"
                        while True:  # retried with its run id until it lands
                            try:
                                await turn(store, agent, sid, run_id)
                                break
                            except StorageUnavailableError as exc:
                                failures.append(exc.retryable)
                            except Exception as exc:
                                other.append(f"{type(exc).__name__}: {exc}")
                            if time.monotonic() > end + 300:
                                raise TimeoutError(f"{sid} {run_id} never landed")
                            await asyncio.sleep(0.2)
                        acked[sid] += 1
                        n += 1

                async def chaos() -> None:
                    dead: str | None = None
                    while time.monotonic() < end - 20:
                        await asyncio.sleep(rng.uniform(8, 15))
                        if dead is not None:
                            formation.rejoin(dead)
                            await asyncio.to_thread(formation.wait_for, {dead: "secondary"}, 180)
                            events.append((round(time.monotonic() - begin), f"{dead} rejoined"))
                            dead = None
                            continue
                        kind, node = rng.choice(["bouncer", "backend", "node", "node"]), primary(formation)
                        if kind == "bouncer":
                            await asyncio.to_thread(restart_bouncer, bouncer)
                        elif kind == "backend" and node:
                            await asyncio.to_thread(kill_a_backend, formation, node, rng)
                        elif kind == "node" and node:
                            dead = node if rng.random() < 0.7 else ("node_2" if node == "node_1" else "node_1")
                            await asyncio.to_thread(formation.kill, dead)
                        events.append((round(time.monotonic() - begin), f"{kind} (primary {node}, killed {dead})"))

                stop = asyncio.Event()
                background = [asyncio.create_task(c) for c in (watch(formation, bouncer, stop), chaos())]
                await asyncio.gather(*(worker(w) for w in range(WORKERS)))
                stop.set()
                for task in background:
                    task.cancel()
            stored: dict[str, dict[str, int]] = {}
            async with Store.from_url(formation.node_url(primary(formation) or "node_1"), check_schema=False) as check:
                async with check.engine.connect() as conn:
                    for name, sql in (("runs", "SELECT session_id, count(*) FROM agent_runs GROUP BY 1"),
                                      ("messages", "SELECT session_id, count(*) FROM agent_messages GROUP BY 1"),
                                      ("counter", "SELECT session_id, CAST(value AS TEXT) FROM agent_state"
                                                  " WHERE key = 'counter'")):  # fmt: skip
                        found: Any = (await conn.execute(text(sql))).all()
                        stored[name] = {sid: int(value) for sid, value in found}
        finally:
            bouncer.destroy()
    runs, messages, counter = stored["runs"], stored["messages"], stored["counter"]
    bad = sorted(s for s in set(acked) | set(runs)
                 if not runs.get(s) == acked.get(s) == counter.get(s) == messages.get(s, 0) // 2)  # fmt: skip
    print("events (second, what):", events)
    print(f"acknowledged {sum(acked.values())}, stored {sum(runs.values())}, sessions lost or doubled: "
          f"{bad or 'none'}; failed attempts {len(failures)}, all retryable: {all(failures)}; "
          f"other errors: {len(other)}")  # fmt: skip
    for line in other[:10]:
        print("other:", line)
    return not bad and all(failures) and not other


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    raise SystemExit(0 if asyncio.run(chaos_soak(args.seconds, args.seed)) else 1)


if __name__ == "__main__":
    main()
