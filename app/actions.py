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
from typing import Any

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


def record(actor: str, verb: str, target: str, at: datetime, **detail: Any) -> Action:
    action = Action(actor, verb, target, at, detail)
    log.info("%s by %s: %s %s", verb, actor, target, detail or "")
    for listener in LISTENERS:
        listener(action)
    return action
