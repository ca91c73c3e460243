"""A private, disposable PostgreSQL server for fault tests (stop it, restart it, lose it: nobody else cares).

It never touches the machine's own server: its own temp dir, data dir, free port and Unix socket dir.
PostgreSQL refuses to run as root, so when we are root the server tools run as the ``postgres`` OS user.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

TIMEOUT = 60  # seconds, for initdb and for pg_ctl's own -t wait
SERVER_OPTS = "-c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=16MB -c max_connections=50"


def pg_bin(name: str) -> str:
    """The path of a PostgreSQL binary: the newest /usr/lib/postgresql/<ver>/bin/<name>, else one on PATH."""
    version = lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()]  # noqa: E731  (15 > 9.6)
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=version)
    path = found[-1] if found else shutil.which(name)
    if not path:
        raise FileNotFoundError(f"PostgreSQL binary {name!r} not found under /usr/lib/postgresql/*/bin or on PATH")
    return path


def _free_port() -> int:
    """A port nobody listens on right now (the kernel's pick; a tiny race with other processes is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    """Our environment without PG* variables, so a stray PGHOST/PGPORT/PGDATA cannot aim us at another server."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"PGCONNECT_TIMEOUT": "10"}


class ThrowawayCluster:
    """initdb + pg_ctl in a temp dir. ``with ThrowawayCluster() as pg:`` starts it and destroys it afterwards."""

    def __init__(self, extra_opts: str = "") -> None:
        self.tmpdir: Path | None = None
        self.port: int = 0  # chosen by the first start(), then kept across stop()/start()/restart()
        self.extra_opts = extra_opts  # more "-c name=value" server options

    @property
    def datadir(self) -> Path:
        if self.tmpdir is None:
            raise RuntimeError("this ThrowawayCluster has no directory yet: call start() first")
        return self.tmpdir / "data"

    @property
    def logfile(self) -> Path:
        return self.datadir.parent / "server.log"

    def dsn(self, database: str = "postgres") -> str:  # plain libpq/asyncpg form
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def url(self, database: str = "postgres") -> str:  # SQLAlchemy form, asyncpg driver
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def log_tail(self, lines: int = 40) -> str:  # for error messages
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, RuntimeError):
            return "(no server log)"

    def _run(self, argv: list[str], *, as_postgres: bool = True, timeout: float = TIMEOUT + 10) -> str:
        """Run a command (as the postgres user when we are root); raise with its output and the log tail."""
        if as_postgres and os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        try:
            done = subprocess.run(argv, cwd=self.tmpdir, env=_env(), capture_output=True, text=True, timeout=timeout)
            if done.returncode == 0:
                return done.stdout
            problem = f"exited {done.returncode}\n{done.stdout}{done.stderr}"
        except subprocess.TimeoutExpired:
            problem = f"timed out after {timeout}s"
        raise RuntimeError(f"{argv} {problem}\n--- server log ---\n{self.log_tail()}")

    def running(self) -> bool:
        """Whether this cluster's postmaster is up (pg_ctl status exits 0; 3 = stopped, 4 = no data dir)."""
        if self.tmpdir is None:
            return False
        try:
            self._run([pg_bin("pg_ctl"), "status", "-D", str(self.datadir)], timeout=15)
        except RuntimeError:
            return False
        return True

    def start(self) -> ThrowawayCluster:
        """Create the cluster on first use, then start the server (same data dir and port on later calls)."""
        first = self.tmpdir is None
        try:
            if first:
                self.tmpdir = Path(tempfile.mkdtemp(prefix="throwaway_pg_"))
                if os.geteuid() == 0:
                    shutil.chown(self.tmpdir, "postgres", "postgres")
                atexit.register(self.destroy)  # no orphan servers if a test run dies half-way
                self._run([pg_bin("initdb"), "-D", str(self.datadir), "-A", "trust", "-U", "postgres", "--no-sync",
                           "-E", "UTF8", "--locale=C"], timeout=TIMEOUT)  # fmt: skip
                self.port = _free_port()
            if not self.running():
                opts = f"-p {self.port} -k {self.tmpdir} {SERVER_OPTS} {self.extra_opts}"
                self._run([pg_bin("pg_ctl"), "start", "-w", "-t", str(TIMEOUT), "-D", str(self.datadir),
                           "-l", str(self.logfile), "-o", opts])  # fmt: skip
        except BaseException:
            if first:
                self.destroy()  # never leave a half-made cluster behind (a later start() would trust it)
            raise
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop this cluster only (``mode``: smart, fast or immediate). A no-op when it is not running."""
        if self.running():
            self._run([pg_bin("pg_ctl"), "stop", "-w", "-t", str(TIMEOUT), "-D", str(self.datadir), "-m", mode])

    def restart(self, mode: str = "fast") -> None:  # same data dir, same port
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        """Stop (immediately: nothing here is worth keeping) and delete the whole temp dir."""
        if self.tmpdir is None:
            return
        atexit.unregister(self.destroy)
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def create_database(self, name: str) -> None:
        """CREATE DATABASE through psql (a blocking call; fine in tests)."""
        ident = '"' + name.replace('"', '""') + '"'
        self._run([pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.dsn(), "-c",
                   f"CREATE DATABASE {ident}"], as_postgres=False, timeout=30)  # fmt: skip

    def __enter__(self) -> ThrowawayCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.destroy()
