"""Every lifecycle statement, once, as SQLAlchemy Core.

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

from jobdeck.core.states import ALL_STATES, CANCEL_AT_ONCE, AttemptOutcome, State, Transition, sources
from jobdeck.store import postgres
from jobdeck.store.models import CLAIMABLE_STATES, attempts, jobs, status_in, workers
from jobdeck.store.postgres import CHANNEL
from jobdeck.store.sqlite import Prepared
from sqlalchemy import (
    ARRAY,
    BigInteger,
    Integer,
    Select,
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
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.sql.elements import BindParameter, ColumnElement

JOB_COLUMNS = tuple(jobs.c)
CLAIM_SETS = ("status", "claimed_at", "heartbeat_at", "worker_id", "progress", "progress_message", "updated_at")
"""The columns a claim sets to values the claimer already holds (``_claimed_values``)."""
CLAIM_COLUMNS = tuple(c for c in jobs.c if c.name not in CLAIM_SETS and c.name != "error_fingerprint")
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
    "rate_key", "concurrency_key",
)  # fmt: skip
"""The order of an enqueue's values (``job_row``), the table's: on SQLite the
rows of a bulk insert go to the driver as they are. The rest of a new row
is fixed (``NEW_JOB``)."""


def job_row(new: Any, payload_json: str, now: Any, at: Any) -> tuple[Any, ...]:
    """An enqueue's values, in ``JOB_FIELDS`` order, for a ``NewJob``: the one
    place they are built (``at``, ``now``: times as the dialect's path takes them)."""
    return (
        new.type, new.queue, payload_json, new.priority, new.max_retries, new.idempotency_key, at, now, now,
        new.rate_key, new.concurrency_key,
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
    formatted a thousand times (half the CPU of the statement's values)."""
    arrays = select(*(func.unnest(bindparam(f, type_=ARRAY(jobs.c[f].type))).label(f) for f in UNNEST_FIELDS))
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


def _claimed_values() -> dict[str, Any]:
    """What a claim sets; each of ``CLAIM_SETS`` to a value the claimer
    holds (the decoders of ``CLAIM_COLUMNS`` fill them in from it)."""
    values = {
        "status": State.RUNNING.value,
        "worker_id": bindparam("worker"),
        "claimed_at": NOW,
        "heartbeat_at": NOW,
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
def claim(n_types: int | None, n_queues: int | None, n_excluded: int) -> Prepared:
    """pending|failed (due) -> running, up to ``limit`` jobs in one statement.
    Values: worker, now, *types, *queues, *excluded queues, limit.
    The dialects differ in how the update finds the picked rows (``_among``)."""
    picked = due(n_types, n_queues, n_excluded).limit(bindparam("limit", type_=Integer)).scalar_subquery()
    stmts = [
        update(jobs).where(_among(picked, dialect)).values(_claimed_values()).returning(*CLAIM_COLUMNS)
        for dialect in ("postgresql", "sqlite")
    ]
    return Prepared(stmts[0], ["worker", *due_order(n_types, n_queues, n_excluded), "limit"], stmts[1])


@lru_cache(maxsize=512)
def claim_ids(n: int) -> Prepared:
    """Claim the ``n`` given jobs, each only if still claimable (the queue
    policy picks the ids itself). Values: worker, now, *ids."""
    stmt = (
        update(jobs)
        .where(jobs.c.id.in_(binds("id_", n, BigInteger())), claimable())
        .values(_claimed_values())
        .returning(*CLAIM_COLUMNS)
    )
    return Prepared(stmt, ["worker", "now", *names("id_", n)])


# -- finishing an attempt ----------------------------------------------------------


def cancel_requested() -> ColumnElement[bool]:
    """A person cancelled the job while it ran: however its attempt ends,
    the job ends ``cancelled`` (each finishing statement decides it with a
    CASE on this, in the same statement)."""
    return jobs.c.cancel_requested_at.is_not(None)


def _cancelled_or(state: State) -> Any:
    """``state``, or cancelled when a cancel was requested: the one CASE."""
    return case((cancel_requested(), State.CANCELLED.value), else_=state.value)


def _fenced(n: int, transition: Transition, by_rowid: bool = False) -> ColumnElement[bool]:
    """Each of ``n`` (id, attempt) pairs, only while held by the worker that
    ran that attempt and in a source state of ``transition``. ``by_rowid``
    names the ids alone as well, for SQLite: it then finds the rows by rowid
    and checks the pairs only on the rows found. PostgreSQL plans the pair
    list alone better (its drain was 5-7% slower with both)."""
    ids = binds("id_", n, BigInteger())
    pairs = [tuple_(i, a) for i, a in zip(ids, binds("at_", n, Integer()), strict=True)]
    fence = [
        tuple_(jobs.c.id, jobs.c.attempt).in_(pairs),
        jobs.c.worker_id == bindparam("worker"),
        in_states(transition),
    ]
    return and_(jobs.c.id.in_(ids), *fence) if by_rowid else and_(*fence)


def _unnest(name: str, columns: Sequence[Any]) -> Any:
    """PostgreSQL: one bound array per column, unnested into rows named like
    the columns: a batch of any size is one statement of one shape (prepared
    once by the server) instead of a list of placeholders per size. Each
    array is bound as its text literal (``postgres.array_encoder``) and cast."""
    arrays = [cast(bindparam(c.name, type_=Text()), pg_dialect.ARRAY(c.type)) for c in columns]
    return func.unnest(*arrays).table_valued(*(c.name for c in columns)).render_derived(name=name)


def _encoders(order: Sequence[str], columns: Sequence[Any]) -> tuple[Any, ...]:
    """For each value in ``order``: its column's array encoder, or None for a scalar."""
    by_name = {c.name: postgres.array_encoder(c.type) for c in columns}
    return tuple(by_name.get(name) for name in order)


def _fenced_set(transition: Transition, *carried: Any) -> tuple[Any, list[ColumnElement[bool]]]:
    """``_fenced`` for PostgreSQL's batches: the (id, attempt) pairs (and
    any ``carried`` column's values) as arrays. Values: ids, attempts, worker, [carried]."""
    done = _unnest("done", [jobs.c.id.label("ids"), jobs.c.attempt.label("attempts"), *carried])
    fence = [
        jobs.c.id == done.c.ids,
        jobs.c.attempt == done.c.attempts,
        jobs.c.worker_id == bindparam("worker"),
        in_states(transition),
    ]
    return done, fence


def _pairs(n: int) -> list[str]:
    return [name for i in range(n) for name in (f"id_{i}", f"at_{i}")]


PAIRS_STEP = 16
"""Batches of fenced pairs above this many are padded to a multiple of it."""


def fenced_pairs(held: Sequence[tuple[int, int | None]]) -> tuple[int, list[int | None]]:
    """The size of the ``complete``/``release`` statement for the (id,
    attempt) pairs ``held``, and the pairs' values laid out for it: above
    ``PAIRS_STEP`` pairs the last one is repeated up to the next multiple of
    it. A drain's batches come in every size up to ``claim_batch``: each
    size was a statement of its own to compile (63 in one 100,000-job SQLite
    drain, 7% of its Python time) and to prepare past the driver's statement
    cache; padded, at most ``claim_batch / PAIRS_STEP + PAIRS_STEP``. A pair
    listed twice matches its row once."""
    n = len(held)
    size = n if n <= PAIRS_STEP else -(-n // PAIRS_STEP) * PAIRS_STEP
    values = [x for pair in held for x in pair]
    return size, values + list(held[-1]) * (size - n) if held else values


COMPLETE_RETURNS = (jobs.c.id, jobs.c.attempt, jobs.c.status, *GROUPS)


def _completed(result: Any = None) -> dict[str, Any]:
    """What a completion writes, once for both of its statements: completed
    (cancelled if a cancel was requested), finished now, progress full if
    it was reported, and the handler's ``result`` when given."""
    values: dict[str, Any] = {
        "status": _cancelled_or(State.COMPLETED),
        "finished_at": NOW,
        "updated_at": NOW,
        "progress": case((jobs.c.progress.is_(None), None), else_=1.0),
    }
    if result is not None:
        values["result"] = result
    return values


@lru_cache(maxsize=512)
def complete(n: int, with_result: bool = False) -> Prepared:
    """SQLite's completion: running -> completed (cancelled if a cancel was
    requested) for ``n`` fenced (id, attempt) pairs of one worker; returns
    (id, attempt, status, workflow_id, batch_id). PostgreSQL completes
    through ``complete_recorded`` alone, so this statement has one form,
    phrased for SQLite's planner (``_fenced``).
    Values: now, worker, *(id, attempt), [result]."""
    values = _completed(bindparam("with_result") if with_result else None)
    stmt = (
        update(jobs).where(_fenced(n, Transition.COMPLETE, by_rowid=True)).values(values).returning(*COMPLETE_RETURNS)
    )
    return Prepared(stmt, ["now", "worker", *_pairs(n), *(["with_result"] if with_result else [])])


ATTEMPT_FIELDS = ("job_id", "attempt", "worker_id", "started_at", "finished_at", "outcome", "error", "traceback")


CANCELLED_WHILE_RUNNING = "cancelled while running; the handler returned anyway"
"""The error of the attempt row of a completion that ended its job cancelled."""


@lru_cache(maxsize=4)
def complete_recorded(with_result: bool = False, alone: bool = False) -> Prepared:
    """``complete`` for PostgreSQL: the pairs (and results) as arrays, and
    the attempt rows of the completions applied written by the same
    statement (the UPDATE's rows feed the INSERT): a batch's completion is
    one statement, whatever its size. Returns what ``complete`` returns.

    ``alone``: only the completions that need no other statement in their
    transaction, those of jobs in no workflow and no batch (their ends move
    the jobs that wait on them, ``jobdeck.store.graph``). Atomic by itself, it
    then runs in autocommit: the acker's batch takes one round trip where
    BEGIN, the UPDATE, the INSERT and COMMIT took four, each a wake-up of
    its thread while the executors and the fetcher want the GIL.
    Values: now, worker, ids, attempts, started, [results]."""
    carried = [attempts.c.started_at.label("started")]
    if with_result:
        carried.append(jobs.c.result.label("results"))
    done, fence = _fenced_set(Transition.COMPLETE, *carried)
    if alone:
        fence += [jobs.c.workflow_id.is_(None), jobs.c.batch_id.is_(None)]
    values = _completed(done.c.results if with_result else None)
    completing = update(jobs).where(*fence).values(values).returning(*COMPLETE_RETURNS, done.c.started)
    completed = completing.cte("completed")
    cancelled = completed.c.status == State.CANCELLED.value
    rows = select(
        completed.c.id,
        completed.c.attempt,
        bindparam("worker", type_=attempts.c.worker_id.type),
        completed.c.started,
        NOW,
        case((cancelled, AttemptOutcome.CANCELLED.value), else_=AttemptOutcome.COMPLETED.value),
        case((cancelled, CANCELLED_WHILE_RUNNING), else_=None),
    )
    recorded = insert(attempts).from_select(list(ATTEMPT_FIELDS[:7]), rows).cte("recorded")
    stmt = select(*(completed.c[c.name] for c in COMPLETE_RETURNS)).add_cte(recorded)
    order = ["now", "worker", "ids", "attempts", "started", *(["results"] if with_result else [])]
    arrays = [jobs.c.id.label("ids"), jobs.c.attempt.label("attempts"), *carried]
    return Prepared(stmt, order, encoders=_encoders(order, arrays))


@lru_cache(maxsize=2)
def attempt(with_error: bool = True) -> Prepared:
    """One finished attempt's row. Values: ``ATTEMPT_FIELDS``, without the
    error and traceback for a completion (fewer values to bind per row)."""
    fields = ATTEMPT_FIELDS if with_error else ATTEMPT_FIELDS[:6]
    stmt = insert(attempts).values({f: bindparam(f, type_=attempts.c[f].type) for f in fields})
    columns = [attempts.c[f] for f in fields]
    rows = _unnest("a", columns)
    as_set = insert(attempts).from_select(list(fields), select(*(rows.c[f] for f in fields)))
    return Prepared(stmt, fields, as_set=Prepared(as_set, fields, encoders=_encoders(fields, columns)))


FAIL_FIELDS = ("job", "job_attempt", "worker", "now", "retry_at", "why", "fingerprint")


def _held_attempt(transition: Transition) -> tuple[Any, ...]:
    """The fence of a worker's report on one attempt: this job, at this
    attempt, held by this worker, in a source state of ``transition``.
    Values: job, job_attempt, worker."""
    return (
        jobs.c.id == bindparam("job"),
        jobs.c.attempt == bindparam("job_attempt"),
        jobs.c.worker_id == bindparam("worker"),
        in_states(transition),
    )


@lru_cache(maxsize=2)
def fail(retryable: bool) -> Prepared:
    """running -> failed (retry_count + 1, due at ``retry_at``) while retries
    are left, else -> dead. A non-retryable error goes to dead whatever the
    budget; a job cancelled while it ran goes to cancelled, never retried.
    Fenced by (id, attempt, worker). Values: ``FAIL_FIELDS``."""
    ended = _cancelled_or(State.DEAD)
    if retryable:
        left = and_(jobs.c.retry_count < jobs.c.max_retries, ~cancel_requested())
        values: dict[str, Any] = {
            "status": case((left, State.FAILED.value), else_=ended),
            "retry_count": case((left, jobs.c.retry_count + 1), else_=jobs.c.retry_count),
            "available_at": case(
                (left, bindparam("retry_at", type_=jobs.c.available_at.type)), else_=jobs.c.available_at
            ),
            "finished_at": case((left, None), else_=NOW),
        }
    else:
        values = {"status": ended, "finished_at": NOW}
    values.update(error=bindparam("why"), updated_at=NOW)
    values["error_fingerprint"] = bindparam("fingerprint")  # the errors view's group (jobdeck.core.fingerprint)
    stmt = update(jobs).where(*_held_attempt(Transition.FAIL)).values(values).returning(*JOB_COLUMNS)
    order = FAIL_FIELDS if retryable else tuple(f for f in FAIL_FIELDS if f != "retry_at")
    return Prepared(stmt, order)


def current(lock: bool) -> Select[Any]:
    """What the fail rule and the HTTP worker's checks read first (``ids``, expanding)."""
    stmt = select(
        jobs.c.id, jobs.c.type, jobs.c.status, jobs.c.attempt, jobs.c.worker_id,
        jobs.c.retry_count, jobs.c.max_retries, jobs.c.claimed_at, jobs.c.heartbeat_at,
    ).where(jobs.c.id.in_(bindparam("ids", expanding=True)))  # fmt: skip
    return stmt.with_for_update() if lock else stmt


def stalled(cutoff: Any, limit: int) -> Select[Any]:
    """The rescue's pick: running jobs with an old heartbeat held by no worker
    still heart-beating, those another transaction holds skipped."""
    live_worker = select(workers.c.id).where(workers.c.id == jobs.c.worker_id, workers.c.heartbeat_at >= cutoff)
    return (
        select(jobs.c.id, jobs.c.worker_id, jobs.c.attempt, jobs.c.heartbeat_at)
        .where(in_states(Transition.RESCUE), jobs.c.heartbeat_at < cutoff, ~live_worker.exists())
        .limit(limit)
        .with_for_update(of=jobs, skip_locked=True)
    )


# -- while running ---------------------------------------------------------------


def heartbeat() -> Any:
    """One job's heartbeat (the HTTP worker's). Values: job, worker, now."""
    return (
        update(jobs)
        .where(jobs.c.id == bindparam("job"), jobs.c.worker_id == bindparam("worker"), in_states(Transition.HEARTBEAT))
        .values(heartbeat_at=NOW, updated_at=NOW)
        .returning(*JOB_COLUMNS)
    )


def _among(picked: Any, dialect: str) -> ColumnElement[bool]:
    """The job is one of the ids ``picked`` selects. PostgreSQL takes them
    as one array computed once, so the update reaches each row by its
    primary key: given ``id IN (subquery)`` on an analyzed table its planner
    hash-joined the ids against a scan of the whole table."""
    return jobs.c.id == any_(func.array(picked)) if dialect == "postgresql" else jobs.c.id.in_(picked)


@lru_cache(maxsize=2)
def heartbeat_held(dialect: str) -> Any:
    """Every job a worker holds; rows another transaction holds (an ack
    finishing them) are skipped, not waited for: waiting deadlocked with an
    ack batch locking the same rows in another order. Returns (id,
    cancel_requested_at, attempt): how other processes' cancels reach the pool (not
    ``IS NOT NULL``: SQLite's RETURNING answered it true for NULL).
    Values: worker, now."""
    held = select(jobs.c.id).where(jobs.c.worker_id == bindparam("worker"), in_states(Transition.HEARTBEAT))
    return (
        update(jobs)
        .where(_among(held.with_for_update(skip_locked=True).scalar_subquery(), dialect))
        .values(heartbeat_at=NOW)
        .returning(jobs.c.id, jobs.c.cancel_requested_at, jobs.c.attempt)
    )


def heartbeat_worker() -> Any:
    return update(workers).where(workers.c.id == bindparam("worker")).values(heartbeat_at=NOW)


def set_progress() -> Any:
    """Values: job, job_attempt, worker, to_progress, message, now."""
    return (
        update(jobs)
        .where(*_held_attempt(Transition.HEARTBEAT))
        .values(
            progress=bindparam("to_progress"), progress_message=bindparam("message"), heartbeat_at=NOW, updated_at=NOW
        )
    )


_HOLDER = ("worker_id", "claimed_at", "heartbeat_at", "progress", "progress_message")
"""What a released job forgets of the worker that held it."""


@lru_cache(maxsize=256)
def release(n: int) -> Prepared:
    """running -> pending for ``n`` fenced (id, attempt) pairs, no attempt
    counted (graceful shutdown); a job cancelled meanwhile goes to cancelled
    instead. Returns (id, status, workflow_id, batch_id, attempt). Values: now, worker, *(id, attempt)."""
    ended = {"status": _cancelled_or(State.PENDING), "finished_at": case((cancel_requested(), NOW), else_=None)}
    stmts = [
        update(jobs)
        .where(_fenced(n, Transition.RELEASE, by_rowid))
        .values(**ended, updated_at=NOW, **dict.fromkeys(_HOLDER))
        .returning(jobs.c.id, jobs.c.status, *GROUPS, jobs.c.attempt)
        for by_rowid in (False, True)
    ]
    return Prepared(stmts[0], ["now", "worker", *_pairs(n)], stmts[1])


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
        .where(*_held_attempt(Transition.SNOOZE))
        .values(
            status=_cancelled_or(State.PENDING),
            available_at=case((cancel_requested(), jobs.c.available_at), else_=until),
            finished_at=case((cancel_requested(), NOW), else_=None),
            updated_at=NOW,
            **dict.fromkeys(_HOLDER),
        )
        .returning(jobs.c.id, jobs.c.status, *GROUPS)
    )
    return Prepared(stmt, SNOOZE_FIELDS)


SNOOZED_ATTEMPT_FIELDS = (*ATTEMPT_FIELDS[:7], "snooze_seconds")


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
