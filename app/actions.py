"""Operator actions on schedules and queues (pause, resume, run now), announced
in one place so the audit log can record them.

Each action is logged at INFO on the ``jobdeck.audit`` logger and handed to
every function in ``LISTENERS``; the audit log registers one there. Keeping
this seam separate means schedules and queue controls do not depend on how
(or whether) the audit trail is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.store import Store

log = logging.getLogger("jobdeck.audit")


@dataclass(frozen=True)
class Action:
    actor: str
    """Who: a dashboard user name, ``api`` or ``cli``."""
    verb: str
    """What: ``schedule.pause``, ``schedule.resume``, ``schedule.run``,
    ``queue.pause``, ``queue.resume``."""
    target: str
    """The schedule's or queue's name."""
    at: datetime
    detail: dict[str, Any] = field(default_factory=dict)


LISTENERS: list[Callable[[Action], None]] = []


def record(actor: str, verb: str, target: str, at: datetime, *, store: Store | None = None, **detail: Any) -> Action:
    """Log the action, write it to the audit log (when given the store), and
    tell the listeners."""
    action = Action(actor, verb, target, at, detail)
    log.info("%s by %s: %s %s", verb, actor, target, detail or "")
    if store is not None:
        from app.store.reads import record_action

        job_id = detail.get("job_id")
        record_action(store, actor, verb, at, count=1 if job_id else 0, job_id=job_id, detail=target)
    for listener in LISTENERS:
        listener(action)
    return action
