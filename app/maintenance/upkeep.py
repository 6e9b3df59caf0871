"""Maintenance loops, each a thin body around a few statements (after Oban's
Lifeline and Pruner): the stalled-job sweeper, retention, and the per-minute
counters the dashboard's charts read.

``sweep_once`` rescues running jobs whose heartbeat is older than
``stall_timeout`` (``Store.rescue_stalled``: the attempt is recorded as
"stalled: worker W stopped heart-beating at T" and the fail rule sends the job
to ``failed`` or, with no retries left, ``dead``) and marks silent workers
gone. Every update is conditional, so several processes may sweep at once.

Retention (``[retention]`` in config)::

    completed_days = 7      # completed and discarded jobs, with their attempts
    dead_days = 0           # 0 keeps dead jobs until a person acts
    stats_days = 30         # per-minute counters
    batch = 1000            # rows per delete transaction

An idempotency key is remembered exactly as long as its job row exists: after
a completed job is pruned, enqueueing its key again creates a new job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, select, update

from app.config import Config, ConfigError
from app.deck import Jobdeck
from app.states import FINISHED, State
from app.store.models import INTERRUPTED, attempts, jobs, maintenance_marks, stats_minutely, workers

log = logging.getLogger("jobdeck.maintenance")

STATS_SETTLE = timedelta(seconds=30)
"""A minute is rolled up this long after it ends, so late acks land in it."""
STATS_MARK = _STATS_MARK = "stats_minutely"
"""The ``maintenance_marks`` key of the roll-up's watermark: minutes before
it are in ``stats_minutely`` (the overview's throughput chart reads both)."""


@dataclass(frozen=True)
class Retention:
    completed_days: float = 7.0
    dead_days: float = 0.0
    stats_days: float = 30.0
    batch: int = 1000
    max_batches: int = 20
    """Per call, so one prune never holds the database for long."""


def parse_retention(config: Config) -> Retention:
    raw = config.extra.get("retention", {})
    if not isinstance(raw, dict):
        raise ConfigError("retention: expected a table")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in Retention.__dataclass_fields__ or key == "max_batches":
            raise ConfigError(f"retention.{key}: unknown key")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"retention.{key}: must be a number >= 0, got {value!r}")
        values[key] = int(value) if key == "batch" else float(value)
    retention = Retention(**values)
    if retention.batch < 1 or retention.completed_days <= 0 or retention.stats_days <= 0:
        raise ConfigError("retention: completed_days, stats_days and batch must be > 0")
    return retention


