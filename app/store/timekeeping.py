"""The database's clock, read for ``jobdeck.core.clock.DatabaseClock``, and what each
process measured of time kept in its workers row: its clock's offset, and
its last heartbeat that landed late."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.store.models import workers
from sqlalchemy import update

if TYPE_CHECKING:
    from jobdeck.store import Store
    from jobdeck.store.transactions import Transactions


WAITED = 0.25
"""Seconds a claim may take from its caller's reading of the time
to its writes before it stamps them later (``after_waiting``): a rate's
window is widened by as much (``jobdeck.jobs.flow.START_SLACK``)."""


def after_waiting(store: Transactions, now: datetime) -> datetime:
    """The time a claim writes on the jobs it claims (``claimed_at``,
    ``heartbeat_at``) and, under flow limits, on the starts it logs, read
    once it holds its lock (the limited claims' advisory lock on
    PostgreSQL, SQLite's write lock): ``now``, which its caller read before,
    or, when the deck's clock (``Store.fresh_time``) has moved on more than
    ``WAITED`` since (the claim waited for the lock, or the acker retried),
    the clock's time.
    Stamped with the time from before a long wait, an HTTP worker's job was
    claimed already older than ``stall_timeout`` and a sweeper rescued it at
    once; a rate limit's starts were logged early by the wait, and the next
    claim took a second batch within one window. A clock a test injected is
    left alone: its ``now`` is the test's."""
    fresh = store.fresh_time
    if fresh is None:
        return now
    later = fresh()
    return later if (later - now).total_seconds() > WAITED else now


def database_time(store: Store) -> datetime:
    """The database server's ``clock_timestamp()`` (the time now, not the
    transaction's start), in UTC. PostgreSQL only: SQLite's processes share
    their host's clock."""
    if store.sqlite:
        raise ValueError("SQLite has no clock of its own: its processes share their host's")
    with store.glance() as db:
        value = db.execute("SELECT clock_timestamp()").fetchone()[0]
    assert isinstance(value, datetime)
    return value


def record_late_beat(store: Store, worker_id: str, seconds: float, now: datetime) -> None:
    """Keep a pool's last late heartbeat in its row, for every process's Workers page."""
    with store.write() as conn:
        conn.execute(
            update(workers).where(workers.c.id == worker_id).values(late_beat_seconds=seconds, late_beat_at=now)
        )


def record_loop_held(
    store: Store, worker_id: str, seconds: float, job_id: int | None, job_type: str | None, now: datetime
) -> None:
    """Keep the last time a pool's event loop of async handlers was held in
    its row (how long, by which job), for every process's Workers page."""
    values = {"loop_held_seconds": seconds, "loop_held_at": now, "loop_held_job": job_id, "loop_held_type": job_type}
    with store.write() as conn:
        conn.execute(update(workers).where(workers.c.id == worker_id).values(**values))


def record_executors(store: Store, worker_id: str, executors: dict[str, Any]) -> None:
    """Keep what each of a pool's executors holds in its row, for every process's Workers page and /metrics."""
    with store.write() as conn:
        conn.execute(update(workers).where(workers.c.id == worker_id).values(executors=json.dumps(executors)))


def record_clock_offset(store: Store, worker_id: str, offset: float) -> None:
    """Keep a pool's last measured offset in its row, for every process's Workers page."""
    with store.write() as conn:
        conn.execute(update(workers).where(workers.c.id == worker_id).values(clock_offset=offset))
