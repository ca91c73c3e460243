"""Search over stored messages: words, phrases, OR and exclusions, Chinese inside words; one user's at a time.

    query.py      the query language, its SQL on each backend (PostgreSQL's indexes, SQLite's FTS5), the cursor
    embedders.py  text to unit vectors, offline (wordllama, e5) or through the framework's embedding clients
    vectors.py    the message vectors: the backfill that writes them, the scan that ranks them by meaning
    hybrid.py     keyword, vector and hybrid (reciprocal rank fusion) ranking, with keyword search's scoping

Uses db/ only; the Store and the search tool (agent_framework/search_tool.py) call it.
"""