class Maintenance:
    def __init__(self, deck: Jobdeck, retention: Retention | None = None) -> None:
        self.deck = deck
        self.store = deck.store
        self.retention = retention or parse_retention(deck.config)

    # -- the sweeper ------------------------------------------------------------

    def sweep_once(self, now: datetime) -> list[int]:
        """Rescue stalled jobs; mark workers gone that stopped heart-beating
        without stopping (and un-mark one that came back). Returns the ids of
        the rescued jobs."""
        timeout = self.deck.config.stall_timeout
        rescued = self.store.rescue_stalled(now, timeout)
        for job in rescued:
            log.warning("rescued job %s (%s) -> %s: %s", job.id, job.type, job.status.value, job.error)
        cutoff = now - timedelta(seconds=timeout)
        with self.store.write() as conn:
            gone = (
                conn.execute(
                    update(workers)
                    .where(workers.c.stopped_at.is_(None), workers.c.gone_at.is_(None), workers.c.heartbeat_at < cutoff)
                    .values(gone_at=now)
                    .returning(workers.c.id)
                )
                .scalars()
                .all()
            )
            conn.execute(
                update(workers)
                .where(workers.c.gone_at.is_not(None), workers.c.heartbeat_at >= cutoff, workers.c.stopped_at.is_(None))
                .values(gone_at=None)
            )
        for worker_id in gone:
            log.warning("worker %s stopped heart-beating; marked gone", worker_id)
        return [j.id for j in rescued]

    # -- retention --------------------------------------------------------------

    def prune_once(self, now: datetime) -> dict[str, int]:
        """Delete finished jobs (and dead ones, with ``dead_days``) past their
        age in batches, with their attempts; old counters; long-gone workers."""
        r = self.retention
        pruned = {"jobs": 0, "dead": 0, "stats": 0, "workers": 0}
        pruned["jobs"] = self._prune_jobs(FINISHED, now - timedelta(days=r.completed_days))
        if r.dead_days > 0:
            pruned["dead"] = self._prune_jobs(frozenset({State.DEAD}), now - timedelta(days=r.dead_days))
        with self.store.write() as conn:
            pruned["stats"] = conn.execute(
                delete(stats_minutely).where(stats_minutely.c.minute < now - timedelta(days=r.stats_days))
            ).rowcount
            pruned["workers"] = conn.execute(
                delete(workers).where(workers.c.heartbeat_at < now - timedelta(days=r.completed_days))
            ).rowcount
        if any(pruned.values()):
            log.info("retention pruned %s", pruned)
        return pruned

    def _prune_jobs(self, states: frozenset[State], cutoff: datetime) -> int:
        values = [s.value for s in states]
        total = 0
        for _ in range(self.retention.max_batches):
            with self.store.write() as conn:
                ids = list(
                    conn.execute(
                        select(jobs.c.id)
                        .where(jobs.c.status.in_(values), jobs.c.finished_at < cutoff)
                        .order_by(jobs.c.id)
                        .limit(self.retention.batch)
                    ).scalars()
                )
                if not ids:
                    break
                conn.execute(delete(attempts).where(attempts.c.job_id.in_(ids)))
                total += conn.execute(delete(jobs).where(jobs.c.id.in_(ids), jobs.c.status.in_(values))).rowcount
            if len(ids) < self.retention.batch:
                break
        return total

    # -- per-minute counters ------------------------------------------------------

    def rollup_once(self, now: datetime) -> int:
        """Add the minutes that ended since the last roll-up to
        ``stats_minutely``; returns how many minutes were closed. The
        watermark moves by compare-and-set in the same transaction, so two
        processes never count a minute twice."""
        until = _minute(now - STATS_SETTLE)
        with self.store.write() as conn:
            mark = conn.execute(
                select(maintenance_marks.c.value).where(maintenance_marks.c.key == _STATS_MARK)
            ).scalar()
            if mark is None:
                conn.execute(
                    self.store._insert()(maintenance_marks)
                    .values(key=_STATS_MARK, value=until - timedelta(hours=1))
                    .on_conflict_do_nothing(index_elements=["key"])
                )
                return 0
            if mark >= until:
                return 0
            moved = conn.execute(
                update(maintenance_marks)
                .where(maintenance_marks.c.key == _STATS_MARK, maintenance_marks.c.value == mark)
                .values(value=until)
            ).rowcount
            if not moved:
                return 0
            counts: dict[tuple[datetime, str], list[int]] = {}
            minute = self._minute_expr(attempts.c.finished_at)
            for m, job_type, outcome, n in conn.execute(
                select(minute, jobs.c.type, attempts.c.outcome, func.count())
                .select_from(attempts.join(jobs, jobs.c.id == attempts.c.job_id))
                .where(attempts.c.finished_at >= mark, attempts.c.finished_at < until)
                .group_by(minute, jobs.c.type, attempts.c.outcome)
            ):
                if outcome == INTERRUPTED:
                    continue  # cut short by shutdown, neither done nor a failure
                row = counts.setdefault((_parse_minute(m), job_type), [0, 0, 0])
                row[0 if outcome == State.COMPLETED.value else 1] += n
            dead_minute = self._minute_expr(jobs.c.finished_at)
            for m, job_type, n in conn.execute(
                select(dead_minute, jobs.c.type, func.count())
                .where(and_(jobs.c.status == State.DEAD.value, jobs.c.finished_at >= mark, jobs.c.finished_at < until))
                .group_by(dead_minute, jobs.c.type)
            ):
                counts.setdefault((_parse_minute(m), job_type), [0, 0, 0])[2] += n
            if counts:
                insert = self.store._insert()(stats_minutely)
                stmt = insert.on_conflict_do_update(
                    index_elements=["minute", "type"],
                    set_={
                        "completed": stats_minutely.c.completed + insert.excluded.completed,
                        "failed": stats_minutely.c.failed + insert.excluded.failed,
                        "dead": stats_minutely.c.dead + insert.excluded.dead,
                    },
                )
                conn.execute(
                    stmt,
                    [{"minute": m, "type": t, "completed": c[0], "failed": c[1], "dead": c[2]}
                     for (m, t), c in counts.items()],
                )  # fmt: skip
        return int((until - mark).total_seconds() // 60)

    def _minute_expr(self, column: Any) -> Any:
        if self.store.dialect == "postgresql":
            return func.date_trunc("minute", func.timezone("UTC", column))
        return func.strftime("%Y-%m-%d %H:%M:00", column)

    def stats(self, since: datetime, job_type: str | None = None) -> list[dict[str, Any]]:
        """Counters from ``since`` on, oldest first (for the dashboard's charts)."""
        stmt = select(stats_minutely).where(stats_minutely.c.minute >= since)
        if job_type is not None:
            stmt = stmt.where(stats_minutely.c.type == job_type)
        with self.store.read() as conn:
            rows = conn.execute(stmt.order_by(stats_minutely.c.minute, stats_minutely.c.type)).all()
        return [dict(r._mapping) for r in rows]


def _minute(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(second=0, microsecond=0)


def _parse_minute(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return _minute(value)
