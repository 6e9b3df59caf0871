"""Operator actions on schedules and queues (pause, resume, run now, and
creating, editing and deleting runtime schedules with what changed),
recorded in one place: each is logged at INFO on the ``jobdeck.audit``
logger and written to the audit log (``jobdeck.store.reads.record_action``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobdeck.store import Store

log = logging.getLogger("jobdeck.audit")


@dataclass(frozen=True)
class Action:
    actor: str
    """Who: a dashboard user name, ``api`` or ``cli``."""
    verb: str
    """What: ``schedule.pause``, ``schedule.resume``, ``schedule.run``,
    ``queue.pause``, ``queue.resume``, ``schedule.create``, ``schedule.update``,
    ``schedule.delete``."""
    target: str
    """The schedule's or queue's name."""
    at: datetime
    detail: dict[str, Any] = field(default_factory=dict)


def record(
    actor: str,
    verb: str,
    target: str,
    at: datetime,
    *,
    store: Store | None = None,
    changes: str | None = None,
    **detail: Any,
) -> Action:
    """Log the action and write it to the audit log (when given the store);
    ``changes`` is the before/after diff of an edit, kept after the target."""
    if changes is not None:
        detail["changes"] = changes
    action = Action(actor, verb, target, at, detail)
    if store is None:
        log.info("%s by %s: %s %s", verb, actor, target, detail or "",
                 extra={"event": "audit", "actor": actor, "action": verb, "target": target})  # fmt: skip
    else:  # record_action logs it (jobdeck.audit)
        from jobdeck.store.audit import record_action

        job_id = detail.get("job_id")
        text = target if changes is None else f"{target}: {changes}"
        record_action(store, actor, verb, at, count=1 if job_id else 0, job_id=job_id, detail=text)
    return action
