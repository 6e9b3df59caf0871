"""The store's part of workflows and batches (records and statements in
``jobdeck.store.graph``).

Everything a job's end does to the jobs that wait on it happens in the
transaction that ends it (``Graph._settle``), on every path that ends a
job: the batched acknowledgement, fail and rescue, release, snooze, cancel
and discard. So there is no sweeper to miss a promotion and no window in
which a finished dependency has a dependent still waiting.

- **Promote.** A blocked job counts its dependencies not yet completed
  (``deps_left``). A completion takes each dependent's count down by the
  edges it frees, and the dependent whose count reaches 0 becomes
  ``pending``, due now, in the same conditional UPDATE. On PostgreSQL the
  dependents' rows are locked first, in id order: two processes completing
  siblings then wait for each other there (never in a deadlock), and the
  second's UPDATE counts down from what the first committed. Exactly one of
  them promotes; neither misses it. SQLite has one writer.
- **Dependency failure.** A dependency that ends dead, cancelled or
  discarded cancels its blocked dependents ("dependency X is dead"), and
  theirs in turn; a dependent whose ``on_dependency_failure`` is ``hold``
  stays blocked until a person retries the dependency and it completes.
  A cancelled dependency cancels even those: it can never be retried.
- **Batches.** Once a batch is closed, the transaction that ends its last
  job (completed, dead, cancelled or discarded) enqueues its callbacks and
  stamps ``fired_at``. It holds the batch's row while it looks: on
  PostgreSQL the second of two ending the last two jobs sees the first's
  commit, and ``fired_at`` keeps it to once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from jobdeck.core.states import State
from jobdeck.store.graph import (
    BLOCKED,
    CANCELLED,
    COMPLETED,
    ENDED_VALUES,
    FAILED_DEPENDENCY,
    PENDING,
    BatchClosed,
    BatchNotFound,
    BatchRecord,
    EnqueuedWorkflow,
    NewWorkflow,
    WorkflowGraph,
    WorkflowKeyConflict,
    WorkflowNotFound,
    WorkflowRecord,
    cancel_dependents,
    freed_edges,
    job_insert,
    promote,
)
from jobdeck.store.models import batches, job_dependencies, jobs, status_in, workflows
from jobdeck.store.records import JobRecord, NewJob
from jobdeck.store.statements import dialect_insert
from jobdeck.store.transactions import Transactions
from sqlalchemy import Connection, func, insert, select, update

MAX_CALLBACK_IDS = 2000
"""The most job ids a callback's payload lists (about 16 KB); ``more_job_ids`` counts the others."""

Ended = tuple[int, str, int | None, int | None]
"""(job id, its new state, workflow_id, batch_id), as a transition returned it."""


