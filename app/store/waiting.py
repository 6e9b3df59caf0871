"""The reads behind "why is it waiting?" (``jobdeck.jobs.waiting``): what holds jobs
back, read once per request however many jobs are shown.

Everything here is small by construction: running jobs are few (the status
index finds them), the workers table has a row per pool, and the finished
attempts of the last stall timeout are a short range of
``ix_attempts_finished`` (and bounded: ``RECENT_ATTEMPTS``). The paused queues come from the queue controls'
cached set, the one the claim itself uses, so they are not read here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from jobdeck.store import statements
from jobdeck.store.models import attempts, jobs, workers
from jobdeck.store.records import Holders, PoolRow, RunningGroup
from jobdeck.store.sqlite import Prepared, parse_time
from sqlalchemy import func, literal_column, null, select, union_all

if TYPE_CHECKING:
    from jobdeck.store.transactions import Transactions

RECENT_ATTEMPTS = 1000
"""How many of the newest finished attempts are looked through for an
external type's trace. An HTTP worker that serves a type claims a due job of
it within one poll, so missing its trace behind heavy other traffic shows a
waiting job "no live worker" for one poll at most."""


@dataclass(frozen=True)
class WaitingReads:
    running: list[RunningGroup]
    pools: list[PoolRow]
    recently_finished_types: frozenset[str]
    """Of the types asked about, those with one of the newest attempts finished since the cutoff."""


@lru_cache(maxsize=1)
def running_and_pools() -> Prepared:
    """The running jobs grouped by (queue, type, worker) and the pools not
    stopped or gone, in one statement: one snapshot and one round trip.
    Each row is tagged ``r`` (queue, type, worker_id, count, freshest
    heartbeat) or ``p`` (id, threads, heartbeat, unhealthy)."""
    grouped = (
        select(literal_column("'r'"), jobs.c.queue, jobs.c.type, jobs.c.worker_id, func.count(),
               func.max(jobs.c.heartbeat_at), null())
        .where(statements.running())
        .group_by(jobs.c.queue, jobs.c.type, jobs.c.worker_id)
    )  # fmt: skip
    pools = select(
        literal_column("'p'"), workers.c.id, null(), null(), workers.c.threads, workers.c.heartbeat_at,
        workers.c.unhealthy,
    ).where(workers.c.stopped_at.is_(None), workers.c.gone_at.is_(None))  # fmt: skip
    return Prepared(union_all(grouped, pools), ())


def read_waiting(
    store: Transactions, cutoff: datetime, finished_types: Collection[str] = (), holders: Holders | None = None
) -> WaitingReads:
    """The running jobs grouped by (queue, type, worker) (the limits, the
    pools' busy slots and the HTTP workers' heartbeats) and the pools not
    stopped or gone, in one statement (``read_holders``) at driver level
    (``Transactions.glance``): every answer to ``POST /api/jobs`` needs
    them, and through a Core read transaction they cost 16 times the CPU
    SQLite needs for them. ``holders``: that read made already (the
    enqueue's own, right after its commit: ``Enqueueing.enqueue``), not made
    again. Then, only when asked, which of ``finished_types`` had an attempt
    finish since ``cutoff`` (an HTTP worker's trace when it holds nothing
    right now), in a read of its own."""
    if holders is None:
        with store.glance() as db:
            holders = read_holders(db, store.sqlite)
    running, pool_rows = holders.running, holders.pools
    if not finished_types:
        return WaitingReads(running, pool_rows, frozenset())
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
    with store.read() as conn:
        finished = frozenset(conn.execute(recent).scalars())
    return WaitingReads(running, pool_rows, finished)


def read_holders(db: Any, sqlite: bool) -> Holders:
    """``running_and_pools`` on the driver connection ``db``, outside any
    transaction (the statement is its own snapshot)."""
    compiled = running_and_pools().sqlite if sqlite else running_and_pools().postgres
    rows = db.execute(compiled.text, compiled.params(())).fetchall()
    when: Callable[[Any], Any] = parse_time if sqlite else _as_given
    return Holders(
        [RunningGroup(a, b, c, int(n), when(hb)) for tag, a, b, c, n, hb, _ in rows if tag == "r"],
        [PoolRow(a, int(n or 0), when(hb), bad) for tag, a, _, _, n, hb, bad in rows if tag == "p"],
    )


def _as_given(value: Any) -> Any:
    """PostgreSQL's times at driver level: aware, in the session's UTC (``jobdeck.store.engine``)."""
    return value
