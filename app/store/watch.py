"""The SQLite commit watcher's two reads (``jobdeck.worker.commit_watch``): has
another connection committed, and is a job this pool could claim due now.
Both run on the watcher's own plain ``sqlite3`` connection."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from functools import lru_cache

from jobdeck.store import claim_statements
from jobdeck.store.sqlite import Compiled, db_time
from sqlalchemy import literal_column

DATA_VERSION = "PRAGMA data_version"
"""Changes whenever another connection commits to the file; costs a look at
the WAL index in shared memory (``jobdeck.worker.commit_watch``)."""


def data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute(DATA_VERSION).fetchone()[0])


@lru_cache(maxsize=256)
def _probe(n_types: int, n_queues: int | None, n_priorities: int | None) -> Compiled:
    stmt = claim_statements.due(
        n_types, n_queues, 0, columns=(literal_column("1"),), lock=False, n_priorities=n_priorities
    ).limit(1)
    return Compiled(stmt, tuple(claim_statements.due_order(n_types, n_queues, 0, n_priorities)))


def claimable_due(conn: sqlite3.Connection, now: datetime, types: list[str], queues: list[str] | None) -> bool:
    """Is a job of these types (and queues) claimable now? The claim's own
    pick with LIMIT 1, on the caller's plain ``sqlite3`` connection (the
    commit watcher's, in autocommit: no lock held after it returns); served
    by the claim's partial index, read only where the named priorities'
    due jobs lie (``claim_statements.claimable_priorities``). Both reads
    see one snapshot (a read transaction, ended before this returns)."""
    conn.execute("BEGIN")
    try:
        priorities = claim_statements.claimable_priorities(conn.cursor())
        if priorities == []:
            return False
        n = None if priorities is None else len(priorities)
        probe = _probe(len(types), None if queues is None else len(queues), n)
        params = probe.params((db_time(now), *types, *(queues or ()), *(priorities or ())))
        return conn.execute(probe.text, params).fetchone() is not None
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
