"""Every lifecycle statement, once, as SQLAlchemy Core: here the enqueue,
the claim and what every statement shares (the source-state guard, the
bound ``now``); the ends of a held attempt and what it does while it runs
in ``jobdeck.store.attempt_statements``; the operators' actions in
``jobdeck.store.operator_statements``.

Each transition is one conditional statement whose WHERE names the allowed
source states from ``jobdeck.core.states.SOURCES``; the store runs it and reads zero
rows as a refusal. PostgreSQL executes these statements through Core;
SQLite executes the very same statements compiled once to text
(``jobdeck.store.sqlite.Prepared``). The statements whose shape
depends on how many ids they name are built per shape and cached.

The claim is the one statement where the dialects differ, and only in the
hints each ignores: ``FOR UPDATE SKIP LOCKED`` (PostgreSQL; SQLite's single
writer already excludes other claimers inside ``BEGIN IMMEDIATE``) and
``INDEXED BY ix_jobs_claim`` (SQLite, whose planner without statistics
prefers the type index and sorts every due job on every claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from jobdeck.core.states import State, Transition, sources
from jobdeck.store.models import CLAIMABLE_STATES, flow_starts, jobs, status_in
from jobdeck.store.postgres import CHANNEL, array_encoder, int_array, text_array
from jobdeck.store.sqlite import Prepared
from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    String,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal_column,
    select,
    update,
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


# -- claim -----------------------------------------------------------------------


def on_time(late: Any) -> Any:
    """PostgreSQL: ``now``, the time its caller read before it sent the
    statement, unless the row is written later than ``void_at`` on the
    server's clock (the statement resent after a partition, or held on a
    lock); then ``late``. Read in the row's new value, the server's clock is
    read when the row is written, after any lock wait; in a WHERE clause it
    was read once, as the statement started. Values: now, void_at."""
    return case((func.clock_timestamp() <= bindparam("void_at", type_=jobs.c.updated_at.type), NOW), else_=late)


def _claimed_values(voidable: bool = False) -> dict[str, Any]:
    """What a claim sets; each of ``CLAIM_SETS`` to a value the claimer
    holds (the decoders of ``CLAIM_COLUMNS`` fill them in from it). With
    ``voidable`` (PostgreSQL), a claim that lands later than ``void_at``
    stamps the server's time instead (``on_time``): stamped with the time
    read before, a claim held up past ``stall_timeout`` made an HTTP
    worker's job stalled the moment it was claimed, and a sweeper rescued
    it. The record the claimer gets keeps ``now``."""
    stamp = on_time(func.clock_timestamp()) if voidable else NOW
    values = {
        "status": State.RUNNING.value,
        "worker_id": bindparam("worker"),
        "claimed_at": stamp,
        "heartbeat_at": stamp,
        "updated_at": NOW,
        "progress": None,
        "progress_message": None,
    }
    assert set(values) == set(CLAIM_SETS)
    return {**values, "attempt": jobs.c.attempt + 1}


def due(
    n_types: int | None,
    n_queues: int | None,
    n_excluded: int,
    *,
    columns: Sequence[Any] = (jobs.c.id,),
    lock: bool = True,
) -> Any:
    """Due jobs in claim order (priority DESC, available_at, id); with
    ``lock``, those another claimer holds are skipped. Values: now, *types,
    *queues, *excluded queues."""
    stmt = select(*columns).with_hint(jobs, "INDEXED BY ix_jobs_claim", "sqlite").where(claimable())
    if n_types is not None:
        stmt = stmt.where(jobs.c.type.in_(binds("type_", n_types)))
    if n_queues is not None:
        stmt = stmt.where(jobs.c.queue.in_(binds("queue_", n_queues)))
    if n_excluded:
        stmt = stmt.where(jobs.c.queue.not_in(binds("skip_", n_excluded)))
    stmt = stmt.order_by(jobs.c.priority.desc(), jobs.c.available_at, jobs.c.id)
    return stmt.with_for_update(skip_locked=True) if lock else stmt


def due_order(n_types: int | None, n_queues: int | None, n_excluded: int) -> list[str]:
    return ["now", *names("type_", n_types), *names("queue_", n_queues), *names("skip_", n_excluded)]


@lru_cache(maxsize=512)
def due_picks(
    columns: tuple[Any, ...], n_types: int | None, n_queues: int | None, n_excluded: int, n_full: int
) -> Prepared:
    """What a claim policy picks its ids from: ``columns`` of the due jobs in
    claim order, but for ``n_full`` types at their limit, up to a bound
    limit. Values: now, *types, *queues, *excluded queues, *full types, limit."""
    stmt = due(n_types, n_queues, n_excluded, columns=columns)
    if n_full:  # named apart from the due list's type_N binds, which an anonymous bind would collide with
        stmt = stmt.where(jobs.c.type.not_in(binds("full_", n_full)))
    stmt = stmt.limit(bindparam("limit", type_=Integer))
    return Prepared(stmt, [*due_order(n_types, n_queues, n_excluded), *names("full_", n_full), "limit"])


@lru_cache(maxsize=256)
def claim(n_types: int | None, n_queues: int | None, n_excluded: int, voidable: bool = False) -> Prepared:
    """pending|failed (due) -> running, up to ``limit`` jobs in one statement.
    Values: worker, now, *types, *queues, *excluded queues, limit, and with
    ``voidable`` (PostgreSQL only) void_at (``_claimed_values``).
    The dialects differ in how the update finds the picked rows (``among``)."""
    picked = due(n_types, n_queues, n_excluded).limit(bindparam("limit", type_=Integer)).scalar_subquery()
    stmts = [
        update(jobs).where(among(picked, dialect)).values(_claimed_values(voidable)).returning(*CLAIM_COLUMNS)
        for dialect in ("postgresql", "sqlite")
    ]
    order = ["worker", *due_order(n_types, n_queues, n_excluded), "limit", *(["void_at"] if voidable else [])]
    return Prepared(stmts[0], order, stmts[1])


@lru_cache(maxsize=512)
def claim_ids(n: int) -> Prepared:
    """SQLite: claim the ``n`` given jobs, each only if still claimable (the
    queue policy picks the ids itself). Values: worker, now, *ids.
    PostgreSQL's is ``claim_id_array``."""
    stmt = (
        update(jobs)
        .where(jobs.c.id.in_(binds("id_", n, BigInteger())), claimable())
        .values(_claimed_values())
        .returning(*CLAIM_COLUMNS)
    )
    return Prepared(stmt, ["worker", "now", *names("id_", n)])


