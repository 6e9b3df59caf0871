"""Which database errors are worth retrying, in one place, and how to make a
value storable before it is written.

A retry loop that retries an error that can never succeed wedges whatever
waits behind it: a handler's error message with a NUL byte, refused by
PostgreSQL's text type on every attempt, held the pool's acknowledgements
(and so every later job) forever. So the worker pool retries only what
``is_transient`` says can succeed on a later try, the API answers 503
(``is_unavailable``) instead of 500 for the same errors, and everything else
is a fault of the value or of the code, handled once and not retried.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import exc as sa_exc

# SQLSTATEs after which the same statement can succeed on a later try.
_TRANSIENT_SQLSTATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57P01",  # admin_shutdown (pg_terminate_backend, a fast shutdown)
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up, recovering)
    "53300",  # too_many_connections
}
_TRANSIENT_SQLSTATE_CLASSES = ("08",)  # connection exceptions
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy")


def is_transient(exc: BaseException) -> bool:
    """True when the failed database call can succeed if simply tried again:
    the connection was lost or could not be made, the database was locked or
    busy, or a serialization failure, deadlock or lock timeout. False for
    everything else (a value the database refuses, a constraint, a bug)."""
    if isinstance(exc, (sa_exc.TimeoutError, sa_exc.DisconnectionError)):
        return True  # the pool had no connection to give, or it was dead
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        return _transient_driver_error(exc.orig)
    return _transient_driver_error(exc)


def _transient_driver_error(err: BaseException | None) -> bool:
    if err is None:
        return False
    if isinstance(err, sqlite3.OperationalError):
        message = str(err).lower()
        return any(m in message for m in _SQLITE_TRANSIENT)
    try:
        import psycopg
    except ImportError:  # pragma: no cover - SQLite-only installs
        return False
    if not isinstance(err, psycopg.Error):
        return False
    state = err.sqlstate
    if state is None:
        # psycopg raises OperationalError without a SQLSTATE when the
        # connection itself failed (refused, closed by the server, reset).
        return isinstance(err, psycopg.OperationalError)
    return state in _TRANSIENT_SQLSTATES or state.startswith(_TRANSIENT_SQLSTATE_CLASSES)


def is_unavailable(exc: BaseException) -> bool:
    """The database cannot be reached or is locked right now: the HTTP
    answer is 503 with ``Retry-After``, not 500. The same test as
    ``is_transient``, so what the pool retries is what the API asks its
    clients to retry."""
    return is_transient(exc)


def storable_text(value: str | None) -> str | None:
    """``value`` as every backend can store it in a text column: PostgreSQL
    refuses NUL (on every try, so an unchanged retry never succeeds), and
    neither driver can encode a lone surrogate (``surrogateescape``-decoded
    bytes in an exception message). NUL is written as the text ``\\x00``
    and a surrogate as ``\\udcXX``, so a person reading the error sees
    that something was there."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


__all__ = ["is_transient", "is_unavailable", "storable_text"]
