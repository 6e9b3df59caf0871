"""The queue controls' SQL: paused queues, running counts and the
limit-aware claim (the policy itself lives in ``jobdeck.jobs.queues``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from functools import lru_cache
from typing import Any

from jobdeck.core.states import State
from jobdeck.store import postgres, statements
from jobdeck.store.lifecycle import Store
from jobdeck.store.models import jobs, queue_state
from jobdeck.store.records import JobRecord
from jobdeck.store.sqlite import Prepared, translated_errors
from sqlalchemy import func, select

DUE_COLUMNS = (jobs.c.id, jobs.c.type, jobs.c.queue)

Pick = Callable[[list[Any]], list[int]]
"""Given due (id, type, queue) rows (tuples) in claim order, the ids to claim."""


def paused_queues(store: Store) -> frozenset[str]:
    with store.read() as conn:
        return frozenset(conn.execute(select(queue_state.c.name).where(queue_state.c.paused)).scalars())


def set_paused(store: Store, name: str, paused: bool, now: datetime) -> None:
    stmt = statements.dialect_insert(store.dialect)(queue_state).values(name=name, paused=paused, updated_at=now)
    stmt = stmt.on_conflict_do_update(index_elements=["name"], set_={"paused": paused, "updated_at": now})
    with store.write() as conn:
        conn.execute(stmt)


def queue_counts(store: Store) -> tuple[dict[str, dict[str, int]], dict[str, bool]]:
    """Jobs waiting (pending, failed) or running per queue and state, and
    every queue's paused flag."""
    active = [State.PENDING.value, State.FAILED.value, State.RUNNING.value]
    counts: dict[str, dict[str, int]] = {}
    with store.read() as conn:
        for queue, status, n in conn.execute(
            select(jobs.c.queue, jobs.c.status, func.count()).where(jobs.c.status.in_(active))
            .group_by(jobs.c.queue, jobs.c.status)
        ):  # fmt: skip
            counts.setdefault(queue, {})[status] = n
        paused = {name: bool(p) for name, p in conn.execute(select(queue_state.c.name, queue_state.c.paused))}
    return counts, paused


@lru_cache(maxsize=64)
def _running(column: str, n: int) -> Prepared:
    """Running jobs of each of ``n`` values of ``column`` (type or queue). Values: the names."""
    col = jobs.c[column]
    stmt = select(col, func.count()).where(statements.running(), col.in_(statements.binds("name_", n))).group_by(col)
    return Prepared(stmt, statements.names("name_", n))


def claim_due(
    store: Store,
    worker_id: str,
    now: datetime,
    *,
    limit: int,
    types: Iterable[str] | None,
    queues: Iterable[str] | None,
    limited_types: Iterable[str],
    limited_queues: Iterable[str],
    decide: Callable[[dict[str, int], dict[str, int]], tuple[list[str], list[str], Pick]],
) -> list[JobRecord]:
    """The limit-aware claim, in one write transaction no other limited
    claim interleaves with (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an
    advisory lock taken first). ``decide`` gets the running counts of the
    limited types and queues and answers (full types, queues to skip, how to
    pick); the due jobs are read with the claim's own predicate, a little
    past ``limit`` so a limited type at the head of the line does not starve
    the rest of the batch, and the picked ids are claimed (``claim_ids``).
    Every statement runs at driver level, compiled once per shape: built
    and run through Core, the reads cost a claim of one job 630 us against
    the plain claim's 140, and a deployment with any limit pays that on
    every claim. On SQLite the plain claim is tried first, and kept when it
    took no job over a limit (``_claim_unless_over``)."""
    type_list = None if types is None else list(types)
    queue_list = None if queues is None else list(queues)
    n_types = None if type_list is None else len(type_list)
    n_queues = None if queue_list is None else len(queue_list)
    with store.write() as conn:
        if store.dialect == "postgresql":
            conn.execute(postgres.lock_limited_claims())
        running = []
        for column, names in (("type", list(limited_types)), ("queue", list(limited_queues))):
            rows = store.driver_rows(conn, _running(column, len(names)), tuple(names)) if names else []
            running.append({name: int(n) for name, n in rows})
        full_t, skip_q, pick = decide(*running)
        if store.sqlite and (type_list is not None or not full_t):
            claimed = _claim_unless_over(
                store, conn, worker_id, now, limit, type_list, queue_list, full_t, skip_q, pick
            )
            if claimed is not None:
                return claimed
            full_t, skip_q, pick = decide(*running)  # a fresh pick: the tried one counted the rolled-back jobs
        values = (store.stored_time(now), *(type_list or ()), *(queue_list or ()), *skip_q, *full_t, limit * 4 + 16)
        due = statements.due_picks(DUE_COLUMNS, n_types, n_queues, len(skip_q), len(full_t))
        chosen = pick(store.driver_rows(conn, due, values))
        if not chosen:
            return []
        return store.claim_ids(conn, worker_id, now, chosen)


def _claim_unless_over(
    store: Store,
    conn: Any,
    worker_id: str,
    now: datetime,
    limit: int,
    types: list[str] | None,
    queues: list[str] | None,
    full_types: list[str],
    skip_queues: list[str],
    pick: Pick,
) -> list[JobRecord] | None:
    """SQLite: the plain claim (one statement), but for the full types and
    the queues to skip, under a savepoint; kept if ``pick`` would have chosen
    every job it claimed (none over a limit: then they are the same jobs the
    picked claim takes, the first due in claim order), else rolled back and
    None. Most claims of a deployment with a limit take no limited job over
    what is left: the due read of ``limit * 4 + 16`` rows, the pick and the
    claim of ids cost the demo's 100,000 no-op jobs (one type limited) about
    a tenth of the drain's CPU (docs/performance.md). Not on PostgreSQL,
    where the savepoint costs two round trips more."""
    if types is not None:
        types = [t for t in types if t not in full_types]
        if not types:
            return []
    with translated_errors():
        cursor = conn.connection.cursor()
        cursor.execute("SAVEPOINT jobdeck_claim")
    # An error in the claim ends the whole transaction (``write()`` rolls it back).
    claimed = store.claim_in(conn, worker_id, now, limit, types, queues, skip_queues)
    kept = len(pick([(j.id, j.type, j.queue) for j in claimed])) == len(claimed)
    with translated_errors():
        if not kept:
            cursor.execute("ROLLBACK TO jobdeck_claim")
        cursor.execute("RELEASE jobdeck_claim")
    return claimed if kept else None
