"""Column types of the schema: JSON documents bound as the codec's text, and UTC timestamps on every backend."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Dialect, Text, TypeDecorator
from sqlalchemy.dialects.postgresql import JSON, JSONB
from sqlalchemy.types import TypeEngine

from agent_store.errors import DatabaseError

__all__ = ["ExactJsonText", "JsonText", "UTCDateTime"]


class _JSONBText(JSONB):
    """JSONB that takes already-serialized JSON text (the codec serializes once, with its own rules)."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None


class _JSONText(JSON):
    """PostgreSQL ``json`` (the text as written) taking already-serialized JSON text."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None


class JsonText(TypeDecorator[Any]):
    """A JSON document column: JSONB on PostgreSQL, UTF-8 text (not \\uXXXX-escaped) on SQLite.

    Binds take JSON *text* produced by :mod:`agent_store.codec`; reads give Python values.
    """

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(_JSONBText())
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is not None and not isinstance(value, str):
            raise TypeError("JsonText binds serialized JSON text; use agent_store.codec.dumps()")
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name == "postgresql" or value is None:
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:  # only a write from outside agent_store leaves text that is not JSON
            raise DatabaseError(f"a stored JSON column does not decode ({exc.msg} at {exc.pos}): the row was "
                                "changed outside agent_store") from exc  # fmt: skip


class ExactJsonText(JsonText):
    """A JSON document kept exactly as written: PostgreSQL ``json``, not ``jsonb``, which would reorder keys and
    rewrite numbers (1e20 comes back as an integer). For documents that must round-trip unchanged."""

    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(_JSONText())
        return dialect.type_descriptor(Text())


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite keeps no zone, so UTC is implied)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value
