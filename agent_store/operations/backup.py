"""Backups that restore, and erasures that stay erased after a restore (``agent-store backup`` / ``restore``).

- SQLite: SQLite's online backup API (``sqlite3.Connection.backup``), one consistent copy even while other
  processes write (WAL mode: copying the file is not a backup). Restore copies it to a path that has no database.
- PostgreSQL: ``pg_dump --format=custom`` of the store's database, and ``pg_restore`` into an empty one. The
  connection goes to them in ``PG*`` variables, never on a command line (a password there is any user's to read).
  Base backups and point-in-time recovery are the server's (docs/operations.md); a restore of those is followed
  by the same erasure step.

A backup is older than the erasures made since. The erasure log (``agent_erasures``: a SHA-256 of each erased
user id and when; nothing readable) is kept ``ERASURE_LOG_KEPT`` (400 days), longer than backups are usually
kept, and ``agent-store erasures -o FILE`` writes it out to keep beside the backups. ``reapply_erasures`` takes
the log of the store the backup was taken of (or that file) and erases, in the restored database, every owner
whose id hashes to an entry newer than all of that owner's rows there: what the erasure deleted, and nothing the
user stored after it. Its entries join the restored log, so the fence holds there too.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, literal, select, text, union_all
from sqlalchemy.engine import URL

from agent_store.db.column_types import UTCDateTime
from agent_store.db.database import Database
from agent_store.db.engine import make_engine
from agent_store.db.erasures import ERASURE_LOG_KEPT, user_key
from agent_store.db.hosted_tables import checkpoint_user, hosted_items_t, hosted_responses_t
from agent_store.db.journal_tables import streams_t
from agent_store.db.tables import (
    budgets_t,
    checkpoint_workflows_t,
    checkpoints_t,
    erasures_t,
    sessions_t,
    ui_snapshots_t,
    user_state_t,
)
from agent_store.db.translation import translated
from agent_store.errors import ConfigurationError, InvalidValueError, redact
from agent_store.operations.retention import erase_user

__all__ = ["ERASURE_LOG_KEPT", "backup", "checked_log", "direct_only", "erasure_log", "reapply_erasures", "restore"]
# Where a user's rows are, and when each was last written (None: the table keeps no time): every table erase_user
# deletes from, so an owner with rows only there is found too. A checkpoint owner may be a user's hosted workflow
# context (``user`` + CHECKPOINT_CONTEXT + a hash): it is that user's.
_NO_TIME = literal(None, type_=UTCDateTime())
_OWNED = ((sessions_t.c.user_id, sessions_t.c.updated_at), (user_state_t.c.user_id, user_state_t.c.updated_at),
          (hosted_responses_t.c.user_id, hosted_responses_t.c.updated_at), (hosted_items_t.c.user_id, _NO_TIME),
          (ui_snapshots_t.c.scope, ui_snapshots_t.c.updated_at), (streams_t.c.user_id, streams_t.c.updated_at),
          (checkpoints_t.c.user_id, checkpoints_t.c.saved_at),
          (checkpoint_workflows_t.c.user_id, _NO_TIME))  # fmt: skip
_PG_ENV = {"sslmode": "PGSSLMODE", "sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY",
           "passfile": "PGPASSFILE", "target_session_attrs": "PGTARGETSESSIONATTRS"}  # fmt: skip


async def backup(url: URL, path: Path) -> int:
    """Write a backup of the store at ``url`` to ``path`` (whole or absent: a ``.partial`` renamed at the end);
    returns its size in bytes."""
    partial = await asyncio.to_thread(_partial_for, path, "a backup never overwrites a file")
    try:
        if url.get_backend_name() == "sqlite":
            await asyncio.to_thread(_sqlite_copy, _sqlite_path(url), partial)
        else:
            await _run("pg_dump", ["--format=custom", "--no-owner", f"--file={partial}"], url)
    except BaseException:
        await asyncio.to_thread(partial.unlink, missing_ok=True)
        raise
    return await asyncio.to_thread(_renamed, partial, path)


async def restore(path: Path, url: URL) -> None:
    """Restore a backup into the database at ``url``, which must hold nothing yet (a new SQLite path, or an
    empty PostgreSQL database; pg_restore's one transaction refuses tables that exist): never over a store."""
    if not await asyncio.to_thread(path.is_file):
        raise InvalidValueError(f"no backup file at {path}")
    if url.get_backend_name() != "sqlite":
        await _refuse_tables(url)
        await _run("pg_restore", ["--no-owner", "--exit-on-error", "--single-transaction", str(path)], url)
        return
    target = _sqlite_path(url)
    partial = await asyncio.to_thread(_partial_for, target, "restore into a new path, then point the app at it")
    try:
        await asyncio.to_thread(_sqlite_copy, path, partial)  # also proves the file is a SQLite database
    except BaseException:
        await asyncio.to_thread(partial.unlink, missing_ok=True)
        raise
    await asyncio.to_thread(_renamed, partial, target)


async def _refuse_tables(url: URL) -> None:
    """A database with tables is refused in one sentence before pg_restore would fail on them in its own words."""
    engine = make_engine(url)
    try:
        with translated(url, "checking the restore's database is empty"):
            async with engine.connect() as conn:
                found = await conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"))
                tables = int(found.scalar_one())
    finally:
        await engine.dispose()
    if tables:
        raise InvalidValueError(f"{redact(url)} holds {tables} tables already: restore into an empty database "
                                "(createdb NAME), never over a store")  # fmt: skip


def _partial_for(path: Path, why: str) -> Path:
    """A partial file of this call's own beside ``path`` (two at once never share one)."""
    if path.exists():
        raise InvalidValueError(f"{path} exists: {why}")
    if not path.parent.is_dir():
        raise InvalidValueError(f"cannot write {path}: its folder does not exist")
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.partial")


def _renamed(partial: Path, path: Path) -> int:
    """Put the whole file in place, never over one that appeared meanwhile (a link fails if the name exists)."""
    try:
        os.link(partial, path)
    except FileExistsError:
        raise InvalidValueError(f"{path} exists: it appeared while this was being written; nothing replaced") from None
    finally:
        partial.unlink(missing_ok=True)
    return path.stat().st_size


async def erasure_log(db: Database) -> list[dict[str, Any]]:
    """The erasure log: ``{"user_key", "erased_at"}`` per erased user (ids hashed, nothing readable)."""
    async with db.transaction(write=False, doing="reading the erasure log") as conn:
        found = (await conn.execute(select(erasures_t).order_by(erasures_t.c.user_key))).all()
    return [{"user_key": row.user_key, "erased_at": row.erased_at.isoformat()} for row in found]


async def reapply_erasures(db: Database, log: Iterable[dict[str, Any]] | dict[str, datetime]) -> list[str]:
    """Erase every owner of ``db`` that ``log`` erased after their newest row here; record the log's entries.
    Returns the owners erased."""
    erased = log if isinstance(log, dict) else _checked_log(log)
    if not erased:
        return []
    parts = [select(column.label("owner"), when.label("at")) for column, when in _OWNED]
    parts.append(select(budgets_t.c.subject, budgets_t.c.period_start).where(budgets_t.c.scope == "user"))
    owners = union_all(*parts).subquery()
    newest: dict[str, Any] = {}
    async with db.transaction(write=False, doing="finding erased owners") as conn:
        for row in await conn.execute(select(owners.c.owner, func.max(owners.c.at).label("at"))
                                      .where(owners.c.owner.is_not(None)).group_by(owners.c.owner)):  # fmt: skip
            owner = checkpoint_user(row.owner)  # a hosted workflow context's checkpoints: its user's
            if owner and row.at is not None:
                newest[owner] = max(row.at, newest.get(owner) or row.at)
            elif owner:
                newest.setdefault(owner, None)  # rows with no time: nothing shows they are newer
    again = sorted(owner for owner, at in newest.items() if user_key(owner) in erased
                   and (at is None or at < erased[user_key(owner)]))  # fmt: skip
    # The log first: from here the fence refuses every run loaded before each erasure, even if a re-erasure
    # below is interrupted (run it again to finish).
    async with db.transaction(write=True, doing="recording the erasure log") as conn:
        for key, at in erased.items():
            mine = (await conn.execute(select(erasures_t.c.erased_at).where(erasures_t.c.user_key == key))).first()
            if mine is None:
                await conn.execute(erasures_t.insert().values(user_key=key, erased_at=at))
            elif mine[0] < at:
                await conn.execute(erasures_t.update().where(erasures_t.c.user_key == key).values(erased_at=at))
    for owner in again:  # their keys went with the first erasure: no keys needed to delete the rows again
        await erase_user(db, owner, 10_000, None, again=True)
    return again


def read_log_file(path: Path) -> list[dict[str, Any]]:
    """An erasure log written by ``agent-store erasures -o FILE`` (one JSON object per line)."""
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise InvalidValueError(f"{path} is not an erasure log ({type(exc).__name__})") from exc


def checked_log(log: Iterable[dict[str, Any]]) -> dict[str, datetime]:
    """The log's entries, each checked (a hex SHA-256, an aware time not in the future): by user key."""
    return _checked_log(log)


def _checked_log(log: Iterable[dict[str, Any]]) -> dict[str, datetime]:
    erased: dict[str, datetime] = {}
    for entry in log:
        try:
            key, at = entry["user_key"], datetime.fromisoformat(entry["erased_at"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidValueError(f"not an erasure log entry: {str(entry)[:100]}") from exc
        if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)) or not at.tzinfo:
            raise InvalidValueError(f"not an erasure log entry: {str(entry)[:100]}")
        if at > datetime.now(UTC) + timedelta(minutes=5):  # a wrong clock's: its fence would shut the user out
            raise InvalidValueError(f"an erasure log entry dated in the future ({at.isoformat()}): nothing applied")
        erased[key] = max(at, erased.get(key, at))
    return erased


def direct_only(url: URL, program: str = "a backup") -> None:
    """pg_dump and pg_restore need the server itself: behind PgBouncer in transaction mode their settings and
    snapshot would not hold. Checked before any connection is made."""
    if url.query.get("pgbouncer") in ("true", "1", "yes") or "prepared_statement_cache_size" in url.query:
        raise ConfigurationError(f"{program} needs a direct connection to the server, not PgBouncer in "
                                 "transaction mode (its settings and snapshot would not hold): give the server's URL")


def _sqlite_path(url: URL) -> Path:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        raise ConfigurationError("a backup or restore needs a SQLite database file path")
    return Path(database)


def _sqlite_copy(source: Path, target: Path) -> None:
    """SQLite's online backup: a consistent copy while others write (it restarts if they write meanwhile)."""
    if not source.is_file():
        raise InvalidValueError(f"no SQLite database at {source}")
    try:
        with sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro", uri=True) as src, sqlite3.connect(target) as dst:
            try:
                src.backup(dst)
            except sqlite3.DatabaseError as exc:
                raise InvalidValueError(f"{source} is not a SQLite database ({exc})") from exc
            try:  # a damaged page is refused here, not at the first read after the restore
                checked = dst.execute("PRAGMA quick_check").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                checked = str(exc)
            if checked != "ok":
                raise InvalidValueError(f"{source} is damaged (SQLite quick_check: {str(checked)[:200]})")
            dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file (a store sets WAL again on open)
    except sqlite3.OperationalError as exc:
        raise InvalidValueError(f"cannot copy {source} to {target}: {exc}") from exc


async def _run(program: str, arguments: list[str], url: URL) -> None:
    """pg_dump or pg_restore on the URL's database; the connection in PG* variables, its stderr in the error."""
    direct_only(url, program)
    binary = shutil.which(program)
    if binary is None:
        raise ConfigurationError(f"{program} is not installed here (Debian: apt-get install postgresql-client)")
    env = {**os.environ, "PGHOST": url.host or "localhost", "PGPORT": str(url.port or 5432),
           "PGUSER": url.username or "", "PGDATABASE": url.database or ""}  # fmt: skip
    if url.password is not None:
        env["PGPASSWORD"] = str(url.password)
    for key, value in url.query.items():
        if key in _PG_ENV and isinstance(value, str):
            env[_PG_ENV[key]] = value
    if program == "pg_restore":
        arguments = [f"--dbname={url.database}", *arguments]
    pipe = asyncio.subprocess.PIPE
    done = await asyncio.create_subprocess_exec(binary, *arguments, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=pipe, stderr=pipe)  # fmt: skip
    _, err = await done.communicate()
    if done.returncode != 0:
        said = err.decode(errors="replace").strip().splitlines()
        errors = [line for line in said if "error:" in line.lower()] or said  # the first error says why
        raise InvalidValueError(f"{program} failed: {errors[0] if errors else f'exit status {done.returncode}'}"[:500])
