"""Engines: SQLite with WAL, busy_timeout and BEGIN IMMEDIATE; or PostgreSQL."""

from __future__ import annotations

import hashlib
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from jobdeck.core import forks, processes
from jobdeck.store.models import metadata
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects.sqlite.base import SQLiteCompiler
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError

# SQLAlchemy drops table hints on SQLite; render them so a query can say
# ``.with_hint(jobs, "INDEXED BY ix_jobs_claim", "sqlite")``. Without
# statistics SQLite's planner prefers the status index and sorts every due
# job on every claim.
SQLiteCompiler.get_from_hint_text = lambda self, table, text: text  # type: ignore[method-assign]

READONLY = "jobdeck_readonly"
"""Execution option: this connection only reads, so on SQLite it begins a
deferred transaction instead of taking the write lock."""

LOCK_WAIT = "jobdeck_lock_wait"
"""Execution option: on SQLite, the seconds this connection's write
transaction waits for the write lock, instead of the busy timeout."""

T = TypeVar("T")

PROMPT_POLL = 0.001
"""Seconds between a SQLite writer's tries for the write lock (``promptly``)."""

_before_wait = threading.local()


@contextmanager
def before_lock_wait(fn: Callable[[], object]) -> Iterator[None]:
    """Inside: if this thread's SQLite writer finds the write lock taken
    (another process is writing, or another thread of this one waits for
    it), ``fn`` runs once before it waits. The pool's acker hands its
    executors the jobs it held for its next claim there, so they do not
    wait on another process's transaction."""
    outer = getattr(_before_wait, "fn", None)
    _before_wait.fn = fn
    try:
        yield
    finally:
        _before_wait.fn = outer


def waiting_for_lock() -> None:
    """This thread is about to wait for a write lock (SQLite's, or this
    process's queue for it): run its ``before_lock_wait`` function, once."""
    fn, _before_wait.fn = getattr(_before_wait, "fn", None), None
    if fn is not None:
        fn()


def make_engine(
    url: str,
    *,
    synchronous: str = "FULL",
    pool_size: int = 10,
    busy_timeout: float = 30.0,
    idle_in_transaction: float = 30.0,
    timeouts: tuple[float, float] | None = None,
) -> Engine:
    """The engine of one database, its connections refused in a child a
    handler forked (``jobdeck.core.forks``).

    ``idle_in_transaction`` (PostgreSQL): seconds after which the server
    ends a session of ours left idle inside a transaction. A host cut off
    mid-transaction (a partition) leaves its backend waiting for a COMMIT
    that never comes, holding the row locks of the jobs it beat, and the
    other hosts' rescue skips locked rows: without this, for hours.

    ``timeouts`` (PostgreSQL; seconds, 0 for none): every session's
    ``lock_timeout`` and ``statement_timeout``."""
    parsed = make_url(url)
    engine = (
        _sqlite_engine(url, synchronous, pool_size, busy_timeout)
        if parsed.get_backend_name() == "sqlite"
        else _postgres_engine(url, pool_size, idle_in_transaction, timeouts)
    )
    forks.watch(engine)
    return engine


