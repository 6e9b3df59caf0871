"""The claim's statements (``jobdeck.store.statements`` holds what every
statement shares): pending|failed (due) -> running, by the claim order or
for given ids, and what a claim stamps on the rows it takes.

The claim is the one statement where the dialects differ, and only in the
hints each ignores: ``FOR UPDATE SKIP LOCKED`` (PostgreSQL; SQLite's single
writer already excludes other claimers inside ``BEGIN IMMEDIATE``) and
``INDEXED BY ix_jobs_claim`` (SQLite, whose planner without statistics
prefers the type index and sorts every due job on every claim).

On SQLite the due reads also name the priorities the claimable jobs hold
(``PRIORITIES``, ``claimable_priorities``). The claim index orders each
priority's jobs by ``available_at``, so a priority's due jobs come first,
then its jobs scheduled for later. Walked in claim order, a read that found
fewer due jobs than its limit went on through every scheduled job: 8 ms a
claim over 100,000 jobs due in an hour, and so on every claim, poll and
commit-watcher probe of a deployment holding them. With the priorities
named, SQLite seeks each one's due range and stops where its scheduled
jobs begin, in the same order, without a sort.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from jobdeck.core.states import State
from jobdeck.store.models import CLAIMABLE_STATES, flow_starts, jobs
from jobdeck.store.postgres import array_encoder, array_param
from jobdeck.store.sqlite import Prepared
from jobdeck.store.statements import CLAIM_COLUMNS, CLAIM_SETS, NOW, binds, claimable, names
from sqlalchemy import BigInteger, Integer, String, any_, bindparam, case, func, insert, or_, select, update
from sqlalchemy.sql.elements import ColumnElement


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


PRIORITY_SPREAD = 32
"""At most this many priorities among the claimable jobs are named in a
SQLite due read (``claimable_priorities``); with more, the read walks the
claim index as before (naming each priority costs a seek of the index)."""

PRIORITIES = (
    "WITH RECURSIVE held(p) AS ("
    "SELECT (SELECT max(priority) FROM jobs INDEXED BY ix_jobs_claim WHERE {held}) "
    "UNION ALL SELECT (SELECT max(priority) FROM jobs INDEXED BY ix_jobs_claim WHERE {held} AND priority < held.p) "
    "FROM held WHERE held.p IS NOT NULL LIMIT {most}"
    ") SELECT p FROM held WHERE p IS NOT NULL"
).format(held=f"status IN ({', '.join(repr(s) for s in CLAIMABLE_STATES)})", most=PRIORITY_SPREAD + 1)
"""SQLite: the distinct priorities of the claimable jobs (pending or
failed, due or not), highest first, up to ``PRIORITY_SPREAD`` + 1: one
seek of the claim index each (a skip scan), not a read of its entries.
Its predicate is the claim index's own, so SQLite may use that index."""


def claimable_priorities(cursor: Any) -> list[int] | None:
    """SQLite, on ``cursor`` (a raw ``sqlite3`` cursor, in the caller's
    transaction): the priorities a due read names (``due``'s
    ``n_priorities``), highest first; ``[]`` when no job is claimable at
    all, None when they are more than ``PRIORITY_SPREAD``."""
    held = [row[0] for row in cursor.execute(PRIORITIES).fetchall()]
    return None if len(held) > PRIORITY_SPREAD else held


def due(
    n_types: int | None,
    n_queues: int | None,
    n_excluded: int,
    *,
    columns: Sequence[Any] = (jobs.c.id,),
    lock: bool = True,
    n_priorities: int | None = None,
) -> Any:
    """Due jobs in claim order (priority DESC, available_at, id); with
    ``lock``, those another claimer holds are skipped. Values: now, *types,
    *queues, *excluded queues, and with ``n_priorities`` (SQLite) that many
    priorities, the only ones read (``claimable_priorities``)."""
    stmt = select(*columns).with_hint(jobs, "INDEXED BY ix_jobs_claim", "sqlite").where(claimable())
    if n_types is not None:
        stmt = stmt.where(jobs.c.type.in_(binds("type_", n_types)))
    if n_queues is not None:
        stmt = stmt.where(jobs.c.queue.in_(binds("queue_", n_queues)))
    if n_excluded:
        stmt = stmt.where(jobs.c.queue.not_in(binds("skip_", n_excluded)))
    if n_priorities:
        stmt = stmt.where(jobs.c.priority.in_(binds("priority_", n_priorities, Integer())))
    stmt = stmt.order_by(jobs.c.priority.desc(), jobs.c.available_at, jobs.c.id)
    return stmt.with_for_update(skip_locked=True) if lock else stmt


def due_order(n_types: int | None, n_queues: int | None, n_excluded: int, n_priorities: int | None = None) -> list[str]:
    return [
        "now", *names("type_", n_types), *names("queue_", n_queues), *names("skip_", n_excluded),
        *names("priority_", n_priorities),
    ]  # fmt: skip


@lru_cache(maxsize=512)
def due_picks(
    columns: tuple[Any, ...],
    n_types: int | None,
    n_queues: int | None,
    n_excluded: int,
    n_full: int,
    n_priorities: int | None = None,
) -> Prepared:
    """What a claim policy picks its ids from: ``columns`` of the due jobs in
    claim order, but for ``n_full`` types at their limit, up to a bound
    limit. Values: now, *types, *queues, *excluded queues, *priorities
    (SQLite: ``n_priorities``, see ``due``), *full types, limit."""
    stmt = due(n_types, n_queues, n_excluded, columns=columns, n_priorities=n_priorities)
    if n_full:  # named apart from the due list's type_N binds, which an anonymous bind would collide with
        stmt = stmt.where(jobs.c.type.not_in(binds("full_", n_full)))
    stmt = stmt.limit(bindparam("limit", type_=Integer))
    order = [*due_order(n_types, n_queues, n_excluded, n_priorities), *names("full_", n_full), "limit"]
    return Prepared(stmt, order)