class Graph(Transactions):
    def _settle(self, conn: Connection, ended: Iterable[Sequence[Any]], now: datetime) -> None:
        """What the end of these jobs does to the jobs that wait on them, in
        the ending transaction (see the module's doc). ``ended``: rows of
        (id, state, workflow_id, batch_id); plain jobs are passed over."""
        rows = [r for r in ended if r[2] is not None or r[3] is not None]
        if not rows:
            return
        completed = [r[0] for r in rows if r[1] == COMPLETED and r[2] is not None]
        if completed:
            self._promote(conn, completed, now)
        failed = [r for r in rows if r[1] in FAILED_DEPENDENCY and r[2] is not None]
        if failed:
            rows = [*rows, *self._fail_dependents(conn, failed, now)]
        in_batches = sorted({r[3] for r in rows if r[3] is not None and r[1] in ENDED_VALUES})
        for batch_id in in_batches:
            self._maybe_fire(conn, batch_id, now)

    def _promote(self, conn: Connection, done: list[int], now: datetime) -> None:
        """Count each blocked dependent of ``done`` down by its edges freed:
        read once, grouped, then one UPDATE per distinct count (one, nearly
        always). The UPDATE still re-checks ``blocked`` on the locked rows."""
        by_freed: dict[int, list[int]] = {}
        for job_id, freed in conn.execute(freed_edges(), {"done": done}):
            by_freed.setdefault(int(freed), []).append(job_id)
        woke = False
        for freed, ids in by_freed.items():
            moved = conn.execute(promote(), {"ids": ids, "freed": freed, "now": now}).all()
            woke = woke or any(status == PENDING for _, status in moved)
        if woke:
            self._wake(conn)

    def _fail_dependents(self, conn: Connection, failed: list[Sequence[Any]], now: datetime) -> list[Ended]:
        """Cancel the dependents of dependencies that will not complete, and
        theirs in turn; returns the jobs cancelled."""
        steps = dict(conn.execute(select(jobs.c.id, jobs.c.step).where(jobs.c.id.in_([r[0] for r in failed]))).all())
        todo = [(r[0], r[1], steps.get(r[0])) for r in failed]
        cancelled: list[Ended] = []
        while todo:
            dep, status, step = todo.pop()
            why = f"dependency {step or dep} is {status}"
            stmt = cancel_dependents(holding_too=status == CANCELLED)
            rows = conn.execute(stmt, {"dep": dep, "why": why, "now": now}).all()
            if not rows:
                continue
            cancelled.extend((r.id, r.status, r.workflow_id, r.batch_id) for r in rows)
            todo.extend((r.id, CANCELLED, r.step) for r in rows)
        return cancelled

    def _wake(self, conn: Connection) -> None:
        """Jobs became claimable in this transaction: NOTIFY with it, and
        wake this process's pools once it commits (``Transactions.write``)."""
        self._notify_other_processes(conn)
        self._joined.wake = True

    # -- workflows -------------------------------------------------------------------

    def enqueue_workflows(self, news: Sequence[NewWorkflow], now: datetime) -> list[EnqueuedWorkflow]:
        """Insert whole workflows in one transaction: their rows, their jobs
        (blocked while they have dependencies) and their edges. A workflow
        whose ``key`` exists already is not inserted again: its result is
        the existing one's, ``created`` False."""
        done: list[EnqueuedWorkflow] = []
        with self.write() as conn:
            for new in news:
                done.append(self._insert_workflow(conn, new, now))
            if any(w.created for w in done):
                self._wake(conn)
        return done

    def _insert_workflow(self, conn: Connection, new: NewWorkflow, now: datetime) -> EnqueuedWorkflow:
        row = {"name": new.name, "key": new.key, "on_dependency_failure": new.on_dependency_failure, "created_at": now}
        if new.key is None:
            workflow_id = conn.execute(insert(workflows).values(row).returning(workflows.c.id)).scalar_one()
        else:
            # The UNIQUE key decides between racing enqueues: the insert does
            # nothing on conflict, and the loser answers the winner's workflow.
            stmt = dialect_insert(self.dialect)(workflows).values(row).on_conflict_do_nothing(index_elements=["key"])
            workflow_id = conn.execute(stmt.returning(workflows.c.id)).scalar()
            if workflow_id is None:
                found = conn.execute(select(workflows.c.id, workflows.c.name).where(workflows.c.key == new.key)).one()
                if found.name != new.name:
                    raise WorkflowKeyConflict(new.key, found.id, found.name)
                return EnqueuedWorkflow(found.id, found.name, self._steps_of(conn, found.id), created=False)
        values = [
            _job_values(
                s.job,
                now,
                status=BLOCKED if s.depends_on else PENDING,
                workflow_id=workflow_id,
                step=s.name,
                deps_left=len(s.depends_on),
                on_dependency_failure=s.on_dependency_failure,
            )
            for s in new.steps
        ]
        ids = list(conn.execute(job_insert(), values).scalars())
        by_name = {s.name: job_id for s, job_id in zip(new.steps, ids, strict=True)}
        edges = [{"job_id": by_name[s.name], "depends_on": by_name[d]} for s in new.steps for d in s.depends_on]
        if edges:
            conn.execute(insert(job_dependencies), edges)
        return EnqueuedWorkflow(workflow_id, new.name, by_name)

    def _steps_of(self, conn: Connection, workflow_id: int) -> dict[str, int]:
        rows = conn.execute(select(jobs.c.step, jobs.c.id).where(jobs.c.workflow_id == workflow_id).order_by(jobs.c.id))
        return {step: job_id for step, job_id in rows}

    def dependency_results(self, job_id: int) -> dict[str, Any]:
        """The results of a job's dependencies, by step name (``ctx.dependency_results``)."""
        deps = job_dependencies
        stmt = (
            select(jobs.c.step, jobs.c.id, jobs.c.result)
            .join(deps, deps.c.depends_on == jobs.c.id)
            .where(deps.c.job_id == job_id)
            .order_by(jobs.c.id)
        )
        with self.read() as conn:
            rows = conn.execute(stmt).all()
        return {(r.step or str(r.id)): (None if r.result is None else json.loads(r.result)) for r in rows}

    def workflow(self, workflow_id: int) -> WorkflowGraph:
        """A workflow with its jobs (in id order) and edges."""
        deps = job_dependencies
        with self.read() as conn:
            row = conn.execute(select(workflows).where(workflows.c.id == workflow_id)).first()
            if row is None:
                raise WorkflowNotFound(workflow_id)
            members = [
                JobRecord.from_row(r)
                for r in conn.execute(select(jobs).where(jobs.c.workflow_id == workflow_id).order_by(jobs.c.id))
            ]
            ids = [j.id for j in members]
            edges = (
                conn.execute(select(deps.c.job_id, deps.c.depends_on).where(deps.c.job_id.in_(ids))).all()
                if ids
                else []
            )
        counts: dict[str, int] = {}
        for j in members:
            counts[j.status.value] = counts.get(j.status.value, 0) + 1
        return WorkflowGraph(_workflow_record(row, counts), members, sorted(edges))

    def list_workflows(
        self, limit: int = 50, before: int | None = None, name: str | None = None
    ) -> list[WorkflowRecord]:
        """The newest workflows first, each with its jobs' counts by state."""
        stmt = select(workflows).order_by(workflows.c.id.desc()).limit(limit)
        if before is not None:
            stmt = stmt.where(workflows.c.id < before)
        if name is not None:
            stmt = stmt.where(workflows.c.name == name)
        with self.read() as conn:
            rows = conn.execute(stmt).all()
            counts = _counts(conn, jobs.c.workflow_id, [r.id for r in rows])
        return [_workflow_record(r, counts.get(r.id, {})) for r in rows]

    # -- batches -----------------------------------------------------------------------

    def open_batch(self, name: str | None, callbacks: Mapping[str, Any], now: datetime) -> int:
        with self.write() as conn:
            values = {"name": name, "callbacks": json.dumps(dict(callbacks)), "created_at": now}
            return int(conn.execute(insert(batches).values(values).returning(batches.c.id)).scalar_one())

    def add_to_batch(self, batch_id: int, news: Sequence[NewJob], now: datetime) -> list[int]:
        """Enqueue jobs into an open batch, in one transaction; refused
        (``BatchClosed``) once it is closed. Holds the batch's row, so a
        close cannot slip between the check and the insert."""
        with self.write() as conn:
            self._open(conn, batch_id)
            ids = list(conn.execute(job_insert(), [_job_values(n, now, batch_id=batch_id) for n in news]).scalars())
            if ids:
                self._wake(conn)
        return ids

    def close_batch(self, batch_id: int, now: datetime) -> BatchRecord:
        """No more jobs: from now on the end of its last job fires the
        callbacks, or this close does, when every job has ended already."""
        with self.write() as conn:
            self._open(conn, batch_id, closing=True)
            conn.execute(update(batches).where(batches.c.id == batch_id).values(closed_at=now))
            self._maybe_fire(conn, batch_id, now)
        return self.batch(batch_id)

    def _open(self, conn: Connection, batch_id: int, closing: bool = False) -> None:
        row = conn.execute(select(batches.c.closed_at).where(batches.c.id == batch_id).with_for_update()).first()
        if row is None:
            raise BatchNotFound(batch_id)
        if row.closed_at is not None:
            raise BatchClosed(batch_id, closing)

    def _maybe_fire(self, conn: Connection, batch_id: int, now: datetime) -> None:
        row = conn.execute(select(batches).where(batches.c.id == batch_id).with_for_update()).first()
        if row is None or row.closed_at is None or row.fired_at is not None:
            return
        unended = select(jobs.c.id).where(jobs.c.batch_id == batch_id, ~status_in(jobs.c.status, ENDED_VALUES)).limit(1)
        if conn.execute(unended).first() is not None:
            return
        members = conn.execute(
            select(jobs.c.id, jobs.c.status).where(jobs.c.batch_id == batch_id).order_by(jobs.c.id)
        ).all()
        counts: dict[str, int] = {}
        for _, status in members:
            counts[status] = counts.get(status, 0) + 1
        ids = [job_id for job_id, _ in members]
        callbacks = json.loads(row.callbacks)
        fire = ["on_complete"]
        if counts.get(COMPLETED, 0) == len(ids):
            fire.append("on_success")
        if counts.get(State.DEAD.value):
            fire.append("on_dead")
        told = {"id": batch_id, "name": row.name, "counts": counts, "job_ids": ids[:MAX_CALLBACK_IDS]}
        if len(ids) > MAX_CALLBACK_IDS:  # a payload is bounded; the rest are GET /api/batches/<id>'s
            told["more_job_ids"] = len(ids) - MAX_CALLBACK_IDS
        news = [callback_job(callbacks[name], name, told) for name in fire if callbacks.get(name)]
        fired = list(conn.execute(job_insert(), [_job_values(n, now) for n in news]).scalars()) if news else []
        outcome = {"counts": counts, "callbacks": dict(zip([n for n in fire if callbacks.get(n)], fired, strict=True))}
        conn.execute(
            update(batches)
            .where(batches.c.id == batch_id, batches.c.fired_at.is_(None))
            .values(fired_at=now, outcome=json.dumps(outcome))
        )
        if fired:
            self._wake(conn)

    def batch(self, batch_id: int) -> BatchRecord:
        with self.read() as conn:
            row = conn.execute(select(batches).where(batches.c.id == batch_id)).first()
            if row is None:
                raise BatchNotFound(batch_id)
            counts = _counts(conn, jobs.c.batch_id, [batch_id]).get(batch_id, {})
        return _batch_record(row, counts)

    def list_batches(self, limit: int = 50, before: int | None = None) -> list[BatchRecord]:
        stmt = select(batches).order_by(batches.c.id.desc()).limit(limit)
        if before is not None:
            stmt = stmt.where(batches.c.id < before)
        with self.read() as conn:
            rows = conn.execute(stmt).all()
            counts = _counts(conn, jobs.c.batch_id, [r.id for r in rows])
        return [_batch_record(r, counts.get(r.id, {})) for r in rows]

    def batch_jobs(self, batch_id: int, limit: int = 200) -> list[JobRecord]:
        stmt = select(jobs).where(jobs.c.batch_id == batch_id).order_by(jobs.c.id).limit(limit)
        with self.read() as conn:
            return [JobRecord.from_row(r) for r in conn.execute(stmt)]

    def dependencies_of(self, job_id: int) -> tuple[list[JobRecord], list[JobRecord]]:
        """A job's dependencies and its dependents (the job page's links)."""
        deps = job_dependencies

        def across(near: Any, far: Any) -> list[JobRecord]:
            """The jobs at the ``far`` end of the edges whose ``near`` end is this job."""
            stmt = select(jobs).join(deps, far == jobs.c.id).where(near == job_id).order_by(jobs.c.id)
            return [JobRecord.from_row(r) for r in conn.execute(stmt)]

        with self.read() as conn:
            return across(deps.c.job_id, deps.c.depends_on), across(deps.c.depends_on, deps.c.job_id)