def _postgres_engine(
    url: str, pool_size: int, idle_in_transaction: float, timeouts: tuple[float, float] | None
) -> Engine:
    parsed = make_url(url)
    idle_ms = int(idle_in_transaction * 1000)
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        # The connection handed back last goes out first: under a light load
        # the same few stay warm and skip the ping after a rest (``needs_ping``).
        pool_use_lifo=True,
        # A host that does not answer (not one that refuses) would block a
        # connect forever: the pool's retries and its shutdown need an end.
        connect_args={"connect_timeout": 5, **{k: v for k, v in _session_settings().items() if k not in parsed.query}},
    )

    @event.listens_for(engine, "connect")
    def _utc_session(dbapi_conn: Any, _record: Any) -> None:
        # Times come back in the session's zone: in UTC, a row the claim
        # reads at driver level (``jobdeck.store.claim``) holds the same aware
        # UTC times that Core's ``UTCDateTime`` gives, whatever the server's TimeZone.
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        dbapi_conn.execute("SET TIME ZONE 'UTC'")
        dbapi_conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
        if timeouts is not None:
            lock, statement = (f"{round(seconds * 1000)}ms" for seconds in timeouts)
            dbapi_conn.execute(f"SET lock_timeout = '{lock}'; SET statement_timeout = '{statement}'")
        dbapi_conn.autocommit = autocommit

    @event.listens_for(engine, "checkin")
    def _rests_from(_dbapi_conn: Any, record: Any) -> None:
        record.info[RESTING_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_when_stirred(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        # Instead of pool_pre_ping's round trip on every checkout, which was
        # a third of a single enqueue's time: see ``needs_ping``.
        if not needs_ping(dbapi_conn, record.info.get(RESTING_SINCE)):
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"a pooled connection did not answer: {exc}") from exc

    return engine


_LIVENESS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 3, "keepalives_count": 3,
             "tcp_user_timeout": 15000}  # fmt: skip
"""libpq's settings that end a connection whose peer went silent (a
partition, a host gone) in about 15-20 s instead of TCP's 15 minutes: a
statement stuck on one then fails, is retried on a new connection, and
resumes once the network does. A busy server's kernel still answers both,
so a long statement is never cut. A URL that sets one keeps its own."""

SESSION_PREFIX = "jobdeck "
"""What the ``application_name`` of this process's PostgreSQL sessions starts
with; ``host:pid.nonce`` follows (``jobdeck.core.processes.name``), the part
of a worker id (``host:pid.nonce:pool``) that names the process (``session_name``)."""


def _session_settings() -> dict[str, Any]:
    """libpq's liveness settings (``_LIVENESS``) and the sessions' name (``session_name``)."""
    return {**_LIVENESS, "application_name": session_name(processes.name())}


NAME_BYTES = 63
"""The longest ``application_name`` the server keeps (NAMEDATALEN - 1)."""


def session_name(host_pid: str) -> str:
    """The ``application_name`` of the sessions of process ``host:pid``
    (``host:pid.nonce``: ``jobdeck.core.processes.name``), so a sweeper on
    another host can find the sessions of a worker it marks gone
    (``jobdeck.store.server_sessions``). It fits the server's 63 bytes
    whole: a host name too long for it is cut and a digest of the whole name
    put in its place, never what follows the last colon, which would make
    every process of that host one name (and a sweep end its live
    neighbours' sessions)."""
    name = SESSION_PREFIX + host_pid
    if len(name.encode()) <= NAME_BYTES:
        return name
    host, _, pid = host_pid.rpartition(":")
    digest = "~" + hashlib.sha1(host.encode()).hexdigest()[:10]
    room = NAME_BYTES - len(SESSION_PREFIX) - len(digest) - len(pid) - 1
    return f"{SESSION_PREFIX}{host.encode()[: max(room, 0)].decode(errors='ignore')}{digest}:{pid}"


BUSY_TIMEOUT = "jobdeck_busy_timeout"
"""A pooled SQLite connection's ``info``: the busy timeout (seconds) it was
opened with, given to ``promptly`` so it need not ask the connection
(a statement, and a wait for the GIL, per group commit)."""

RESTING_SINCE = "jobdeck_resting_since"
"""A pooled connection's ``info``: when it was last handed back (monotonic)."""

PING_AFTER_REST = 1.0
"""Seconds a pooled PostgreSQL connection may rest and still be handed out
without a ping, when its socket is quiet (``needs_ping``)."""


def needs_ping(dbapi_conn: Any, resting_since: float | None) -> bool:
    """Whether a pooled PostgreSQL connection is pinged before it is handed
    out: when it rested longer than ``PING_AFTER_REST`` (or was never handed
    back), or its socket is not ``quiet``. A pool in use hands its
    connections on within milliseconds, without the round trip, and a ping
    that fails replaces the connection before anyone uses it."""
    if resting_since is None or time.monotonic() - resting_since > PING_AFTER_REST:
        return True
    return not quiet(dbapi_conn)


