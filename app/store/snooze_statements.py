"""The statements of a snooze: the held attempt back to ``pending``, due
later, with no retry counted; its attempt row with the delay; and the count
of snoozes in a row that ``max_snoozes`` caps. Fenced as the other ends of
an attempt are (``jobdeck.store.attempt_statements``)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jobdeck.core.states import AttemptOutcome, State, Transition
from jobdeck.store.attempt_statements import ATTEMPT_FIELDS, HOLDER, cancel_requested, cancelled_or, held_attempt
from jobdeck.store.models import attempts, jobs
from jobdeck.store.sqlite import Prepared
from jobdeck.store.statements import GROUPS, NOW
from sqlalchemy import BigInteger, bindparam, case, func, insert, select, update

SNOOZE_FIELDS = ("job", "job_attempt", "worker", "now", "snooze_until")


@lru_cache(maxsize=1)
def snooze() -> Prepared:
    """running -> pending, due at ``snooze_until``, with no retry counted and
    the worker forgotten as by a release; a job cancelled while it ran goes
    to cancelled instead. Fenced by (id, attempt, worker) like fail.
    Returns (id, status, workflow_id, batch_id). Values: ``SNOOZE_FIELDS``."""
    until = bindparam("snooze_until", type_=jobs.c.available_at.type)
    stmt = (
        update(jobs)
        .where(*held_attempt(Transition.SNOOZE))
        .values(
            status=cancelled_or(State.PENDING),
            available_at=case((cancel_requested(), jobs.c.available_at), else_=until),
            finished_at=case((cancel_requested(), NOW), else_=None),
            updated_at=NOW,
            **dict.fromkeys(HOLDER),
        )
        .returning(jobs.c.id, jobs.c.status, *GROUPS)
    )
    return Prepared(stmt, SNOOZE_FIELDS)


SNOOZED_ATTEMPT_FIELDS = (*ATTEMPT_FIELDS[:7], "snooze_seconds", "executor")


@lru_cache(maxsize=1)
def snoozed_attempt() -> Prepared:
    """A snoozed attempt's row, with its delay. Values: ``SNOOZED_ATTEMPT_FIELDS``."""
    fields = SNOOZED_ATTEMPT_FIELDS
    return Prepared(insert(attempts).values({f: bindparam(f, type_=attempts.c[f].type) for f in fields}), fields)


def snoozes_in_a_row() -> Any:
    """How many attempts of a job were snoozed since its last attempt that
    was not (what ``max_snoozes`` caps). Values: job."""
    job = bindparam("job", type_=BigInteger())
    last_other = (
        select(func.coalesce(func.max(attempts.c.attempt), 0))
        .where(attempts.c.job_id == job, attempts.c.outcome != AttemptOutcome.SNOOZED.value)
        .scalar_subquery()
    )
    return select(func.count()).where(
        attempts.c.job_id == job, attempts.c.outcome == AttemptOutcome.SNOOZED.value, attempts.c.attempt > last_other
    )
