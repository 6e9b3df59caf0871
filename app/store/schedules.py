"""The schedules' state in the database: the operator's pause flag and the
watermark ``checked_until`` (``schedule_state``), and every firing
(``schedule_runs``). ``jobdeck.maintenance.cron`` decides what is due; the jobs
themselves go in through ``Store.enqueue`` / ``Store.enqueue_many``, whose
idempotency key makes one job per fire time however many processes fire.

A workflow schedule's run is kept under the workflow's first job;
``workflow_runs`` reads such a run's outcome from the whole workflow, in a
job's words, so the history and schedule health judge it like a job's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.states import GroupState, State
from jobdeck.store.graph import group_state
from jobdeck.store.models import jobs, schedule_runs, schedule_state
from jobdeck.store.statements import dialect_insert
from sqlalchemy import select, update

if TYPE_CHECKING:
    from jobdeck.store import Store


@dataclass(frozen=True)
class WorkflowRun:
    """The outcome of the workflow a schedule run started, as a job's would be."""

    workflow_id: int
    status: str
    error: str | None
    finished_at: datetime | None
    claimed_at: datetime | None


@dataclass(frozen=True)
class Fire:
    """One fire time of a schedule, and the job enqueued for it."""

    schedule: str
    fire_time: datetime
    job_id: int


def schedule_states(store: Store, names: Sequence[str], now: datetime) -> dict[str, tuple[bool, datetime]]:
    """(paused, checked_until) of each named schedule; a schedule seen for the
    first time is stored unpaused, checked until ``now``."""
    with store.read() as conn:
        rows = conn.execute(
            select(schedule_state.c.name, schedule_state.c.paused, schedule_state.c.checked_until).where(
                schedule_state.c.name.in_(list(names))
            )
        ).all()
    states = {r.name: (bool(r.paused), r.checked_until) for r in rows}
    missing = [n for n in names if n not in states]
    if not missing:
        return states
    with store.write() as conn:
        conn.execute(
            dialect_insert(store.dialect)(schedule_state).on_conflict_do_nothing(index_elements=["name"]),
            [{"name": n, "paused": False, "checked_until": now, "updated_at": now} for n in missing],
        )
    return schedule_states(store, names, now)


def record_fires(store: Store, fires: Sequence[Fire], passed: Sequence[str], now: datetime) -> None:
    """Keep each fire's run (once per schedule and fire time) and move the
    watermark of the schedules in ``passed`` to ``now`` (never back)."""
    with store.write() as conn:
        if fires:
            conn.execute(
                dialect_insert(store.dialect)(schedule_runs).on_conflict_do_nothing(index_elements=["schedule", "fire_time"]),
                [{"schedule": f.schedule, "fire_time": f.fire_time, "job_id": f.job_id, "manual": False,
                  "created_at": now} for f in fires],
            )  # fmt: skip
        conn.execute(
            update(schedule_state)
            .where(schedule_state.c.name.in_(list(passed)), schedule_state.c.checked_until < now)
            .values(checked_until=now, updated_at=now)
        )


def record_manual_run(store: Store, name: str, job_id: int, now: datetime) -> None:
    """Keep an operator's "run now" of schedule ``name`` in its history."""
    with store.write() as conn:
        conn.execute(
            dialect_insert(store.dialect)(schedule_runs)
            .values(schedule=name, fire_time=now, job_id=job_id, manual=True, created_at=now)
            .on_conflict_do_nothing(index_elements=["schedule", "fire_time"])
        )


def set_schedule_paused(store: Store, name: str, paused: bool, now: datetime) -> None:
    """Pause or resume a stored schedule. Resuming moves the watermark to
    ``now``, so the fire times missed while paused are not replayed."""
    values: dict[str, Any] = {"paused": paused, "updated_at": now}
    if not paused:
        values["checked_until"] = now
    with store.write() as conn:
        conn.execute(update(schedule_state).where(schedule_state.c.name == name).values(values))


