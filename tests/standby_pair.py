"""A private primary and hot standby (streaming replication) for replica and failover tests.

Both are throwaway clusters (tests/throwaway_pg.py): their own temp dirs and free ports, never the machine's
server. The standby is a ``pg_basebackup -R`` of the primary. Replication is synchronous (``synchronous_standby_names
= '*'``, ``synchronous_commit = on``): a commit is acknowledged only once the standby has flushed it, which is
what "failover without loss" needs. With asynchronous replication (PostgreSQL's default) a promoted standby can
miss the last commits the primary acknowledged; docs/SCALING.md says so.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from throwaway_pg import TIMEOUT, ThrowawayCluster, _env, _free_port, pg_bin

PRIMARY_OPTS = "-c synchronous_standby_names=* -c wal_keep_size=64MB"
STANDBY_OPTS = "-c hot_standby=on -c max_standby_streaming_delay=5s"


class StandbyPair:
    """``with StandbyPair() as pair:`` a running primary with a streaming, synchronous hot standby."""

    def __init__(self) -> None:
        self.primary = ThrowawayCluster(extra_opts=PRIMARY_OPTS)
        self.standby = ThrowawayCluster(extra_opts=STANDBY_OPTS)

    def start(self) -> StandbyPair:
        try:
            self.primary.start()
            standby = self.standby
            standby.tmpdir = Path(tempfile.mkdtemp(prefix="throwaway_standby_"))
            if os.geteuid() == 0:
                shutil.chown(standby.tmpdir, "postgres", "postgres")
            atexit.register(standby.destroy)
            standby.port = _free_port()
            # -R writes standby.signal and primary_conninfo; -X stream copies the WAL the backup needs.
            standby._run([pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                          "-D", str(standby.datadir), "-R", "-X", "stream", "--no-sync"], timeout=TIMEOUT)  # fmt: skip
            standby.start()
            self.wait_streaming()
        except BaseException:
            self.destroy()
            raise
        return self

    def _psql(self, cluster: ThrowawayCluster, sql: str) -> str:
        argv = [pg_bin("psql"), "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-d", cluster.dsn(), "-c", sql]
        done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"psql on port {cluster.port}: {done.stderr}\n{cluster.log_tail()}")
        return done.stdout.strip()

    def wait_streaming(self) -> None:
        """Until the primary sees its standby streaming synchronously (commits wait for it from then on)."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if (
                self._psql(self.primary, "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'")
                == "sync"
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the standby never streamed\n{self.standby.log_tail()}")

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        target = self._psql(self.primary, "SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            done = self._psql(self.standby, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")
            if done == "t":
                return
            time.sleep(0.1)
        raise RuntimeError("the standby did not catch up")

    def pause_replay(self) -> None:
        self._psql(self.standby, "SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        self._psql(self.standby, "SELECT pg_wal_replay_resume()")

    def promote(self) -> None:
        """Make the standby a primary (pg_ctl promote waits until it accepts writes)."""
        self.standby._run([pg_bin("pg_ctl"), "promote", "-w", "-t", str(TIMEOUT), "-D", str(self.standby.datadir)])
        if self._psql(self.standby, "SELECT pg_is_in_recovery()") != "f":
            raise RuntimeError("the standby is still in recovery after promote")

    def destroy(self) -> None:
        try:
            self.standby.destroy()
        finally:
            self.primary.destroy()

    def __enter__(self) -> StandbyPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
