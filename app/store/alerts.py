"""The dead-letter alerts' statements: choosing an alert's slot, and the dead
jobs one alert reports. ``jobdeck.maintenance.alerts`` decides the policy (the
window, what to send) and enqueues the alert jobs through ``Store.enqueue``.

The last slot of each job type is a watermark in ``maintenance_marks``,
moved by compare-and-set (like the roll-up's): of several processes planning
an alert for the same type at once exactly one wins a slot, without a lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.states import State
from jobdeck.store.models import jobs, maintenance_marks
from jobdeck.store.statements import dialect_insert
from sqlalchemy import select, update

if TYPE_CHECKING:
    from jobdeck.store import Store

MARK_PREFIX = "alert:"
_MARK_CHARS = 100
"""The length of ``maintenance_marks.key``: a longer type's mark is keyed by its hash."""
_TRIES = 20


def claim_alert_slot(
    store: Store, job_type: str, slot_for: Callable[[datetime | None], datetime | None]
) -> tuple[datetime | None, datetime] | None:
    """Move the alert watermark of ``job_type`` from its last slot (None at
    first) to ``slot_for(last)``; returns (last, new slot), or None when
    ``slot_for`` answers None (the last slot already covers it). A process
    that loses the compare-and-set to another reads the new slot and asks
    ``slot_for`` again."""
    key = _mark_key(job_type)
    for _ in range(_TRIES):
        with store.write() as conn:
            last = conn.execute(select(maintenance_marks.c.value).where(maintenance_marks.c.key == key)).scalar()
            slot = slot_for(last)
            if slot is None:
                return None
            if last is None:
                stmt: Any = (
                    dialect_insert(store.dialect)(maintenance_marks)
                    .values(key=key, value=slot)
                    .on_conflict_do_nothing(index_elements=["key"])
                )
            else:
                stmt = (
                    update(maintenance_marks)
                    .where(maintenance_marks.c.key == key, maintenance_marks.c.value == last)
                    .values(value=slot)
                )
            # RETURNING, not rowcount: on PostgreSQL an INSERT ... ON CONFLICT DO
            # NOTHING answers rowcount -1 (true) whether or not it inserted, so
            # every racer "won" the first slot and each sent its own alert.
            if conn.execute(stmt.returning(maintenance_marks.c.key)).first() is not None:
                return last, slot
    raise RuntimeError(f"the alert slot of {job_type!r} kept moving under {_TRIES} tries")


def dead_between(store: Store, job_type: str, since: datetime, until: datetime) -> list[Any]:
    """The jobs of ``job_type`` still dead that died in (since, until],
    newest first: (id, error, attempt, finished_at)."""
    with store.read() as conn:
        return list(
            conn.execute(
                select(jobs.c.id, jobs.c.error, jobs.c.attempt, jobs.c.finished_at)
                .where(
                    jobs.c.type == job_type,
                    jobs.c.status == State.DEAD.value,
                    jobs.c.finished_at > since,
                    jobs.c.finished_at <= until,
                )
                .order_by(jobs.c.id.desc())
            ).all()
        )


def _mark_key(job_type: str) -> str:
    key = f"{MARK_PREFIX}{job_type}"
    if len(key) <= _MARK_CHARS:
        return key
    return f"{MARK_PREFIX}sha256:{hashlib.sha256(job_type.encode()).hexdigest()}"
