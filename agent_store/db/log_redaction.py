"""No stored content in the logs of the drivers agent_store uses, at any level.

Statement parameters and result rows are message text and state values. SQLAlchemy hides parameters on every
engine a Store uses (``hide_parameters``, set in database.py), but two records still carried them:

- aiosqlite logs at DEBUG each call it runs on its connection's thread, with the call's arguments (a
  statement's parameters) in the record: "executing functools.partial(<... execute>, 'INSERT ...', (...))";
- SQLAlchemy with ``echo="debug"`` (or its logger at DEBUG) logs every result row ("Row %r").

:func:`keep_values_out_of_logs` puts one filter on both loggers: the records stay, so the logs still show what
ran and when; what was called keeps its name (``Cursor.execute(...)``), an exception its type, a row only
that it was one. asyncpg logs no statements. The filter is process-wide on the ``aiosqlite`` logger.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["keep_values_out_of_logs"]

ROW = "(a result row: its values are not logged)"


class _NoStoredValues(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.partition(".")[0] == "aiosqlite":
            if isinstance(record.args, Mapping):
                record.args = {key: _named(value) for key, value in record.args.items()}
            elif record.args:
                record.args = tuple(_named(value) for value in record.args)
        elif record.msg == "Row %r":  # SQLAlchemy's row echo (cursor.py); "Col %r" names columns only
            record.args = (ROW,)
        return True


_FILTER = _NoStoredValues()


def _named(value: Any) -> str:
    """What a logged argument is, never what it holds: a callable's name, an exception's type, else a type."""
    if isinstance(value, functools.partial):
        value = value.func
    if isinstance(value, BaseException):
        return type(value).__name__
    name = getattr(value, "__qualname__", None)
    return f"{name}(...)" if isinstance(name, str) else f"<{type(value).__name__}>"


def keep_values_out_of_logs(engine: AsyncEngine) -> None:
    """Install the filter on the engine's SQLAlchemy logger and, for SQLite, aiosqlite's; idempotent."""
    sync_engine = engine.sync_engine
    logger: Any = sync_engine.logger
    getattr(logger, "logger", logger).addFilter(_FILTER)  # an echo flag wraps the Logger (SQLAlchemy's log.py)
    if sync_engine.dialect.name == "sqlite":
        logging.getLogger("aiosqlite").addFilter(_FILTER)
