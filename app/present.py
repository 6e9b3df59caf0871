"""How a job's numbers read to a person, the same wherever they are read:
the dashboard (``jobdeck.web.dashboard.present`` makes these Jinja globals) and
the CLI's ``jobs`` and ``show`` import them from here, so the two never
count a job's attempts or name its priority differently."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from jobdeck.core.states import CLAIMABLE, State, priority_label

if TYPE_CHECKING:
    from jobdeck.store import JobRecord


def attempts_allowed(job: JobRecord) -> int:
    """How many attempts the job may make in all, counting those it made:
    ``job.attempt`` numbers every attempt (the timeline's "Attempt N"), and
    its retry budget (``max_retries`` + 1 attempts) restarts when a person
    retries it. The attempts made in the current budget are its retries, plus
    the one that ended it (running, completed, dead) when it is not waiting
    for its next attempt. A discarded job keeps no trace of where it was
    discarded from: it was waiting if every attempt it made was retried."""
    waiting = job.status in CLAIMABLE or (job.status is State.DISCARDED and job.attempt == job.retry_count)
    in_budget = job.retry_count + (0 if waiting else 1)
    return job.attempt - in_budget + job.max_retries + 1


_NOTE = re.compile(r"\(not retried: ([\w.]{1,200}) is non-retryable\)")
"""The last line the worker adds to the error of an attempt sent to dead
with retries left (``jobdeck.worker.executors.not_retried_note``)."""
_CLASS = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def not_retried(job: JobRecord) -> str | None:
    """Why a dead job did not use the retries it had left, or None when it
    is not dead or used them all: ``non-retryable InvalidField``. The reason
    is the worker's note on the error, else the error's class (a
    ``DeadLetter`` a handler raised says so in its own words), else that the
    worker marked the failure non-retryable (an HTTP worker's
    ``"retryable": false``)."""
    if job.status is not State.DEAD or job.retry_count >= job.max_retries:
        return None
    error = (job.error or "").strip()
    note = _NOTE.fullmatch(error.rsplit("\n", 1)[-1].strip())
    if note:
        return f"non-retryable {note.group(1)}"
    head, sep, _ = error.split("\n", 1)[0].partition(": ")
    if sep and len(head) <= 200 and _CLASS.fullmatch(head):
        return f"non-retryable {head}"
    return "marked non-retryable"


def attempts_text(job: JobRecord, why: bool = True) -> str:
    """Attempts made / allowed (``2/4``), as every front end shows them. A
    dead job that had retries left reads ``1 of 4, not retried:
    non-retryable InvalidField`` (without the reason when ``why`` is false):
    "1/4" alone read as three retries still to come."""
    allowed = attempts_allowed(job)
    reason = not_retried(job)
    if reason is None:
        return f"{job.attempt}/{allowed}"
    return f"{job.attempt} of {allowed}, not retried" + (f": {reason}" if why else "")


def priority_text(priority: int) -> str:
    """The label and the number (``high (20)``), as the job page's Priority
    field reads: the API's ``priority_label``, one word everywhere. The
    default, 0, is ``low (0, the default)``: the lowest named level, where
    every job starts unless it is given one."""
    return f"{priority_label(priority)} ({priority}{', the default' if priority == 0 else ''})"