def quiet(dbapi_conn: Any) -> bool:
    """A pooled PostgreSQL connection is open and its socket has nothing to
    read. Between statements the server sends nothing unasked: a backend
    that is terminated (``pg_terminate_backend``, a shutdown or restart)
    sends its FATAL error and closes, and a killed one leaves the socket
    closed, both of which make it readable; anything readable (a notice
    included) gets a real ping. A peer that forgot the connection without
    a word (a NAT or firewall that dropped its state, a host that
    rebooted) answers only when written to: the ping after a rest
    (``needs_ping``) covers the connections such a peer forgets, which rest
    longer than a second."""
    if dbapi_conn.closed or dbapi_conn.broken:
        return False
    try:
        poller = select.poll()  # not select(): a socket's fd may be above FD_SETSIZE
        poller.register(dbapi_conn.fileno(), select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError, dbapi_conn.Error):
        return False


def _sqlite_engine(url: str, synchronous: str, pool_size: int, busy_timeout: float = 30.0) -> Engine:
    parsed = make_url(url)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size * 2,
        connect_args={"check_same_thread": False, "timeout": busy_timeout},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        record.info[BUSY_TIMEOUT] = busy_timeout
        # Let SQLAlchemy own BEGIN so it can be IMMEDIATE (see _on_begin).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        _journal_mode_wal(cur)
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A deferred read-to-write upgrade fails at once with "database is
        # locked" whatever the busy timeout; writers take the lock up front.
        if conn.get_execution_options().get(READONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            try:
                wait = conn.get_execution_options().get(LOCK_WAIT, busy_timeout)
                _begin_promptly(conn.connection.driver_connection, wait)
            except sqlite3.Error as exc:  # raised in an event, so SQLAlchemy would not wrap it
                raise DBAPIError.instance("BEGIN IMMEDIATE", None, exc, sqlite3.Error) from exc

    return engine


def _begin_promptly(raw: sqlite3.Connection, busy_timeout: float) -> None:
    """``BEGIN IMMEDIATE``, asked for every millisecond (``promptly``)."""
    promptly(raw, lambda: raw.execute("BEGIN IMMEDIATE"), busy_timeout)


def promptly(raw: sqlite3.Connection, attempt: Callable[[], T], busy_timeout: float | None = None) -> T:
    """``attempt()``, a statement that takes SQLite's write lock (``BEGIN
    IMMEDIATE``, or one write in autocommit, which changes nothing when
    refused), asked again every millisecond for up to the busy timeout
    (the connection's own unless given). SQLite's busy handler sleeps 1, 2,
    5 ... then 100 ms between tries, and a writer that just committed
    begins again at once, so a waiter can lose to the other processes'
    writers for seconds: during a three-process drain of one file a
    heartbeat waited up to 4.5 s there, past the stall timeout, and with two
    worker processes and a producer on one file (benchmark scenario 5) one
    batch of jobs waited 4 s to start. Asking every millisecond, the first
    free moment goes to this writer. On the driver's connection: two pragmas
    and a BEGIN through SQLAlchemy cost more than the BEGIN itself."""
    ms = int(busy_timeout * 1000) if busy_timeout is not None else int(raw.execute("PRAGMA busy_timeout").fetchone()[0])
    raw.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + ms / 1000
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            waiting_for_lock()
            time.sleep(PROMPT_POLL)  # the poll that replaces the busy handler's longer sleeps
    finally:
        # The lock is held (or the caller gives up): the wait is over either way.
        raw.execute(f"PRAGMA busy_timeout={ms}")


def _journal_mode_wal(cur: Any) -> None:
    """Switching a new file to WAL needs an exclusive lock, and SQLite does
    not call the busy handler for it: processes opening a fresh database at
    once (three hosts' worth on one machine) got "database is locked" at
    once. Retry for as long as the busy timeout would have waited."""
    deadline = time.monotonic() + 30  # not busy_timeout: a fresh file, opened by several processes at once
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)  # backoff between retries of one pragma; nothing to wake for


def create_schema(engine: Engine) -> None:
    metadata.create_all(engine)
