"""A Hypothesis state machine: random runs, failures, concurrent pairs, deletes, closes, forks and truncations,
checked against a plain in-memory model after every step, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from agent_framework import Message
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import text

from agent_store import ConflictError, SessionClosedError, SessionNotFoundError, Store

T = TypeVar("T")
NAMES = st.sampled_from(["a", "b", "c"])
KEYS = st.sets(st.sampled_from(["k1", "k2", "k3", "k4"]), max_size=3)


class Boom(Exception):
    pass


@dataclass
class Model:
    messages: list[str] = field(default_factory=list)
    state: dict[str, int] = field(default_factory=dict)
    closed: bool = False


class StoreMachine(RuleBasedStateMachine):
    url: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store = Store.from_url(self.url)
        self.prefix = uuid.uuid4().hex[:8] + "-"  # each example gets its own sessions: no cleanup between examples
        self.model: dict[str, Model] = {}
        self.counter = itertools.count()

    def do(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.do(self.store.close())
        self.loop.close()

    def sid(self, name: str) -> str:
        return self.prefix + name

    def message(self) -> Message:
        return Message(role="user", contents=[f"m{next(self.counter)}"])

    @rule(name=NAMES, n=st.integers(0, 3), sets=KEYS, deletes=KEYS, fail=st.booleans())
    def run(self, name: str, n: int, sets: set[str], deletes: set[str], fail: bool) -> None:
        expected = self.model.get(name)
        new = [self.message() for _ in range(n)]
        values = {k: next(self.counter) for k in sets}

        async def go() -> None:
            async with self.store.session(self.sid(name), user_id="u") as session:
                session.state["in_memory"]["messages"].extend(new)
                session.state.update(values)
                for key in deletes - sets:
                    session.state.pop(key, None)
                if fail:
                    raise Boom

        if expected is not None and expected.closed:
            with pytest.raises(SessionClosedError):
                self.do(go())
            return
        if fail:
            with pytest.raises(Boom):
                self.do(go())
            return
        self.do(go())
        model = self.model.setdefault(name, Model())
        model.messages += [m.text for m in new]
        model.state.update(values)
        for key in deletes - sets:
            model.state.pop(key, None)

    @rule(name=NAMES, first=KEYS, second=KEYS)
    def concurrent_pair(self, name: str, first: set[str], second: set[str]) -> None:
        """Two runs load the same version; the second to commit conflicts exactly when they share a key."""
        model = self.model.get(name)
        if model is not None and model.closed:
            return
        a, b = (
            self.do(self.store.load(self.sid(name), user_id="u")),
            self.do(self.store.load(self.sid(name), user_id="u")),
        )
        writes = []
        for run, keys in ((a, first), (b, second)):
            message, values = self.message(), {k: next(self.counter) for k in keys}
            run.session.state["in_memory"]["messages"].append(message)
            run.session.state.update(values)
            writes.append((message.text, values))
        self.do(a.commit())
        model = self.model.setdefault(name, Model())
        model.messages.append(writes[0][0])
        model.state.update(writes[0][1])
        if first & second:
            with pytest.raises(ConflictError):
                self.do(b.commit())
        else:
            self.do(b.commit())
            model.messages.append(writes[1][0])
            model.state.update(writes[1][1])

    @rule(name=NAMES)
    def delete(self, name: str) -> None:
        assert self.do(self.store.delete(self.sid(name), user_id="u")) is (name in self.model)
        self.model.pop(name, None)

    @rule(name=NAMES)
    def close(self, name: str) -> None:
        if name not in self.model:
            with pytest.raises(SessionNotFoundError):
                self.do(self.store.close_session(self.sid(name), user_id="u"))
            return
        self.do(self.store.close_session(self.sid(name), user_id="u"))
        self.model[name].closed = True

    @rule(name=NAMES, at=st.none() | st.integers(0, 6))
    def fork(self, name: str, at: int | None) -> None:
        source = self.model.get(name)
        new_name = f"f{next(self.counter)}"
        if source is None:
            with pytest.raises(SessionNotFoundError):
                self.do(self.store.fork(self.sid(name), user_id="u", new_id=self.sid(new_name)))
            return
        self.do(self.store.fork(self.sid(name), user_id="u", at_seq=at, new_id=self.sid(new_name)))
        kept = source.messages if at is None else source.messages[: at + 1]
        self.model[new_name] = Model(messages=list(kept), state=dict(source.state))

    @rule(name=NAMES, after=st.integers(-1, 6))
    def truncate(self, name: str, after: int) -> None:
        if name not in self.model:
            return
        removed = self.do(self.store.truncate(self.sid(name), after, user_id="u"))
        model = self.model[name]
        assert removed == max(0, len(model.messages) - (after + 1))
        model.messages = model.messages[: after + 1]

    @invariant()
    def database_equals_model(self) -> None:
        async def read() -> dict[str, Model]:
            found: dict[str, Model] = {}
            async with self.store.engine.connect() as conn:
                sessions = await conn.execute(
                    text("SELECT id, closed_at, next_seq FROM agent_sessions WHERE id LIKE :p"),
                    {"p": self.prefix + "%"},
                )
                for sid, closed_at, next_seq in sessions.all():
                    msgs = await conn.execute(
                        text("SELECT seq, text FROM agent_messages WHERE session_id = :s ORDER BY seq"), {"s": sid}
                    )
                    pairs = msgs.all()
                    assert [p[0] for p in pairs] == list(range(next_seq)), sid  # gap-free, count matches
                    state = await conn.execute(
                        text("SELECT key, value FROM agent_state WHERE session_id = :s"), {"s": sid}
                    )
                    values = {k: int(v) for k, v in state.all()}
                    found[sid[len(self.prefix) :]] = Model([p[1] for p in pairs], values, closed_at is not None)
            return found

        assert self.do(read()) == self.model


def test_the_store_behaves_like_the_model(url: str) -> None:
    async def migrate() -> None:
        async with Store.from_url(url) as store:
            await store.migrate()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(migrate())
    loop.close()
    StoreMachine.url = url
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
