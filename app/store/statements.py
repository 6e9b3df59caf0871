"""Every lifecycle statement, once, as SQLAlchemy Core: here the enqueue
and what every statement shares (the source-state guard, the bound
``now``); the claim in ``jobdeck.store.claim_statements``; the ends of a
held attempt and what it does while it runs in
``jobdeck.store.attempt_statements``; the operators' actions in
``jobdeck.store.operator_statements``.

Each transition is one conditional statement whose WHERE names the allowed
source states from ``jobdeck.core.states.SOURCES``; the store runs it and reads zero
rows as a refusal. PostgreSQL executes these statements through Core;
SQLite executes the very same statements compiled once to text
(``jobdeck.store.sqlite.Prepared``). The statements whose shape
depends on how many ids they name are built per shape and cached.

"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jobdeck.core.states import State, Transition, sources
from jobdeck.store.models import CLAIMABLE_STATES, jobs, status_in
from jobdeck.store.postgres import CHANNEL, array_encoder, array_param
from jobdeck.store.sqlite import Prepared
from sqlalchemy import (
    Select,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.sql.elements import BindParameter, ColumnElement

JOB_COLUMNS = tuple(jobs.c)
CLAIM_SETS = ("status", "claimed_at", "heartbeat_at", "worker_id", "progress", "progress_message", "updated_at")
"""The columns a claim sets to values the claimer already holds (``_claimed_values``)."""
CLAIM_COLUMNS = tuple(
    c for c in jobs.c if c.name not in CLAIM_SETS and c.name not in ("error_fingerprint", "error_since")
)
"""What a claim returns: the rest of a ``JobRecord`` (``records.claimed_records``
fills in the ``CLAIM_SETS``). Seven columns fewer a
claimed row: a tenth of the claim's time on SQLite."""
GROUPS = (jobs.c.workflow_id, jobs.c.batch_id)
"""What an ending transition returns besides (id, status): whether the job
is in a workflow or a batch, whose waiting jobs its end may move (``jobdeck.store.graph``)."""
NOW = bindparam("now", type_=jobs.c.updated_at.type)


def in_states(transition: Transition) -> ColumnElement[bool]:
    """The job is in a state ``transition`` may move it from."""
    return status_in(jobs.c.status, sources(transition))


def running() -> ColumnElement[bool]:
    """The job is running: held by a worker (what the limits and the workers' page count)."""
    return status_in(jobs.c.status, [State.RUNNING.value])


def claimable(now: Any = NOW) -> ColumnElement[bool]:
    """The claimable predicate, defined once: a claim source state and due.
    The claim, the queue policy's pick and the SQLite commit watcher's probe
    all use it; the claim indexes hold the rows of its first half."""
    return and_(status_in(jobs.c.status, CLAIMABLE_STATES), jobs.c.available_at <= now)


def dialect_insert(dialect: str) -> Any:
    """The dialect's ``insert``: the one with ``on_conflict_do_nothing`` and ``on_conflict_do_update``."""
    return pg_dialect.insert if dialect == "postgresql" else sqlite_dialect.insert


def binds(prefix: str, n: int, type_: Any = None) -> list[BindParameter[Any]]:
    return [bindparam(f"{prefix}{i}", type_=type_) for i in range(n)]


def names(prefix: str, n: int | None) -> list[str]:
    return [f"{prefix}{i}" for i in range(n or 0)]


# -- enqueue ---------------------------------------------------------------------

JOB_FIELDS = (
    "type", "queue", "payload", "priority", "max_retries", "idempotency_key", "available_at", "created_at", "updated_at",
    "rate_key", "concurrency_key", "traceparent",
)  # fmt: skip
"""The order of an enqueue's values (``job_row``), the table's: on SQLite the
rows of a bulk insert go to the driver as they are. The rest of a new row
is fixed (``NEW_JOB``)."""


