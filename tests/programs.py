"""The programs the tests start, and the Debian package each comes from.

One list, two readers: a test that starts one calls ``require`` first, so a missing program fails (in CI) or skips
with its name and the package that installs it, never as an opaque exit status; and tests/test_ci_script.py checks
that `.ci/run` and the README install every package here before the first test runs.
"""

from __future__ import annotations

import glob
import shutil

# program -> the Debian package that installs it (PostgreSQL's own binaries come with the server's package).
PROGRAMS = {
    "pgbouncer": "pgbouncer",
    "pg_autoctl": "pg-auto-failover-cli",
    "chromium": "chromium",
    "chromedriver": "chromium-driver",
}
# Files a program needs that are not on PATH: pg_autoctl loads this extension into the monitor it creates.
FILES = {"/usr/share/postgresql/*/extension/pgautofailover.control": "postgresql-15-auto-failover"}


def missing(*programs: str) -> str | None:
    """Why these programs cannot run here (one line naming each missing one and its package), or None."""
    absent = [f"{name} (Debian package {PROGRAMS[name]})" for name in programs if shutil.which(name) is None]
    if "pg_autoctl" in programs:
        absent += [f"{pattern} (Debian package {package})" for pattern, package in FILES.items()
                   if not glob.glob(pattern)]  # fmt: skip
    if not absent:
        return None
    return f"not installed: {', '.join(absent)}; `bash .ci/run` installs them, or apt-get install them as root"


def require(*programs: str) -> None:
    """Raise FileNotFoundError (which the own-server fixtures turn into a CI failure or a skip) if one is missing."""
    problem = missing(*programs)
    if problem:
        raise FileNotFoundError(problem)