@lru_cache(maxsize=256)
def claim(
    n_types: int | None,
    n_queues: int | None,
    n_excluded: int,
    voidable: bool = False,
    n_priorities: int | None = None,
    n_unless: tuple[int, int] = (0, 0),
) -> Prepared:
    """pending|failed (due) -> running, up to ``limit`` jobs in one statement.
    Values: worker, now, *types, *queues, *excluded queues, *priorities
    (SQLite: ``n_priorities``, see ``due``), limit, then ``n_unless``'s
    types and queues, and with ``voidable`` (PostgreSQL only) void_at
    (``_claimed_values``). The dialects differ in how the update finds the
    picked rows (``among``).

    With ``n_unless`` (PostgreSQL only: a number of types, a number of
    queues) the statement takes the picked jobs only if none of them is of
    one of those types or in one of those queues, and else none: the claim
    of a policy whose limits the last claims did not meet
    (``jobdeck.store.controls.claim_due``). What it takes is then exactly
    what the limit-aware claim would take, without its lock and counts."""
    if any(n_unless):
        return _claim_unless(n_types, n_queues, n_excluded, voidable, n_unless)
    picked = (
        due(n_types, n_queues, n_excluded, n_priorities=n_priorities)
        .limit(bindparam("limit", type_=Integer))
        .scalar_subquery()
    )
    stmts = [
        update(jobs).where(among(picked, dialect)).values(_claimed_values(voidable)).returning(*CLAIM_COLUMNS)
        for dialect in ("postgresql", "sqlite")
    ]
    order = [
        "worker", *due_order(n_types, n_queues, n_excluded, n_priorities), "limit", *(["void_at"] if voidable else [])
    ]  # fmt: skip
    return Prepared(stmts[0], order, stmts[1])


HEAD_DEPTH = 2
"""How far past its ``limit`` the quiet claim reads the head of the line
(``_claim_unless``): the head's first ``limit`` jobs are mostly another
claimer's while two processes claim at once, and with a head of ``limit``
the second found all of it held and fell back to the limit-aware claim."""


def _claim_unless(
    n_types: int | None, n_queues: int | None, n_excluded: int, voidable: bool, n_unless: tuple[int, int]
) -> Prepared:
    """``claim`` with ``n_unless`` (PostgreSQL). The head of the line (the
    first ``HEAD_DEPTH`` x ``limit`` due jobs in claim order, those other
    claimers hold included) is read without a lock; when none of them is
    of a refused type or queue, the first ``limit`` of the head's jobs no
    other claimer holds are locked (``SKIP LOCKED``) and claimed, and else
    nothing is read further, nor locked. A refusing claim never locks the
    job it refuses: had it, a claim running beside it would skip that job
    and take the ones behind it. Nor does it reach past the head: a job
    behind the head is never taken before one in it, even when other
    claimers hold part of it."""
    head = (
        due(n_types, n_queues, n_excluded, columns=(jobs.c.id, jobs.c.type, jobs.c.queue), lock=False)
        .limit(bindparam("limit", type_=Integer) * HEAD_DEPTH)
        .cte("head")
    )
    n_refused_types, n_refused_queues = n_unless
    refused = [
        *([head.c.type.in_(binds("unless_type_", n_refused_types))] if n_refused_types else []),
        *([head.c.queue.in_(binds("unless_queue_", n_refused_queues))] if n_refused_queues else []),
    ]
    free = (
        select(jobs.c.id)
        .where(jobs.c.id == any_(func.array(select(head.c.id).scalar_subquery())), claimable())
        .order_by(jobs.c.priority.desc(), jobs.c.available_at, jobs.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    stmt = (
        update(jobs)
        .where(~select(head.c.id).where(or_(*refused)).exists(), jobs.c.id == any_(func.array(free.scalar_subquery())))
        .values(_claimed_values(voidable))
        .returning(*CLAIM_COLUMNS)
    )
    order = [
        "worker", *due_order(n_types, n_queues, n_excluded), "limit", *names("unless_type_", n_refused_types),
        *names("unless_queue_", n_refused_queues), *(["void_at"] if voidable else []),
    ]  # fmt: skip
    return Prepared(stmt, order)


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
    return Prepared(_claim_id_array(voidable), order, encoders=_encoders(order))


def _claim_id_array(voidable: bool) -> Any:
    return (
        update(jobs)
        .where(jobs.c.id == any_(array_param("ids", ARRAYS["ids"])), claimable())
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
        func.unnest(*(array_param(name, ARRAYS[name]) for name in ("start_ids", "start_limits", "start_keys")))
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
    return Prepared(stmt, order, encoders=_encoders(order))


ARRAYS = {"ids": BigInteger(), "start_ids": BigInteger(), "start_limits": String(), "start_keys": String()}
"""The claims' values that travel as arrays, and their elements' types."""


def _encoders(order: Sequence[str]) -> list[Any]:
    """For each value in ``order``: its array's encoder (``postgres.array_encoder``), or None for a scalar."""
    return [array_encoder(ARRAYS[name]) if name in ARRAYS else None for name in order]


def among(picked: Any, dialect: str) -> ColumnElement[bool]:
    """The job is one of the ids ``picked`` selects. PostgreSQL takes them
    as one array computed once, so the update reaches each row by its
    primary key: given ``id IN (subquery)`` on an analyzed table its planner
    hash-joined the ids against a scan of the whole table."""
    return jobs.c.id == any_(func.array(picked)) if dialect == "postgresql" else jobs.c.id.in_(picked)