def job_row(new: Any, payload_json: str, now: Any, at: Any) -> tuple[Any, ...]:
    """An enqueue's values, in ``JOB_FIELDS`` order, for a ``NewJob``: the one
    place they are built (``at``, ``now``: times as the dialect's path takes them)."""
    return (
        new.type, new.queue, payload_json, new.priority, new.max_retries, new.idempotency_key, at, now, now,
        new.rate_key, new.concurrency_key, new.traceparent,
    )  # fmt: skip


NEW_JOB: dict[str, Any] = {"status": State.PENDING.value, "attempt": 0, "retry_count": 0}
"""What every new job starts with."""


def _job_values() -> dict[str, Any]:
    """The fixed values written literally, not bound: SQLite's bulk insert
    then takes the rows exactly as ``job_row`` builds them."""
    fixed: dict[str, Any] = {name: literal_column(repr(value)) for name, value in NEW_JOB.items()}
    return {**fixed, **{f: bindparam(f, type_=jobs.c[f].type) for f in JOB_FIELDS}}


@lru_cache(maxsize=8)
def enqueue(returning: str = "row") -> Prepared:
    """Insert one plain job (no idempotency key). ``returning``: ``row`` (the
    whole job), ``id`` (in parameter order, for executemany) or ``none``."""
    stmt = insert(jobs).values(_job_values())
    if returning == "row":
        stmt = stmt.returning(*JOB_COLUMNS)
    elif returning == "id":
        stmt = stmt.returning(jobs.c.id, sort_by_parameter_order=True)
    return Prepared(stmt, JOB_FIELDS)


KEYED_CONFLICT: dict[str, Any] = {
    "index_elements": [jobs.c.idempotency_key],
    "index_where": jobs.c.idempotency_key.is_not(None),
}
"""The conflict target of a keyed enqueue: ``ux_jobs_idempotency_key``,
partial (a job without a key is not in it), so ON CONFLICT names its
predicate too, or neither database matches the index."""
UNIQUE_CONFLICT: dict[str, Any] = {"index_elements": [jobs.c.unique_key], "index_where": jobs.c.unique_key.is_not(None)}
"""The conflict target of a unique enqueue: ``ux_jobs_unique_key``, partial like the key's."""


@lru_cache(maxsize=16)
def enqueue_rows_sqlite(n: int) -> str:
    """``enqueue("none")`` for ``n`` rows in one statement, as SQLite text:
    its compiled VALUES group repeated ``n`` times, the values of the rows
    one after the other (``JOB_FIELDS`` order each). SQLite runs one
    statement for all of them: less than half the CPU per row of running
    the one-row statement ``n`` times (executemany), which pays the
    statement's start, its journal and the sequence update per row."""
    compiled = enqueue("none").sqlite
    assert compiled.as_given, "the rows must go to the driver as job_row builds them"
    head, values = compiled.text.split(" VALUES ")
    return f"{head} VALUES {', '.join([values] * n)}"


def _woke() -> Any:
    """``pg_notify`` of ``jobdeck.store.postgres.CHANNEL`` as a column of a
    statement's RETURNING: an uncorrelated subquery, run once when the
    first row is returned (never when none is), so the statement that
    inserts jobs also wakes the other processes' pools, at its commit."""
    return select(func.pg_notify(literal_column(f"'{CHANNEL}'"), literal_column("''"))).scalar_subquery().label("woke")


@lru_cache(maxsize=2)
def enqueue_notifying(keyed: bool) -> Prepared:
    """PostgreSQL: ``enqueue`` (``keyed``: ``enqueue_keyed``'s, which inserts
    nothing when the key is taken) that also sends the NOTIFY (``_woke``)
    when it inserts: run alone in autocommit it is the whole durable
    enqueue, one round trip instead of BEGIN, INSERT, NOTIFY and COMMIT.
    Returns the id alone: the rest of the row is the values given and
    ``NEW_JOB`` (``jobdeck.store.enqueue.inserted``), and the driver describes
    every returned column anew on each call (a third of its CPU here)."""
    stmt = pg_dialect.insert(jobs).values(_job_values())
    if keyed:
        stmt = stmt.on_conflict_do_nothing(**KEYED_CONFLICT)
    return Prepared(stmt.returning(jobs.c.id, _woke()), JOB_FIELDS)


