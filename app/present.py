"""How a job's numbers read to a person, the same wherever they are read:
the dashboard (``jobdeck.web.dashboard.present`` makes these Jinja globals) and
the CLI's ``jobs`` and ``show`` import them from here, so the two never
count a job's attempts or name its priority differently."""

from __future__ import annotations

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


def priority_text(priority: int) -> str:
    """``0 (default)``, or the label and the number (``high (10)``), as
    the job page's Priority field reads: 0 is the default, not "low"."""
    return f"{priority_label(priority)} ({priority})" if priority else "0 (default)"
