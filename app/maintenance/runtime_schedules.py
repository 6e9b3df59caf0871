"""Schedules made at runtime: operators create, edit, pause and delete them
from the dashboard or ``POST``/``PUT``/``DELETE /api/schedules``.

A runtime schedule is a ``[[schedules]]`` entry kept in the database
(``jobdeck.store.runtime_schedules``) and validated by the same
``parse_schedule`` (cron, time zone, type, payload, health options), so what
the API accepts is exactly what the config file would. Config schedules stay
the source of truth for their names: they cannot be edited or deleted here,
and no runtime schedule can take one of their names (409). Every process
picks changes up within ``poll_interval`` (``Periodic.refresh``) and fires
them through the same ``fire_key``, so each fire time is one job however
many processes run. Every change is in the audit log with what changed.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck import actions
from jobdeck.core.config import ConfigError
from jobdeck.core.errors import JobdeckError
from jobdeck.core.validation import check_json
from jobdeck.maintenance.cron import Schedule, UnknownSchedule, parse_schedule
from jobdeck.store.runtime_schedules import (
    delete_runtime_schedule,
    get_runtime_schedule,
    insert_runtime_schedule,
    replace_runtime_schedule,
)

if TYPE_CHECKING:
    from jobdeck.maintenance.cron import Periodic
    from jobdeck.store import Store

DIFF_VALUE_CHARS = 300
"""How much of one value the audit log's diff shows (a payload may be large)."""


class ScheduleInvalid(JobdeckError):
    """The entry would not pass as a ``[[schedules]]`` entry; says why."""

    status_code = 422


class ScheduleConflict(JobdeckError):
    status_code = 409


def config_owned(name: str) -> ScheduleConflict:
    return ScheduleConflict(
        f"schedule {name!r} comes from the configuration file, which is its source of truth: "
        "change it there and restart (it cannot be created, edited or deleted here)"
    )


class RuntimeSchedules:
    """Create, edit and delete the schedules kept in the database; each
    change is checked as a config entry is and picked up by ``periodic``."""

    def __init__(self, store: Store, periodic: Periodic) -> None:
        self.store = store
        self.periodic = periodic

    def validate(self, data: Any) -> Schedule:
        """A schedule from a request body, or ScheduleInvalid (422) saying why."""
        if not isinstance(data, dict):
            raise ScheduleInvalid("expected a JSON object: a schedule like a [[schedules]] entry")
        check_json(data)
        try:
            return parse_schedule(data, self.periodic.targets)
        except ConfigError as exc:
            raise ScheduleInvalid(str(exc)) from None

    def create(self, data: Any, actor: str, now: datetime) -> Schedule:
        schedule = self.validate(data)
        if schedule.name in self.periodic.configured:
            raise config_owned(schedule.name)
        entry = dict(data)  # as the operator wrote it ("26h", not 93600.0): the diff and the form read it
        if not insert_runtime_schedule(self.store, schedule.name, entry, actor, now):
            raise ScheduleConflict(f"a schedule named {schedule.name!r} exists already: edit it (PUT) instead")
        self._record(actor, "schedule.create", schedule.name, now, {}, entry)
        return schedule

    def update(self, name: str, data: Any, actor: str, now: datetime) -> Schedule:
        """Replace a runtime schedule's definition (a full entry; ``name``,
        if given, must be the same: a rename is a create and a delete)."""
        if name in self.periodic.configured:
            raise config_owned(name)
        stored = get_runtime_schedule(self.store, name)
        if stored is None:
            raise UnknownSchedule(name)
        if isinstance(data, dict):
            if data.get("name", name) != name:
                raise ScheduleInvalid("name: a schedule cannot be renamed; create the new one and delete this one")
            data = {**data, "name": name}
        schedule = self.validate(data)
        entry = dict(data)
        if not replace_runtime_schedule(self.store, name, stored.definition, entry, actor, now):
            raise ScheduleConflict(f"schedule {name!r} changed while it was being edited: look again and redo the edit")
        self._record(actor, "schedule.update", name, now, stored.definition, entry)
        return schedule

    def delete(self, name: str, actor: str, now: datetime) -> None:
        if name in self.periodic.configured:
            raise config_owned(name)
        stored = get_runtime_schedule(self.store, name)
        if stored is None or not delete_runtime_schedule(self.store, name):
            raise UnknownSchedule(name)
        self._record(actor, "schedule.delete", name, now, stored.definition, {})

    def _record(self, actor: str, verb: str, name: str, now: datetime, before: dict[str, Any],
                after: dict[str, Any]) -> None:  # fmt: skip
        actions.record(actor, verb, name, now, store=self.store, changes=diff(before, after))
        self.periodic.refresh(force=True)


def diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What changed, field by field: ``cron: "0 2 * * *" → "0 3 * * *"``."""
    parts = []
    for key in sorted(set(before) | set(after)):
        if key == "name" or before.get(key) == after.get(key):
            continue
        parts.append(f"{key}: {_shown(before, key)} → {_shown(after, key)}")
    return "; ".join(parts) or "no change"


def _shown(entry: dict[str, Any], key: str) -> str:
    if key not in entry:
        return "(none)"
    text = json.dumps(entry[key], ensure_ascii=False, sort_keys=True)
    return text if len(text) <= DIFF_VALUE_CHARS else text[:DIFF_VALUE_CHARS] + "…"
