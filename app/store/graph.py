"""Workflows and batches in the store: jobs that wait for other jobs, and
jobs grouped for one callback (``jobdeck.jobs.workflows`` builds and checks them).

Here their records, errors and the statements that move waiting jobs;
``jobdeck.store.graph_store`` runs them in the transaction that ends a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from jobdeck.core.errors import JobdeckError
from jobdeck.core.states import DEPENDENCY_FAILED, ENDED, BatchState, GroupState, State
from jobdeck.store.models import job_dependencies, jobs, status_in
from jobdeck.store.records import JobRecord, NewJob
from sqlalchemy import Integer, and_, bindparam, case, func, insert, select, update

BLOCKED = State.BLOCKED.value
PENDING = State.PENDING.value
CANCELLED = State.CANCELLED.value
COMPLETED = State.COMPLETED.value
FAILED_DEPENDENCY = frozenset(s.value for s in DEPENDENCY_FAILED)
ENDED_VALUES = sorted(s.value for s in ENDED)
_NOW = bindparam("now", type_=jobs.c.updated_at.type)
ON_DEPENDENCY_FAILURE = ("cancel", "hold")
CALLBACKS = ("on_complete", "on_success", "on_dead")


class BatchClosed(JobdeckError):
    status_code = 409

    def __init__(self, batch_id: int, closing: bool = False) -> None:
        what = "already closed" if closing else "closed; no job can be added to it"
        super().__init__(f"batch {batch_id} is {what}")


class WorkflowKeyConflict(JobdeckError):
    """A workflow key names a workflow of another name: the same request
    again is answered with the first, another request is refused."""

    status_code = 409

    def __init__(self, key: str, existing_id: int, name: str) -> None:
        super().__init__(f"key {key!r} already belongs to workflow {existing_id}, named {name!r}")
        self.existing_id = existing_id

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "field": "key", "workflow_id": self.existing_id}


class BatchNotFound(JobdeckError):
    status_code = 404

    def __init__(self, batch_id: int) -> None:
        super().__init__(f"batch {batch_id} does not exist")


class WorkflowNotFound(JobdeckError):
    status_code = 404

    def __init__(self, workflow_id: int) -> None:
        super().__init__(f"workflow {workflow_id} does not exist")


@dataclass(frozen=True)
class Step:
    """One job of a workflow to enqueue, checked (``jobdeck.jobs.workflows``)."""

    name: str
    job: NewJob
    depends_on: tuple[str, ...] = ()
    on_dependency_failure: str = "cancel"


@dataclass(frozen=True)
class NewWorkflow:
    name: str
    steps: tuple[Step, ...]
    """In an order where every step comes after its dependencies."""
    on_dependency_failure: str = "cancel"
    key: str | None = None


@dataclass(frozen=True)
class EnqueuedWorkflow:
    id: int
    name: str
    jobs: dict[str, int]
    """Step name -> job id."""
    created: bool = True
    """False when ``key`` named a workflow enqueued before: these are its jobs."""


class JobCounts:
    """A group's jobs counted by state (``counts``): how many, and how many ended."""

    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> int:
        return sum(n for s, n in self.counts.items() if s in ENDED_VALUES)


@dataclass(frozen=True)
class WorkflowRecord(JobCounts):
    id: int
    name: str
    key: str | None
    on_dependency_failure: str
    created_at: datetime
    counts: dict[str, int] = field(default_factory=dict)
    """Its jobs by state."""

    @property
    def state(self) -> GroupState:
        """``completed``, ``running``, ``held`` (only blocked jobs are left:
        they wait for a person to retry a failed dependency), ``dead`` or
        ``cancelled``: read from its jobs' states."""
        return group_state(self.counts)


@dataclass(frozen=True)
class WorkflowGraph:
    workflow: WorkflowRecord
    jobs: list[JobRecord]
    edges: list[tuple[int, int]]
    """(job id, the id of the job it depends on)."""


@dataclass(frozen=True)
class BatchRecord(JobCounts):
    id: int
    name: str | None
    callbacks: dict[str, Any]
    created_at: datetime
    closed_at: datetime | None
    fired_at: datetime | None
    outcome: dict[str, Any] | None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> BatchState:
        if self.fired_at is not None:
            return BatchState.FIRED
        return BatchState.OPEN if self.closed_at is None else BatchState.RUNNING


def group_state(counts: Mapping[str, int]) -> GroupState:
    active = sum(counts.get(s, 0) for s in (PENDING, State.RUNNING.value, State.FAILED.value, BLOCKED))
    dead = counts.get(State.DEAD.value, 0)
    if active == 0:
        if dead:
            return GroupState.DEAD
        if counts.get(COMPLETED, 0) == sum(counts.values()):
            return GroupState.COMPLETED
        return GroupState.CANCELLED
    if active == counts.get(BLOCKED, 0):  # nothing can run: a failed dependency holds the rest
        return GroupState.HELD
    return GroupState.RUNNING


# -- statements ----------------------------------------------------------------------


@lru_cache(maxsize=1)
def promote() -> Any:
    """blocked -> pending for the ``ids`` (expanding) whose count of
    unfinished dependencies reaches 0 when ``freed`` more complete; the
    others count down. Values: ids, freed, now."""
    left = jobs.c.deps_left - bindparam("freed", type_=Integer())
    free = left <= 0
    return (
        update(jobs)
        .where(status_in(jobs.c.status, [BLOCKED]), jobs.c.id.in_(bindparam("ids", expanding=True)))
        .values(
            deps_left=left,
            status=case((free, PENDING), else_=BLOCKED),
            available_at=case((and_(free, jobs.c.available_at < _NOW), _NOW), else_=jobs.c.available_at),
            updated_at=_NOW,
        )
        .returning(jobs.c.id, jobs.c.status)
    )


def freed_edges() -> Any:
    """The blocked dependents of ``done`` (expanding), each with how many of
    its dependencies are among them, in id order; on PostgreSQL their rows
    are locked in that order, so two completions of siblings wait for each
    other there, never in a deadlock."""
    deps = job_dependencies
    waiting = (
        select(deps.c.job_id, func.count().label("freed"))
        .where(deps.c.depends_on.in_(bindparam("done", expanding=True)))
        .group_by(deps.c.job_id)
        .subquery()
    )
    return (
        select(jobs.c.id, waiting.c.freed)
        .join(waiting, waiting.c.job_id == jobs.c.id)
        .where(status_in(jobs.c.status, [BLOCKED]))
        .order_by(jobs.c.id)
        .with_for_update(of=jobs)
    )


@lru_cache(maxsize=2)
def cancel_dependents(holding_too: bool) -> Any:
    """blocked -> cancelled for the dependents of ``dep`` that do not hold;
    ``holding_too``: those that do as well (a cancelled dependency can never
    be retried, so holding for it would wait forever). Values: dep, why, now."""
    deps = job_dependencies
    held = () if holding_too else (jobs.c.on_dependency_failure != "hold",)
    return (
        update(jobs)
        .where(
            status_in(jobs.c.status, [BLOCKED]),
            *held,
            jobs.c.id.in_(select(deps.c.job_id).where(deps.c.depends_on == bindparam("dep"))),
        )
        .values(status=CANCELLED, finished_at=_NOW, updated_at=_NOW, error=bindparam("why"))
        .returning(jobs.c.id, jobs.c.status, jobs.c.workflow_id, jobs.c.batch_id, jobs.c.step)
    )


def job_insert() -> Any:
    return insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True)
