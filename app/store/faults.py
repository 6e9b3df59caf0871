"""Which database errors are outages, in one place, and how to make a value
storable before it is written.

A retry loop that retries an error that can never succeed wedges whatever
waits behind it: a handler's error message with a NUL byte, refused by
PostgreSQL's text type on every attempt, held the pool's acknowledgements
(and so every later job) forever. So ``outage_of`` names the errors that
say the database (or its storage) cannot take writes right now, and nothing
else: the worker pool retries exactly those (``is_transient``), the API
and the dashboard answer them 503, or 507 for a full disk, with
``Retry-After`` and the cause (``is_unavailable``), and everything else is a
fault of the value or of the code, handled once and not retried.

Storage outages are outages: a full disk (SQLite's ``SQLITE_FULL``,
PostgreSQL's 53100), a read-only file system (``SQLITE_READONLY``, or an
``EROFS`` that SQLite reports as an I/O error), a server out of memory
(53200) or out of connection slots (53300) each pass once a person or the
load acts, and a write retried then succeeds.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass

from jobdeck.core.validation import storable_text
from sqlalchemy import exc as sa_exc


@dataclass(frozen=True)
class Outage:
    """Why the database cannot take writes now: ``cause`` (a stable name for
    clients and logs), the HTTP ``status`` and ``retry_after`` seconds of the
    answer, and the ``message`` a person reads."""

    cause: str
    status: int
    retry_after: int
    message: str


UNAVAILABLE = Outage("unavailable", 503, 1, "the database is unavailable right now; retry shortly")
DISK_FULL = Outage("disk_full", 507, 30, "the database's disk is full: nothing can be written until space is freed")
READ_ONLY = Outage(
    "read_only", 503, 30, "the database's storage is read-only: nothing can be written until it is writable again"
)
STORAGE_ERROR = Outage("storage_error", 503, 30, "the database's storage failed a write (I/O error)")
OUT_OF_MEMORY = Outage("out_of_memory", 503, 5, "the database is out of memory")
TOO_MANY_CONNECTIONS = Outage(
    "too_many_connections", 503, 1, "the database has no free connection slots (too many connections)"
)
LOCK_TIMEOUT = Outage(
    "lock_timeout",
    503,
    1,
    "a database lock was held longer than this request may wait (request_lock_timeout): "
    "nothing of it was stored; retry shortly",
)
STATEMENT_TIMEOUT = Outage(
    "statement_timeout",
    503,
    1,
    "the database cancelled a statement of this request (request_statement_timeout): "
    "nothing of it was stored; retry shortly",
)

# SQLSTATEs after which the same statement can succeed on a later try.
_SQLSTATES = {
    "40001": UNAVAILABLE,  # serialization_failure
    "40P01": UNAVAILABLE,  # deadlock_detected
    "55P03": LOCK_TIMEOUT,  # lock_not_available (lock_timeout)
    "57014": STATEMENT_TIMEOUT,  # query_canceled (statement_timeout, pg_cancel_backend)
    "57P01": UNAVAILABLE,  # admin_shutdown (pg_terminate_backend, a fast shutdown)
    "57P02": UNAVAILABLE,  # crash_shutdown
    "57P03": UNAVAILABLE,  # cannot_connect_now (starting up, recovering)
    "53100": DISK_FULL,  # disk_full
    "53200": OUT_OF_MEMORY,  # out_of_memory
    "53300": TOO_MANY_CONNECTIONS,  # too_many_connections (the server's or a role's or database's limit)
    "25006": READ_ONLY,  # read_only_sql_transaction: a standby, or default_transaction_read_only
}
_SQLSTATE_CLASSES = {"08": UNAVAILABLE}  # connection exceptions

# A connection the server refused at start-up carries no SQLSTATE in psycopg,
# only the server's message (in English unless lc_messages says otherwise).
_CONNECT_MESSAGES = {
    "too many connections": TOO_MANY_CONNECTIONS,  # the server's, a role's or a database's limit
    "too many clients already": TOO_MANY_CONNECTIONS,
    "remaining connection slots are reserved": TOO_MANY_CONNECTIONS,
    "out of memory": OUT_OF_MEMORY,
    "no space left on device": DISK_FULL,
}

# SQLite's primary result codes (``sqlite_errorcode & 0xFF``).
_SQLITE_CODES = {
    5: UNAVAILABLE,  # SQLITE_BUSY: another connection holds the lock past busy_timeout
    6: UNAVAILABLE,  # SQLITE_LOCKED
    7: OUT_OF_MEMORY,  # SQLITE_NOMEM
    8: READ_ONLY,  # SQLITE_READONLY (a read-only file or file system, a moved database file)
    10: STORAGE_ERROR,  # SQLITE_IOERR: refined by the file system when it is known (``outage_of``'s ``where``)
    13: DISK_FULL,  # SQLITE_FULL: "database or disk is full"
    14: STORAGE_ERROR,  # SQLITE_CANTOPEN: the file (or its -wal, -shm) cannot be opened now
}
_SQLITE_IOERR_NOMEM = 3082
_SQLITE_MESSAGES = {"database is locked": UNAVAILABLE, "database table is locked": UNAVAILABLE,
                    "database is busy": UNAVAILABLE, "database or disk is full": DISK_FULL,
                    "attempt to write a readonly database": READ_ONLY}  # fmt: skip


def outage_of(exc: BaseException, where: str | None = None) -> Outage | None:
    """The outage a failed database call shows, or None when it is not one
    (a value the database refuses, a constraint, a bug): the connection was
    lost or could not be made, the database was locked or busy, a
    serialization failure, deadlock or lock timeout; or the storage refused
    the write (full, read-only, out of memory, out of connections).

    ``where`` is the folder of a SQLite database: SQLite reports a write
    that the kernel refused with ``EROFS`` or ``ENOSPC`` as a plain I/O
    error, and its file system then says which it was."""
    if isinstance(exc, (sa_exc.TimeoutError, sa_exc.DisconnectionError)) or _checkout_exhausted(exc):
        return UNAVAILABLE  # the pool had no connection to give, or it was dead
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return UNAVAILABLE
        exc = exc.orig  # type: ignore[assignment]
    if isinstance(exc, sqlite3.Error):
        outage = _sqlite_outage(exc)
        if outage is STORAGE_ERROR and where is not None:
            return _file_system_outage(where)
        return outage
    return _postgres_outage(exc)


def _checkout_exhausted(exc: BaseException) -> bool:
    """SQLAlchemy's pool gave up handing out a connection: each one it tried
    failed its ping at checkout (``jobdeck.store.engine``), as while a burst of
    backend terminations lasts. The pool says so with a plain
    InvalidRequestError, not a DisconnectionError; a closed Connection used
    again is a ResourceClosedError, a bug, and stays one."""
    return type(exc) is sa_exc.InvalidRequestError and str(exc) == "This connection is closed"


def is_transient(exc: BaseException) -> bool:
    """True when the failed database call can succeed if simply tried again,
    once the outage has passed (``outage_of``)."""
    return outage_of(exc) is not None


def is_unavailable(exc: BaseException) -> bool:
    """The database cannot take writes right now: the HTTP answer is 503
    (507 for a full disk) with ``Retry-After``, not 500. The same test as
    ``is_transient``, so what the pool retries is what the API asks its
    clients to retry."""
    return is_transient(exc)


def _sqlite_outage(err: sqlite3.Error) -> Outage | None:
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return OUT_OF_MEMORY if code == _SQLITE_IOERR_NOMEM else _SQLITE_CODES.get(code & 0xFF)
    message = str(err).lower()  # raised without a code (by the sqlite3 module itself)
    return next((outage for text, outage in _SQLITE_MESSAGES.items() if text in message), None)


def _postgres_outage(err: BaseException | None) -> Outage | None:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - SQLite-only installs
        return None
    if not isinstance(err, psycopg.Error):
        return None
    state = err.sqlstate
    if state is None:
        # psycopg raises OperationalError without a SQLSTATE when the
        # connection itself failed (refused, closed by the server, reset, or
        # refused at start-up for a cause only its message names).
        if not isinstance(err, psycopg.OperationalError):
            return None
        message = str(err).lower()
        return next((outage for text, outage in _CONNECT_MESSAGES.items() if text in message), UNAVAILABLE)
    return _SQLSTATES.get(state) or _SQLSTATE_CLASSES.get(state[:2])


def _file_system_outage(folder: str) -> Outage:
    """Which refusal a SQLite I/O error was, asked of the file system that
    holds the database: read-only (mounted so, or made so after an error,
    as ext4 does with ``errors=remount-ro``), full, or neither. An unnamed
    temporary file (``O_TMPFILE``) is what asks: it leaves nothing behind."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return STORAGE_ERROR
    if stats.f_flag & os.ST_RDONLY:
        return READ_ONLY
    if stats.f_bavail == 0:
        return DISK_FULL
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except OSError as err:
        if err.errno == errno.EROFS:
            return READ_ONLY
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return DISK_FULL
    return STORAGE_ERROR


__all__ = ["Outage", "is_transient", "is_unavailable", "outage_of", "storable_text"]
