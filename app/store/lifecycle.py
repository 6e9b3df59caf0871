"""``Store``: every transition of a job, each one statement of
``jobdeck.store.statements`` run in one transaction.

A transition names its allowed source states (from ``jobdeck.core.states``); zero
rows updated means it was refused, and the caller gets an error saying why.
The parts: ``transactions`` (write/read, listeners, running a statement on
each dialect), ``enqueue``, ``claim``, ``finish`` (complete, fail, rescue,
release, heartbeat); this module adds the operator's actions, the workers'
rows and the reads the API and the pool make.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from jobdeck.core.config_tables import DEFAULT_ARTIFACT_BYTES
from jobdeck.core.errors import JobMovedOn, JobNotFound, RunNowRefused, TransitionRefused
from jobdeck.core.states import CLAIMABLE, SOURCES, State, Transition
from jobdeck.store import operator_statements, statements
from jobdeck.store.audit import Tally, count_moved
from jobdeck.store.enqueue import Enqueueing, dumps
from jobdeck.store.faults import is_transient, is_unavailable, storable_text
from jobdeck.store.filters import filtered
from jobdeck.store.ledger import Ledger
from jobdeck.store.models import attempts, jobs, workers
from jobdeck.store.records import AttemptRecord, JobFilter, JobRecord, NewJob, Outcome
from jobdeck.store.snoozing import Snoozing
from jobdeck.store.transactions import Backoff
from sqlalchemy import Engine, delete, func, insert, select, update

__all__ = [
    "AttemptRecord", "Backoff", "Edited", "JobChanges", "JobFilter", "JobRecord", "NewJob", "Outcome", "Seen", "Store",
    "exponential_backoff", "is_transient", "is_unavailable", "storable_text",
]  # fmt: skip


def backoff_delay(base: float, cap: float, retry_count: int) -> float:
    """``base * 2 ** retry_count`` plus up to 10% jitter, capped at ``cap``."""
    delay = min(cap, base * 2 ** min(retry_count, 62))
    return float(min(cap, delay + random.uniform(0, delay * 0.1)))


def exponential_backoff(base: float = 1.0, cap: float = 3600.0) -> Backoff:
    def backoff(_type: str, retry_count: int) -> float:
        return backoff_delay(base, cap, retry_count)

    return backoff


@dataclass(frozen=True)
class JobChanges:
    """What an operator's edit sets, already validated (``Jobdeck.job_changes``);
    None leaves a field as it is."""

    payload_json: str | None = None
    priority: int | None = None
    queue: str | None = None
    available_at: datetime | None = None

    def values(self) -> dict[str, Any]:
        """The set fields by column name, in ``operator_statements.EDIT_FIELDS`` order."""
        given: dict[str, Any] = {"payload": self.payload_json, "priority": self.priority, "queue": self.queue}
        given["available_at"] = self.available_at
        return {f: given[f] for f in operator_statements.EDIT_FIELDS if given[f] is not None}


@dataclass(frozen=True)
class Seen:
    """The job as an operator saw it when they opened the edit form: what
    the edit is fenced on, so it never lands on a job that moved on."""

    status: State
    attempt: int
    updated_at: datetime


@dataclass(frozen=True)
class Edited:
    """An applied edit: the job before and after, for the answer and the audit log."""

    before: JobRecord
    after: JobRecord

    def summary(self) -> str:
        """The changes in words, old and new value, e.g. ``priority 0 → 20;
        queue default → mail; retried, due ...``; payloads by size only (they
        are user data and may be large)."""
        b, a = self.before, self.after
        parts = []
        if a.payload != b.payload:
            parts.append(f"payload edited ({_size(b.payload)} → {_size(a.payload)} bytes)")
        if a.priority != b.priority:
            parts.append(f"priority {b.priority} → {a.priority}")
        if a.queue != b.queue:
            parts.append(f"queue {b.queue} → {a.queue}")
        if a.available_at != b.available_at and b.status is not State.DEAD:
            parts.append(f"run at {_when(b.available_at)} → {_when(a.available_at)}")
        if b.status is State.DEAD:
            parts.append(f"retried, due {_when(a.available_at)}")
        return "; ".join(parts) or "nothing changed"


def _size(payload: dict[str, Any]) -> int:
    return len(dumps(payload).encode())


def _when(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


class Store(Enqueueing, Snoozing):
    def __init__(self, engine: Engine, backoff: Backoff | None = None) -> None:
        super().__init__(engine)
        self.backoff: Backoff = backoff or exponential_backoff()
        self.ledger = Ledger(self)
        """The effects ledger's steps (``jobdeck.store.ledger``), on this store's transactions."""
        self.artifact_max_bytes: int = DEFAULT_ARTIFACT_BYTES
        """``[artifacts] max_bytes`` of the deck that owns this store (set by
        ``Jobdeck``): every ``ctx.artifact`` on it is held to this."""
        self.flow_keys: Callable[[str, str, Any], tuple[str | None, str | None]] | None = None
        """Installed by the deck when keyed flow limits are configured (``jobdeck.jobs.flow.Flow.keys``):
        an edit of a job's payload or queue recomputes its keys."""
        self._cancel_listeners: list[Callable[[list[int]], object]] = []

    # -- operator actions -----------------------------------------------------

    def retry(self, job_id: int, now: datetime, payload: dict[str, Any] | None = None) -> JobRecord:
        """failed|dead|discarded -> pending now, with a fresh retry budget.
        With ``payload`` (edit and retry) the old payload stays visible on the
        attempts that ran with it."""
        params: dict[str, Any] = {"job": job_id, "now": now}
        with self.write() as conn:
            if payload is not None:
                old = conn.execute(operator_statements.payload_of(), params).scalar()
                params["new_payload"] = dumps(payload)
            row = conn.execute(operator_statements.retry(True, payload is not None), params).first()
            if row is None:
                raise self._why_refused(conn, job_id, Transition.RETRY)
            if payload is not None:
                conn.execute(operator_statements.keep_old_payload(), {"job": job_id, "old": old})
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return JobRecord.from_row(row)

    def edit(self, job_id: int, now: datetime, changes: JobChanges, seen: Seen | None = None) -> Edited:
        """Change a waiting job's payload, priority, queue or run-at in one
        fenced statement (``operator_statements.edit``): a pending or failed job keeps
        its state, a dead one is retried. ``seen`` is the job as the operator
        saw it; without it, the job as read here (so a claim racing this very
        call still wins). Raises ``TransitionRefused`` for a job no edit
        applies to and ``JobMovedOn`` when it changed since ``seen``. The
        attempts that ran with the old payload keep it, as for edit and retry."""
        values = changes.values()
        with self.write() as conn:
            row = conn.execute(operator_statements.job_of(), {"job": job_id}).first()
            if row is None:
                raise JobNotFound(job_id)
            before = JobRecord.from_row(row)
            if before.status not in SOURCES[Transition.EDIT]:
                raise TransitionRefused(job_id, before.status, Transition.EDIT)
            fence = seen or Seen(before.status, before.attempt, before.updated_at)
            params: dict[str, Any] = {"job": job_id, "now": now, "seen_attempt": fence.attempt}
            params["seen_updated_at"] = fence.updated_at
            params.update({f"new_{name}": value for name, value in values.items()})
            edited = conn.execute(operator_statements.edit(tuple(values), fence.status), params).first()
            if edited is None:
                raise self._why_not_edited(conn, job_id)
            after = JobRecord.from_row(edited)
            if after.payload != before.payload:
                conn.execute(operator_statements.keep_old_payload(), {"job": job_id, "old": row.payload})
            if self.flow_keys is not None and (after.payload != before.payload or after.queue != before.queue):
                rate_key, concurrency_key = self.flow_keys(after.type, after.queue, after.payload)
                conn.execute(
                    operator_statements.set_flow_keys(), {"job": job_id, "rk": rate_key, "ck": concurrency_key}
                )
                after = replace(after, rate_key=rate_key, concurrency_key=concurrency_key)
            due = after.status in CLAIMABLE and after.available_at <= now
            if due:
                self._notify_other_processes(conn)
        if due:
            self._notify_enqueued()
        return Edited(before, after)

    def _why_not_edited(self, conn: Any, job_id: int) -> Exception:
        now_row = conn.execute(operator_statements.job_of(), {"job": job_id}).first()
        if now_row is None:
            return JobNotFound(job_id)
        if now_row.status not in {s.value for s in SOURCES[Transition.EDIT]}:
            return TransitionRefused(job_id, now_row.status, Transition.EDIT)
        return JobMovedOn(job_id, now_row.status, now_row.attempt)

    def discard(self, job_id: int, now: datetime) -> JobRecord:
        """pending|failed|dead -> discarded."""
        with self.write() as conn:
            row = conn.execute(operator_statements.discard(True), {"job": job_id, "now": now}).first()
            if row is None:
                raise self._why_refused(conn, job_id, Transition.DISCARD)
            job = JobRecord.from_row(row)
            self._settle(conn, [(job.id, job.status.value, job.workflow_id, job.batch_id)], now)
        return job

    def run_now(self, job_id: int, now: datetime) -> JobRecord:
        """A scheduled or retrying job becomes due now. Like retry and
        release it wakes this process's pool and, on PostgreSQL, every other
        process's (NOTIFY in the same transaction)."""
        with self.write() as conn:
            row = conn.execute(operator_statements.run_now(), {"job": job_id, "now": now}).first()
            if row is None:
                status = conn.execute(operator_statements.status_of(), {"job": job_id}).scalar()
                if status is None:
                    raise JobNotFound(job_id)
                state = State(status)
                raise RunNowRefused(job_id, state, due=state in SOURCES[Transition.RUN_NOW])
            self._notify_other_processes(conn)
        self._notify_enqueued()
        return JobRecord.from_row(row)

    def cancel(self, job_id: int, now: datetime) -> JobRecord:
        """pending|failed -> cancelled at once; a running job stays running
        with a cancel request, which this process's pools hear of now (and
        other processes' at their next heartbeat): its attempt's end, however
        it ends, ends the job cancelled. Refused for dead and finished jobs."""
        with self.write() as conn:
            row = conn.execute(operator_statements.cancel(True), {"job": job_id, "now": now}).first()
            if row is None:
                raise self._why_refused(conn, job_id, Transition.CANCEL)
            job = JobRecord.from_row(row)
            self._settle(conn, [(job.id, job.status.value, job.workflow_id, job.batch_id)], now)
        if job.status is State.RUNNING:
            self._notify_cancel([job.id])
        return job

    def cancel_ids(self, ids: Sequence[int], now: datetime, tally: Tally | None = None) -> list[int]:
        """Bulk cancel; returns the ids cancelled or asked to cancel (others
        had moved on). With ``tally``, what moved is counted into its bulk
        action's audit entry in the same transaction (``jobdeck.store.audit``)."""
        with self.write() as conn:
            moved = conn.execute(operator_statements.cancel(False), {"ids": list(ids), "now": now}).all()
            self._settle(conn, moved, now)
            if tally is not None:
                count_moved(conn, tally, len(moved), now)
        running = [r[0] for r in moved if r[1] == State.RUNNING.value]
        if running:
            self._notify_cancel(running)
        return [r[0] for r in moved]

    def on_cancel(self, fn: Callable[[list[int]], object]) -> None:
        """Call ``fn`` with the ids of running jobs just asked to cancel in
        this process (a pool of this process running one stops it at once)."""
        self._cancel_listeners.append(fn)

    def _notify_cancel(self, job_ids: list[int]) -> None:
        for fn in self._cancel_listeners:
            fn(job_ids)

    def retry_ids(self, ids: Sequence[int], now: datetime, tally: Tally | None = None) -> list[int]:
        """Bulk retry; returns the ids moved (others had moved on), counted
        into ``tally``'s audit entry in the same transaction."""
        with self.write() as conn:
            moved = list(conn.execute(operator_statements.retry(False), {"ids": list(ids), "now": now}).scalars())
            if tally is not None:
                count_moved(conn, tally, len(moved), now)
            if moved:
                self._notify_other_processes(conn)
        if moved:
            self._notify_enqueued()
        return moved

    def retry_workflow(self, workflow_id: int, now: datetime, tally: Tally | None = None) -> list[int]:
        """Retry the failed part of a workflow: its failed, dead and discarded
        jobs. Dependents held (``hold``) run once these complete; dependents
        already cancelled by a failure stay cancelled."""
        return self.retry_ids(self.workflow_members(workflow_id, Transition.RETRY), now, tally)

    def cancel_workflow(self, workflow_id: int, now: datetime, tally: Tally | None = None) -> list[int]:
        """Cancel the rest of a workflow: every job of it a cancel applies to
        (blocked, pending and failed ones at once, running ones cooperatively)."""
        return self.cancel_ids(self.workflow_members(workflow_id, Transition.CANCEL), now, tally)

    def workflow_members(self, workflow_id: int, transition: Transition) -> list[int]:
        """The jobs of a workflow that ``transition`` applies to now."""
        self.workflow(workflow_id)  # WorkflowNotFound
        stmt = select(jobs.c.id).where(jobs.c.workflow_id == workflow_id, statements.in_states(transition))
        with self.read() as conn:
            return list(conn.execute(stmt.order_by(jobs.c.id)).scalars())

    def discard_ids(self, ids: Sequence[int], now: datetime, tally: Tally | None = None) -> list[int]:
        """Bulk discard; returns the ids moved, counted into ``tally``'s audit entry in the same transaction."""
        with self.write() as conn:
            moved = conn.execute(operator_statements.discard(False), {"ids": list(ids), "now": now}).all()
            self._settle(conn, moved, now)
            if tally is not None:
                count_moved(conn, tally, len(moved), now)
        return [r[0] for r in moved]

    # -- workers ----------------------------------------------------------------

    def register_worker(
        self, worker_id: str, host: str, pid: int, threads: int, now: datetime, queues: Sequence[str] | None = None
    ) -> None:
        """Record a starting pool; ``queues`` it claims from (None: every queue)."""
        served = None if queues is None else json.dumps(sorted(queues))
        with self.write() as conn:
            conn.execute(delete(workers).where(workers.c.id == worker_id))
            conn.execute(
                insert(workers).values(
                    id=worker_id, host=host, pid=pid, threads=threads, started_at=now, heartbeat_at=now, queues=served
                )
            )

    def stop_worker(self, worker_id: str, now: datetime) -> None:
        with self.write() as conn:
            conn.execute(update(workers).where(workers.c.id == worker_id).values(stopped_at=now, heartbeat_at=now))

    def set_worker_health(self, worker_id: str, abandoned_threads: int, unhealthy: str | None, now: datetime) -> None:
        """Record a pool's health in its row, where every process's
        dashboard reads it (``jobdeck.worker.pool.WorkerPool.health_once``)."""
        with self.write() as conn:
            conn.execute(
                update(workers)
                .where(workers.c.id == worker_id)
                .values(abandoned_threads=abandoned_threads, unhealthy=storable_text(unhealthy))
            )

    def list_workers(self) -> list[dict[str, Any]]:
        running = statements.running()
        with self.read() as conn:
            rows = conn.execute(select(workers).order_by(workers.c.started_at.desc())).all()
            held: dict[str, int] = dict(
                conn.execute(select(jobs.c.worker_id, func.count()).where(running).group_by(jobs.c.worker_id)).all()
            )
        return [
            dict(r._mapping, running=held.get(r.id, 0), executors=json.loads(r.executors) if r.executors else None)
            for r in rows
        ]

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
