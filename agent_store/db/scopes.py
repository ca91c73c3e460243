"""Where a state key lives: the session's own rows, or rows shared by all of a user's or an app's sessions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table

from agent_store.db.tables import app_state_t, state_t, user_state_t
from agent_store.errors import InvalidValueError

USER_PREFIX, APP_PREFIX, TEMP_PREFIX = "user:", "app:", "temp:"


@dataclass(frozen=True)
class Scope:
    """One scope of state keys: its prefix, its table, and whose rows (``owner_column = owner``)."""

    prefix: str
    table: Table
    owner_column: str
    owner: str

    def stored_key(self, key: str) -> str:
        return key[len(self.prefix) :]


def owner_is(column: Any, value: str | None) -> Any:
    """``column = value``, or ``IS NULL`` for no owner (``IS NOT DISTINCT FROM`` cannot use an index)."""
    return column.is_(None) if value is None else column == value


def scopes(session_id: str, user_id: str | None, app_id: str) -> list[Scope]:
    found = [Scope("", state_t, "session_id", session_id), Scope(APP_PREFIX, app_state_t, "app_id", app_id)]
    if user_id is not None:
        found.append(Scope(USER_PREFIX, user_state_t, "user_id", user_id))
    return found


def scope_of(key: str, available: Sequence[Scope]) -> Scope:
    prefix = USER_PREFIX if key.startswith(USER_PREFIX) else APP_PREFIX if key.startswith(APP_PREFIX) else ""
    for scope in available:
        if scope.prefix == prefix:
            return scope
    raise InvalidValueError(f"state[{key!r}]: user-scoped keys need a session opened with a user_id")
