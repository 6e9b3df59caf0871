"""The overview's numbers (counts per state, throughput, queue latency).

They come from ``Snapshots``: one process-wide snapshot, recomputed at most once per
TTL however many tabs poll, in a background thread while the previous one
keeps being served (stale-while-revalidate). We chose this over a per-state
counter table maintained by every transition because (1) the counters would
add a write to the claim and ack statements, the hottest path, and on
PostgreSQL turn one counter row into a lock every worker process queues on;
(2) ``scheduled`` depends on the clock, so no counter can maintain it; and
(3) the counts are for display: a few seconds late is fine, and the one place
that needs an exact number (the "all N matching" confirmation) counts then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobdeck.core.states import AttemptOutcome
from jobdeck.store import claim_statements
from jobdeck.store.lifecycle import Store
from jobdeck.store.models import (
    attempts,
    jobs,
    maintenance_marks,
    queue_state,
    stats_minutely,
)
from jobdeck.store.upkeep import STATS_MARK
from sqlalchemy import case, func, select

log = logging.getLogger("jobdeck.dashboard")


@dataclass(frozen=True)
class Snapshot:
    at: datetime
    counts: dict[str, int]
    """Per state, with ``scheduled`` split out of ``pending``."""
    throughput: list[tuple[datetime, int, int]]
    """(minute, completed, failed) for each of the last 60 minutes."""
    latency: float | None
    """Seconds the job at the head of the claim order has been due."""
    latency_history: list[tuple[datetime, float]]


def _minute(value: datetime) -> datetime:
    return value.replace(second=0, microsecond=0)


def throughput(store: Store, now: datetime) -> list[tuple[datetime, int, int]]:
    """Attempts finished per minute over the last hour, completed vs failed
    (failed, timed out or stalled).

    Minutes the maintenance roll-up has closed come from ``stats_minutely``
    (at most 60 small rows per type, and they outlive retention and
    restarts); only the minutes after its watermark, normally the last one
    or two, are counted from ``attempts`` (a short range of
    ``ix_attempts_finished``). Without a roll-up (no scheduler running) the
    whole hour is counted from ``attempts``."""
    start = _minute(now) - timedelta(minutes=59)
    per: dict[datetime, tuple[int, int]] = {}
    with store.read() as conn:
        mark = conn.execute(select(maintenance_marks.c.value).where(maintenance_marks.c.key == STATS_MARK)).scalar()
        live_from = start
        if mark is not None and mark > start:
            live_from = mark
            rolled = (
                select(stats_minutely.c.minute, func.sum(stats_minutely.c.completed), func.sum(stats_minutely.c.failed))
                .where(stats_minutely.c.minute >= start, stats_minutely.c.minute < mark)
                .group_by(stats_minutely.c.minute)
            )
            for minute, done, failed in conn.execute(rolled):
                per[_minute(minute.astimezone(now.tzinfo))] = (int(done or 0), int(failed or 0))
        per.update(_live_throughput(conn, store.dialect, live_from, now))
    return [(m, *per.get(m, (0, 0))) for m in (start + timedelta(minutes=i) for i in range(60))]


NOT_RUNS = (AttemptOutcome.INTERRUPTED.value, AttemptOutcome.SNOOZED.value)
"""Attempts that are neither done nor failed: cut short by shutdown, or put off by their handler."""


def _live_throughput(conn: Any, dialect: str, since: datetime, now: datetime) -> dict[datetime, tuple[int, int]]:
    """Per-minute (completed, failed) from ``attempts`` finished since ``since``."""
    if dialect == "postgresql":
        bucket: Any = func.date_trunc("minute", attempts.c.finished_at)
    else:
        bucket = func.strftime("%Y-%m-%d %H:%M", attempts.c.finished_at)
    ok: Any = func.sum(case((attempts.c.outcome == AttemptOutcome.COMPLETED.value, 1), else_=0))
    stmt = (
        select(bucket.label("minute"), ok.label("ok"), func.count().label("n"))
        .where(attempts.c.finished_at >= since, attempts.c.outcome.not_in(NOT_RUNS))
        .group_by(bucket)
    )
    per: dict[datetime, tuple[int, int]] = {}
    for minute, done, n in conn.execute(stmt):
        if isinstance(minute, str):
            minute = datetime.fromisoformat(minute).replace(tzinfo=now.tzinfo)
        else:
            minute = minute.astimezone(now.tzinfo)
        per[minute] = (int(done or 0), int(n) - int(done or 0))
    return per


def queue_latency(store: Store, now: datetime) -> float | None:
    """How long the next job a worker could claim has been due: the claim's
    own order (``claim_statements.due``), so it reads one entry of the claim index
    (on SQLite, one per priority the claimable jobs hold).
    Jobs in paused queues are left out: nobody can claim them, so their age
    is a person's choice, not a delay, and counting it raised an alarm that
    grew for as long as the pause lasted."""
    with store.read() as conn:
        paused = list(conn.execute(select(queue_state.c.name).where(queue_state.c.paused)).scalars())
        priorities = store.claimable_priorities(conn)  # SQLite: past the due jobs, no scheduled job is read
        if priorities == []:
            return None
        n = None if priorities is None else len(priorities)
        stmt = claim_statements.due(None, None, len(paused), columns=(jobs.c.available_at,), lock=False, n_priorities=n)
        values = {
            "now": now,
            **{f"skip_{i}": name for i, name in enumerate(paused)},
            **{f"priority_{i}": p for i, p in enumerate(priorities or ())},
        }
        oldest = conn.execute(stmt.limit(1), values).scalar()
    return None if oldest is None else max(0.0, (now - oldest).total_seconds())


@dataclass
class Snapshots:
    """One overview snapshot per process, shared by every poll.

    A stale snapshot is served while its refresh runs only if it is younger
    than twice the TTL, i.e. it was taken during the current spell of polling:
    after a quiet spell the first read recomputes inline, so a page never
    opens on numbers from an hour ago (it once showed all zeros)."""

    store: Store
    ttl: float = 3.0
    """Seconds a snapshot is served before a refresh starts; 0 disables
    caching (every read recomputes, for tests)."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock ages are measured on (a test moves it)."""
    _current: Snapshot | None = None
    _taken: float = 0.0
    _refreshing: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _history: dict[datetime, float] = field(default_factory=dict)

    def get(self, now: datetime, first_paint: bool = False) -> Snapshot:
        """The current snapshot. A ``first_paint`` (a page opened, not a poll)
        is never older than the TTL; a poll may get one up to twice the TTL
        old while the next is taken in the background."""
        with self._lock:
            current, age = self._current, self.monotonic() - self._taken
            stale = current is None or age >= self.ttl
            too_old = age >= (self.ttl if first_paint else 2 * self.ttl)
            start_refresh = stale and not too_old and current is not None and not self._refreshing and self.ttl > 0
            if start_refresh:
                self._refreshing = True
        if current is None or self.ttl <= 0 or too_old:
            return self._take(now)
        if start_refresh:
            threading.Thread(target=self._refresh, args=(now,), name="jobdeck-snapshot", daemon=True).start()
        return current

    def invalidate(self) -> None:
        """After an operator action: the next read recomputes inline, so the
        operator sees the counts their action changed."""
        with self._lock:
            self._current = None

    def _refresh(self, now: datetime) -> None:
        try:
            self._take(now)
        except Exception:  # the next poll retries; the stale snapshot stays served
            log.warning("overview snapshot failed", exc_info=True)
        finally:
            with self._lock:
                self._refreshing = False

    def _take(self, now: datetime) -> Snapshot:
        counts = self.store.counts(now)
        latency = queue_latency(self.store, now)
        with self._lock:
            if latency is not None:
                minute = _minute(now)
                self._history[minute] = max(latency, self._history.get(minute, 0.0))
            cutoff = _minute(now) - timedelta(minutes=59)
            for m in [m for m in self._history if m < cutoff]:
                del self._history[m]
            history = sorted(self._history.items())
        snap = Snapshot(now, counts, throughput(self.store, now), latency, history)
        with self._lock:
            self._current, self._taken = snap, self.monotonic()
        return snap
