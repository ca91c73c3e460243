"""The database layer: the engine and its pool, the tables, the statements, and the rows objects become.

    engine.py        the engine a Store uses: drivers, SQLite's pragmas, the LIFO pool, the schema check
    connections.py   checkout and cleanup that never replace the caller's error with their own
    translation.py   the error boundary: driver, pool and Alembic errors become agent_store's (errors.py)
    database.py      Database: every way agent_store uses a connection (transaction, one statement, one hop)
    driver_path.py   a run's load and commit straight on the driver (asyncpg, aiosqlite)
    tables.py        the schema as SQLAlchemy tables (created and evolved only by migrations/)
    load_statement.py, statements.py   the SQL of a run's load, and of its commit and the lifecycle
    branch_deletes.py   deleting sessions with their branches, under lock; a restart that keeps a live branch
    codec.py, message_rows.py, scopes.py   state values and messages as JSON rows; which table a key lives in
    runlog.py, erasures.py, stored_twice.py   the run log, the erasure fence, naming an id stored twice
    log_redaction.py, text_match.py   no stored values in driver logs; SQLite's search functions

It imports nothing of the layers above it: run/, operations/, search/, the Store, the seams, the CLI, the browser.
"""
