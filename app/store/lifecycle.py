"""All SQL for the job lifecycle, behind intention-named functions.

Every transition is one conditional statement naming its allowed source
states (from ``app.states``); zero rows updated means it was refused, and the
caller gets an error saying why. The claim is the one place where dialects
differ: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL; on SQLite the IMMEDIATE
transaction already holds the single write lock.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, case, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite

from app.crashpoints import crash_point
from app.errors import IdempotencyConflict, JobNotFound, NotHeld, TransitionRefused
from app.states import State, Transition, sources
from app.store import sqlite as sqlite_hot
from app.store.engine import PROMPT, READONLY
from app.store.faults import is_transient, is_unavailable, storable_text
from app.store.group_commit import GroupCommitter
from app.store.ledger import Ledger
from app.store.models import INTERRUPTED, attempts, jobs, workers
from app.store.records import AttemptRecord, JobFilter, JobRecord, NewJob, Outcome
from app.validation import fits_id
from app.worker.listener import NOTIFY_SQL

__all__ = [
    "AttemptRecord", "JobFilter", "JobRecord", "NewJob", "Outcome", "Store", "exponential_backoff",
    "is_transient", "is_unavailable", "storable_text",
]  # fmt: skip

Backoff = Callable[[str, int], float]
"""(job type, retry_count) -> seconds until the retry."""


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _dumps(value: Any) -> str:
    return "{}" if value == {} else _ENCODER.encode(value)


def backoff_delay(base: float, cap: float, retry_count: int) -> float:
    """``base * 2 ** retry_count`` plus up to 10% jitter, capped at ``cap``."""
    delay = min(cap, base * 2 ** min(retry_count, 62))
    return float(min(cap, delay + random.uniform(0, delay * 0.1)))


def exponential_backoff(base: float = 1.0, cap: float = 3600.0) -> Backoff:
    def backoff(_type: str, retry_count: int) -> float:
        return backoff_delay(base, cap, retry_count)

    return backoff


_JOB_COLS = list(jobs.c)
_RUNNING = State.RUNNING.value

_BEAT_JOBS = (
    update(jobs)
    .where(jobs.c.worker_id == bindparam("beat_worker"), jobs.c.status == _RUNNING)
    .values(heartbeat_at=bindparam("beat_at"))
)
_BEAT_WORKER = update(workers).where(workers.c.id == bindparam("beat_worker")).values(heartbeat_at=bindparam("beat_at"))


class Store:
    def __init__(self, engine: Engine, backoff: Backoff | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.backoff: Backoff = backoff or exponential_backoff()
        self._enqueue_listeners: list[Callable[[], None]] = []
        self._dead_listeners: list[Callable[[list[JobRecord]], None]] = []
        self.claim_policy: Callable[..., list[JobRecord]] | None = None
        """Installed by ``app.queues`` (via ``create_app``): paused queues, concurrency limits."""
        self._write_lock = threading.RLock() if self.dialect == "sqlite" else None
        self._enqueuer: GroupCommitter[Any] | None = None
        if self._write_lock is not None:
            self._enqueuer = GroupCommitter(self._write_lock, self._insert_batch_sqlite)
        self._joined = threading.local()
        """``conn`` set while ``complete_and_claim`` runs: this thread's ``write()`` joins it.
        ``locked`` while this thread holds the write lock: an urgent write then
        queues like the others (its own connection would wait for this one)."""
        self.ledger = Ledger(self)
        """The effects ledger's steps (``app.store.ledger``), on this store's transactions."""

    # -- plumbing -----------------------------------------------------------

    @contextmanager
    def write(self, *, urgent: bool = False) -> Iterator[Connection]:
        """A write transaction. On SQLite the writers of this process queue
        on a lock first: SQLite has one writer anyway, and a thread that finds
        the file locked sleeps in SQLite's busy handler (1, 2, 5, 10 ms ...)
        long after the lock was freed, which capped throughput at a few
        thousand jobs/s. Other processes still wait through busy_timeout.

        ``urgent`` is for a small write that must not wait behind the others
        (a heartbeat: a drain's back-to-back acks must not delay the beat
        that tells the other processes' sweepers this one is alive). On
        SQLite it skips this process's queue, whose holder may itself be
        waiting for another process, and asks for the file's write lock
        every millisecond (``app.store.engine.PROMPT``)."""
        outer = getattr(self._joined, "conn", None)
        if outer is not None:  # inside complete_and_claim: one transaction for both
            yield outer
            return
        if self._write_lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        if urgent and not getattr(self._joined, "locked", False):
            with self.engine.connect() as conn:
                conn.execution_options(**{PROMPT: True})
                with conn.begin():
                    yield conn
            return
        with self._write_lock:
            self._joined.locked = True
            try:
                with self.engine.begin() as conn:
                    yield conn
            finally:
                self._joined.locked = False

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            conn = conn.execution_options(**{READONLY: True})
            with conn.begin():
                yield conn

    def on_enqueue(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` after every committed enqueue in this process."""
        self._enqueue_listeners.append(fn)

    def on_dead(self, fn: Callable[[list[JobRecord]], None]) -> None:
        """Call ``fn`` with the jobs that just landed in ``dead``."""
        self._dead_listeners.append(fn)

    def _notify_enqueued(self) -> None:
        for fn in self._enqueue_listeners:
            fn()

    def _notify_other_processes(self, conn: Connection) -> None:
        """PostgreSQL: NOTIFY in the same transaction, so every process's
        listener (app.worker.listener) hears of the job exactly when it is committed."""
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

    def _insert(self) -> Any:
        return postgresql.insert if self.dialect == "postgresql" else sqlite.insert

    # -- enqueue --------------------------------------------------------------

    def _values(self, new: NewJob, now: datetime) -> dict[str, Any]:
        return {
            "type": new.type,
            "queue": new.queue,
            "payload": self._payload_json(new),
            "priority": new.priority,
            "status": State.PENDING.value,
            "attempt": 0,
            "retry_count": 0,
            "max_retries": new.max_retries,
            "idempotency_key": new.idempotency_key,
            "available_at": new.available_at or now,
            "created_at": now,
            "updated_at": now,
        }

    def enqueue(self, new: NewJob, now: datetime) -> tuple[JobRecord, bool]:
        """Insert a job; with a known idempotency key return the existing one.

        Returns (job, created). The UNIQUE constraint decides under concurrency:
        the insert does nothing on conflict and the existing row is read back.
        On PostgreSQL the read sees a newer snapshot than the insert did: if
        retention deleted the job in between, the key is free and the insert
        runs again (it read nothing and answered 500).
        """
        if self._enqueuer is not None and new.idempotency_key is None:
            row = self._enqueuer.submit(
                sqlite_hot.job_params(new, self._payload_json(new), now, sqlite_hot.db_time(now))
            )
            self._notify_enqueued()
            return JobRecord.from_sqlite(row), True
        values = self._values(new, now)
        with self.write() as conn:
            if new.idempotency_key is None:
                row = conn.execute(insert(jobs).values(values).returning(*_JOB_COLS)).one()
            else:
                stmt = (
                    self._insert()(jobs)
                    .values(values)
                    .on_conflict_do_nothing(index_elements=["idempotency_key"])
                    .returning(*_JOB_COLS)
                )
                existing_row = None
                for _ in range(3):  # the key's job deleted (retention) between the two: the key is free again
                    inserted = conn.execute(stmt).first()
                    if inserted is not None:
                        break
                    existing_row = conn.execute(
                        select(jobs).where(jobs.c.idempotency_key == new.idempotency_key)
                    ).first()
                    if existing_row is not None:
                        break
                if inserted is None:
                    if existing_row is None:
                        raise RuntimeError(
                            f"idempotency_key {new.idempotency_key!r} is taken and freed again and again"
                        )
                    existing = JobRecord.from_row(existing_row)
                    _check_same(existing, new)
                    return existing, False
                row = inserted
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return JobRecord.from_row(row), True

    def enqueue_many(self, news: Sequence[NewJob], now: datetime) -> list[int]:
        """Insert many jobs in one transaction; returns their ids in order.

        A job whose idempotency key exists already is not inserted; its slot in
        the result holds the existing job's id.
        """
        if not news:
            return []
        keyed = any(n.idempotency_key is not None for n in news)
        if self.dialect == "sqlite" and not keyed:
            t = sqlite_hot.db_time(now)
            return self.insert_rows_sqlite([sqlite_hot.job_params(n, self._payload_json(n), now, t) for n in news])
        rows = [self._values(n, now) for n in news]
        with self.write() as conn:
            if not keyed:
                result = conn.execute(insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True), rows)
                ids = list(result.scalars())
            else:
                stmt = (
                    self._insert()(jobs)
                    .on_conflict_do_nothing(index_elements=["idempotency_key"])
                    .returning(jobs.c.id, jobs.c.idempotency_key)
                )
                by_key: dict[str | None, int] = {}
                plain: list[int] = []
                for row in conn.execute(stmt, rows):
                    if row.idempotency_key is None:
                        plain.append(row.id)
                    else:
                        by_key[row.idempotency_key] = row.id
                missing = [n.idempotency_key for n in news if n.idempotency_key and n.idempotency_key not in by_key]
                if missing:
                    for row in conn.execute(
                        select(jobs.c.id, jobs.c.idempotency_key).where(jobs.c.idempotency_key.in_(missing))
                    ):
                        by_key[row.idempotency_key] = row.id
                plain.sort()
                it = iter(plain)
                ids = [by_key[n.idempotency_key] if n.idempotency_key else next(it) for n in news]
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return ids

    def insert_rows_sqlite(self, params: list[tuple[Any, ...]]) -> list[int]:
        """SQLite: insert jobs without idempotency keys from ready
        ``sqlite_hot.INSERT_JOB`` parameters (``job_params``, ``app.bulk``)
        in one transaction; returns their ids in order."""
        if not params:
            return []
        with self.write() as conn, sqlite_hot.translated_errors():
            cur = conn.connection.cursor()
            cur.executemany(sqlite_hot.INSERT_JOB, params)
            # One writer holds the lock: the rowids of this statement are consecutive.
            last = cur.execute("SELECT last_insert_rowid()").fetchone()[0]
        self._notify_enqueued()
        return list(range(last - len(params) + 1, last + 1))

    @staticmethod
    def _payload_json(new: NewJob) -> str:
        return new.payload_json if new.payload_json is not None else _dumps(new.payload)

    def _insert_batch_sqlite(self, params: list[tuple[Any, ...]]) -> list[Any]:
        """Insert plain jobs in one transaction (the group commit's batch);
        returns their raw rows in order. On a pooled DBAPI connection under
        the write lock, without SQLAlchemy's Connection: its begin and commit
        events cost more CPU than the insert (one HTTP enqueue per batch)."""
        assert self._write_lock is not None
        with self._write_lock, sqlite_hot.translated_errors():
            raw = self.engine.raw_connection()
            try:
                db = raw.driver_connection
                assert db is not None
                db.execute("BEGIN IMMEDIATE")
                try:
                    rows = [db.execute(sqlite_hot.INSERT_JOB_RETURNING, p).fetchone() for p in params]
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
                return rows
            finally:
                raw.close()

    # -- claim ----------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        now: datetime,
        *,
        limit: int = 1,
        types: Iterable[str] | None = None,
        queues: Iterable[str] | None = None,
        exclude_queues: Iterable[str] | None = None,
        controlled: bool = True,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` due jobs in one statement, in claim order
        (priority DESC, available_at ASC, id ASC).

        With a ``claim_policy`` installed (``app.queues``: paused queues,
        concurrency limits) the policy claims instead; it calls back here with
        ``controlled=False`` and the paused queues in ``exclude_queues``."""
        if controlled and self.claim_policy is not None:
            return self.claim_policy(self, worker_id, now, limit=limit, types=types, queues=queues)
        if self.dialect == "sqlite":
            return self._claim_sqlite(worker_id, now, limit, types, queues, exclude_queues)
        due = select(jobs.c.id).where(
            jobs.c.status.in_(sources(Transition.CLAIM)),
            jobs.c.available_at <= now,
        )
        if types is not None:
            due = due.where(jobs.c.type.in_(list(types)))
        if queues is not None:
            due = due.where(jobs.c.queue.in_(list(queues)))
        if exclude_queues:
            due = due.where(jobs.c.queue.not_in(list(exclude_queues)))
        due = due.order_by(jobs.c.priority.desc(), jobs.c.available_at, jobs.c.id).limit(limit)
        if self.dialect == "postgresql":
            due = due.with_for_update(skip_locked=True)
        stmt = (
            update(jobs)
            .where(jobs.c.id.in_(due.scalar_subquery()))
            .values(_claimed_values(worker_id, now))
            .returning(*_JOB_COLS)
        )
        with self.write() as conn:
            rows = conn.execute(stmt).all()
        claimed = [JobRecord.from_row(r) for r in rows]
        claimed.sort(key=lambda j: (-j.priority, j.available_at, j.id))
        return claimed

    def _claim_sqlite(
        self,
        worker_id: str,
        now: datetime,
        limit: int,
        types: Iterable[str] | None,
        queues: Iterable[str] | None,
        exclude_queues: Iterable[str] | None = None,
    ) -> list[JobRecord]:
        type_list = None if types is None else list(types)
        queue_list = None if queues is None else list(queues)
        excluded = list(exclude_queues or ())
        sql = sqlite_hot.claim_sql(
            None if type_list is None else len(type_list),
            None if queue_list is None else len(queue_list),
            len(excluded),
        )
        t = sqlite_hot.db_time(now)
        params = (worker_id, t, t, t, t, *(type_list or ()), *(queue_list or ()), *excluded, limit)
        with self.write() as conn:
            rows = conn.exec_driver_sql(sql, params).fetchall()
        claimed = [JobRecord.from_sqlite(r) for r in rows]
        claimed.sort(key=lambda j: (-j.priority, j.available_at, j.id))
        return claimed

    def claim_ids(self, conn: Connection, worker_id: str, now: datetime, ids: Sequence[int]) -> list[JobRecord]:
        """Inside the caller's write transaction (``app.queues`` picks the ids
        under its concurrency limits): claim exactly ``ids``, those still
        claimable, in claim order. On SQLite decoded without Core's
        per-column processors."""
        if self.dialect == "sqlite":
            t = sqlite_hot.db_time(now)
            with sqlite_hot.translated_errors():
                cur = conn.connection.cursor()
                rows = cur.execute(sqlite_hot.claim_ids_sql(len(ids)), (worker_id, t, t, t, *ids)).fetchall()
            claimed = [JobRecord.from_sqlite(r) for r in rows]
        else:
            stmt = (
                update(jobs)
                .where(jobs.c.id.in_(list(ids)), jobs.c.status.in_(sources(Transition.CLAIM)))
                .values(_claimed_values(worker_id, now))
                .returning(*_JOB_COLS)
            )
            claimed = [JobRecord.from_row(r) for r in conn.execute(stmt)]
        claimed.sort(key=lambda j: (-j.priority, j.available_at, j.id))
        return claimed

    def complete_and_claim(
        self,
        outcomes: Sequence[Outcome],
        worker_id: str,
        now: datetime,
        *,
        limit: int,
        types: Iterable[str] | None = None,
        queues: Iterable[str] | None = None,
    ) -> tuple[list[int], list[JobRecord]]:
        """``complete_many`` then ``claim`` in ONE write transaction: the
        pool's acker refills the slots it just freed with one commit (one
        fsync on SQLite FULL) instead of two. Both run unchanged inside it
        (their ``write()`` joins this one), so fencing, attempt rows, SKIP
        LOCKED and an installed ``claim_policy`` (which counts the running
        jobs after these completions) keep their guarantees; if anything
        fails, neither is applied. Returns (accepted ids, claimed jobs)."""
        with self.write() as conn:
            self._joined.conn = conn
            try:
                accepted = self.complete_many(outcomes, now)
                claimed = self.claim(worker_id, now, limit=limit, types=types, queues=queues) if limit > 0 else []
            finally:
                self._joined.conn = None
        return accepted, claimed

    # -- finishing attempts -----------------------------------------------------

    def complete_many(self, outcomes: Sequence[Outcome], now: datetime) -> list[int]:
        """Mark running jobs completed, each only if still held by the worker
        and attempt that ran it; returns the ids accepted (late results of a
        timed-out or rescued attempt are refused)."""
        if not outcomes:
            return []
        accepted: list[int] = []
        # (job, attempt, worker) of each completion applied: only those get an
        # attempt row, not a refused late outcome of the same job in the batch.
        won: set[tuple[int, int, str]] = set()
        with self.write() as conn:
            pending = list(outcomes)
            if any(o.attempt is None for o in pending):
                current = self._current(conn, [o.job_id for o in pending if o.attempt is None])
                for o in pending:
                    if o.attempt is None:
                        row = current.get(o.job_id)
                        o.attempt = row.attempt if row is not None else -1
            by_worker: dict[tuple[str, bool], list[Outcome]] = {}
            for o in pending:
                by_worker.setdefault((o.worker_id, o.result is not None), []).append(o)
            for (worker_id, has_result), group in by_worker.items():
                if self.dialect == "sqlite" and not has_result:
                    t = sqlite_hot.db_time(now)
                    params = (t, t, *(o.job_id for o in group), *(x for o in group for x in (o.job_id, o.attempt)))
                    applied = conn.exec_driver_sql(sqlite_hot.complete_sql(len(group)), (*params, worker_id)).all()
                elif has_result:
                    applied = []
                    for o in group:
                        stmt = self._complete_stmt(worker_id, [o], now).values(result=_dumps(o.result))
                        applied.extend(conn.execute(stmt).all())
                else:
                    applied = list(conn.execute(self._complete_stmt(worker_id, group, now)).all())
                accepted.extend(r[0] for r in applied)
                won.update((r[0], r[1], worker_id) for r in applied)
            pending = [o for o in pending if (o.job_id, o.attempt, o.worker_id) in won]
            pending = list({(o.job_id, o.attempt): o for o in pending}.values())  # one row per attempt
            crash_point("ack")
            if self.dialect == "sqlite":
                t = sqlite_hot.db_time(now)
                done = [
                    (
                        o.job_id,
                        o.attempt,
                        o.worker_id,
                        o.started_at and sqlite_hot.db_time(o.started_at),
                        t,
                        "completed",
                    )
                    for o in pending
                ]
                if done:
                    conn.exec_driver_sql(sqlite_hot.INSERT_ATTEMPT, done)
                return accepted
            rows = [
                {
                    "job_id": o.job_id,
                    "attempt": o.attempt,
                    "worker_id": o.worker_id,
                    "started_at": o.started_at,
                    "finished_at": now,
                    "outcome": "completed",
                    "error": None,
                    "traceback": None,
                    "payload": None,
                }
                for o in pending
            ]
            if rows:
                conn.execute(insert(attempts), rows)
        return accepted

    def _complete_stmt(self, worker_id: str, group: Sequence[Outcome], now: datetime) -> Any:
        return (
            update(jobs)
            .where(
                tuple_(jobs.c.id, jobs.c.attempt).in_([(o.job_id, o.attempt) for o in group]),
                jobs.c.worker_id == worker_id,
                jobs.c.status.in_(sources(Transition.COMPLETE)),
            )
            .values(
                status=State.COMPLETED.value,
                finished_at=now,
                updated_at=now,
                progress=case((jobs.c.progress.is_(None), None), else_=1.0),
            )
            .returning(jobs.c.id, jobs.c.attempt)
        )

    def _current(self, conn: Connection, ids: list[int], lock: bool = False) -> dict[int, Any]:
        stmt = select(
            jobs.c.id, jobs.c.type, jobs.c.status, jobs.c.attempt, jobs.c.worker_id,
            jobs.c.retry_count, jobs.c.max_retries, jobs.c.claimed_at, jobs.c.heartbeat_at,
        ).where(jobs.c.id.in_(ids))  # fmt: skip
        if lock and self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return {row.id: row for row in conn.execute(stmt)}

    def complete(self, job_id: int, worker_id: str, now: datetime, result: Any = None) -> JobRecord:
        """The HTTP worker's complete: refused unless running and held by it.
        Checked and applied in one transaction: checked in one and applied in
        another, a job rescued in between answered 200 unchanged."""
        with self._one_transaction() as conn:
            row = self._held(conn, job_id, worker_id, Transition.COMPLETE)
            outcome = Outcome(job_id, worker_id, attempt=row.attempt, started_at=row.claimed_at, result=result)
            self.complete_many([outcome], now)
            return JobRecord.from_row(conn.execute(select(jobs).where(jobs.c.id == job_id)).one())

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

    def _held(self, conn: Connection, job_id: int, worker_id: str, transition: Transition) -> Any:
        row = self._current(conn, [job_id], lock=True).get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        if row.status != _RUNNING:
            raise TransitionRefused(job_id, row.status, transition)
        if row.worker_id != worker_id:
            raise NotHeld(job_id, worker_id, row.worker_id)
        return row

    def fail_many(self, outcomes: Sequence[Outcome], now: datetime) -> list[JobRecord]:
        """Apply the fail rule to each: ``failed`` with a backoff while
        retry_count < max_retries (and the error is retryable), else ``dead``.
        Returns the jobs as they now stand; refused ones are left out."""
        if not outcomes:
            return []
        done: list[JobRecord] = []
        with self.write() as conn:
            current = self._current(conn, [o.job_id for o in outcomes], lock=True)
            for o in outcomes:
                row = current.get(o.job_id)
                if row is None:
                    continue
                attempt = row.attempt if o.attempt is None else o.attempt
                retry_at = now + timedelta(seconds=self.backoff(row.type, row.retry_count))
                record = self._fail_one(conn, o, attempt, retry_at, now)
                if record is not None:
                    done.append(record)
                    conn.execute(
                        insert(attempts).values(
                            job_id=o.job_id,
                            attempt=attempt,
                            worker_id=o.worker_id,
                            started_at=o.started_at or row.claimed_at,
                            finished_at=now,
                            outcome=o.kind,
                            error=storable_text(o.error),
                            traceback=storable_text(o.traceback),
                        )
                    )
            crash_point("sweep" if outcomes[0].kind == "stalled" else "ack")
        self._notify_dead([j for j in done if j.status is State.DEAD])
        return done

    def _fail_one(
        self, conn: Connection, o: Outcome, attempt: int, retry_at: datetime, now: datetime
    ) -> JobRecord | None:
        retries_left = jobs.c.retry_count < jobs.c.max_retries
        if not o.retryable:
            retries_left = jobs.c.retry_count < -1  # never true: straight to dead
        stmt = (
            update(jobs)
            .where(
                jobs.c.id == o.job_id,
                jobs.c.attempt == attempt,
                jobs.c.worker_id == o.worker_id,
                jobs.c.status.in_(sources(Transition.FAIL)),
            )
            .values(
                status=case((retries_left, State.FAILED.value), else_=State.DEAD.value),
                retry_count=case((retries_left, jobs.c.retry_count + 1), else_=jobs.c.retry_count),
                available_at=case((retries_left, retry_at), else_=jobs.c.available_at),
                finished_at=case((retries_left, None), else_=now),
                error=storable_text(o.error),
                updated_at=now,
            )
            .returning(*_JOB_COLS)
        )
        row = conn.execute(stmt).first()
        return None if row is None else JobRecord.from_row(row)

    def fail(
        self,
        job_id: int,
        worker_id: str,
        error: str,
        now: datetime,
        *,
        retryable: bool = True,
        traceback: str | None = None,
    ) -> JobRecord:
        """The HTTP worker's fail: refused unless running and held by it.
        Checked and applied in one transaction (see ``complete``): checked
        apart, the fail landed on the job's next attempt if it was rescued
        and claimed again in between."""
        with self._one_transaction() as conn:
            row = self._held(conn, job_id, worker_id, Transition.FAIL)
            outcome = Outcome(
                job_id, worker_id, attempt=row.attempt, error=error, traceback=traceback, retryable=retryable
            )
            (done,) = self.fail_many([outcome], now)
        return done

    # -- while running ------------------------------------------------------------

    def heartbeat(self, job_id: int, worker_id: str, now: datetime) -> JobRecord:
        """One job's heartbeat (the HTTP worker's); urgent, like ``heartbeat_worker``."""
        stmt = (
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.worker_id == worker_id, jobs.c.status == _RUNNING)
            .values(heartbeat_at=now, updated_at=now)
            .returning(*_JOB_COLS)
        )
        with self.write(urgent=True) as conn:
            row = conn.execute(stmt).first()
            if row is None:
                self._held(conn, job_id, worker_id, Transition.HEARTBEAT)
        return JobRecord.from_row(row)

    def heartbeat_worker(self, worker_id: str, now: datetime | Callable[[], datetime]) -> int:
        """Heartbeat every job a worker holds, and the worker itself.

        An urgent write (``Store.write``): it must not wait behind the acks
        and claims it vouches for, nor behind other processes' writers.
        Given a clock, the time written is read once the write lock is held,
        so a beat that had to wait still says "alive now", not "alive when
        it started waiting".

        On PostgreSQL, rows another transaction holds (the acker finishing
        them) are skipped, not waited for: waiting deadlocked with an ack
        batch locking the same rows in another order, and a job being
        finished needs no heartbeat (the next beat comes well within the
        stall timeout)."""
        beat_jobs = _BEAT_JOBS
        if self.dialect == "postgresql":
            held = select(jobs.c.id).where(jobs.c.worker_id == worker_id, jobs.c.status == _RUNNING)
            beat_jobs = beat_jobs.where(jobs.c.id.in_(held.with_for_update(skip_locked=True).scalar_subquery()))
        with self.write(urgent=True) as conn:
            params = {"beat_worker": worker_id, "beat_at": now() if callable(now) else now}
            n = conn.execute(beat_jobs, params).rowcount
            conn.execute(_BEAT_WORKER, params)
        return int(n)

    def set_progress(
        self, job_id: int, attempt: int, worker_id: str, progress: float | None, message: str | None, now: datetime
    ) -> bool:
        stmt = (
            update(jobs)
            .where(
                jobs.c.id == job_id,
                jobs.c.attempt == attempt,
                jobs.c.worker_id == worker_id,
                jobs.c.status == _RUNNING,
            )
            .values(progress=progress, progress_message=storable_text(message), heartbeat_at=now, updated_at=now)
        )
        with self.write() as conn:
            return bool(conn.execute(stmt).rowcount)

    def release(
        self,
        worker_id: str,
        held: Sequence[tuple[int, int]],
        now: datetime,
        *,
        interrupted: Mapping[int, datetime | None] | None = None,
    ) -> list[int]:
        """Give claimed jobs back to ``pending`` without counting a retry
        (graceful shutdown). ``held`` is (job id, attempt) pairs.

        The attempt number is kept, not given back: results are fenced by
        (job, attempt, worker), and a number handed out again would let the
        released attempt's late result complete the next claim of the same
        job by the same worker (a pool claims what it shed).

        ``interrupted`` names the jobs whose handler had started (id ->
        when): shutdown cut them short. Each gets an attempt row saying
        "interrupted by shutdown", so the job's history shows the run that
        did not finish (and an effect it started is seen as that attempt's)."""
        if not held:
            return []
        started = dict(interrupted or {})
        stmt = (
            update(jobs)
            .where(
                tuple_(jobs.c.id, jobs.c.attempt).in_(list(held)),
                jobs.c.worker_id == worker_id,
                jobs.c.status.in_(sources(Transition.RELEASE)),
            )
            .values(
                status=State.PENDING.value,
                worker_id=None,
                claimed_at=None,
                heartbeat_at=None,
                progress=None,
                progress_message=None,
                updated_at=now,
            )
            .returning(jobs.c.id)
        )
        attempt_of = dict(held)
        with self.write() as conn:
            released = list(conn.execute(stmt).scalars())
            rows = [
                {
                    "job_id": job_id,
                    "attempt": attempt_of[job_id],
                    "worker_id": worker_id,
                    "started_at": started[job_id],
                    "finished_at": now,
                    "outcome": INTERRUPTED,
                    "error": "interrupted by shutdown",
                    "traceback": None,
                    "payload": None,
                }
                for job_id in released
                if job_id in started
            ]
            if rows:
                conn.execute(insert(attempts), rows)
            if released:
                self._notify_other_processes(conn)
        if released:
            self._notify_enqueued()
        return released

    def rescue_stalled(self, now: datetime, stall_timeout: float, limit: int = 500) -> list[JobRecord]:
        """Running jobs whose heartbeat is older than the stall timeout, held
        by no worker that is still heart-beating: record the attempt as
        stalled and apply the fail rule. Each job's update is conditional on
        its attempt, so concurrent sweepers rescue it once.

        A job's own ``heartbeat_at`` is not enough: a claim stamps it with
        the time the claimer read before it waited for the write lock, which
        under a saturated drain was seconds earlier than its commit, and a
        sweeper elsewhere rescued live jobs (250 at once) moments after they
        were claimed. The worker's own row is stamped only by its heartbeat,
        with the time the beat was written. Jobs of a worker with no row (an
        HTTP worker beats each job) go by the job's heartbeat alone.

        Picked and rescued in one transaction (the rows locked on PostgreSQL,
        those another transaction holds skipped): picked apart, a heartbeat
        landing in between was accepted and the job rescued anyway."""
        cutoff = now - timedelta(seconds=stall_timeout)
        live_worker = (
            select(workers.c.id).where(workers.c.id == jobs.c.worker_id, workers.c.heartbeat_at >= cutoff).exists()
        )
        stalled = (
            select(jobs.c.id, jobs.c.worker_id, jobs.c.attempt, jobs.c.heartbeat_at)
            .where(jobs.c.status == _RUNNING, jobs.c.heartbeat_at < cutoff, ~live_worker)
            .limit(limit)
        )
        if self.dialect == "postgresql":
            stalled = stalled.with_for_update(of=jobs, skip_locked=True)
        with self._one_transaction() as conn:
            return self.fail_many(self._stalled_outcomes(conn.execute(stalled).all()), now)

    @staticmethod
    def _stalled_outcomes(rows: Sequence[Any]) -> list[Outcome]:
        return [
            Outcome(
                r.id,
                r.worker_id,
                attempt=r.attempt,
                error=f"stalled: worker {r.worker_id} stopped heart-beating at {r.heartbeat_at.isoformat()}",
                kind="stalled",
            )
            for r in rows
        ]

    # -- operator actions -----------------------------------------------------

    def retry(self, job_id: int, now: datetime, payload: dict[str, Any] | None = None) -> JobRecord:
        """failed|dead|discarded -> pending now, with a fresh retry budget.
        With ``payload`` (edit and retry) the old payload stays visible on the
        attempts that ran with it."""
        values: dict[str, Any] = {
            "status": State.PENDING.value,
            "available_at": now,
            "retry_count": 0,
            "finished_at": None,
            "updated_at": now,
        }
        with self.write() as conn:
            if payload is not None:
                old = conn.execute(select(jobs.c.payload).where(jobs.c.id == job_id)).scalar()
                values["payload"] = _dumps(payload)
            row = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.status.in_(sources(Transition.RETRY)))
                .values(values)
                .returning(*_JOB_COLS)
            ).first()
            if row is None:
                raise self._why_refused(conn, job_id, Transition.RETRY)
            if payload is not None:
                conn.execute(
                    update(attempts)
                    .where(attempts.c.job_id == job_id, attempts.c.payload.is_(None))
                    .values(payload=old)
                )
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return JobRecord.from_row(row)

    def discard(self, job_id: int, now: datetime) -> JobRecord:
        """pending|failed|dead -> discarded."""
        with self.write() as conn:
            row = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.status.in_(sources(Transition.DISCARD)))
                .values(status=State.DISCARDED.value, finished_at=now, updated_at=now)
                .returning(*_JOB_COLS)
            ).first()
            if row is None:
                raise self._why_refused(conn, job_id, Transition.DISCARD)
        return JobRecord.from_row(row)

    def retry_ids(self, ids: Sequence[int], now: datetime) -> list[int]:
        """Bulk retry; returns the ids moved (others had moved on)."""
        with self.write() as conn:
            moved = list(
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id.in_(list(ids)), jobs.c.status.in_(sources(Transition.RETRY)))
                    .values(
                        status=State.PENDING.value, available_at=now, retry_count=0, finished_at=None, updated_at=now
                    )
                    .returning(jobs.c.id)
                ).scalars()
            )
            if moved:
                self._notify_other_processes(conn)
        if moved:
            self._notify_enqueued()
        return moved

    def discard_ids(self, ids: Sequence[int], now: datetime) -> list[int]:
        with self.write() as conn:
            return list(
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id.in_(list(ids)), jobs.c.status.in_(sources(Transition.DISCARD)))
                    .values(status=State.DISCARDED.value, finished_at=now, updated_at=now)
                    .returning(jobs.c.id)
                ).scalars()
            )

    def _why_refused(self, conn: Connection, job_id: int, transition: Transition) -> Exception:
        status = conn.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar()
        if status is None:
            return JobNotFound(job_id)
        return TransitionRefused(job_id, status, transition)

    # -- workers ----------------------------------------------------------------

    def register_worker(self, worker_id: str, host: str, pid: int, threads: int, now: datetime) -> None:
        with self.write() as conn:
            conn.execute(delete(workers).where(workers.c.id == worker_id))
            conn.execute(
                insert(workers).values(
                    id=worker_id, host=host, pid=pid, threads=threads, started_at=now, heartbeat_at=now
                )
            )

    def stop_worker(self, worker_id: str, now: datetime) -> None:
        with self.write() as conn:
            conn.execute(update(workers).where(workers.c.id == worker_id).values(stopped_at=now, heartbeat_at=now))

    def set_worker_health(self, worker_id: str, abandoned_threads: int, unhealthy: str | None, now: datetime) -> None:
        """Record a pool's health in its row, where every process's
        dashboard reads it (``app.worker.pool.WorkerPool.health_once``)."""
        with self.write() as conn:
            conn.execute(
                update(workers)
                .where(workers.c.id == worker_id)
                .values(abandoned_threads=abandoned_threads, unhealthy=storable_text(unhealthy))
            )

    def list_workers(self) -> list[dict[str, Any]]:
        with self.read() as conn:
            rows = conn.execute(select(workers).order_by(workers.c.started_at.desc())).all()
            held: dict[str, int] = dict(
                conn.execute(
                    select(jobs.c.worker_id, func.count()).where(jobs.c.status == _RUNNING).group_by(jobs.c.worker_id)
                ).all()
            )
        return [dict(r._mapping, running=held.get(r.id, 0)) for r in rows]

    # -- reads ------------------------------------------------------------------

    def get(self, job_id: int) -> JobRecord:
        with self.read() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise JobNotFound(job_id)
        return JobRecord.from_row(row)

    def attempts_of(self, job_id: int) -> list[AttemptRecord]:
        with self.read() as conn:
            rows = conn.execute(
                select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.attempt, attempts.c.id)
            ).all()
        return [AttemptRecord.from_row(r) for r in rows]

    def list_jobs(self, f: JobFilter, now: datetime) -> list[JobRecord]:
        """Newest first with keyset pagination (``before_id``/``after_id``)."""
        stmt = filtered(select(jobs), f, now)
        if f.after_id is not None:
            stmt = stmt.where(jobs.c.id > f.after_id).order_by(jobs.c.id.asc())
        else:
            if f.before_id is not None:
                stmt = stmt.where(jobs.c.id < f.before_id)
            stmt = stmt.order_by(jobs.c.id.desc())
        with self.read() as conn:
            rows = conn.execute(stmt.limit(f.limit)).all()
        records = [JobRecord.from_row(r) for r in rows]
        records.sort(key=lambda j: -j.id)
        return records

    def counts(self, now: datetime) -> dict[str, int]:
        """Jobs per state, plus ``scheduled`` (pending, not yet due) split out
        of ``pending``."""
        with self.read() as conn:
            counts = {s.value: 0 for s in State}
            for status, n in conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status)):
                counts[status] = n
            scheduled = conn.execute(
                select(func.count()).where(jobs.c.status == State.PENDING.value, jobs.c.available_at > now)
            ).scalar_one()
        counts["pending"] -= scheduled
        counts["scheduled"] = scheduled
        return counts


def _claimed_values(worker_id: str, now: datetime) -> dict[str, Any]:
    """What the claim transition writes (the SQLite fast path in
    ``app.store.sqlite`` writes the same)."""
    return {
        "status": _RUNNING,
        "worker_id": worker_id,
        "claimed_at": now,
        "heartbeat_at": now,
        "attempt": jobs.c.attempt + 1,
        "progress": None,
        "progress_message": None,
        "updated_at": now,
    }


def filtered(stmt: Any, f: JobFilter, now: datetime) -> Any:
    """``stmt`` narrowed to the jobs ``f`` matches (paging aside); shared by
    the API's list and the dashboard's lists, counts and bulk actions."""
    if f.status is not None:
        stmt = stmt.where(jobs.c.status == f.status.value)
    if f.scheduled is True:
        stmt = stmt.where(jobs.c.available_at > now)
    elif f.scheduled is False:
        stmt = stmt.where(jobs.c.available_at <= now)
    if f.type:
        stmt = stmt.where(jobs.c.type == f.type)
    if f.queue:
        stmt = stmt.where(jobs.c.queue == f.queue)
    if f.search:
        stmt = stmt.where(_search(f.search))
    return stmt


def _search(text: str) -> Any:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    like = f"%{escaped}%"
    clauses: list[Any] = [
        jobs.c.idempotency_key.like(like, escape="\\"),
        jobs.c.error.like(like, escape="\\"),
        jobs.c.payload.like(like, escape="\\"),
        jobs.c.type.like(like, escape="\\"),
    ]
    stripped = text.strip().lstrip("#")
    # ASCII digits only ("²".isdigit() is true) and within BIGINT, or it is no id.
    if stripped.isascii() and stripped.isdigit() and len(stripped) <= 19 and fits_id(int(stripped)):
        clauses.insert(0, jobs.c.id == int(stripped))
    return or_(*clauses)


def _check_same(existing: JobRecord, new: NewJob) -> None:
    assert new.idempotency_key is not None
    if existing.type != new.type:
        raise IdempotencyConflict(new.idempotency_key, existing.id, f"type {existing.type!r}, not {new.type!r}")
    if existing.payload != new.payload:
        raise IdempotencyConflict(new.idempotency_key, existing.id, "a different payload")
