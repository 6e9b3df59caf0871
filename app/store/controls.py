"""The queue controls' SQL: paused queues, running counts and the
limit-aware claim (the policy itself lives in ``app.queues``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from app.states import State
from app.store import postgres, statements
from app.store.lifecycle import Store
from app.store.models import jobs, queue_state
from app.store.records import JobRecord

Pick = Callable[[list[Any]], list[int]]
"""Given due (id, type, queue) rows in claim order, the ids to claim."""


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


def _running(conn: Connection, column: Any, names: Iterable[str]) -> dict[str, int]:
    stmt = select(column, func.count()).where(statements.running(), column.in_(list(names))).group_by(column)
    return {name: n for name, n in conn.execute(stmt)}


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
    the rest of the batch, and the picked ids are claimed (``claim_ids``)."""
    type_list = None if types is None else list(types)
    queue_list = None if queues is None else list(queues)
    with store.write() as conn:
        if store.dialect == "postgresql":
            conn.execute(postgres.lock_limited_claims())
        running_t = _running(conn, jobs.c.type, limited_types) if limited_types else {}
        running_q = _running(conn, jobs.c.queue, limited_queues) if limited_queues else {}
        full_t, skip_q, pick = decide(running_t, running_q)
        stmt = statements.due(
            None if type_list is None else len(type_list),
            None if queue_list is None else len(queue_list),
            len(skip_q),
            columns=(jobs.c.id, jobs.c.type, jobs.c.queue),
        )
        if full_t:  # named apart from the due list's type_N binds, which an anonymous bind would collide with
            stmt = stmt.where(jobs.c.type.not_in(bindparam("full_types", expanding=True)))
        values = statements.due_order(
            None if type_list is None else len(type_list), None if queue_list is None else len(queue_list), len(skip_q)
        )
        params = dict(zip(values, (now, *(type_list or ()), *(queue_list or ()), *skip_q), strict=True))
        if full_t:
            params["full_types"] = full_t
        chosen = pick(list(conn.execute(stmt.limit(limit * 4 + 16), params)))
        if not chosen:
            return []
        return store.claim_ids(conn, worker_id, now, chosen)