def callback_job(spec: Mapping[str, Any], name: str, batch: dict[str, Any]) -> NewJob:
    """A batch's callback as a job: its own payload, plus ``batch`` (id,
    name, counts by state, the jobs' ids) and which callback it is."""
    payload = {**spec.get("payload", {}), "batch": {**batch, "callback": name}}
    return NewJob(
        type=spec["type"],
        payload=payload,
        queue=spec.get("queue") or "default",
        priority=int(spec.get("priority") or 0),
        max_retries=int(spec.get("max_retries", 3)),
    )


def _job_values(new: NewJob, now: datetime, **extra: Any) -> dict[str, Any]:
    from jobdeck.store.enqueue import payload_json

    at = new.available_at if new.available_at is not None else now
    return {
        "type": new.type, "queue": new.queue, "payload": payload_json(new), "priority": new.priority,
        "max_retries": new.max_retries, "idempotency_key": new.idempotency_key, "available_at": at,
        "created_at": now, "updated_at": now, "rate_key": new.rate_key, "concurrency_key": new.concurrency_key,
        "status": PENDING, "attempt": 0, "retry_count": 0, "traceparent": new.traceparent, **extra,
    }  # fmt: skip


def _counts(conn: Connection, column: Any, ids: list[int]) -> dict[int, dict[str, int]]:
    if not ids:
        return {}
    stmt = select(column, jobs.c.status, func.count()).where(column.in_(ids)).group_by(column, jobs.c.status)
    counts: dict[int, dict[str, int]] = {}
    for owner, status, n in conn.execute(stmt):
        counts.setdefault(owner, {})[status] = n
    return counts


def _workflow_record(row: Any, counts: dict[str, int]) -> WorkflowRecord:
    return WorkflowRecord(row.id, row.name, row.key, row.on_dependency_failure, row.created_at, counts)


def _batch_record(row: Any, counts: dict[str, int]) -> BatchRecord:
    return BatchRecord(
        row.id,
        row.name,
        json.loads(row.callbacks),
        row.created_at,
        row.closed_at,
        row.fired_at,
        None if row.outcome is None else json.loads(row.outcome),
        counts,
    )