@lru_cache(maxsize=2)
def claim_id_array(voidable: bool = False) -> Prepared:
    """PostgreSQL: ``claim_ids``, the ids given as one array, so a claim of
    any size is one statement of one shape, which the server prepares once
    (with a placeholder per id each size was a text of its own, and the
    flow claim of 100 jobs took about 15% longer a round trip). Values:
    worker, now, the ids, and with ``voidable`` void_at (``_claimed_values``)."""
    order = ["worker", "now", "ids", *(["void_at"] if voidable else [])]
    return Prepared(_claim_id_array(voidable), order, encoders=[int_array if n == "ids" else None for n in order])


def _claim_id_array(voidable: bool) -> Any:
    return (
        update(jobs)
        .where(jobs.c.id == any_(array_param("ids", BigInteger())), claimable())
        .values(_claimed_values(voidable))
        .returning(*CLAIM_COLUMNS)
    )


@lru_cache(maxsize=2)
def claim_ids_logging(voidable: bool = False) -> Prepared:
    """PostgreSQL: ``claim_id_array`` and, in the same statement, the flow
    starts of the jobs it claimed (a picked job that another transaction
    took or ended meanwhile is not claimed, and its starts are not logged).
    Values: worker, now, the ids, then the starts as three arrays, one
    element a start: the job's id, the limit, the key; with ``voidable``,
    void_at last (the starts too are logged at the time the statement lands,
    when it lands late: ``on_time``). Every list travels as one array
    literal (``postgres.array_encoder``): one statement of one shape for
    any claim, and no list dumped by the driver element by element."""
    claimed = _claim_id_array(voidable).cte("claimed")
    start = (
        func.unnest(
            array_param("start_ids", BigInteger()),
            array_param("start_limits", String()),
            array_param("start_keys", String()),
        )
        .table_valued("id", "limit_name", "key")
        .render_derived(name="start")
    )
    started = (
        select(start.c.limit_name, start.c.key, on_time(func.clock_timestamp()) if voidable else NOW, func.count())
        .join(claimed, claimed.c.id == start.c.id)
        .group_by(start.c.limit_name, start.c.key)
    )
    logged = insert(flow_starts).from_select(["limit_name", "key", "started_at", "count"], started)
    stmt = select(claimed).add_cte(logged.cte("logged"))
    order = ["worker", "now", "ids", "start_ids", "start_limits", "start_keys", *(["void_at"] if voidable else [])]
    arrays = {"ids": int_array, "start_ids": int_array, "start_limits": text_array, "start_keys": text_array}
    return Prepared(stmt, order, encoders=[arrays.get(name) for name in order])


def array_param(name: str, element: Any) -> Any:
    """PostgreSQL: a list bound as its array literal (``postgres.array_encoder``),
    cast to an array of ``element``. A string's length is left out of the
    cast: an explicit cast to ``varchar(n)`` cuts a longer value short without
    a word, where the column it is written to refuses it."""
    if isinstance(element, String) and element.length is not None:
        element = Text()
    return cast(bindparam(name, type_=Text()), pg_dialect.ARRAY(element))


def among(picked: Any, dialect: str) -> ColumnElement[bool]:
    """The job is one of the ids ``picked`` selects. PostgreSQL takes them
    as one array computed once, so the update reaches each row by its
    primary key: given ``id IN (subquery)`` on an analyzed table its planner
    hash-joined the ids against a scan of the whole table."""
    return jobs.c.id == any_(func.array(picked)) if dialect == "postgresql" else jobs.c.id.in_(picked)
