"""The ``AgentSession`` a store hands out: it knows the run that loaded it (``commit.run_of`` reads the link)."""

from __future__ import annotations

import copy
from typing import Any

from agent_framework import AgentSession


class StoredSession(AgentSession):
    """The ``AgentSession`` a store hands out: an ordinary session that also knows the run that loaded it.

    The framework seams (history provider, session store, memory) find the run through it. The link is not
    serialized (``to_dict``) and not copied: a deep copy is a plain ``AgentSession``.
    """

    _run: Any = None  # the Run (commit.py); typed where it is read, by run_of, so this module imports nothing above

    def __deepcopy__(self, memo: dict[int, Any]) -> AgentSession:
        clone = AgentSession(
            session_id=self.session_id, service_session_id=copy.deepcopy(self.service_session_id, memo)
        )
        clone.state = copy.deepcopy(self.state, memo)
        return clone
