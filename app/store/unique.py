"""Unique jobs in the store: the insert the UNIQUE index decides, the
freeing of a key its holder no longer holds, and what a duplicate does.

A job holds its unique key while it is in one of its unique states
(``jobs.unique_states``; ``scheduled`` is pending with ``available_at``
in the future) and before ``unique_until``. Nothing frees a key when the
holder moves on: the claim, the batched completion and every other
transition stay exactly as they are, and a job without a key costs
nothing. The next enqueue of the key frees it instead, with one
conditional UPDATE (``free_key``) in its own transaction, whose WHERE says
"no longer held" in SQL at that enqueue's time: a holder that moved back
into its states meanwhile (an operator's retry) is not freed. Then the
insert runs again; of racing enqueues the UNIQUE index lets one in.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from jobdeck.core.states import SCHEDULED, State
from jobdeck.core.uniqueness import STATE_BITS
from jobdeck.store import statements
from jobdeck.store.models import jobs, status_in
from jobdeck.store.records import JobRecord, NewJob
from sqlalchemy import Connection, and_, bindparam, case, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

_NOW = statements.NOW
_KEY = bindparam("key", type_=jobs.c.unique_key.type)
TRIES = 5
"""Inserts one enqueue makes: each retry follows a key freed by this very
enqueue and taken by a racing one before its insert (which is then its
duplicate), so two suffice; more is margin."""


def holding(now: Any = _NOW) -> ColumnElement[bool]:
    """The row holds its unique key at ``now``: its state (scheduled split
    out of pending) is one of its unique states, and its period has not ended."""
    pending = State.PENDING.value
    bit = case(
        (and_(status_in(jobs.c.status, [pending]), jobs.c.available_at > now), STATE_BITS[SCHEDULED]),
        *[(status_in(jobs.c.status, [state]), b) for state, b in STATE_BITS.items() if state != SCHEDULED],
        else_=0,
    )
    in_states = jobs.c.unique_states.op("&")(bit) != 0
    return and_(in_states, or_(jobs.c.unique_until.is_(None), jobs.c.unique_until > now))


def not_started() -> ColumnElement[bool]:
    """What replace and debounce may still change: pending and never claimed
    (a released job has been claimed; a failed one has run)."""
    return and_(status_in(jobs.c.status, [State.PENDING.value]), jobs.c.attempt == 0)


@lru_cache(maxsize=1)
def free_key() -> Any:
    """Take the key from a row that no longer holds it. Values: key, now."""
    return update(jobs).where(jobs.c.unique_key == _KEY, ~holding()).values(unique_key=None)


@lru_cache(maxsize=4)
def update_kept(replace: bool, debounce: bool) -> Any:
    """A duplicate's change to the kept job, if it has not started: the new
    payload and run-at (replace; with the flow keys computed from the new
    payload), the run-at only (debounce). Values: key, now, new_at,
    [new_payload, new_rate_key, new_concurrency_key]."""
    values: dict[str, Any] = {"available_at": bindparam("new_at", type_=jobs.c.available_at.type)}
    if replace:
        values["payload"] = bindparam("new_payload")
        values["rate_key"] = bindparam("new_rate_key", type_=jobs.c.rate_key.type)
        values["concurrency_key"] = bindparam("new_concurrency_key", type_=jobs.c.concurrency_key.type)
    values["updated_at"] = _NOW
    return (
        update(jobs)
        .where(jobs.c.unique_key == _KEY, holding(), not_started())
        .values(values)
        .returning(*statements.JOB_COLUMNS)
    )


def kept() -> Any:
    return select(jobs).where(jobs.c.unique_key == _KEY)


def enqueue_unique(
    conn: Connection, dialect: str, new: NewJob, payload_json: str, now: datetime
) -> tuple[JobRecord, bool, bool]:
    """Insert ``new`` unless a job holds its key; returns (job, created,
    changed): the new job, or the kept one (``changed``: a replace or a
    debounce applied to it)."""
    claim = new.unique
    assert claim is not None
    at = new.available_at or now
    values = (*statements.job_row(new, payload_json, now, at), claim.key, claim.until, claim.states)
    insert = statements.enqueue_unique(dialect)
    params = {"key": claim.key, "now": now}
    for _ in range(TRIES):
        row = conn.execute(insert.stmt, insert.params(values)).first()
        if row is not None:
            return JobRecord.from_row(row), True, False
        if conn.execute(free_key(), params).rowcount:
            continue
        if claim.replace or claim.debounce:
            change = dict(
                params, new_at=at, new_payload=payload_json,
                new_rate_key=new.rate_key, new_concurrency_key=new.concurrency_key,
            )  # fmt: skip
            changed = conn.execute(update_kept(claim.replace, claim.debounce is not None), change).first()
            if changed is not None:
                return JobRecord.from_row(changed), False, True
        found = conn.execute(kept(), params).first()
        if found is not None:
            return JobRecord.from_row(found), False, False
    raise RuntimeError(f"unique key {claim.key!r} is taken and freed again and again")