def schedule_history(
    store: Store, configured: Sequence[str], recent: int
) -> tuple[dict[str, bool], dict[str, list[dict[str, Any]]]]:
    """The paused flag of every stored schedule, and the ``recent`` last runs
    (newest first) of the configured schedules and of every other schedule
    that left runs, keyed by name in that order. A run's ``status`` is its
    job's (a workflow run's: its workflow's, ``workflow_runs``, and its
    ``workflow_id`` is set), or ``None`` once retention pruned the job."""
    with store.read() as conn:
        paused = {name: bool(p) for name, p in conn.execute(select(schedule_state.c.name, schedule_state.c.paused))}
        with_runs = set(conn.execute(select(schedule_runs.c.schedule).distinct()).scalars())
        history: dict[str, list[dict[str, Any]]] = {}
        for name in list(configured) + sorted(with_runs - set(configured)):
            rows = conn.execute(
                select(schedule_runs.c.fire_time, schedule_runs.c.job_id, schedule_runs.c.manual, jobs.c.status)
                .select_from(schedule_runs.outerjoin(jobs, jobs.c.id == schedule_runs.c.job_id))
                .where(schedule_runs.c.schedule == name)
                .order_by(schedule_runs.c.id.desc())
                .limit(recent)
            ).all()
            history[name] = [
                {"fire_time": r.fire_time, "job_id": r.job_id, "manual": bool(r.manual), "status": r.status}
                for r in rows
            ]
    started = workflow_runs(store, [run["job_id"] for runs in history.values() for run in runs])
    for runs in history.values():
        for run in runs:
            workflow = started.get(run["job_id"])
            run["workflow_id"] = workflow.workflow_id if workflow else None
            if workflow is not None:
                run["status"] = workflow.status
    return paused, history


_AS_JOB = {GroupState.COMPLETED: State.COMPLETED.value, GroupState.HELD: State.DEAD.value,
           GroupState.DEAD: State.DEAD.value, GroupState.CANCELLED: State.CANCELLED.value}  # fmt: skip
"""A workflow's state (``jobdeck.store.graph.group_state``) in a job's words; one
that is ``held`` waits on a dead job for a person: to the schedule, dead."""


def workflow_runs(store: Store, job_ids: Sequence[int | None]) -> dict[int, WorkflowRun]:
    """For each of ``job_ids`` that is in a workflow, that workflow's outcome:
    the state of its jobs together, the error of its first failed or dead
    job, its start (the first claim) and, once every job ended, its end."""
    ids = [i for i in job_ids if i is not None]
    if not ids:
        return {}
    with store.read() as conn:
        of = dict(
            conn.execute(
                select(jobs.c.id, jobs.c.workflow_id).where(jobs.c.id.in_(ids), jobs.c.workflow_id.is_not(None))
            ).all()
        )
        if not of:
            return {}
        members = conn.execute(
            select(jobs.c.workflow_id, jobs.c.status, jobs.c.error, jobs.c.finished_at, jobs.c.claimed_at)
            .where(jobs.c.workflow_id.in_(set(of.values())))
            .order_by(jobs.c.id)
        ).all()
    by_workflow: dict[int, list[Any]] = {}
    for m in members:
        by_workflow.setdefault(m.workflow_id, []).append(m)
    outcomes = {w: _outcome(w, rows) for w, rows in by_workflow.items()}
    return {job_id: outcomes[w] for job_id, w in of.items() if w in outcomes}


def _outcome(workflow_id: int, rows: list[Any]) -> WorkflowRun:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    state = group_state(counts)
    status = _AS_JOB.get(state)
    if status is None:  # running: as a job, failed (waiting for a retry), running, or not started yet
        started = any(r.claimed_at is not None for r in rows)
        status = (
            State.FAILED.value
            if counts.get(State.FAILED.value)
            else State.RUNNING.value
            if started
            else State.PENDING.value
        )
    failed = (State.FAILED.value, State.DEAD.value)
    error = next((r.error for r in rows if r.status in failed and r.error), None)
    claims = [r.claimed_at for r in rows if r.claimed_at is not None]
    ends = [r.finished_at for r in rows if r.finished_at is not None]
    finished = max(ends) if status in _AS_JOB.values() and ends else None
    return WorkflowRun(workflow_id, status, error, finished, min(claims) if claims else None)
