"""The reads behind "why is it waiting?" (``app.waiting``): what holds jobs
back, read once per request however many jobs are shown.

Everything here is small by construction: running jobs are few (the status
index finds them), the workers table has a row per pool, and the finished
attempts of the last stall timeout are a short range of
``ix_attempts_finished`` (and bounded: ``RECENT_ATTEMPTS``). The paused queues come from the queue controls'
cached set, the one the claim itself uses, so they are not read here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from app.store import statements
from app.store.lifecycle import Store
from app.store.models import attempts, jobs, workers

RECENT_ATTEMPTS = 1000
"""How many of the newest finished attempts are looked through for an
external type's trace. An HTTP worker that serves a type claims a due job of
it within one poll, so missing its trace behind heavy other traffic shows a
waiting job "no live worker" for one poll at most."""


@dataclass(frozen=True)
class RunningGroup:
    """Running jobs of one (queue, type, worker), and their freshest heartbeat."""

    queue: str
    type: str
    worker_id: str | None
    count: int
    heartbeat_at: datetime | None


@dataclass(frozen=True)
class PoolRow:
    """A worker pool that has neither stopped nor been marked gone."""

    id: str
    threads: int
    heartbeat_at: datetime
    unhealthy: str | None


@dataclass(frozen=True)
class WaitingReads:
    running: list[RunningGroup]
    pools: list[PoolRow]
    recently_finished_types: frozenset[str]
    """Of the types asked about, those with one of the newest attempts finished since the cutoff."""


def read_waiting(store: Store, cutoff: datetime, finished_types: Collection[str] = ()) -> WaitingReads:
    """The running jobs grouped by (queue, type, worker) (the limits, the
    pools' busy slots and the HTTP workers' heartbeats in one statement),
    the pools not stopped or gone, and which of ``finished_types`` had an
    attempt finish since ``cutoff`` (an HTTP worker's trace when it holds
    nothing right now); in one read transaction."""
    grouped = (
        select(jobs.c.queue, jobs.c.type, jobs.c.worker_id, func.count(), func.max(jobs.c.heartbeat_at))
        .where(statements.running())
        .group_by(jobs.c.queue, jobs.c.type, jobs.c.worker_id)
    )
    pools = select(workers.c.id, workers.c.threads, workers.c.heartbeat_at, workers.c.unhealthy).where(
        workers.c.stopped_at.is_(None), workers.c.gone_at.is_(None)
    )
    with store.read() as conn:
        running = [RunningGroup(q, t, w, int(n), hb) for q, t, w, n, hb in conn.execute(grouped)]
        pool_rows = [PoolRow(i, int(th or 0), hb, bad) for i, th, hb, bad in conn.execute(pools)]
        finished: frozenset[str] = frozenset()
        if finished_types:
            newest = (
                select(attempts.c.job_id)
                .where(attempts.c.finished_at >= cutoff)
                .order_by(attempts.c.finished_at.desc())
                .limit(RECENT_ATTEMPTS)
                .subquery()
            )
            recent = (
                select(jobs.c.type)
                .where(jobs.c.id.in_(select(newest.c.job_id)), jobs.c.type.in_(list(finished_types)))
                .distinct()
            )
            finished = frozenset(conn.execute(recent).scalars())
    return WaitingReads(running, pool_rows, finished)
