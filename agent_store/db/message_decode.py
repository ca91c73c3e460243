"""A stored row back into the framework's ``Message``: the load's hottest loop, so the common shape is built
directly.

Most messages are plain text: their row keeps the text in its column and the body is only ``{"$text": 1}``
(message_rows.TEXT_FROM_COLUMN), plus the provider's ``message_id`` for a model's reply. The load's statement
hands the first kind's body back as NULL (load_statement.py), so it is not even decoded. For both, the
``Message`` and its one text ``Content`` are made by copying the attributes of a pair the framework's own
constructors built once (``_TextTemplates``) and setting the five that vary: about three times as fast as
calling the constructors, five times as fast as the framework's generic ``Message.from_dict`` (which walks the
dict, looks up each content type and copies every mapping). If the framework's classes ever stop being plain
attribute objects, or the copy stops matching its constructors, the constructors are used instead (checked
once, at import).

Every other shape (tool calls, results, reasoning, media, extra properties, encrypted bodies) goes through
``from_dict``. tests/test_message_decode.py checks that every way builds the same message, field for field,
for every shape and mark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_framework import Content, Message

from agent_store.db import sealing
from agent_store.db.message_rows import (
    ENCRYPTED,
    MESSAGE_ID_MARK,
    NO_ID_PREFIX,
    STORE_ID,
    TEXT_FROM_COLUMN,
    MessageCipher,
    full_body,
    give_id,
    with_marks,
)
from agent_store.errors import DatabaseError


def message_from_row(
    body: Mapping[str, Any] | None, cipher: MessageCipher | None, *, identity: str, role: str,
    author_name: str | None, text: str, marks: Mapping[str, Any] | None = None,
) -> Message:  # fmt: skip
    """Rebuild a ``Message`` from its row: the stored body (decrypted if need be) and the columns it leaves out.

    ``body`` None is a plain text message's ``{"$text": 1}``, as the load's statement returns it.
    """
    if getattr(cipher, "binds_rows", False) and not (body is not None and ENCRYPTED in body):
        raise sealing.in_clear("m")  # per-user keys seal every body: this one was put there in clear
    if body is None:
        return _plain_text(identity, None, role, author_name, text, marks)
    if body.get(TEXT_FROM_COLUMN) == 1 and (
        len(body) == 1 or (len(body) == 2 and isinstance(body.get("message_id"), str))
    ):
        # with a provider's message_id (a model client's reply), which the store's own identity is not
        return _plain_text(identity, body.get("message_id"), role, author_name, text, marks)
    full = with_marks(full_body(body, cipher, message_id=identity, role=role, author_name=author_name, text=text),
                      marks)  # fmt: skip
    try:
        message = Message.from_dict(dict(full))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # only a row changed outside agent_store
        why = f"stored message {identity!r} is not an Agent Framework message ({type(exc).__name__})"[:200]
        raise DatabaseError(f"{why}: the row was changed outside agent_store") from exc
    message.additional_properties[STORE_ID] = identity
    if message.message_id is None:
        give_id(message, identity)  # see message_rows.store_id()
    return message


def _plain_text(
    identity: str, message_id: str | None, role: str, author_name: str | None, text: str,
    marks: Mapping[str, Any] | None,
) -> Message:  # fmt: skip
    """What ``from_dict`` builds for ``{"role", "contents": [{"type": "text", "text"}], ...}``, with the marks
    where message_rows.with_marks puts them (message_rows.full_body: the body's message_id, else the row's)."""
    properties: dict[str, Any] = {}
    if message_id is None:
        message_id = None if identity.startswith(NO_ID_PREFIX) else identity
    if marks:
        # Copies of each mapping value, as Message() makes them: the framework edits a mark in place.
        properties.update((k, dict(v) if isinstance(v, Mapping) else v) for k, v in marks.items()
                          if k != MESSAGE_ID_MARK)  # fmt: skip
        if isinstance(marks.get(MESSAGE_ID_MARK), str):
            message_id = marks[MESSAGE_ID_MARK]
    properties[STORE_ID] = identity
    message = _TEMPLATES.build(role, text, author_name, message_id, properties)
    if message_id is None:
        give_id(message, identity)  # see message_rows.store_id()
    return message


_VARYING = ("role", "contents", "author_name", "message_id", "additional_properties")


class _TextTemplates:
    """A text ``Message`` built by copying the attributes of one the framework's constructors made."""

    def __init__(self) -> None:
        self.content = vars(Content("text", text="", additional_properties={}))
        # CPython shares one table of attribute names among a class's instances and lets it take fewer new
        # names with every instance made: the two the store adds to a message (give_id) go in now, at import,
        # while it has room, so they stay in the object later too rather than in a dict of its own.
        give_id(Message("user", []), NO_ID_PREFIX)
        message = vars(Message("user", [], additional_properties={}))
        # The attributes the constructor sets besides the five that vary (raw_representation), in its order.
        self.message_rest = [(k, v) for k, v in message.items() if k not in _VARYING]
        self.copying = list(message)[: len(_VARYING)] == list(_VARYING) and self._copy_matches()

    def build(self, role: str, text: str, author_name: str | None, message_id: str | None,
              properties: dict[str, Any]) -> Message:  # fmt: skip
        """``properties`` becomes the message's own (the caller made it, with copies of its mapping values)."""
        if not self.copying:
            content = Content("text", text=text, additional_properties={})
            return Message(role, [content], author_name=author_name, message_id=message_id,
                           additional_properties=properties)  # fmt: skip
        # dict.copy() then item sets: the fastest way to a new 46-key dict (Content has a field per content type).
        content, message = object.__new__(Content), object.__new__(Message)
        content.__dict__ = fields = self.content.copy()
        fields["text"], fields["additional_properties"] = text, {}
        # The Message's few attributes are set one by one, as its constructor does, so they stay in the object
        # (CPython's shared keys) instead of a dict of their own: one tracked object fewer per loaded message
        # for the collector to walk and promote (issue 43).
        message.role, message.contents, message.author_name = role, [content], author_name
        message.message_id, message.additional_properties = message_id, properties
        for name, value in self.message_rest:
            setattr(message, name, value)
        return message

    def _copy_matches(self) -> bool:
        """Whether a copied pair has exactly the attributes (and values) the constructors give the same input."""
        self.copying = True
        try:
            copied = self.build("assistant", "probe", "author", "id", {"key": "value"})
        except (AttributeError, TypeError):  # __slots__, a read-only __dict__: not plain attribute objects
            return False
        made = Message("assistant", [Content("text", text="probe", additional_properties={})], author_name="author",
                       message_id="id", additional_properties={"key": "value"})  # fmt: skip
        return (
            list(vars(copied)) == list(vars(made))
            and vars(copied) | {"contents": None} == vars(made) | {"contents": None}
            and vars(copied.contents[0]) == vars(made.contents[0])
            and copied.to_dict() == made.to_dict()
        )


_TEMPLATES = _TextTemplates()
