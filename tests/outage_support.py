"""Storage outages without mounting anything, for the quick and browser
tests: each connection of a deck's engine is held, at checkout, to what the
test sets: ``read_only`` (``PRAGMA query_only``: every write fails with
SQLite's own ``SQLITE_READONLY``) or ``max_pages`` (``PRAGMA
max_page_count``: a write that needs a new page fails with ``SQLITE_FULL``).
Call ``deck.store.engine.dispose()`` after a change so pooled connections
are checked out again under it."""

from __future__ import annotations

from typing import Any

from jobdeck.deck import Jobdeck
from sqlalchemy import event


class Limits:
    """What each connection of an engine is held to at checkout."""

    def __init__(self, deck: Jobdeck) -> None:
        self.read_only = False
        self.max_pages: int | None = None
        self.probes = 0
        event.listen(deck.store.engine, "checkout", self._apply)
        probe = deck.store.storage._write_probe

        def counted(now: Any) -> None:
            self.probes += 1
            probe(now)

        deck.store.storage._write_probe = counted  # type: ignore[method-assign]

    def _apply(self, dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        dbapi_conn.execute(f"PRAGMA query_only = {int(self.read_only)}")
        pages = self.max_pages or 1 << 30
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

    def fill(self, deck: Jobdeck) -> None:
        """The database may not grow by a page from now on."""
        raw = deck.store.engine.raw_connection()
        try:
            self.max_pages = raw.driver_connection.execute("PRAGMA page_count").fetchone()[0]
        finally:
            raw.close()
