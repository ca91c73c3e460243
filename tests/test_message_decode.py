"""The load's fast way to rebuild a plain text message builds exactly what the framework's ``from_dict`` does.

Every field of the Message and of its Content is compared (``vars``, not only ``to_dict``): the framework reads
attributes that ``to_dict`` leaves out, such as the de-duplication handle ``id``.
"""

from __future__ import annotations

import copy
import json
from typing import Any
from unittest import mock

from agent_framework import Content, Message
from helpers import rows
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from agent_store import Store
from agent_store.db import message_decode
from agent_store.db.message_decode import message_from_row
from agent_store.db.message_rows import MESSAGE_ID_MARK, TEXT_FROM_COLUMN, full_body, give_id, with_marks

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


def generic(body: Any, identity: str, role: str, author_name: str | None, text: str, marks: Any) -> Message:
    """The way every other shape is built: the full to_dict() through Message.from_dict."""
    full = with_marks(
        full_body(body or PLAIN, None, message_id=identity, role=role, author_name=author_name, text=text), marks
    )
    message = Message.from_dict(dict(full))
    message.additional_properties["agent_store_id"] = identity
    if message.message_id is None:
        give_id(message, identity)
    return message


def fields(message: Message) -> dict[str, Any]:
    found = {k: v for k, v in vars(message).items() if k != "contents"}
    return {**found, "contents": [vars(c) for c in message.contents], "dict": message.to_dict()}


@settings(max_examples=300, deadline=None)
@given(
    # None: the load statement's plain text body; with a message_id: a model client's reply
    body=st.one_of(st.sampled_from([PLAIN, None]), st.text(max_size=12).map(lambda i: {**PLAIN, "message_id": i})),
    copying=st.booleans(),  # the copied attributes, and the constructors they are checked against at import
    identity=st.one_of(st.uuids().map(lambda u: u.hex), st.uuids().map(lambda u: "~" + u.hex)),
    role=st.sampled_from(["user", "assistant", "system", "tool"]),
    author_name=st.one_of(st.none(), st.text(max_size=10)),
    text=st.text(max_size=40),
    marks=MARKS,
)
def test_a_plain_text_row_builds_what_from_dict_builds(
    body: Any, copying: bool, identity: str, role: str, author_name: str | None, text: str, marks: Any
) -> None:
    assert message_decode._TEMPLATES.copying  # this framework's classes are plain: the copying way is the one used
    templates = message_decode._TextTemplates()
    templates.copying = copying
    with mock.patch.object(message_decode, "_TEMPLATES", templates):
        fast = message_from_row(body, None, identity=identity, role=role, author_name=author_name, text=text,
                                marks=copy.deepcopy(marks))  # fmt: skip
    assert fields(fast) == fields(generic(body, identity, role, author_name, text, copy.deepcopy(marks)))


def test_marks_are_copies_the_framework_may_edit() -> None:
    marks = {"_group": {"id": "g", "kind": "user"}, "_excluded": False}
    message = message_from_row(PLAIN, None, identity="abc", role="user", author_name=None, text="hi", marks=marks)
    message.additional_properties["_group"]["kind"] = "summary"  # what a compaction does in place
    assert marks["_group"]["kind"] == "user"  # the loaded marks, which a commit compares against, are unchanged
    assert message.message_id == "abc" and message.additional_properties["agent_store_id"] == "abc"


def test_the_copying_way_is_refused_when_it_would_not_match_the_constructors() -> None:
    templates = message_decode._TextTemplates()
    assert templates._copy_matches()
    del templates.content["annotations"]  # as if the framework's Content grew a field the templates lack
    assert not templates._copy_matches()


async def test_a_load_hands_back_every_shape_as_stored_with_plain_text_bodies_not_decoded(store: Store) -> None:
    """Plain text rows come back NULL-bodied from the statement and are built from their columns; the others
    through from_dict. Both kinds, mixed, load as what was stored; a plain body written by hand in another
    spelling (a space: what another tool would write) still loads, through the generic way."""
    stored = [
        Message(role="user", contents=["what is 2+2?"]),
        Message(role="assistant", contents=[Content.from_function_call(call_id="c1", name="add", arguments={"a": 2})]),
        Message(role="tool", contents=[Content.from_function_result(call_id="c1", result="4")]),
        Message(role="assistant", contents=["4"], author_name="Calc", message_id="resp-1"),
        Message(role="user", contents=['{"$text":1}']),  # a text that is the plain body's own spelling
    ]
    async with store.session("shapes") as session:
        session.state["in_memory"]["messages"] = list(stored)
    bodies = [
        b for (b,) in await rows(store, "SELECT body FROM agent_messages WHERE session_id = 'shapes' ORDER BY seq")
    ]
    decoded = [json.loads(b) if isinstance(b, str) else b for b in bodies]
    assert decoded[0] == decoded[4] == {TEXT_FROM_COLUMN: 1} != decoded[1]
    assert decoded[3] == {TEXT_FROM_COLUMN: 1, "message_id": "resp-1"}  # a reply: the provider's id kept
    async with store.engine.begin() as conn:  # the first row's body respelled, as another writer might
        await conn.execute(text("UPDATE agent_messages SET body = :b WHERE session_id = 'shapes' AND seq = 0"),
                           {"b": '{"$text": 1}'})  # fmt: skip
    run = await store.load("shapes")
    loaded = run.history
    await run.discard()
    assert [m.to_dict(exclude={"additional_properties"}) for m in loaded] == [
        m.to_dict(exclude={"additional_properties"}) for m in stored
    ]
    assert [m.text for m in loaded] == ["what is 2+2?", "", "", "4", '{"$text":1}']
    assert all(isinstance(m.additional_properties["agent_store_id"], str) for m in loaded)
