"""Search over stored messages: words, phrases, OR and exclusions, Chinese inside words; one user's at a time.

    query.py   the query language, its SQL on each backend (PostgreSQL's indexes, SQLite's FTS5), the cursor

Uses db/ only; the Store and the search tool (agent_framework/search_tool.py) call it.
"""
