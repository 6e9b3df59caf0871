"""The schedules operators make at runtime (``runtime_schedules``): each a
JSON definition in config form, read by every process's ``Periodic`` and
changed by ``jobdeck.maintenance.runtime_schedules``. Creating one (re)starts
its watermark at ``now``, so a name used before does not replay old fire times.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.store.models import runtime_schedules, schedule_health, schedule_state
from jobdeck.store.statements import dialect_insert
from sqlalchemy import select, update

if TYPE_CHECKING:
    from jobdeck.store import Store


@dataclass(frozen=True)
class StoredSchedule:
    name: str
    definition: dict[str, Any]
    updated_at: datetime
    updated_by: str


def load_runtime_schedules(store: Store) -> list[StoredSchedule]:
    with store.read() as conn:
        rows = conn.execute(select(runtime_schedules).order_by(runtime_schedules.c.name)).all()
    return [StoredSchedule(r.name, json.loads(r.definition), r.updated_at, r.updated_by) for r in rows]


def get_runtime_schedule(store: Store, name: str) -> StoredSchedule | None:
    with store.read() as conn:
        r = conn.execute(select(runtime_schedules).where(runtime_schedules.c.name == name)).first()
    return None if r is None else StoredSchedule(r.name, json.loads(r.definition), r.updated_at, r.updated_by)


def insert_runtime_schedule(store: Store, name: str, definition: dict[str, Any], actor: str, now: datetime) -> bool:
    """Store a new schedule; False when the name is taken. Its watermark and
    health start afresh at ``now``, unpaused."""
    with store.write() as conn:
        added = conn.execute(
            dialect_insert(store.dialect)(runtime_schedules)
            .values(name=name, definition=_dumps(definition), created_at=now, updated_at=now, updated_by=actor)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(runtime_schedules.c.name)
        ).first()
        if added is None:
            return False
        conn.execute(schedule_state.delete().where(schedule_state.c.name == name))
        conn.execute(schedule_health.delete().where(schedule_health.c.name == name))
        conn.execute(
            dialect_insert(store.dialect)(schedule_state).values(
                name=name, paused=False, checked_until=now, updated_at=now
            )
        )
    return True


def replace_runtime_schedule(
    store: Store, name: str, before: dict[str, Any], definition: dict[str, Any], actor: str, now: datetime
) -> bool:
    """Replace the definition, if it is still ``before`` (compare-and-set:
    two operators editing at once do not silently overwrite each other)."""
    with store.write() as conn:
        changed = conn.execute(
            update(runtime_schedules)
            .where(runtime_schedules.c.name == name, runtime_schedules.c.definition == _dumps(before))
            .values(definition=_dumps(definition), updated_at=now, updated_by=actor)
            .returning(runtime_schedules.c.name)
        ).first()
    return changed is not None


def delete_runtime_schedule(store: Store, name: str) -> bool:
    """Remove it (its runs and paused flag stay, as for a config schedule removed)."""
    with store.write() as conn:
        gone = conn.execute(
            runtime_schedules.delete().where(runtime_schedules.c.name == name).returning(runtime_schedules.c.name)
        ).first()
        conn.execute(schedule_health.delete().where(schedule_health.c.name == name))
    return gone is not None


def _dumps(definition: dict[str, Any]) -> str:
    return json.dumps(definition, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
