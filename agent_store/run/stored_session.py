"""The ``AgentSession`` a store hands out: it knows the run that loaded it (``commit.run_of`` reads the link)."""

from __future__ import annotations

import copy
import weakref
from typing import Any

from agent_framework import AgentSession


class StoredSession(AgentSession):
    """The ``AgentSession`` a store hands out: an ordinary session that also knows the run that loaded it.

    The framework seams (history provider, session store, memory) find the run through it. The link is not
    serialized (``to_dict``) and not copied: a deep copy is a plain ``AgentSession``.
    """

    # The run that loaded it (commit.py's Run; typed where it is read, by run_of, so this module imports nothing
    # above): its attributes, which never refer back to the session, and a weak reference to the Run itself.
    # Not the Run: the Run holds the session, and a cycle between them would keep every loaded message alive
    # until a garbage collection (promoted meanwhile: the long pauses of a whole-history service,
    # bench/studies/gc_pauses.py).
    # run_of gives back the Run while anything holds it, else a new Run on the same attributes.
    _run_attributes: dict[str, Any] | None = None
    _run_ref: weakref.ref[Any] | None = None

    def link(self, run: Any) -> None:
        self._run_attributes, self._run_ref = run.__dict__, weakref.ref(run)

    def __deepcopy__(self, memo: dict[int, Any]) -> AgentSession:
        clone = AgentSession(
            session_id=self.session_id, service_session_id=copy.deepcopy(self.service_session_id, memo)
        )
        clone.state = copy.deepcopy(self.state, memo)
        return clone
