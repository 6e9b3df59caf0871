"""The statements of a held attempt: its ends (complete, fail, release,
the rescue's reads; snooze's are in ``jobdeck.store.snooze_statements``) and what it does while it runs (heartbeats,
progress). Each is fenced by the (id, attempt, worker) that holds the job
and by the transition's source states (``jobdeck.store.statements.in_states``);
a job cancelled while it ran ends ``cancelled`` whichever way its attempt
ends, decided in the same statement."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from jobdeck.core.states import AttemptOutcome, State, Transition
from jobdeck.store import postgres
from jobdeck.store.claim_statements import among, on_time
from jobdeck.store.models import attempts, jobs, workers
from jobdeck.store.postgres import array_param
from jobdeck.store.sqlite import Prepared
from jobdeck.store.statements import GROUPS, JOB_COLUMNS, NOW, binds, in_states
from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    func,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

# -- ending an attempt ------------------------------------------------------------


def cancel_requested() -> ColumnElement[bool]:
    """A person cancelled the job while it ran: however its attempt ends,
    the job ends ``cancelled`` (each finishing statement decides it with a
    CASE on this, in the same statement)."""
    return jobs.c.cancel_requested_at.is_not(None)


def cancelled_or(state: State) -> Any:
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
    arrays = [array_param(c.name, c.type) for c in columns]
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
        "status": cancelled_or(State.COMPLETED),
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
    Values: now, worker, ids, attempts, started, [results], executor."""
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
        bindparam("executor", type_=attempts.c.executor.type),
    )
    recorded = insert(attempts).from_select([*ATTEMPT_FIELDS[:7], "executor"], rows).cte("recorded")
    stmt = select(*(completed.c[c.name] for c in COMPLETE_RETURNS)).add_cte(recorded)
    order = ["now", "worker", "ids", "attempts", "started", *(["results"] if with_result else []), "executor"]
    arrays = [jobs.c.id.label("ids"), jobs.c.attempt.label("attempts"), *carried]
    return Prepared(stmt, order, encoders=_encoders(order, arrays))


@lru_cache(maxsize=2)
def attempt(with_error: bool = True) -> Prepared:
    """One finished attempt's row. Values: ``ATTEMPT_FIELDS``, without the
    error and traceback for a completion (fewer values to bind per row), then the executor."""
    fields = (*(ATTEMPT_FIELDS if with_error else ATTEMPT_FIELDS[:6]), "executor")
    stmt = insert(attempts).values({f: bindparam(f, type_=attempts.c[f].type) for f in fields})
    columns = [attempts.c[f] for f in fields]
    rows = _unnest("a", columns)
    as_set = insert(attempts).from_select(list(fields), select(*(rows.c[f] for f in fields)))
    return Prepared(stmt, fields, as_set=Prepared(as_set, fields, encoders=_encoders(fields, columns)))


FAIL_FIELDS = ("job", "job_attempt", "worker", "now", "retry_at", "why", "fingerprint")


def held_attempt(transition: Transition) -> tuple[Any, ...]:
    """The fence of a worker's report on one attempt: this job, at this
    attempt, held by this worker, in a source state of ``transition``.
    Values: job, job_attempt, worker."""
    return (
        jobs.c.id == bindparam("job"),
        jobs.c.attempt == bindparam("job_attempt"),
        jobs.c.worker_id == bindparam("worker"),
        in_states(transition),
    )


def _failed(retryable: bool, given: Any) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """What a failure writes, and its fence, once for both of its statements:
    ``given`` holds the values by ``FAIL_FIELDS``' names (bound parameters,
    or the columns of the set a batch is unnested into)."""
    ended = cancelled_or(State.DEAD)
    if retryable:
        left = and_(jobs.c.retry_count < jobs.c.max_retries, ~cancel_requested())
        values: dict[str, Any] = {
            "status": case((left, State.FAILED.value), else_=ended),
            "retry_count": case((left, jobs.c.retry_count + 1), else_=jobs.c.retry_count),
            "available_at": case((left, given["retry_at"]), else_=jobs.c.available_at),
            "finished_at": case((left, None), else_=NOW),
        }
    else:
        values = {"status": ended, "finished_at": NOW}
    values.update(error=given["why"], updated_at=NOW)
    values["error_fingerprint"] = given["fingerprint"]  # the errors view's group (jobdeck.core.fingerprint)
    same_error = and_(jobs.c.error_fingerprint == given["fingerprint"], jobs.c.error_since.is_not(None))
    values["error_since"] = case((same_error, jobs.c.error_since), else_=NOW)  # kept across retries
    fence = (
        jobs.c.id == given["job"],
        jobs.c.attempt == given["job_attempt"],
        jobs.c.worker_id == given["worker"],
        in_states(Transition.FAIL),
    )
    return values, fence


