"""The store's transactions and how a prepared statement runs on each
dialect: the plumbing every part of ``Store`` shares."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobdeck.core import forks
from jobdeck.core.errors import JobNotFound, TransitionRefused
from jobdeck.core.states import Transition
from jobdeck.core.wakeups import Event
from jobdeck.store import operator_statements
from jobdeck.store.engine import READONLY, waiting_for_lock
from jobdeck.store.postgres import NOTIFY_SQL, PQTRANS_IDLE
from jobdeck.store.records import JobRecord
from jobdeck.store.sqlite import Prepared, db_time, translated_errors
from jobdeck.store.storage import StorageHealth
from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError

Backoff = Callable[[str, int], float]
"""(job type, retry_count) -> seconds until the retry."""


@dataclass(frozen=True)
class Ahead:
    """Statements ``complete_and_claim`` leaves for its claim to send first
    (PostgreSQL: the completions). A pipelined claim sends them in its first
    batch, with BEGIN and the reads, and hands ``land`` their rows; any
    other path's first statement in the joined transaction runs them first,
    the ordinary way (``land(None)``), so every claim still sees them.
    ``applied_all``: whether the sent statements' rows cover every
    completion (else ``land`` completes the rest: jobs in a workflow or a
    batch, and late results, which it refuses)."""

    statements: list[tuple[Prepared, tuple[Any, ...]]]
    land: Callable[[list[Any] | None], None]
    applied_all: Callable[[list[Any]], bool]


class Transactions:
    """Write and read transactions, the listeners of this process, and the
    execution of ``jobdeck.store.statements`` (Core on PostgreSQL, compiled text
    at driver level on SQLite)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.sqlite = self.dialect == "sqlite"
        self.claimable: Event[[]] = Event()
        """Emitted after a commit made jobs claimable in this process (``jobdeck.core.wakeups``)."""
        self._dead_listeners: list[Callable[[list[JobRecord]], None]] = []
        self._write_lock = threading.RLock() if self.sqlite else None
        self.storage = StorageHealth(engine, self._write_lock)
        """Whether writes land now (``jobdeck.store.storage``): health and the sweeper ask it."""
        self._decode: Callable[[Any], JobRecord] = JobRecord.from_sqlite if self.sqlite else JobRecord.from_columns
        """A job row as the dialect's path returns it, decoded."""
        self.void_after: float | None = None
        """PostgreSQL, on the database's clock: seconds after its time past which
        a heartbeat that reaches its row changes nothing, and a claim stamps the
        server's time instead of its own (half of ``stall_timeout``;
        ``claim_statements.on_time``, ``Claiming.void_at``). None: every write lands as it says."""
        self.fresh_time: Callable[[], datetime] | None = None
        """The deck's clock when it is the real one (the database's or the
        host's, not one a test injected): a claim reads it again after waiting
        for its lock (``jobdeck.store.timekeeping.after_waiting``)."""
        self._autocommit: Engine | None = (
            None if self.sqlite else engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        """PostgreSQL: the engine in autocommit, for a write that is one
        statement (``single``): no BEGIN and COMMIT round trips around it."""
        self._for_requests: tuple[Engine, Engine] | None = None
        """PostgreSQL: the engine whose sessions carry the request timeouts,
        and its autocommit twin (``bound_requests``)."""
        self._serving = threading.local()
        """``on`` while this thread answers an HTTP request (``serving_request``)."""
        self._joined = threading.local()
        """``conn`` set while ``complete_and_claim`` or ``_one_transaction``
        runs: this thread's ``write()`` joins it. ``locked`` while this thread
        holds the write lock: an urgent write then queues like the others
        (its own connection would wait for this one). ``dead`` collects the
        jobs a joined transaction killed, told once it commits. ``ahead``: the
        joined transaction's ``Ahead``, until a claim takes it."""

    @contextmanager
    def write(self, *, urgent: bool = False) -> Iterator[Connection]:
        """A write transaction. On SQLite the writers of this process queue
        on a lock first: SQLite has one writer anyway, and one thread asking
        for the file's lock is enough. The holder of this lock waits for
        other processes' writers by asking for the file's write lock every
        millisecond, up to busy_timeout (``jobdeck.store.engine.promptly``).

        ``urgent`` is for a small write that must not wait behind the others
        (a heartbeat: a drain's back-to-back acks must not delay the beat
        that tells the other processes' sweepers this one is alive). On
        SQLite it skips this process's queue, whose holder may itself be
        waiting for another process."""
        if forks.forked:  # before this process's write lock, which the fork may have copied held
            forks.leave(70, "the database")
        outer = getattr(self._joined, "conn", None)
        if outer is not None:
            ahead = self.take_ahead()
            if ahead is not None:  # no pipelined claim took them: they go first, the ordinary way
                ahead.land(None)
            yield outer
            return
        self._joined.wake = False
        try:
            if self._write_lock is None or (urgent and not getattr(self._joined, "locked", False)):
                with self._engines()[0].begin() as conn:
                    yield conn
            else:
                if not self._write_lock.acquire(blocking=False):
                    waiting_for_lock()  # behind another thread's write: this thread's ``before_lock_wait`` first
                    self._write_lock.acquire()
                try:
                    self._joined.locked = True
                    with self.engine.begin() as conn:
                        yield conn
                finally:
                    self._joined.locked = False
                    self._write_lock.release()
        except Exception as exc:
            self.storage.note(exc)  # an outage shows on /api/health at once
            raise
        if self._joined.wake:  # jobs became claimable in it (``Graph._wake``): tell this process's pools
            self._joined.wake = False
            self._notify_enqueued()

    @contextmanager
    def single(self) -> Iterator[Connection]:
        """A connection for a write of ONE statement, atomic by itself (the
        claim): on PostgreSQL in autocommit, one round trip instead of
        BEGIN, the statement and COMMIT (the pool pings only a connection
        that rested or whose server spoke: ``engine.needs_ping``); a
        transaction of this thread already open is joined; on SQLite it is
        ``write()``."""
        if not self.outside():
            with self.write() as conn:
                yield conn
            return
        autocommit = self._engines()[1]
        assert autocommit is not None
        with autocommit.connect() as conn:
            yield conn

    @contextmanager
    def alone(self) -> Iterator[Any]:
        """PostgreSQL: a pooled psycopg connection in autocommit, for one
        statement run at driver level outside any transaction of the
        store's (a single enqueue: ``Enqueueing.enqueue``). SQLAlchemy's
        Connection and execution took 160 µs of CPU a call here, more than
        the driver's whole insert. Errors come out as SQLAlchemy's, as from
        any other path, and a connection they broke leaves the pool."""
        error = self.engine.dialect.loaded_dbapi.Error
        try:
            raw = self._engines()[0].raw_connection()  # connecting can fail too: inside the translation
        except error as exc:
            raise DBAPIError.instance(None, None, exc, error) from exc
        db = raw.driver_connection
        assert db is not None
        try:
            db.autocommit = True
            yield db
        except error as exc:
            _hand_back(raw, db, exc)
            raise DBAPIError.instance(
                None, None, exc, error, connection_invalidated=raw.dbapi_connection is None
            ) from exc
        except BaseException as exc:
            _hand_back(raw, db, exc)
            raise
        else:
            _hand_back(raw, db, None)
        finally:
            raw.close()

    @contextmanager
    def glance(self) -> Iterator[Any]:
        """A pooled driver connection for ONE read statement, which is its
        own snapshot: on PostgreSQL ``alone``'s, in autocommit; on SQLite
        the pooled sqlite3 connection outside a transaction (SQLAlchemy owns
        BEGIN there, so a lone SELECT runs in its own implicit read
        transaction), errors raised as SQLAlchemy's. What a hot read needs
        when a Core read transaction costs more than the read
        (``jobdeck.store.waiting.read_waiting``)."""
        if not self.sqlite:
            with self.alone() as db:
                yield db
            return
        with translated_errors():
            raw = self.engine.raw_connection()
            try:
                yield raw.driver_connection
            finally:
                raw.close()

    def bound_requests(self, engine: Engine) -> None:
        """PostgreSQL: statements run inside ``serving_request`` go to
        ``engine``, whose sessions carry ``lock_timeout`` and
        ``statement_timeout`` (``make_engine``), so a request blocked on a
        lock fails (503) before its client gives up, having committed
        nothing. The worker pool and maintenance keep this store's own
        engine, without them: their long statements are not cut short.
        Disposing this store's engine disposes that one too; in a process
        forked since, without closing the parent's connections."""
        self._for_requests = (engine, engine.execution_options(isolation_level="AUTOCOMMIT"))
        built_in = os.getpid()

        @event.listens_for(self.engine, "engine_disposed")
        def _dispose_too(_engine: Engine) -> None:
            engine.dispose(close=os.getpid() == built_in)

    @contextmanager
    def serving_request(self) -> Iterator[None]:
        """This thread answers an HTTP request: its statements run under the
        request timeouts (``bound_requests``)."""
        outer = getattr(self._serving, "on", False)
        self._serving.on = True
        try:
            yield
        finally:
            self._serving.on = outer

    def _engines(self) -> tuple[Engine, Engine | None]:
        """The engine for this thread's statements, and its autocommit twin."""
        if self._for_requests is not None and getattr(self._serving, "on", False):
            return self._for_requests
        return self.engine, self._autocommit

    def outside(self) -> bool:
        """PostgreSQL, and no transaction of this thread's open: a write of
        one statement runs alone in autocommit (``single``, ``alone``)."""
        return self._autocommit is not None and not self._joining()

    def last_in_transaction(self) -> bool:
        """The statement about to run in this thread's joined transaction is
        its last (``complete_and_claim``'s claim): a driver-level write may
        send the COMMIT with it, in one round trip (``flow_pipelined``)."""
        return getattr(self._joined, "last", False)

    def take_ahead(self) -> Ahead | None:
        """The statements this thread's joined transaction is to send first,
        taken (``Ahead``): a pipelined claim sends them with its reads."""
        ahead: Ahead | None = getattr(self._joined, "ahead", None)
        self._joined.ahead = None
        return ahead

    def _joining(self) -> bool:
        """A transaction of this thread is open that the store's writes join (``write``)."""
        return getattr(self._joined, "conn", None) is not None

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._engines()[0].connect() as conn:
            conn = conn.execution_options(**{READONLY: True})
            with conn.begin():
                yield conn

    @contextmanager
    def _one_transaction(self) -> Iterator[Connection]:
        """A write transaction that the store calls made inside it join (their
        ``write()`` yields it), for a check and its transition in one. Dead
        listeners hear of what it killed once it has committed."""
        dead: list[JobRecord] = []
        outer = getattr(self._joined, "conn", None), getattr(self._joined, "dead", None)
        with self.write() as conn:
            self._joined.conn, self._joined.dead = conn, dead
            try:
                yield conn
            finally:
                self._joined.conn, self._joined.dead = outer
        self._notify_dead(dead)

    # -- listeners -------------------------------------------------------------

    def on_enqueue(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` after every committed enqueue in this process."""
        self.claimable.subscribe(fn)

    def on_dead(self, fn: Callable[[list[JobRecord]], None]) -> None:
        """Call ``fn`` with the jobs that just landed in ``dead``."""
        self._dead_listeners.append(fn)

    def _notify_enqueued(self) -> None:
        self.claimable.emit()

    def _notify_other_processes(self, conn: Connection) -> None:
        """PostgreSQL: NOTIFY in the same transaction, so every process's
        listener (``jobdeck.worker.listener``) hears of the job exactly when it is committed."""
        if self.dialect == "postgresql":
            conn.exec_driver_sql(NOTIFY_SQL)

    def _notify_dead(self, dead: list[JobRecord]) -> None:
        deferred = getattr(self._joined, "dead", None)
        if deferred is not None:  # inside _one_transaction: after its commit
            deferred.extend(dead)
            return
        if dead:
            for fn in self._dead_listeners:
                fn(dead)

    # -- running statements ------------------------------------------------------

    def stored_time(self, when: datetime) -> Any:
        """A time as the dialect's driver-level path takes it: SQLite's stored text, or the datetime."""
        return db_time(when) if self.sqlite else when

    _t = stored_time  # the short name the store's own statements use

    def _run(self, conn: Connection, prepared: Prepared, values: tuple[Any, ...]) -> Any:
        """Run one of the statements: compiled text with positional values on
        SQLite (rows decoded by ``JobRecord.from_sqlite``), Core elsewhere."""
        if self.sqlite:
            compiled = prepared.sqlite
            return conn.exec_driver_sql(compiled.text, compiled.params(values))
        return conn.execute(prepared.stmt, prepared.params(values))

    def _run_many(self, conn: Connection, prepared: Prepared, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        if self.sqlite:
            compiled = prepared.sqlite
            if not compiled.takes_rows:
                conn.exec_driver_sql(compiled.text, [compiled.params(r) for r in rows])
                return
            # One INSERT per power-of-two chunk (at most nine shapes to
            # prepare, all kept in the driver's statement cache): a batch of
            # 250 attempt rows cost 2.8 us a row by executemany, 1.3 this way.
            cursor = conn.connection.cursor()
            start = 0
            with translated_errors():
                while start < len(rows):
                    n = min(ROWS_CHUNK, 1 << ((len(rows) - start).bit_length() - 1))
                    chunk = rows[start : start + n]
                    cursor.execute(compiled.rows(n), [v for r in chunk for v in r])
                    start += n
        elif prepared.as_set is not None and len(rows) > 1:
            conn.execute(prepared.as_set.stmt, prepared.as_set.params(list(zip(*rows, strict=True))))
        else:
            conn.execute(prepared.stmt, [prepared.params(r) for r in rows])

    def _record(self, row: Any) -> JobRecord:
        return self._decode(row)

    def _why_refused(self, conn: Connection, job_id: int, transition: Transition) -> Exception:
        status = conn.execute(operator_statements.status_of(), {"job": job_id}).scalar()
        if status is None:
            return JobNotFound(job_id)
        return TransitionRefused(job_id, status, transition)


ROWS_CHUNK = 256
"""The most rows one multi-row INSERT takes (``_run_many``): 256 rows of
the widest attempt row bind 2,048 values, far under SQLite's 32,766."""


def _hand_back(raw: Any, db: Any, exc: BaseException | None) -> None:
    """Out of autocommit for the pool's next user; a connection that broke,
    or that is mid-statement (an interrupt between the send and the
    answer), is dropped instead, as SQLAlchemy drops one it cannot vouch
    for, and a broken one takes the rest of the pool with it."""
    if not db.broken and not db.closed and db.info.transaction_status == PQTRANS_IDLE:
        db.autocommit = False
        return
    if db.broken or db.closed:
        # A lost connection: the others in the pool are suspect too. What
        # SQLAlchemy's own execution does on a disconnect (private API,
        # pinned < 2.2): each connection older than now is replaced at its
        # next checkout.
        raw._pool._invalidate(raw, exc, _checkin=False)
    raw.invalidate(exc)
