"""The run journal's NOTIFY channel (journal/listen.py), as an outside review of row-level security found it: any
role that can connect can LISTEN and NOTIFY on any channel, past every policy. So a payload names its run by a
hash that says neither its user nor its id, and a cancel heard is only a reason to read the run's row: a forged
one (in the current form or an earlier version's) cancels nothing, while a real cancel is still heard at once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from helpers import raw_connect, until

from agent_store import Store
from agent_store.db.journal_tables import NOTIFY_CHANNEL
from agent_store.journal.listen import payload


async def test_a_notify_names_no_one_and_a_forged_cancel_cancels_nothing(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
    async with Store.from_url(pg_url) as store:
        journal = store.journal(batch_events=1, lease_s=60)
        journal.heartbeat_s = 3600  # no heartbeat brings a cancel here: only the NOTIFY and the row it sends to
        spy = await raw_connect(pg_url)
        heard: list[str] = []
        await spy.add_listener(NOTIFY_CHANNEL, lambda *args: heard.append(args[3]))
        try:
            writer = await journal.start("bobs-secret-run", user_id="bob")
            await writer.append({"step": 1})
            await until(lambda: heard, "a batch's NOTIFY")
            assert not any("bob" in said for said in heard), heard  # neither the user nor the run's id
            key = json.loads(heard[0])[1]
            checked: list[bool] = []  # each cancel heard is checked against the run's row: what it said
            real_check = journal.cancel_asked

            async def check(*args: Any, **kwargs: Any) -> bool:
                checked.append(await real_check(*args, **kwargs))
                return checked[-1]

            journal.cancel_asked = check  # type: ignore[method-assign]
            async with journal.wakeups.watch("bob", "after the forgeries") as woken:
                for forged in (["cancel", key], ["cancel", "bob", "bobs-secret-run"]):  # today's form, an earlier one
                    await spy.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, json.dumps(forged))
                # NOTIFYs arrive in the order they were sent: once this one has, the forged ones were heard
                await spy.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL,
                                  payload("batch", "bob", "after the forgeries"))  # fmt: skip
                await asyncio.wait_for(woken.wait(), 60)
            await until(lambda: checked and not journal.wakeups._checking, "the forged cancels' checks")
            assert not any(checked) and not writer.cancel_requested  # the row says no cancel was asked
            await writer.append({"step": 2})  # the run goes on
            assert await journal.cancel("bobs-secret-run", user_id="bob") is True
            await until(lambda: writer.cancel_requested, "the cancel")  # heard at once, by the NOTIFY and the row
            await writer.finish("cancelled")
            assert (await journal.read("bobs-secret-run", user_id="bob"))[1]["status"] == "cancelled"
        finally:
            await spy.close()
            await journal.close()
