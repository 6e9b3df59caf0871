"""The effects ledger's SQL: each step of an effect is one conditional
statement on its row, like a job's transitions.

An effect is ``started`` by an attempt before its side effect and ``done``
(with the result) after it; ``not_performed`` when it certainly did not
happen. The row is keyed by the handler's key, so every attempt of every job
that reaches the same key meets the same row (``jobdeck.core.states.EffectState``).
``JobContext.effect`` (jobdeck.jobs.context) drives these steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.errors import (
    AttemptOver,
    EffectNotFound,
    EffectResolveRefused,
    JobNotFound,
    NotHeld,
    StaleAttempt,
)
from jobdeck.core.states import EFFECT_RESOLUTIONS, EffectState, State
from jobdeck.store import attempt_statements
from jobdeck.store.effect_records import EffectRecord, storable
from jobdeck.store.models import effects, jobs
from jobdeck.store.statements import dialect_insert
from sqlalchemy import Connection, select, update

if TYPE_CHECKING:
    from jobdeck.store.transactions import Transactions

_STARTED = EffectState.STARTED.value


@dataclass(frozen=True)
class Start:
    """What ``Ledger.start`` found: the row as it now stands, whether this
    attempt started it, and whether the attempt holding it is still running
    (then the effect is in flight, not lost)."""

    record: EffectRecord
    mine: bool
    holder_running: bool = False


class Ledger:
    def __init__(self, store: Transactions) -> None:
        self.store = store
        """Its transactions only: the ledger is part of the ``Store`` that holds it."""

    @contextmanager
    def held(self, job_id: int, attempt: int, worker_id: str) -> Iterator[None]:
        """One write transaction for an HTTP worker's effect step, refused
        unless its attempt still holds the job: running, at ``attempt``, by
        ``worker_id``. The job's row stays locked (PostgreSQL; on SQLite the
        write lock is held) to the commit, so no rescue or cancel lands
        between the check and the steps; the ledger's and the store's
        statements made inside join the transaction."""
        with self.store._one_transaction() as conn:
            row = conn.execute(attempt_statements.current(lock=True), {"ids": [job_id]}).first()
            if row is None:
                raise JobNotFound(job_id)
            if row.status != State.RUNNING.value:
                raise AttemptOver(job_id, row.status)
            if row.worker_id != worker_id:
                raise NotHeld(job_id, worker_id, row.worker_id)
            if row.attempt != attempt:
                raise StaleAttempt(job_id, attempt, row.attempt)
            yield

    def start(self, key: str, job_id: int, attempt: int, worker_id: str, now: datetime) -> Start:
        """Record ``key`` started by this attempt, unless a row exists that is
        not ``not_performed``; then report that row instead. One statement
        decides, so two attempts racing for a key cannot both start it."""
        owner = {
            "job_id": job_id,
            "attempt": attempt,
            "worker_id": worker_id,
            "state": _STARTED,
            "started_at": now,
            "finished_at": None,
            "result": None,
            "resolved_by": None,
        }
        insert = dialect_insert(self.store.dialect)(effects).values(key=key, created_at=now, **owner)
        stmt = insert.on_conflict_do_update(
            index_elements=["key"],
            set_=owner,
            where=effects.c.state == EffectState.NOT_PERFORMED.value,
        ).returning(*effects.c)
        with self.store.write() as conn:
            row = conn.execute(stmt).first()
            if row is not None:
                return Start(EffectRecord.from_row(row), mine=True)
            record = self._get(conn, key)
            return Start(record, mine=False, holder_running=self._holder_running(conn, record))

    def _holder_running(self, conn: Connection, record: EffectRecord) -> bool:
        if record.state is not EffectState.STARTED or record.job_id is None:
            return False
        row = conn.execute(select(jobs.c.status, jobs.c.attempt).where(jobs.c.id == record.job_id)).first()
        return row is not None and row.status == State.RUNNING.value and row.attempt == record.attempt

    def take_over(
        self, seen: EffectRecord, job_id: int, attempt: int, worker_id: str, now: datetime
    ) -> EffectRecord | None:
        """A replay-safe effect left ``started`` by ``seen``'s attempt is
        started again by this one (the row as it now stands); None, refused,
        if anything moved meanwhile."""
        stmt = (
            update(effects)
            .where(
                effects.c.key == seen.key,
                effects.c.state == _STARTED,
                _same(effects.c.job_id, seen.job_id),
                _same(effects.c.attempt, seen.attempt),
            )
            .values(job_id=job_id, attempt=attempt, worker_id=worker_id, started_at=now)
            .returning(*effects.c)
        )
        with self.store.write() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else EffectRecord.from_row(row)

    def finish(
        self, key: str, job_id: int, attempt: int, result_json: str, now: datetime, worker_id: str | None = None
    ) -> bool:
        """started -> done with the result, by the attempt that started it
        (and, given ``worker_id``, only by that worker: an HTTP worker's).
        Also from ``not_performed``: a late finish (a timed-out thread, a
        person's guess) is the truth about the effect and wins."""
        stmt = (
            update(effects)
            .where(
                effects.c.key == key,
                effects.c.job_id == job_id,
                effects.c.attempt == attempt,
                effects.c.state.in_([_STARTED, EffectState.NOT_PERFORMED.value]),
                *_by(worker_id),
            )
            .values(state=EffectState.DONE.value, result=result_json, finished_at=now)
        )
        with self.store.write() as conn:
            return bool(conn.execute(stmt).rowcount)

    def withdraw(self, key: str, job_id: int, attempt: int, now: datetime, worker_id: str | None = None) -> bool:
        """started -> not_performed: the effect's function said it did not
        happen (``EffectNotPerformed``), so the next attempt performs it.
        Given ``worker_id``, only by that worker (an HTTP worker's)."""
        stmt = (
            update(effects)
            .where(
                effects.c.key == key,
                effects.c.job_id == job_id,
                effects.c.attempt == attempt,
                effects.c.state == _STARTED,
                *_by(worker_id),
            )
            .values(state=EffectState.NOT_PERFORMED.value, finished_at=now)
        )
        with self.store.write() as conn:
            return bool(conn.execute(stmt).rowcount)

    def resolve(self, key: str, outcome: EffectState, actor: str, now: datetime, result: Any = None) -> EffectRecord:
        """A person marks an unknown (``started``) effect done (with an
        optional result) or not performed, after checking the far side (the
        gateway's dashboard). Refused for any other state."""
        if outcome not in EFFECT_RESOLUTIONS:
            raise ValueError(f"an effect can be resolved only as done or not_performed, not {outcome}")
        stmt = (
            update(effects)
            .where(effects.c.key == key, effects.c.state == _STARTED)
            .values(
                state=outcome.value,
                resolved_by=actor,
                finished_at=now,
                result=storable(result) if outcome is EffectState.DONE and result is not None else None,
            )
            .returning(*effects.c)
        )
        with self.store.write() as conn:
            row = conn.execute(stmt).first()
            if row is None:
                raise EffectResolveRefused(key, self._get(conn, key).state.value)
        return EffectRecord.from_row(row)

    def _get(self, conn: Connection, key: str) -> EffectRecord:
        row = conn.execute(select(*effects.c).where(effects.c.key == key)).first()
        if row is None:
            raise EffectNotFound(key)
        return EffectRecord.from_row(row)

    def get(self, key: str) -> EffectRecord:
        with self.store.read() as conn:
            return self._get(conn, key)

    def of_job(self, job_id: int) -> list[EffectRecord]:
        """The effects a job's attempts started, oldest first (the job page)."""
        with self.store.read() as conn:
            rows = conn.execute(
                select(*effects.c).where(effects.c.job_id == job_id).order_by(effects.c.created_at, effects.c.key)
            ).all()
        return [EffectRecord.from_row(r) for r in rows]


def _by(worker_id: str | None) -> list[Any]:
    return [] if worker_id is None else [effects.c.worker_id == worker_id]


def _same(column: Any, value: Any) -> Any:
    return column.is_(None) if value is None else column == value
