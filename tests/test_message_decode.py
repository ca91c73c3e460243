"""The load's fast way to rebuild a plain text message builds exactly what the framework's ``from_dict`` does.

Every field of the Message and of its Content is compared (``vars``, not only ``to_dict``): the framework reads
attributes that ``to_dict`` leaves out, such as the de-duplication handle ``id``.
"""

from __future__ import annotations

import copy
from typing import Any

from agent_framework import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_store.db.message_decode import message_from_row
from agent_store.db.message_rows import MESSAGE_ID_MARK, TEXT_FROM_COLUMN, full_body, with_marks

PLAIN = {TEXT_FROM_COLUMN: 1}
MARKS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "_group": st.fixed_dictionaries({"id": st.text(max_size=8), "kind": st.sampled_from(["user", "summary"])}),
            "_excluded": st.booleans(),
            "_exclude_reason": st.sampled_from(["sliding_window", "token_budget"]),
            MESSAGE_ID_MARK: st.text(min_size=1, max_size=12),
        },
    ),
)


def generic(identity: str, role: str, author_name: str | None, text: str, marks: Any) -> Message:
    """The way every other shape is built: the full to_dict() through Message.from_dict."""
    full = with_marks(full_body(PLAIN, None, message_id=identity, role=role, author_name=author_name, text=text), marks)
    message = Message.from_dict(dict(full))
    message.additional_properties["agent_store_id"] = identity
    if message.message_id is None:
        message.id = identity  # type: ignore[attr-defined]
    return message


def fields(message: Message) -> dict[str, Any]:
    found = {k: v for k, v in vars(message).items() if k != "contents"}
    return {**found, "contents": [vars(c) for c in message.contents], "dict": message.to_dict()}


@settings(max_examples=300, deadline=None)
@given(
    identity=st.one_of(st.uuids().map(lambda u: u.hex), st.uuids().map(lambda u: "~" + u.hex)),
    role=st.sampled_from(["user", "assistant", "system", "tool"]),
    author_name=st.one_of(st.none(), st.text(max_size=10)),
    text=st.text(max_size=40),
    marks=MARKS,
)
def test_a_plain_text_row_builds_what_from_dict_builds(
    identity: str, role: str, author_name: str | None, text: str, marks: Any
) -> None:
    fast = message_from_row(PLAIN, None, identity=identity, role=role, author_name=author_name, text=text,
                            marks=copy.deepcopy(marks))  # fmt: skip
    assert fields(fast) == fields(generic(identity, role, author_name, text, copy.deepcopy(marks)))


def test_marks_are_copies_the_framework_may_edit() -> None:
    marks = {"_group": {"id": "g", "kind": "user"}, "_excluded": False}
    message = message_from_row(PLAIN, None, identity="abc", role="user", author_name=None, text="hi", marks=marks)
    message.additional_properties["_group"]["kind"] = "summary"  # what a compaction does in place
    assert marks["_group"]["kind"] == "user"  # the loaded marks, which a commit compares against, are unchanged
    assert message.message_id == "abc" and message.additional_properties["agent_store_id"] == "abc"
