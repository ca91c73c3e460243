"""The read-only transcript browser (``agent-store ui``; the ui extra): sessions, transcripts, search.

    app.py       the Starlette app: routes, the Host and token gates, read-only by construction
    panels.py    what a session page shows beside the transcript (state, lineage, checkpoints)
    templates/   Jinja2 pages; every stored string is escaped, and the CSP forbids scripts

It uses the Store and operations/lifecycle.py.
"""
