"""Issue 22, item 11: with every logger at DEBUG, no message text or state value reaches a log record.

Statement parameters and result rows are what users wrote. aiosqlite logs each call it runs, arguments included;
SQLAlchemy's ``echo="debug"`` logs each result row (log_redaction.py). A turn through every write path (the
checked commit of a serialized run, the one-call commit, an update, an import) and every read path (load,
transcript page, listing, search, export), on both backends, with a marker in each kind of stored value.
"""

from __future__ import annotations

import logging
import traceback
from datetime import UTC, datetime

import pytest
from agent_framework import Agent

from agent_store import Store, run_of
from agent_store.db.ledger import ModelCall

MARKER = "s3cr3t-标记"


def carried(record: logging.LogRecord) -> str:
    """Everything a handler could write out of a record."""
    parts = [str(record.msg), repr(record.args), record.getMessage()]
    if record.exc_info and record.exc_info[1] is not None:
        parts += traceback.format_exception(record.exc_info[1])
    return " ".join(parts)


async def test_no_message_text_or_state_value_reaches_any_log(
    url: str, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # the root logger: every logger that has no level of its own
    caplog.set_level(logging.DEBUG, logger="sqlalchemy")  # SQLAlchemy sets its own to WARNING on import
    async with Store.from_url(url, echo="debug") as store:  # and its echo flag, as a debugging user sets it
        await store.migrate()
        caplog.clear()
        async with store.session("s", user_id="u", serialized=True) as session:  # the checked commit path
            session.state["note"] = f"{MARKER} in state"
            session.state["user:note"] = {"deep": [f"{MARKER} in user state"]}
            await agent.run(f"{MARKER} in a message", session=session)
        async with store.session("s", user_id="u") as session:  # the one-call commit path
            session.state["note"] = f"{MARKER} changed"
            await agent.run(f"{MARKER} again", session=session)
            ledgered = ModelCall(
                called_at=datetime.now(UTC),
                usage={"input_token_count": 1},
                model=MARKER,
                agent_name=MARKER,
                finish_reason=MARKER,
            )  # the usage ledger's text too
            run_of(session).calls.append(ledgered)  # type: ignore[union-attr]
        assert [line.key for line in await store.usage.report("model")] == [MARKER]
        await store.update("s", user_id="u", title=MARKER, metadata={"topic": MARKER})
        assert any(MARKER in m.text for m in await store.messages("s", user_id="u"))
        assert (await store.search(MARKER, user_id="u")).items
        await store.list_sessions(user_id="u")
        lines = [line async for line in store.export(user_id="u")]
        await store.delete("s", user_id="u")
        assert (await store.import_lines(lines)).imported == 1
        async with store.session("s", user_id="u") as session:
            assert session.state["note"] == f"{MARKER} changed"
    assert len(caplog.records) > 20  # the loggers did run, with these records ...
    assert [r.name for r in caplog.records if MARKER in carried(r)] == []  # ... and none carries the marker
    assert MARKER not in caplog.text
