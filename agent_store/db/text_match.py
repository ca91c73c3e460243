"""Matching a search term in a message's text where SQL cannot say it the same way on both backends.

SQLite calls these as SQL functions (registered on each connection: its own ``lower()`` and ``LIKE`` fold only
ASCII letters); the snippets use them to mark what matched. PostgreSQL uses ``lower()``/``ILIKE`` in its locale
and its full-text parser for short words.
"""

from __future__ import annotations

import functools
import re


def lower(text: str | None) -> str | None:
    return None if text is None else text.lower()


@functools.lru_cache(maxsize=256)
def word_pattern(word: str) -> re.Pattern[str]:
    """``word`` where neither neighbour is a letter or digit (any script), case-insensitively."""
    return re.compile(rf"(?<![^\W_]){re.escape(word)}(?![^\W_])", re.IGNORECASE)


def has_word(text: str | None, word: str | None) -> int:
    return int(bool(text and word and word_pattern(word).search(text)))


def register(dbapi_connection: object) -> None:
    """Make ``agent_store_lower(text)`` and ``agent_store_word(text, word)`` callable from SQLite's SQL."""
    create = dbapi_connection.create_function  # type: ignore[attr-defined]
    create("agent_store_lower", 1, lower, deterministic=True)
    create("agent_store_word", 2, has_word, deterministic=True)
