"""The statements of schedule health (``jobdeck.maintenance.schedule_health``):
each watched schedule's row in ``schedule_health``, the recent outcomes of
its runs, and the two conditional flips (healthy -> unhealthy -> healthy)
that decide, across processes, which one records an alert.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.store.models import jobs, schedule_health, schedule_runs
from jobdeck.store.statements import dialect_insert
from sqlalchemy import select, update

if TYPE_CHECKING:
    from jobdeck.store import Store

RECENT_RUNS = 50
"""How many of a schedule's last runs a check reads (failures in a row, last success)."""


@dataclass(frozen=True)
class HealthRow:
    name: str
    watched_since: datetime
    last_success_at: datetime | None
    unhealthy: bool
    episode: datetime | None
    reason: str | None
    changed_at: datetime | None


@dataclass(frozen=True)
class RunOutcome:
    """One recent run of a schedule, with its job's state (None once pruned)."""

    fire_time: datetime
    job_id: int | None
    status: str | None
    error: str | None
    finished_at: datetime | None
    claimed_at: datetime | None


def health_rows(store: Store, names: Sequence[str], now: datetime) -> dict[str, HealthRow]:
    """The health row of each named schedule; a schedule watched for the
    first time is stored healthy, watched since ``now``."""
    rows = read_health(store, names)
    missing = [n for n in names if n not in rows]
    if missing:
        with store.write() as conn:
            conn.execute(
                dialect_insert(store.dialect)(schedule_health).on_conflict_do_nothing(index_elements=["name"]),
                [{"name": n, "watched_since": now, "unhealthy": False} for n in missing],
            )
        rows = read_health(store, names)
    return rows


def read_health(store: Store, names: Sequence[str] | None = None) -> dict[str, HealthRow]:
    """The stored health rows (of ``names``, or all)."""
    stmt = select(schedule_health)
    if names is not None:
        stmt = stmt.where(schedule_health.c.name.in_(list(names)))
    with store.read() as conn:
        return {r.name: HealthRow(**r._mapping) for r in conn.execute(stmt)}


def recent_outcomes(store: Store, names: Sequence[str]) -> dict[str, list[RunOutcome]]:
    """The last ``RECENT_RUNS`` cron runs (not Run now) of each schedule, newest first."""
    out: dict[str, list[RunOutcome]] = {}
    with store.read() as conn:
        for name in names:
            rows = conn.execute(
                select(
                    schedule_runs.c.fire_time,
                    schedule_runs.c.job_id,
                    jobs.c.status,
                    jobs.c.error,
                    jobs.c.finished_at,
                    jobs.c.claimed_at,
                )  # fmt: skip
                .select_from(schedule_runs.outerjoin(jobs, jobs.c.id == schedule_runs.c.job_id))
                .where(schedule_runs.c.schedule == name, schedule_runs.c.manual.is_(False))
                .order_by(schedule_runs.c.id.desc())
                .limit(RECENT_RUNS)
            ).all()
            out[name] = [RunOutcome(**r._mapping) for r in rows]
    return out


def note_success(store: Store, name: str, at: datetime) -> None:
    """Move the schedule's last success forward to ``at`` (never back): it
    outlives the run's job, which retention prunes."""
    with store.write() as conn:
        conn.execute(
            update(schedule_health)
            .where(
                schedule_health.c.name == name,
                (schedule_health.c.last_success_at.is_(None)) | (schedule_health.c.last_success_at < at),
            )
            .values(last_success_at=at)
        )


def mark_unhealthy(store: Store, name: str, episode: datetime, reason: str, now: datetime) -> bool:
    """healthy -> unhealthy, counted from ``episode``; True for the one caller
    whose UPDATE flipped it (the others find it flipped)."""
    return _flip(
        store,
        update(schedule_health)
        .where(schedule_health.c.name == name, schedule_health.c.unhealthy.is_(False))
        .values(unhealthy=True, episode=episode, reason=reason, changed_at=now),
    )


def mark_recovered(store: Store, name: str, episode: datetime, now: datetime) -> bool:
    """unhealthy (since ``episode``) -> healthy; True for the one caller that flipped it."""
    return _flip(
        store,
        update(schedule_health)
        .where(
            schedule_health.c.name == name,
            schedule_health.c.unhealthy.is_(True),
            schedule_health.c.episode == episode,
        )
        .values(unhealthy=False, reason=None, changed_at=now),
    )


def _flip(store: Store, stmt: Any) -> bool:
    # RETURNING, not rowcount (see jobdeck.store.alerts): the winner is the one that gets a row back.
    with store.write() as conn:
        return conn.execute(stmt.returning(schedule_health.c.name)).first() is not None
