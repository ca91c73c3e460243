"""One minute of `bench/studies/failover_soak.py` in CI (issue 28): 32 workers through PgBouncer, the primary killed at
30 s, pg_auto_failover promoting the secondary and a failover hook moving PgBouncer. Every acknowledged run is on the
new primary exactly once, every failed attempt was retryable (and retried), memory and connections stay flat."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from auto_failover import Bouncer, Formation
from conftest import IN_CI
from programs import missing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "studies"))
from failover_soak import failover_soak, print_report

WORKERS = 32


async def test_a_minute_through_pgbouncer_with_a_failover_loses_and_doubles_nothing(
    formation: Formation, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = missing("pgbouncer")
    if problem:
        (pytest.fail if IN_CI else pytest.skip)(problem)
    bouncer = Bouncer(formation.ports["node_1"], pool_size=WORKERS + 8)
    try:
        report = await failover_soak(formation, bouncer, seconds=60, workers=WORKERS, interval=10)
    finally:
        bouncer.destroy()
    with capsys.disabled():
        print()
        print_report(report, WORKERS)
    assert sum(report.acked.values()) > 500 and len(report.acked) == WORKERS * 4
    assert report.lost_or_doubled() == []
    assert report.failures and {(name, retryable) for name, retryable, _ in report.failures} == {
        ("StorageUnavailableError", True)
    }
    assert not any("password" in message for _, _, message in report.failures)
    assert report.kill_to_first_commit is not None and report.kill_to_first_commit < 30
    assert report.pool_checked_out == 0
    # Runs in every interval but the failover's; the connections PgBouncer holds never pass its pool.
    assert sum(i.runs > 0 for i in report.intervals) >= len(report.intervals) - 2
    assert all(i.server_connections <= WORKERS + 8 for i in report.intervals)
    rss = [i.rss_mib for i in report.intervals]
    assert rss[-1] - rss[1] < 15, rss  # MiB, after the first interval's warm-up
