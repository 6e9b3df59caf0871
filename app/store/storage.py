"""Whether this process's database takes writes now, for ``/api/health``
and the sweeper: the outages its writes met (``jobdeck.store.faults``) and,
when health is asked, a small real write that asks again.

A load balancer polls health often and must see both edges: the process
turns 503 when writes fail, and back to 200 once they land, with no
traffic (a process the balancer took out of service gets none). So every
outage a real write meets is noted at once (``failed``: the API's error
answers, the store's write transactions, the pool's acknowledgements), and
the health check writes one row itself (``probe``): while an outage is
noted, once ``OUTAGE_HOLD`` seconds passed without another failure, to see
it end; otherwise once every ``IDLE_PROBE`` seconds, to see one begin on a
quiet process. However often health is polled, a process writes at most
that much, one probe at a time, and a probe never waits long for a lock: a
database that is only busy is not an outage, and health must answer
quickly.

The probe is an upsert of one ``maintenance_marks`` row
(``storage_probe``, the time of the last write that proved the database
writable), which needs the same room in the log and the file as any
write: on a full SQLite disk every write failed, updates included.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from jobdeck.store.engine import LOCK_WAIT
from jobdeck.store.faults import LOCK_TIMEOUT, STATEMENT_TIMEOUT, Outage, outage_of
from jobdeck.store.models import maintenance_marks
from jobdeck.store.statements import dialect_insert
from sqlalchemy import Engine

log = logging.getLogger("jobdeck.store")

PROBE_MARK = "storage_probe"
PROBE_EVERY = 1.0
"""Seconds between probes while an outage is noted."""
IDLE_PROBE = 5.0
"""Seconds between probes while none is: how soon a quiet process sees one."""
OUTAGE_HOLD = 5.0
"""Seconds health says 503 after a write met an outage, whatever a probe
says: the probe's small row can fit where a job's does not (a nearly full
disk, a PostgreSQL table that cannot grow while others can). A write the
pool lands meanwhile ends it at once (``wrote``)."""
PROBE_WAIT = 0.5
"""Seconds a probe waits for the write lock; a busy database is not an outage."""


class StorageHealth:
    """The write health of one store (one engine, one process)."""

    def __init__(self, engine: Engine, write_lock: Any) -> None:
        self.engine = engine
        self._write_lock = write_lock
        self.where: str | None = None
        """The folder of a SQLite database file, whose file system says which
        refusal an I/O error was (``faults.outage_of``)."""
        database = engine.url.database
        if engine.dialect.name == "sqlite" and database and database != ":memory:":
            self.where = str(Path(database).resolve().parent)
        self._state = threading.Lock()
        self._probing = threading.Lock()
        self._outage: Outage | None = None
        self._since = 0.0
        self._last_failure = float("-inf")
        self._last_probe = float("-inf")

    def outage_of(self, exc: BaseException) -> Outage | None:
        """``faults.outage_of`` for this store's database."""
        return outage_of(exc, self.where)

    def failed(self, outage: Outage) -> None:
        """A real write met ``outage``: health says so until a write lands.
        Not a request's lock or statement timeout: a lock held longer than a
        request may wait says nothing of the storage, and behind one ``LOCK
        TABLE`` every process would turn unhealthy at once."""
        if outage in (LOCK_TIMEOUT, STATEMENT_TIMEOUT):
            return
        now = time.monotonic()
        with self._state:
            if self._outage is None:
                self._since = now
                log.error("database writes fail: %s", outage.message)
            self._outage = outage
            self._last_failure = now

    def note(self, exc: BaseException) -> Outage | None:
        """``failed`` when ``exc`` is an outage; returns it (None otherwise)."""
        outage = self.outage_of(exc)
        if outage is not None:
            self.failed(outage)
        return outage

    def wrote(self) -> None:
        """A write landed: the outage, if one was noted, is over."""
        with self._state:
            if self._outage is None:
                return
            log.warning("database writes land again after %.1f s", time.monotonic() - self._since)
            self._outage = None

    @property
    def outage(self) -> Outage | None:
        """The outage noted last, until a write lands."""
        return self._outage

    def failed_within(self, seconds: float) -> bool:
        """Whether a write of this process met an outage in the last ``seconds``."""
        return time.monotonic() - self._last_failure < seconds

    def problem(self, now: datetime) -> str | None:
        """Why this process's writes fail now, or None: ``/api/health``'s
        check. Probes first when one is due and none is running."""
        mono = time.monotonic()
        held = mono - self._last_failure < OUTAGE_HOLD
        due = PROBE_EVERY if self._outage is not None else IDLE_PROBE
        if not held and mono - self._last_probe >= due and self._probing.acquire(blocking=False):
            try:
                self._last_probe = mono
                self.probe(now)
            except Exception:  # a bug, not an outage: say so in the log, and health answers on what it knows
                log.exception("the storage probe failed")
            finally:
                self._probing.release()
        outage = self._outage
        if outage is None:
            return None
        return f"{outage.message} ({outage.cause}; writes failing for {time.monotonic() - self._since:.0f} s)"

    def probe(self, now: datetime) -> bool | None:
        """Write the probe row: True when it landed, False when it met an
        outage (noted), None when the write lock stayed taken (a busy
        database says nothing either way). Any other error is raised."""
        try:
            self._write_probe(now)
        except Exception as exc:
            if _lock_wait(exc):
                return None
            outage = self.outage_of(exc)
            if outage is None:
                raise
            self.failed(outage)
            return False
        self.wrote()
        return True

    def _write_probe(self, now: datetime) -> None:
        insert = dialect_insert(self.engine.dialect.name)(maintenance_marks).values(key=PROBE_MARK, value=now)
        stmt = insert.on_conflict_do_update(index_elements=["key"], set_={"value": insert.excluded.value})
        if self._write_lock is None:  # PostgreSQL: lock and statement waits bounded in the transaction
            with self.engine.begin() as conn:
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(PROBE_WAIT * 1000)}ms'")
                conn.exec_driver_sql(f"SET LOCAL statement_timeout = '{int(PROBE_WAIT * 4000)}ms'")
                conn.execute(stmt)
            return
        if not self._write_lock.acquire(timeout=PROBE_WAIT):  # this process is writing: not an outage
            raise _Busy()
        try:
            with self.engine.connect() as conn, conn.execution_options(**{LOCK_WAIT: PROBE_WAIT}).begin():
                conn.execute(stmt)
        finally:
            self._write_lock.release()


class _Busy(Exception):
    """The probe found this process's own write lock taken."""


def _lock_wait(exc: BaseException) -> bool:
    """The probe gave up waiting for a lock (SQLite busy, PostgreSQL's
    lock_timeout or statement_timeout), which proves nothing."""
    orig = getattr(exc, "orig", exc)
    if isinstance(exc, _Busy):
        return True
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (5, 6)
    return getattr(orig, "sqlstate", None) in ("55P03", "57014")