@lru_cache(maxsize=2)
def fail(retryable: bool) -> Prepared:
    """running -> failed (retry_count + 1, due at ``retry_at``) while retries
    are left, else -> dead. A non-retryable error goes to dead whatever the
    budget; a job cancelled while it ran goes to cancelled, never retried.
    The error's fingerprint is stored, and ``error_since`` kept while it
    stays the same (set to now when it changes), so a group's "First seen"
    survives its retries. Fenced by (id, attempt, worker). Values: ``FAIL_FIELDS``."""
    given = {"retry_at": bindparam("retry_at", type_=jobs.c.available_at.type)}
    given |= {f: bindparam(f) for f in ("job", "job_attempt", "worker", "why", "fingerprint")}
    values, fence = _failed(retryable, given)
    stmt = update(jobs).where(*fence).values(values).returning(*JOB_COLUMNS)
    return Prepared(stmt, _fail_order(retryable))


def _fail_order(retryable: bool) -> tuple[str, ...]:
    return FAIL_FIELDS if retryable else tuple(f for f in FAIL_FIELDS if f != "retry_at")


FAIL_SET_COLUMNS = {
    "job": jobs.c.id,
    "job_attempt": jobs.c.attempt,
    "worker": jobs.c.worker_id,
    "retry_at": jobs.c.available_at,
    "why": jobs.c.error,
    "fingerprint": jobs.c.error_fingerprint,
}


@lru_cache(maxsize=2)
def fail_set(retryable: bool) -> Prepared:
    """``fail`` for PostgreSQL's batches: every value but ``now`` as an
    array, one element per failure, unnested into rows: a batch of failures
    is one UPDATE (one round trip) where one per job took one each. Each
    job appears once in a batch (``Finishing.fail_many``). Values: ``FAIL_FIELDS``."""
    order = _fail_order(retryable)
    columns = [FAIL_SET_COLUMNS[f].label(f) for f in order if f != "now"]
    given = _unnest("failing", columns)
    values, fence = _failed(retryable, given.c)
    stmt = update(jobs).where(*fence).values(values).returning(*JOB_COLUMNS)
    return Prepared(stmt, order, encoders=_encoders(order, columns))


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


def heartbeat(voidable: bool = False) -> Any:
    """One job's heartbeat (the HTTP worker's). Values: job, worker, now,
    and with ``voidable`` void_at (``claim_statements.on_time``): an HTTP worker has no row
    of its own, so its jobs are judged by this heartbeat alone."""
    return (
        update(jobs)
        .where(jobs.c.id == bindparam("job"), jobs.c.worker_id == bindparam("worker"), in_states(Transition.HEARTBEAT))
        .values(heartbeat_at=on_time(jobs.c.heartbeat_at) if voidable else NOW, updated_at=NOW)
        .returning(*JOB_COLUMNS)
    )


@lru_cache(maxsize=4)
def heartbeat_held(dialect: str, voidable: bool = False) -> Any:
    """Every job a worker holds; rows another transaction holds (an ack
    finishing them) are skipped, not waited for: waiting deadlocked with an
    ack batch locking the same rows in another order. Returns (id,
    cancel_requested_at, attempt): how other processes' cancels reach the pool (not
    ``IS NOT NULL``: SQLite's RETURNING answered it true for NULL).
    Values: worker, now, and with ``voidable`` void_at (``claim_statements.on_time``)."""
    held = select(jobs.c.id).where(jobs.c.worker_id == bindparam("worker"), in_states(Transition.HEARTBEAT))
    return (
        update(jobs)
        .where(among(held.with_for_update(skip_locked=True).scalar_subquery(), dialect))
        .values(heartbeat_at=on_time(jobs.c.heartbeat_at) if voidable else NOW)
        .returning(jobs.c.id, jobs.c.cancel_requested_at, jobs.c.attempt)
    )


def heartbeat_worker(voidable: bool = False) -> Any:
    heartbeat_at = on_time(workers.c.heartbeat_at) if voidable else NOW
    return update(workers).where(workers.c.id == bindparam("worker")).values(heartbeat_at=heartbeat_at)


def set_progress() -> Any:
    """Values: job, job_attempt, worker, to_progress, message, now."""
    return (
        update(jobs)
        .where(*held_attempt(Transition.HEARTBEAT))
        .values(
            progress=bindparam("to_progress"), progress_message=bindparam("message"), heartbeat_at=NOW, updated_at=NOW
        )
    )


HOLDER = ("worker_id", "claimed_at", "heartbeat_at", "progress", "progress_message")
"""What a released job forgets of the worker that held it."""


@lru_cache(maxsize=256)
def release(n: int) -> Prepared:
    """running -> pending for ``n`` fenced (id, attempt) pairs, no attempt
    counted (graceful shutdown); a job cancelled meanwhile goes to cancelled
    instead. Returns (id, status, workflow_id, batch_id, attempt). Values: now, worker, *(id, attempt)."""
    ended = {"status": cancelled_or(State.PENDING), "finished_at": case((cancel_requested(), NOW), else_=None)}
    stmts = [
        update(jobs)
        .where(_fenced(n, Transition.RELEASE, by_rowid))
        .values(**ended, updated_at=NOW, **dict.fromkeys(HOLDER))
        .returning(jobs.c.id, jobs.c.status, *GROUPS, jobs.c.attempt)
        for by_rowid in (False, True)
    ]
    return Prepared(stmts[0], ["now", "worker", *_pairs(n)], stmts[1])