UNNEST_FIELDS = tuple(f for f in JOB_FIELDS if f not in ("created_at", "updated_at"))
"""What ``enqueue_unnest`` takes one array of, a value per job; the row's
created and updated times are ``now``."""
UNNEST_ENCODERS = {f: array_encoder(jobs.c[f].type) for f in UNNEST_FIELDS}
"""How each of ``UNNEST_FIELDS`` travels: one array literal a field (``postgres.array_encoder``)."""


@lru_cache(maxsize=2)
def enqueue_unnest(keyed: bool) -> Any:
    """PostgreSQL: many jobs in one statement, ``INSERT ... SELECT
    unnest(...)`` of one array per field (``UNNEST_FIELDS``) and ``now``:
    one statement text whatever the count, where a multi-row VALUES has a
    placeholder per value to parse and plan. ``keyed``: a job whose
    idempotency key is taken (or given twice) is not inserted. Returns (id,
    idempotency_key) of the inserted jobs, in their order, and wakes the
    other processes (``_woke``). A NULL ``available_at`` is ``now``: the
    driver then sends a NULL for each job due now, not the same time
    formatted a thousand times (half the CPU of the statement's values).
    Each array is bound as its literal (``UNNEST_ENCODERS``): the driver's
    dumpers, element by element, took about 60% of the insert's own CPU."""
    arrays = select(*(func.unnest(array_param(f, jobs.c[f].type)).label(f) for f in UNNEST_FIELDS))
    given = arrays.subquery("given")
    fixed: list[Any] = [literal_column(repr(value)) for value in NEW_JOB.values()]
    due = func.coalesce(given.c.available_at, NOW)
    rows = select(*(due if f == "available_at" else given.c[f] for f in UNNEST_FIELDS), *fixed, NOW, NOW)
    stmt = pg_dialect.insert(jobs).from_select([*UNNEST_FIELDS, *NEW_JOB, "created_at", "updated_at"], rows)
    if keyed:
        stmt = stmt.on_conflict_do_nothing(**KEYED_CONFLICT)
    return stmt.returning(jobs.c.id, jobs.c.idempotency_key, _woke())


@lru_cache(maxsize=8)
def enqueue_keyed(dialect: str, returning: str = "row") -> Prepared:
    """Insert a job with an idempotency key, doing nothing when the key is
    taken: the unique index (``ux_jobs_idempotency_key``) decides between concurrent enqueues."""
    stmt = dialect_insert(dialect)(jobs).values(_job_values()).on_conflict_do_nothing(**KEYED_CONFLICT)
    if returning == "row":
        return Prepared(stmt.returning(*JOB_COLUMNS), JOB_FIELDS)
    return Prepared(stmt.returning(jobs.c.id, jobs.c.idempotency_key), JOB_FIELDS)


UNIQUE_FIELDS = ("unique_key", "unique_until", "unique_states")
"""What a unique enqueue stores besides ``JOB_FIELDS`` (``jobdeck.store.unique``)."""


@lru_cache(maxsize=4)
def enqueue_unique(dialect: str) -> Prepared:
    """Insert a unique job, doing nothing when its unique key is taken: the
    UNIQUE index decides between concurrent enqueues. Values: ``JOB_FIELDS``
    then ``UNIQUE_FIELDS``."""
    values = {**_job_values(), **{f: bindparam(f, type_=jobs.c[f].type) for f in UNIQUE_FIELDS}}
    stmt = dialect_insert(dialect)(jobs).values(values).on_conflict_do_nothing(**UNIQUE_CONFLICT)
    return Prepared(stmt.returning(*JOB_COLUMNS), JOB_FIELDS + UNIQUE_FIELDS)


def job_by_key() -> Select[Any]:
    return select(jobs).where(jobs.c.idempotency_key == bindparam("key"))


def ids_by_key() -> Select[Any]:
    return select(jobs.c.id, jobs.c.idempotency_key).where(
        jobs.c.idempotency_key.in_(bindparam("keys", expanding=True))
    )
