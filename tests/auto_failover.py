"""A real pg_auto_failover formation for the automatic-failover rehearsal: a monitor, a primary, a secondary.

Each is a ``pg_autoctl`` process (with the PostgreSQL it supervises) in its own process group, data dir under one
temp dir, and free port: never the machine's server. As root, everything runs as the ``postgres`` OS user (as the
throwaway clusters do), with its own HOME so pg_autoctl's config and state files stay in the temp dir too.

The monitor is tuned to act in seconds, not the tens of seconds of its defaults (``MONITOR_SETTINGS``): a node is
unhealthy after 3 s without an answer, and a primary that vanished is given 5 s to demote itself before its
secondary is promoted. Replication is pg_auto_failover's default for two data nodes: synchronous, the secondary
in the quorum, so a commit the primary acknowledged is on the secondary too.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from programs import require
from throwaway_pg import _env, _free_port, pg_bin

MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1s",
    "pgautofailover.health_check_timeout": "1s",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500ms",
    "pgautofailover.node_considered_unhealthy_timeout": "3s",
    "pgautofailover.primary_demote_timeout": "5s",
}
NODE_SETTINGS = ("fsync=off",)  # a test server needs no durability past a crash of the machine (reloaded, no restart)
TIMEOUT = 120  # seconds to reach an expected formation state


class Formation:
    """``with Formation() as f:`` a monitor and two data nodes, ``node_1`` primary and ``node_2`` secondary."""

    def __init__(self) -> None:
        self.tmpdir = Path(tempfile.mkdtemp(prefix="throwaway_formation_"))
        self.ports = {"monitor": _free_port(), "node_1": _free_port(), "node_2": _free_port()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        atexit.register(self.destroy)
        if os.geteuid() == 0:
            shutil.chown(self.tmpdir, "postgres", "postgres")

    # -- the formation's URLs ------------------------------------------------------------------------------------
    def url(self) -> str:
        """The store's URL: both data nodes; asyncpg connects to whichever accepts writes."""
        hosts = "&".join(f"host=127.0.0.1:{self.ports[n]}" for n in ("node_1", "node_2"))
        return f"postgresql+asyncpg://postgres@/postgres?{hosts}&target_session_attrs=read-write"

    def node_url(self, node: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.ports[node]}/postgres"

    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.ports['monitor']}/pg_auto_failover?sslmode=disable"

    # -- processes ------------------------------------------------------------------------------------------------
    def _argv(self, *args: str) -> list[str]:
        argv = ["pg_autoctl", *args]
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def _environ(self) -> dict[str, str]:
        home = str(self.tmpdir)
        path = f"{Path(pg_bin('pg_ctl')).parent}:{os.environ.get('PATH', '')}"
        return _env() | {"HOME": home, "XDG_CONFIG_HOME": f"{home}/config", "XDG_DATA_HOME": f"{home}/data",
                         "XDG_RUNTIME_DIR": f"{home}/run", "PATH": path}  # fmt: skip

    def _spawn(self, name: str, *args: str) -> None:
        """Start a ``pg_autoctl ... --run`` (or ``run``) in a process group of its own: killing the group kills the
        keeper and the postgres it supervises at once, as a lost machine would."""
        log = open(self.tmpdir / f"{name}.log", "ab")  # the process keeps its own copy open
        self.procs[name] = subprocess.Popen(
            self._argv(*args), cwd=self.tmpdir, env=self._environ(), stdout=log, stderr=log, start_new_session=True
        )
        log.close()

    def _ctl(self, *args: str, timeout: float = 30) -> str:
        done = subprocess.run(self._argv(*args), cwd=self.tmpdir, env=self._environ(), capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def _psql(self, port: int, database: str, sql: str) -> str:
        argv = [pg_bin("psql"), "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(port),
                "-U", "postgres", "-d", database, "-c", sql]  # fmt: skip
        return subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=30, check=True).stdout

    def _data_node(self, node: str) -> None:
        self._spawn(node, "create", "postgres", "--pgdata", str(self.tmpdir / node), "--pgport",
                    str(self.ports[node]), "--hostname", "127.0.0.1", "--name", node, "--auth", "trust", "--no-ssl",
                    "--monitor", self.monitor_uri(), "--run")  # fmt: skip

    def start(self) -> Formation:
        require("pg_autoctl")
        try:
            self._spawn("monitor", "create", "monitor", "--pgdata", str(self.tmpdir / "monitor"), "--pgport",
                        str(self.ports["monitor"]), "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
                        "--run")  # fmt: skip
            self._until(self._monitor_ready, "the monitor to accept connections")
            for name, value in MONITOR_SETTINGS.items():
                self._psql(self.ports["monitor"], "pg_auto_failover", f"ALTER SYSTEM SET {name} = '{value}'")
            self._psql(self.ports["monitor"], "pg_auto_failover", "SELECT pg_reload_conf()")
            self._data_node("node_1")
            self.wait_for({"node_1": "single"})
            for setting in NODE_SETTINGS:  # node_2's base backup copies these
                name, value = setting.split("=")
                self._psql(self.ports["node_1"], "postgres", f"ALTER SYSTEM SET {name} = '{value}'")
            self._psql(self.ports["node_1"], "postgres", "SELECT pg_reload_conf()")
            self._data_node("node_2")
            self.wait_for({"node_1": "primary", "node_2": "secondary"})
        except BaseException:
            self.destroy()
            raise
        return self

    def _monitor_ready(self) -> bool:
        try:
            return self._psql(self.ports["monitor"], "pg_auto_failover", "SELECT 1").strip() == "1"
        except subprocess.CalledProcessError:
            return False

    # -- what the monitor says ------------------------------------------------------------------------------------
    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported, assigned) state, as the monitor has them."""
        shown = json.loads(self._ctl("show", "state", "--pgdata", str(self.tmpdir / "monitor"), "--json"))
        return {n["nodename"]: (n["current_group_state"], n["assigned_group_state"]) for n in shown}

    def wait_for(self, wanted: dict[str, str], timeout: float = TIMEOUT) -> None:
        """Until each named node reports, and is assigned, the state wanted."""
        self._until(lambda: all(self.states().get(n) == (s, s) for n, s in wanted.items()), f"states {wanted}",
                    timeout)  # fmt: skip

    def _until(self, done: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if done():
                    return
            except (RuntimeError, json.JSONDecodeError, subprocess.SubprocessError):
                pass
            time.sleep(0.3)
        tails = {name: (self.tmpdir / f"{name}.log").read_text(errors="replace")[-1500:] for name in self.procs}
        raise RuntimeError(f"timed out waiting for {what}; last states: {self._states_or_none()}; logs: {tails}")

    def _states_or_none(self) -> object:
        try:
            return self.states()
        except (RuntimeError, json.JSONDecodeError, subprocess.SubprocessError) as exc:
            return exc

    # -- faults ---------------------------------------------------------------------------------------------------
    def kill(self, node: str) -> None:
        """SIGKILL the node's keeper and its postgres together: no clean stop, no goodbye to the monitor."""
        os.killpg(self.procs[node].pid, signal.SIGKILL)
        self.procs[node].wait(timeout=30)

    def rejoin(self, node: str) -> None:
        """Run the killed node's keeper again: it asks the monitor, and comes back as the new primary's secondary."""
        self._spawn(node, "run", "--pgdata", str(self.tmpdir / node))

    def destroy(self) -> None:
        """SIGQUIT to every group (pg_autoctl and postgres stop at once, and postgres frees its shared memory),
        SIGKILL to what is left after 20 s, then the temp dir goes."""
        atexit.unregister(self.destroy)
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            for proc in self.procs.values():
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                for proc in self.procs.values():
                    proc.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                continue
        self.procs.clear()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def __enter__(self) -> Formation:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class Bouncer:
    """A PgBouncer of the test's own (transaction pooling) in front of one node; ``repoint`` moves it, as an
    operator's failover hook does: PgBouncer does not follow a failover by itself."""

    def __init__(self, target_port: int, pool_size: int = 40) -> None:
        require("pgbouncer")
        self.tmpdir = Path(tempfile.mkdtemp(prefix="throwaway_pgbouncer_"))
        self.port, self.pool_size = _free_port(), pool_size
        atexit.register(self.destroy)
        (self.tmpdir / "userlist.txt").write_text('"postgres" ""\n')
        self._write(target_port)
        if os.geteuid() == 0:
            shutil.chown(self.tmpdir, "postgres", "postgres")
            for name in ("pgbouncer.ini", "userlist.txt"):
                shutil.chown(self.tmpdir / name, "postgres", "postgres")
        argv = ["pgbouncer", "-d", str(self.tmpdir / "pgbouncer.ini")]
        subprocess.run(["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv, env=_env(),
                       check=True, capture_output=True, timeout=30)  # fmt: skip
        deadline = time.monotonic() + 20
        while not (self.tmpdir / "pgbouncer.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _write(self, target_port: int) -> None:
        self.target_port = target_port
        (self.tmpdir / "pgbouncer.ini").write_text(f"""[databases]
postgres = host=127.0.0.1 port={target_port} dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.tmpdir}/userlist.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 500
default_pool_size = {self.pool_size}
server_login_retry = 1
server_connect_timeout = 3
ignore_startup_parameters = extra_float_digits,application_name
logfile = {self.tmpdir}/pgbouncer.log
pidfile = {self.tmpdir}/pgbouncer.pid
""")

    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres?pgbouncer=true"

    def _admin(self, command: str) -> list[list[str]]:
        """A command on PgBouncer's admin console: its header row, then its rows (RELOAD: none)."""
        argv = [pg_bin("psql"), "-X", "-A", "-P", "footer=off", "-F", "\t", "-h", "127.0.0.1", "-p", str(self.port),
                "-U", "postgres", "-d", "pgbouncer", "-c", command]  # fmt: skip
        out = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=15, check=True).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    def repoint(self, target_port: int) -> None:
        """Send new connections to ``target_port``: rewrite the ``[databases]`` line, then RELOAD (PgBouncer drops
        its connections to the old host)."""
        self._write(target_port)
        self._admin("RELOAD")

    def server_connections(self) -> int:
        """Server connections PgBouncer holds for the ``postgres`` database (SHOW POOLS: active, idle, used,
        tested, logging in)."""
        head, *pools = self._admin("SHOW POOLS")
        counted = [head.index(name) for name in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")]
        return sum(int(pool[i]) for pool in pools if pool[0] == "postgres" for i in counted)

    def destroy(self) -> None:
        atexit.unregister(self.destroy)
        pid_file = self.tmpdir / "pgbouncer.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(self.tmpdir, ignore_errors=True)
