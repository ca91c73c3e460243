"""Operations on stored sessions, outside any run: what an operator or an application's back office calls.

    lifecycle.py   list, get, page a transcript, update (title, metadata, TTL), close, clear, delete, stats
    retention.py   purge expired sessions and old checkpoints in bounded batches; erase everything of a user
    branching.py   fork a conversation at a message; truncate it (tool calls kept with their results)
    transfer.py    export to JSON Lines and import back, all or nothing
    import_rows.py every imported row checked by the API's own rules

Uses db/ only; the Store (store.py) is their front.
"""
