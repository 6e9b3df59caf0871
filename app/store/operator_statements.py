"""The operators' statements: retry, discard, cancel, run now and edit, one
job or many, each guarded by its transition's source states
(``jobdeck.store.statements.in_states``) like the worker's."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jobdeck.core.states import ALL_STATES, CANCEL_AT_ONCE, State, Transition
from jobdeck.store.models import attempts, jobs, status_in
from jobdeck.store.statements import GROUPS, JOB_COLUMNS, NOW, in_states
from sqlalchemy import (
    bindparam,
    case,
    func,
    select,
    update,
)
from sqlalchemy.sql.elements import BindParameter

# -- operator actions ------------------------------------------------------------

_IDS: BindParameter[Any] = bindparam("ids", expanding=True)


def retry(one: bool, with_payload: bool = False) -> Any:
    """failed|dead|discarded -> pending now, with a fresh retry budget. Values:
    ``job`` (``one``) or ``ids`` (expanding), now, [new_payload]."""
    values: dict[str, Any] = {"status": State.PENDING.value, "available_at": NOW, "retry_count": 0}
    values.update(finished_at=None, updated_at=NOW)
    if with_payload:
        values["payload"] = bindparam("new_payload")
    picked = jobs.c.id == bindparam("job") if one else jobs.c.id.in_(_IDS)
    stmt = update(jobs).where(picked, in_states(Transition.RETRY)).values(values)
    return stmt.returning(*JOB_COLUMNS) if one else stmt.returning(jobs.c.id)


def keep_old_payload() -> Any:
    """Edit and retry: the attempts that ran with the old payload keep it."""
    return (
        update(attempts)
        .where(attempts.c.job_id == bindparam("job"), attempts.c.payload.is_(None))
        .values(payload=bindparam("old"))
    )


def set_flow_keys() -> Any:
    """An edited job's flow keys (``jobdeck.jobs.flow``), in the edit's transaction. Values: job, rk, ck."""
    return (
        update(jobs)
        .where(jobs.c.id == bindparam("job"))
        .values(rate_key=bindparam("rk", type_=jobs.c.rate_key.type), concurrency_key=bindparam("ck"))
    )


def payload_of() -> Any:
    return select(jobs.c.payload).where(jobs.c.id == bindparam("job"))


def discard(one: bool) -> Any:
    """pending|failed|dead -> discarded. Values: ``job`` or ``ids``, now.
    Returns the job, or (id, status, workflow_id, batch_id) per job."""
    picked = jobs.c.id == bindparam("job") if one else jobs.c.id.in_(_IDS)
    stmt = (
        update(jobs)
        .where(picked, in_states(Transition.DISCARD))
        .values(status=State.DISCARDED.value, finished_at=NOW, updated_at=NOW)
    )
    return stmt.returning(*JOB_COLUMNS) if one else stmt.returning(jobs.c.id, jobs.c.status, *GROUPS)


def cancel(one: bool) -> Any:
    """pending|failed -> cancelled; running stays running with the cancel
    request stamped (the first request's time is kept), and its attempt's
    end ends it cancelled. Values: ``job`` or ``ids``, now."""
    picked = jobs.c.id == bindparam("job") if one else jobs.c.id.in_(_IDS)
    at_once = status_in(jobs.c.status, [s.value for s in ALL_STATES if s in CANCEL_AT_ONCE])
    stmt = (
        update(jobs)
        .where(picked, in_states(Transition.CANCEL))
        .values(
            status=case((at_once, State.CANCELLED.value), else_=jobs.c.status),
            finished_at=case((at_once, NOW), else_=jobs.c.finished_at),
            cancel_requested_at=func.coalesce(jobs.c.cancel_requested_at, NOW),
            updated_at=NOW,
        )
    )
    return stmt.returning(*JOB_COLUMNS) if one else stmt.returning(jobs.c.id, jobs.c.status, *GROUPS)


def run_now() -> Any:
    """A scheduled or retrying job (not yet due) becomes due now. Values: job, now."""
    return (
        update(jobs)
        .where(jobs.c.id == bindparam("job"), in_states(Transition.RUN_NOW), jobs.c.available_at > NOW)
        .values(available_at=NOW, updated_at=NOW)
        .returning(*JOB_COLUMNS)
    )


def status_of() -> Any:
    return select(jobs.c.status).where(jobs.c.id == bindparam("job"))


EDIT_FIELDS = ("payload", "priority", "queue", "available_at")
"""What an operator may change on a waiting job (``edit``)."""


@lru_cache(maxsize=64)
def edit(fields: tuple[str, ...], seen: State) -> Any:
    """pending|failed|dead -> the same state with new ``fields`` (a subset
    of ``EDIT_FIELDS``, in that order); a dead job is retried too (->
    pending, fresh retry budget, due now unless ``available_at`` is given).

    Fenced on the job as the operator saw it: still in state ``seen``, on
    the same attempt and with the same ``updated_at``, so a job claimed,
    retried, rescheduled or edited by someone else meanwhile is refused (no
    row) instead of silently changed. Values: job, now, seen_attempt,
    seen_updated_at, ``new_<field>`` for each field."""
    values: dict[str, Any] = {f: bindparam(f"new_{f}", type_=jobs.c[f].type) for f in fields}
    if seen is State.DEAD:
        values.update(status=State.PENDING.value, retry_count=0, finished_at=None)
        values.setdefault("available_at", NOW)
    values["updated_at"] = NOW
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job"),
            in_states(Transition.EDIT),
            status_in(jobs.c.status, [seen.value]),
            jobs.c.attempt == bindparam("seen_attempt"),
            jobs.c.updated_at == bindparam("seen_updated_at", type_=jobs.c.updated_at.type),
        )
        .values(values)
        .returning(*JOB_COLUMNS)
    )


def job_of() -> Any:
    """The whole row: what an edit starts from (and the audit compares with)."""
    return select(jobs).where(jobs.c.id == bindparam("job"))
