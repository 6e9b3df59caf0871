"""Enqueue: one job, many jobs, and the plain jobs of a bulk request."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import chain
from typing import Any

from jobdeck.core.errors import IdempotencyConflict, ItemRefused
from jobdeck.core.states import State
from jobdeck.store import statements
from jobdeck.store.engine import BUSY_TIMEOUT, promptly
from jobdeck.store.group_commit import GroupCommitter
from jobdeck.store.records import Enqueued, Holders, JobRecord, NewJob
from jobdeck.store.sqlite import Prepared, as_stored, db_time, loads, translated_errors
from jobdeck.store.transactions import Transactions
from jobdeck.store.unique import enqueue_unique
from jobdeck.store.waiting import read_holders as read_holders_on
from sqlalchemy import Connection

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_ROWS_PER_STATEMENT = 1000
"""Rows per multi-row INSERT on SQLite at most: 11,000 values, under the
default limit of 32,766 since SQLite 3.32 (fewer where the build's is lower)."""

PlainJob = tuple[str, str, str, int, int]
"""(type, queue, payload JSON, priority, max_retries): a job without a key,
due now, as the deck's bulk enqueue hands it over already checked (the head
of ``statements.JOB_FIELDS``); never for a job a keyed flow limit applies to."""


def dumps(value: Any) -> str:
    return "{}" if value == {} else _ENCODER.encode(value)


def payload_json(new: NewJob) -> str:
    return new.payload_json if new.payload_json is not None else dumps(new.payload)


class Enqueueing(Transactions):
    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self._enqueuer: GroupCommitter[Any] | None = None
        if self._write_lock is not None:
            self._enqueuer = GroupCommitter(self._write_lock, self._commit_enqueues, self._read_holders_after)

    def _row(self, new: NewJob, now: datetime, stamp: Any, as_text: bool) -> tuple[Any, ...]:
        """``stamp`` is ``now`` as the row takes it: SQLite's text (``as_text``) or the datetime."""
        at: Any = new.available_at
        if at is None or at is now:
            at = stamp
        elif as_text:
            at = db_time(at)
        return statements.job_row(new, payload_json(new), stamp, at)

    def enqueue(self, new: NewJob, now: datetime, *, read_holders: bool = False) -> Enqueued:
        """Insert a job; with a known idempotency key return the existing one,
        and with a unique key still held (``jobdeck.store.unique``) the job that
        holds it (a duplicate).

        ``read_holders``: the caller will say why the job waits
        (``jobdeck.jobs.waiting``). On SQLite's group commit, what holds jobs
        back is then read by the batch's leader right after the commit,
        outside the write lock, once for every job of the batch that asked
        (``Enqueued.holders``): those callers are asleep until the commit
        anyway, where a read of their own cost each one more wake-ups than
        the insert did. Elsewhere ``holders`` is None and the caller reads.

        Returns (job, created) as an ``Enqueued``. The unique index on the key decides under concurrency:
        the insert does nothing on conflict and the existing row is read back.
        On PostgreSQL the read sees a newer snapshot than the insert did: if
        retention deleted the job in between, the key is free and the insert
        runs again (it read nothing and answered 500).
        """
        if new.unique is not None:
            return self._enqueue_unique(new, now)
        if self._enqueuer is not None and new.idempotency_key is None:
            values = self._row(new, now, now, False)
            stamp = db_time(now)
            job_id, holders = self._enqueuer.submit((tuple(as_stored(v, now, stamp) for v in values), read_holders))
            self._notify_enqueued()
            return Enqueued(inserted(job_id, values), True, holders=holders)
        values = self._row(new, now, self._t(now), self.sqlite)
        if self.outside():
            return self._enqueue_alone(new, values)
        with self.write() as conn:
            if new.idempotency_key is None:
                row = self._run(conn, statements.enqueue("row"), values).one()
            else:
                found = self._enqueue_keyed(conn, new, values)
                if isinstance(found, JobRecord):
                    return Enqueued(found, False)
                row = found
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return Enqueued(self._record(row), True)

    def _enqueue_alone(self, new: NewJob, values: tuple[Any, ...]) -> Enqueued:
        """PostgreSQL, outside any transaction of the store's: the insert
        and its NOTIFY are one statement in autocommit, durable when it
        returns (``statements.enqueue_notifying``); a plain job's at driver
        level (``alone``). A taken key inserts nothing, and the key's job
        is read after."""
        if new.idempotency_key is None:
            compiled = statements.enqueue_notifying(keyed=False).postgres
            with self.alone() as db:
                job_id = db.execute(compiled.text, compiled.params(values)).fetchone()[0]
        else:
            with self.single() as conn:
                found = self._enqueue_keyed(conn, new, values, statements.enqueue_notifying(keyed=True))
                if isinstance(found, JobRecord):
                    return Enqueued(found, False)
                job_id = found.id
        self._notify_enqueued()
        return Enqueued(inserted(job_id, values), True)

    def _enqueue_unique(self, new: NewJob, now: datetime) -> Enqueued:
        with self.write() as conn:
            job, created, changed = enqueue_unique(conn, self.dialect, new, payload_json(new), now)
            if created or changed:
                self._notify_other_processes(conn)
        if created or changed:
            self._notify_enqueued()
        return Enqueued(job, created, duplicate=not created, changed=changed)

    def _enqueue_keyed(
        self, conn: Connection, new: NewJob, values: tuple[Any, ...], insert: Prepared | None = None
    ) -> Any:
        """The inserted row, or the key's existing job."""
        insert = insert or statements.enqueue_keyed(self.dialect, "row")
        for _ in range(3):  # the key's job deleted (retention) between the two: the key is free again
            inserted = self._run(conn, insert, values).first()
            if inserted is not None:
                return inserted
            existing = conn.execute(statements.job_by_key(), {"key": new.idempotency_key}).first()
            if existing is not None:
                job = JobRecord.from_row(existing)
                _check_same(job, new)
                return job
        raise RuntimeError(f"idempotency_key {new.idempotency_key!r} is taken and freed again and again")

    def enqueue_many(self, news: Sequence[NewJob], now: datetime) -> list[int]:
        """Insert many jobs in one transaction; returns their ids in order.

        A job whose idempotency key exists already is not inserted; its slot in
        the result holds the existing job's id.
        """
        if not news:
            return []
        if any(n.unique is not None for n in news):
            return self._enqueue_many_unique(news, now)
        if not any(n.idempotency_key is not None for n in news):
            stamp = self._t(now)
            return self._insert_plain([self._row(n, now, stamp, self.sqlite) for n in news], stamp)
        with self.write() as conn:
            by_key: dict[str | None, int] = {}
            plain: list[int] = []
            if self.sqlite:
                insert = statements.enqueue_keyed(self.dialect, "id")
                inserted = conn.execute(insert.stmt, [insert.params(self._row(n, now, now, False)) for n in news])
            else:
                inserted = self._insert_unnest(conn, [self._row(n, now, now, False) for n in news], now, keyed=True)
            for row in inserted:
                if row.idempotency_key is None:
                    plain.append(row.id)
                else:
                    by_key[row.idempotency_key] = row.id
            missing = [n.idempotency_key for n in news if n.idempotency_key and n.idempotency_key not in by_key]
            if missing:
                for row in conn.execute(statements.ids_by_key(), {"keys": missing}):
                    by_key[row.idempotency_key] = row.id
            plain.sort()
            it = iter(plain)
            ids = [by_key[n.idempotency_key] if n.idempotency_key else next(it) for n in news]
            if self.sqlite:
                self._notify_other_processes(conn)
        self._notify_enqueued()
        return ids

    def _enqueue_many_unique(self, news: Sequence[NewJob], now: datetime) -> list[int]:
        """A bulk enqueue with unique jobs: one transaction, each job in turn
        (a unique one sees the jobs before it, so two with one key make one
        job, and both slots hold its id). The unique jobs go last, in key
        order: two bulk enqueues on PostgreSQL sharing keys then wait for
        each other's keys in one order, never in a deadlock."""
        ids: list[int] = [0] * len(news)
        stamp = self._t(now)
        unique = sorted((n.unique.key, i) for i, n in enumerate(news) if n.unique is not None)
        with self.write() as conn:
            for i, new in enumerate(news):
                if new.unique is not None:
                    continue
                values = self._row(new, now, stamp, self.sqlite)
                if new.idempotency_key is None:
                    ids[i] = self._run(conn, statements.enqueue("row"), values).one().id
                else:
                    ids[i] = self._enqueue_keyed(conn, new, values).id
            for _, i in unique:
                ids[i] = enqueue_unique(conn, self.dialect, news[i], payload_json(news[i]), now)[0].id
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return ids

    def enqueue_each(self, news: Sequence[NewJob], now: datetime) -> list[Enqueued]:
        """Insert many jobs in one transaction, each answered as ``enqueue``
        answers one: a taken idempotency key gives its job back (``created``
        False), a held unique key the kept job (``duplicate``). A key given
        twice in the call is the first one's request again. In order, one
        ``Enqueued`` per job; a key that belongs to another type or payload
        is an ``ItemRefused`` naming the job's index, and nothing is
        inserted.

        The jobs without a key go in first, in order; then those with an
        idempotency key, in key order, then the unique ones, in unique key
        order: two calls on PostgreSQL that share keys then wait for each
        other's keys in one order, never in a deadlock (which the database
        would break by failing one, and health would report as an outage)."""
        if not news:
            return []
        if all(n.unique is None and n.idempotency_key is None for n in news):
            stamp = self._t(now)
            ids = self._insert_plain([self._row(n, now, stamp, self.sqlite) for n in news], stamp)
            return [Enqueued(inserted(i, self._row(n, now, now, False)), True) for i, n in zip(ids, news, strict=True)]
        done: list[Enqueued | None] = [None] * len(news)
        stamp = self._t(now)
        first: dict[str, JobRecord] = {}
        """Each idempotency key's job, as its first job in the call found or made it."""
        order = sorted(
            (i for i, n in enumerate(news) if n.unique is None),
            key=lambda i: (news[i].idempotency_key is not None, news[i].idempotency_key or "", i),
        )
        with self.write() as conn:
            for i in order:
                new = news[i]
                key = new.idempotency_key
                try:
                    if key and key in first:
                        _check_same(first[key], new)
                        done[i] = Enqueued(first[key], False)
                        continue
                    values = self._row(new, now, stamp, self.sqlite)
                    found = (
                        self._enqueue_keyed(conn, new, values)
                        if key
                        else self._run(conn, statements.enqueue("row"), values).one()
                    )
                except IdempotencyConflict as exc:
                    raise ItemRefused(i, exc) from None
                existed = isinstance(found, JobRecord)
                job = found if existed else self._record(found)
                done[i] = Enqueued(job, not existed)
                if key:
                    first[key] = job
            for _, i in sorted((n.unique.key, i) for i, n in enumerate(news) if n.unique is not None):
                job, created, changed = enqueue_unique(conn, self.dialect, news[i], payload_json(news[i]), now)
                done[i] = Enqueued(job, created, duplicate=not created, changed=changed)
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return [e for e in done if e is not None]

    def enqueue_plain(self, jobs: Sequence[PlainJob], now: datetime, traceparent: str | None = None) -> list[int]:
        """Insert jobs without idempotency keys, due now, from what the deck's
        bulk enqueue checked (``Jobdeck.enqueue_many``); returns their ids in
        order. The rows get the times here, like ``enqueue_many``'s, and
        ``traceparent``, the one trace context of the call (``jobdeck.tracing``)."""
        stamp = self._t(now)
        tail = (None, stamp, stamp, stamp, None, None, traceparent)  # no idempotency key, no flow keys
        return self._insert_plain([job + tail for job in jobs], stamp)

    def _insert_plain(self, rows: list[tuple[Any, ...]], stamp: Any) -> list[int]:
        if not rows:
            return []
        if self.outside():  # one statement: its own transaction
            with self.single() as conn:
                ids = sorted(row.id for row in self._insert_unnest(conn, rows, stamp, keyed=False))
            self._notify_enqueued()
            return ids
        with self.write() as conn:
            if self.sqlite:
                with translated_errors():
                    db = conn.connection.driver_connection
                    assert db is not None
                    ids = _insert_rows_sqlite(db, rows)
            else:
                ids = sorted(row.id for row in self._insert_unnest(conn, rows, stamp, keyed=False))
        self._notify_enqueued()
        return ids

    def _insert_unnest(self, conn: Connection, rows: Sequence[tuple[Any, ...]], now: datetime, keyed: bool) -> Any:
        """PostgreSQL: insert ``rows`` (``job_row``'s, all made at ``now``)
        in one statement (``statements.enqueue_unnest``), which also sends
        the NOTIFY; returns (id, idempotency_key) of those inserted. Ids come
        from the sequence in the rows' order: sorted, they are in it. A job
        due ``now`` (the same object) is sent as NULL, which the statement reads as ``now``."""
        fields = list(zip(*rows, strict=True))
        columns = {f: fields[statements.JOB_FIELDS.index(f)] for f in statements.UNNEST_FIELDS}
        columns["available_at"] = tuple(None if at is now else at for at in columns["available_at"])
        params: dict[str, Any] = {f: statements.UNNEST_ENCODERS[f](values) for f, values in columns.items()}
        params["now"] = now
        return conn.execute(statements.enqueue_unnest(keyed), params).all()

    def _commit_enqueues(self, items: list[tuple[tuple[Any, ...], bool]]) -> list[tuple[int, Holders | None]]:
        """The group commit's batch: ``items`` are (row, read_holders) (``enqueue``)."""
        return [(job_id, None) for job_id in self._insert_batch_sqlite([row for row, _ in items])]

    def _read_holders_after(
        self, items: list[tuple[tuple[Any, ...], bool]], results: list[tuple[int, Holders | None]]
    ) -> list[tuple[int, Holders | None]]:
        """Once a batch is committed, outside the write lock (``GroupCommitter.after``):
        what held jobs back (``jobdeck.store.waiting.read_holders``), read once
        for the jobs of the batch that asked. That read failing fails no
        enqueue (the batch is committed): its askers get None and read on
        their own, where the error is theirs."""
        if not any(read for _, read in items):
            return results
        try:
            with self.glance() as db:
                holders: Holders | None = read_holders_on(db, sqlite=True)
        except Exception:  # noqa: BLE001 - their own read raises it
            holders = None
        return [(job_id, holders if read else None) for (job_id, _), (_, read) in zip(results, items, strict=True)]

    def _insert_batch_sqlite(self, rows: list[tuple[Any, ...]]) -> list[int]:
        """Insert plain jobs in one transaction (the group commit's batch);
        returns their ids in order. On a pooled DBAPI connection under the
        write lock, without SQLAlchemy's Connection: its begin and commit
        events cost more CPU than the insert. A batch that fits one
        multi-row INSERT is that statement alone, in autocommit, its own
        transaction (durable when it returns): one call into SQLite for the
        batch where BEGIN, an INSERT per job and COMMIT were each one, and
        each call gives the GIL up and waits to take it back from the HTTP
        threads."""
        assert self._write_lock is not None
        with self._write_lock, translated_errors():
            raw = self.engine.raw_connection()
            try:
                db = raw.driver_connection
                assert db is not None
                wait = raw.info.get(BUSY_TIMEOUT)
                if len(rows) <= _rows_per_statement(db, rows):
                    ids = promptly(db, lambda: _insert_rows_sqlite(db, rows), wait)
                else:
                    promptly(db, lambda: db.execute("BEGIN IMMEDIATE"), wait)
                    try:
                        ids = _insert_rows_sqlite(db, rows)
                        db.execute("COMMIT")
                    except BaseException:
                        if db.in_transaction:
                            db.execute("ROLLBACK")
                        raise
                return ids
            finally:
                raw.close()


def _rows_per_statement(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> int:
    return min(_ROWS_PER_STATEMENT, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(rows[0]))


def _insert_rows_sqlite(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> list[int]:
    """SQLite: ``rows`` (``job_row``'s, times as stored) in multi-row INSERTs
    (``statements.enqueue_rows_sqlite``) on ``db``, inside the caller's
    transaction (or, one statement, in its own); returns their ids in order.
    One writer holds the lock, so the rowids of these statements are consecutive."""
    cur = db.cursor()
    per = _rows_per_statement(db, rows)
    for start in range(0, len(rows), per):
        chunk = rows[start : start + per]
        cur.execute(statements.enqueue_rows_sqlite(len(chunk)), list(chain.from_iterable(chunk)))
    last = cur.lastrowid
    assert last is not None
    return list(range(last - len(rows) + 1, last + 1))


def inserted(job_id: int, values: tuple[Any, ...]) -> JobRecord:
    """The job an enqueue inserted from ``values`` (``statements.job_row``'s,
    times as datetimes) and ``statements.NEW_JOB``: what its ``RETURNING *``
    reads back, times in UTC as the database gives them."""
    type_, queue, payload, priority, max_retries, key, at, created, updated, rate_key, concurrency_key, trace = values
    fixed = statements.NEW_JOB
    return JobRecord(
        job_id, type_, queue, loads(payload), priority, State(fixed["status"]), fixed["attempt"],
        fixed["retry_count"], max_retries, key, at.astimezone(UTC), None, None, None, None, None, None, None,
        created.astimezone(UTC), updated.astimezone(UTC), None, rate_key=rate_key, concurrency_key=concurrency_key,
        traceparent=trace,
    )  # fmt: skip


def _check_same(existing: JobRecord, new: NewJob) -> None:
    assert new.idempotency_key is not None
    if existing.type != new.type:
        raise IdempotencyConflict(new.idempotency_key, existing.id, f"type {existing.type!r}, not {new.type!r}")
    if existing.payload != new.payload:
        raise IdempotencyConflict(new.idempotency_key, existing.id, "a different payload")
