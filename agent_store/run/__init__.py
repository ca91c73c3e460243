"""The run protocol: load a session, let the agent run on it, commit what changed in one transaction.

    load.py            step 1: one read (load_statement.py), the AgentSession rebuilt: a Run
    delta.py           the pure half: what was loaded (Snapshot), what changed since (Delta), tool-history repair
    commit.py          step 3: Run.commit: the common case in one call, else the checked transaction; retries
    one_call.py        what a commit takes of its run (OneCall): nothing else of the run is read below
    commit_postgresql.py, commit_sqlite.py   the one call per backend (one round trip; one hop to its thread)
    checked_commit.py  the checked transaction: every lock and check, every error named
    stored_session.py  the AgentSession a store hands out, which knows its run (commit.run_of reads it)
    replays.py         which messages of a provider's save replay the stored tail
    read_times.py      when what a seam writes was read: the erasure fence for writes that carry only a key

Between load and commit the model thinks and no connection is held. Uses db/ only.
"""

from agent_store.run.commit import ERASURE_MARGIN, HISTORY_KEY, KEY_MAX, Run, run_of
from agent_store.run.stored_session import StoredSession

__all__ = ["ERASURE_MARGIN", "HISTORY_KEY", "KEY_MAX", "Run", "StoredSession", "run_of"]
