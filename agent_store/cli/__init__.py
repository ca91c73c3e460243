"""The command line, ``agent-store``: one line per error, ``--json`` for scripts, never a traceback.

    commands.py      the commands (demo, upgrade, check, sessions, show, export, import, purge, erase, ...)
    support.py       the store a command opens, and its errors as one line
    search.py        search, and ``ui`` (serves browser/)
    checkpoints.py   workflow checkpoints: list, show, delete
    demo.py          the offline demo on the embedded SQLite default

It uses the Store; ``agent_store.cli:main`` is the entry point.
"""

from agent_store.cli.commands import main

__all__ = ["main"]
