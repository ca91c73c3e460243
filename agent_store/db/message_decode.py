"""A stored row back into the framework's ``Message``: the load's hottest loop, so the common shape is built
directly.

Most messages are plain text: their row keeps the text in its column and the body is only ``{"$text": 1}``
(message_rows.TEXT_FROM_COLUMN). For those the ``Message`` and its one text ``Content`` are constructed with
their fields, about twice as fast as the framework's generic ``Message.from_dict`` (which walks the dict, looks
up each content type and copies every mapping). Every other shape (tool calls, results, reasoning, media,
extra properties, encrypted bodies) goes through ``from_dict``. tests/test_message_decode.py checks that both
ways build the same message, field for field, for every shape and mark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_framework import Content, Message

from agent_store.db.message_rows import (
    MESSAGE_ID_MARK,
    NO_ID_PREFIX,
    STORE_ID,
    TEXT_FROM_COLUMN,
    MessageCipher,
    full_body,
    with_marks,
)


def message_from_row(
    body: Mapping[str, Any], cipher: MessageCipher | None, *, identity: str, role: str, author_name: str | None,
    text: str, marks: Mapping[str, Any] | None = None,
) -> Message:  # fmt: skip
    """Rebuild a ``Message`` from its row: the stored body (decrypted if need be) and the columns it leaves out."""
    if len(body) == 1 and body.get(TEXT_FROM_COLUMN) == 1:
        message = _plain_text(identity, role, author_name, text, marks)
    else:
        full = with_marks(full_body(body, cipher, message_id=identity, role=role, author_name=author_name,
                                    text=text), marks)  # fmt: skip
        message = Message.from_dict(dict(full))
        message.additional_properties[STORE_ID] = identity
    if message.message_id is None:
        message.id = identity  # type: ignore[attr-defined]  # see message_rows.store_id()
    return message


def _plain_text(
    identity: str, role: str, author_name: str | None, text: str, marks: Mapping[str, Any] | None
) -> Message:
    """What ``from_dict`` builds for ``{"role", "contents": [{"type": "text", "text"}], ...}``, with the marks
    where message_rows.with_marks puts them."""
    properties: dict[str, Any] = {}
    message_id = None if identity.startswith(NO_ID_PREFIX) else identity
    if marks:
        # Message() copies each mapping value itself (the framework edits a mark in place): no copy here.
        properties.update((k, v) for k, v in marks.items() if k != MESSAGE_ID_MARK)
        if isinstance(marks.get(MESSAGE_ID_MARK), str):
            message_id = marks[MESSAGE_ID_MARK]
    properties[STORE_ID] = identity
    content = Content("text", text=text, additional_properties={})
    return Message(role, [content], author_name=author_name, message_id=message_id, additional_properties=properties)
