"""The state codec's rules, without a database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from agent_framework import Message, register_state_type
from pydantic import BaseModel

from agent_store import InvalidValueError
from agent_store.db.codec import decode_state, dumps, encode_state


class Preferences(BaseModel):
    theme: str
    tags: list[str]


register_state_type(Preferences, type_id="tests.preferences")


@dataclass
class Point:
    x: int
    y: int

    def to_dict(self) -> dict[str, Any]:
        return {"x": self.x, "y": self.y}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Point:
        return cls(data["x"], data["y"])


register_state_type(Point, type_id="tests.point")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(Preferences(theme="dark", tags=["a"]), id="registered-pydantic"),
        pytest.param({"p": Point(1, 2), "more": [Point(3, 4)]}, id="registered-to-dict"),
        pytest.param(Message(role="user", contents=["hi"]), id="message"),
        pytest.param({"type": "tests.point", "x": 1, "y": 2}, id="plain-dict-with-a-registered-type-name"),
        pytest.param({"$state": {"type": "tests.point", "x": 1, "y": 2}}, id="plain-dict-shaped-like-our-tag"),
        pytest.param({"$tuple": [1], "other": 2}, id="two-keys-is-not-a-tag"),
    ],
)
def test_round_trip(value: Any) -> None:
    restored = decode_state(encode_state(value, key="k"), key="k")
    if isinstance(value, Message):
        assert restored.to_dict() == value.to_dict()
    else:
        assert restored == value
    assert type(restored) is type(value)


def test_an_unregistered_object_with_to_dict_is_refused_not_flattened() -> None:
    class Loose:
        def to_dict(self) -> dict[str, int]:
            return {"a": 1}

    with pytest.raises(InvalidValueError, match=r"state\['k'\]\['inner'\]: a Loose cannot be stored"):
        encode_state({"inner": Loose()}, key="k")


def test_a_stored_type_that_is_not_registered_here_fails_loudly_on_load() -> None:
    with pytest.raises(InvalidValueError, match="not registered"):
        decode_state({"$state": {"type": "nobody.registered.this"}}, key="k")


def test_dumps_keeps_unicode_readable_and_refuses_oversized_documents() -> None:
    assert dumps({"name": "李明"}, where="x") == '{"name":"李明"}'
    with pytest.raises(InvalidValueError, match="over the limit of 10"):
        dumps("x" * 20, where="x", max_bytes=10)


def test_an_escaped_backslash_u0000_is_not_a_nul() -> None:
    assert dumps("literal \\u0000 text", where="x") == '"literal \\\\u0000 text"'
    with pytest.raises(InvalidValueError, match="NUL"):
        dumps("a\\\x00", where="x")


def test_made_ids_are_unique_twenty_characters_and_sort_by_time() -> None:
    import time

    from agent_store.db import ids

    made = [ids.random_id() for _ in range(50_000)] + [ids.run_id() for _ in range(50_000)]
    assert len(set(made)) == len(made) and {len(i) for i in made} == {20}
    assert set("".join(made)) <= set("0123456789abcdefghjkmnpqrstvwxyz")
    earlier = ids.run_id()
    time.sleep(0.002)
    assert ids.run_id() > earlier  # the time comes first, in milliseconds
    # The time is the first 42 of the 100 bits: decoded back, it is now.
    value = int("".join(format("0123456789abcdefghjkmnpqrstvwxyz".index(c), "05b") for c in ids.run_id()), 2)
    assert abs((value >> 58) - time.time_ns() // 1_000_000) < 1_000
