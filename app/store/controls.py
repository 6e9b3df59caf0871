"""The queue controls' SQL: paused queues, running counts and the
limit-aware claim (the policy itself lives in ``jobdeck.jobs.queues``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from jobdeck.core.states import State
from jobdeck.store import claim_statements, postgres, statements
from jobdeck.store.claim import _in_claim_order
from jobdeck.store.flow_pipelined import driver_connection, driver_errors, send, send_first
from jobdeck.store.lifecycle import Store
from jobdeck.store.models import jobs, queue_state
from jobdeck.store.records import JobRecord, claimed_records
from jobdeck.store.sqlite import Prepared, translated_errors
from jobdeck.store.timekeeping import after_waiting
from sqlalchemy import func, select

DUE_COLUMNS = (jobs.c.id, jobs.c.type, jobs.c.queue)

Pick = Callable[[list[Any]], list[int]]
"""Given due (id, type, queue) rows (tuples) in claim order, the ids to claim."""
Decide = Callable[[dict[str, int], dict[str, int]], tuple[list[str], list[str], Pick]]
"""Given the running counts of the limited types and queues: (the full
types, the queues to skip, how to pick)."""


class Blocked:
    """What the last limited claim found: the full types and the queues it
    skipped (``value``, sorted), and whether it took a job of a limited type
    or queue (``took_limited``). PostgreSQL's claim sends its plain claim
    with the counts, excluding what ``value`` names (``_Claim.pipelined``);
    SQLite's claims without counting while the claims take no limited job
    (``quiet``); and while the claims are quiet no limit holds one back, so
    a pool claims as if none were configured (``QueueControls.holding_back``).
    Mostly none of it has changed since. One per policy, shared by its
    threads: a stale answer costs a statement or a cycle, never a wrong claim."""

    def __init__(self) -> None:
        self.value: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        self.took_limited = True

    def quiet(self, paused: frozenset[str]) -> bool:
        """The last claim took no limited job, and found none full: it skipped the paused queues alone."""
        return not self.took_limited and self.value == found([], list(paused))


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
    decide: Decide,
    blocked: Blocked | None = None,
    paused: frozenset[str] = frozenset(),
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
    took no job over a limit (``_Claim.unless_over``); while the claims take
    no limited job (``Blocked.quiet``), before the counts, and kept when it
    takes none (the counts read every running job: hundreds, each claim of a
    drain). On PostgreSQL, with ``blocked``, it goes in one pipelined batch
    with the lock and the counts (``_Claim.pipelined``). ``paused``: the
    queues ``decide`` skips besides the full ones."""
    claim = _Claim(
        store, worker_id, now, limit, None if types is None else list(types), None if queues is None else list(queues)
    )
    names = (list(limited_types), list(limited_queues))
    if store.dialect == "postgresql" and blocked is not None:
        if blocked.quiet(paused) and store.outside():
            took = claim.unless_limited(names, paused)
            if took:
                return took
        return claim.pipelined(names, decide, blocked)
    with store.write() as conn:
        if store.dialect == "postgresql":
            conn.execute(postgres.lock_limited_claims())
        claim = claim.waited()  # the lock may have kept it waiting
        if store.sqlite and blocked is not None and blocked.quiet(paused):
            claimed = claim.tried(conn, claim.types, sorted(paused), lambda got: not _limited(got, names))
            if claimed is not None:
                return claimed
        running = claim.counts(conn, names)
        full_t, skip_q, pick = decide(*running)
        claimed = None
        if store.sqlite and (claim.types is not None or not full_t):
            claimed = claim.unless_over(conn, full_t, skip_q, pick)
            if claimed is None:
                full_t, skip_q, pick = decide(*running)  # a fresh pick: the tried one counted the rolled-back jobs
        if claimed is None:
            claimed = claim.picked(conn, full_t, skip_q, pick)
        if blocked is not None:
            blocked.value = found(full_t, skip_q)
            blocked.took_limited = _limited(claimed, names)
        return claimed


def found(full_types: list[str], skip_queues: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A claim's answer as ``Blocked.value`` holds it: both lists sorted."""
    return tuple(sorted(full_types)), tuple(sorted(skip_queues))


def _limited(claimed: list[JobRecord], names: tuple[list[str], list[str]]) -> bool:
    """Any of ``claimed`` is of a limited type or in a limited queue (``names``)."""
    types, queues = names
    return any(j.type in types or j.queue in queues for j in claimed)


@dataclass(frozen=True)
class _Claim:
    """One limit-aware claim: who claims, when, up to how many, of which
    types and queues (None: any)."""

    store: Store
    worker_id: str
    now: datetime
    limit: int
    types: list[str] | None
    queues: list[str] | None

    def waited(self) -> _Claim:
        """This claim at the time after a wait for the claim lock longer than
        ``WAITED`` (``jobdeck.store.timekeeping.after_waiting``); itself otherwise.
        Its reads move on too: on the deck's own clock the later time is
        still no later than the real one, so no job is claimed before it is due."""
        stamp = after_waiting(self.store, self.now)
        return self if stamp == self.now else replace(self, now=stamp)

    def picked(self, conn: Any, full_types: list[str], skip_queues: list[str], pick: Pick) -> list[JobRecord]:
        """The due jobs read a little past ``limit``, ``pick``'s of them claimed."""
        store, types, queues = self.store, self.types, self.queues
        priorities = store.claimable_priorities(conn)
        if priorities == []:
            return []
        values = (
            store.stored_time(self.now), *(types or ()), *(queues or ()), *skip_queues, *(priorities or ()),
            *full_types, self.limit * 4 + 16,
        )  # fmt: skip
        n_types = None if types is None else len(types)
        n_queues = None if queues is None else len(queues)
        n_priorities = None if priorities is None else len(priorities)
        due = claim_statements.due_picks(
            DUE_COLUMNS, n_types, n_queues, len(skip_queues), len(full_types), n_priorities
        )
        chosen = pick(store.driver_rows(conn, due, values))
        if not chosen:
            return []
        return store.claim_ids(conn, self.worker_id, self.now, chosen)

    def unless_over(
        self, conn: Any, full_types: list[str], skip_queues: list[str], pick: Pick
    ) -> list[JobRecord] | None:
        """SQLite: the plain claim (one statement), but for the full types and
        the queues to skip, under a savepoint; kept if ``pick`` would have chosen
        every job it claimed (none over a limit: then they are the same jobs the
        picked claim takes, the first due in claim order), else rolled back and
        None. Most claims of a deployment with a limit take no limited job over
        what is left: the due read of ``limit * 4 + 16`` rows, the pick and the
        claim of ids cost the demo's 100,000 no-op jobs (one type limited) about
        a tenth of the drain's CPU (docs/performance.md). PostgreSQL sends the
        same in a pipelined batch (``pipelined``), where the savepoint alone
        would cost two round trips more."""
        types = self.types
        if types is not None:
            types = [t for t in types if t not in full_types]
            if not types:
                return []
        return self.tried(
            conn, types, skip_queues, lambda got: len(pick([(j.id, j.type, j.queue) for j in got])) == len(got)
        )

    def tried(
        self, conn: Any, types: list[str] | None, skip_queues: list[str], keep: Callable[[list[JobRecord]], bool]
    ) -> list[JobRecord] | None:
        """SQLite: the plain claim of ``types`` but for ``skip_queues``, under
        a savepoint; kept if ``keep`` says so of what it claimed, else rolled
        back and None."""
        with translated_errors():
            cursor = conn.connection.cursor()
            cursor.execute("SAVEPOINT jobdeck_claim")
        # An error in the claim ends the whole transaction (``write()`` rolls it back).
        claimed = self.store.claim_in(conn, self.worker_id, self.now, self.limit, types, self.queues, skip_queues)
        kept = keep(claimed)
        with translated_errors():
            if not kept:
                cursor.execute("ROLLBACK TO jobdeck_claim")
            cursor.execute("RELEASE jobdeck_claim")
        return claimed if kept else None

    def unless_limited(self, names: tuple[list[str], list[str]], paused: frozenset[str]) -> list[JobRecord]:
        """PostgreSQL, while the claims are quiet (``Blocked.quiet``) and
        outside a transaction: the plain claim in autocommit, taking jobs
        only when the head of the line holds none of a limited type or queue
        (``names``; ``claim_statements.claim``'s ``n_unless``). Those it
        takes are the ones the limit-aware claim would: the first due in
        claim order but the paused queues and those other claimers hold,
        none of them counted by a limit, whatever the limits' counts are
        now. It needs neither the advisory lock nor the counts, nor a
        transaction: one round trip, where ``pipelined`` takes two and
        queues on the lock with every other limited claim. Empty (a limited
        job in the head, none due, or the whole head held by others): the
        caller claims by ``pipelined``, which takes the limited job in its
        turn under the lock."""
        with self.store.single() as conn:
            return self.store.claim_in(
                conn, self.worker_id, self.now, self.limit, self.types, self.queues, sorted(paused), unless=names
            )

    def pipelined(self, names: tuple[list[str], list[str]], decide: Decide, blocked: Blocked) -> list[JobRecord]:
        """PostgreSQL: ``unless_over`` in one round trip before the COMMIT,
        where the plain path takes five or six. One pipelined batch sends the
        acker's completions (``Store.complete_and_claim``), the advisory lock,
        the running counts of ``names`` (limited types, limited queues), a
        savepoint and the plain claim without the types and queues the last
        claim found blocked (``Blocked``). The claim is kept when the counts
        block exactly those and ``pick`` would have chosen every job it took:
        then it took the jobs the picked claim takes, the first due in claim
        order. Else, or when the batch's completions left some to complete
        (``Ahead``: jobs in a workflow or a batch, whose ends may make others
        due), it is rolled back to the savepoint, those completions land,
        and the due jobs are read and picked (``picked``): the claim sees
        every completion before it, and after such completions the running
        jobs are counted again (the batch counted the jobs they ended as
        running: a refill that ended a limited job of a workflow left the
        job waiting for its slot to the next claim). With a concurrency
        limit on a type the drain does not run (the demo's), a 20,000-job
        drain of the bare pool kept 40 to 64% of the unlimited drain's rate
        without this. A batch that waited for the lock longer than ``WAITED``
        keeps no plain claim, which it stamped with its time before the wait:
        the picked claim stamps the time after it (``waited``)."""
        guess = blocked.value
        ahead = self.store.take_ahead()
        with self.store.write() as conn:
            db = driver_connection(conn)
            with driver_errors(db):
                with db.pipeline():
                    completing = send_first(db, ahead)
                    counting = [
                        send(db, _running(column, len(listed)), tuple(listed)) if listed else None
                        for column, listed in zip(("type", "queue"), names)
                    ]
                    trying = self._send_plain(db, *guess)
                running = [{} if c is None else {name: int(n) for name, n in c.fetchall()} for c in counting]
                tried = None if trying is None else self._records(trying.fetchall())
                completed = [r for cursor in completing for r in cursor.fetchall()]
            applied_all = ahead is None or ahead.applied_all(completed)
            full_t, skip_q, pick = decide(*running)
            blocked.value = found(full_t, skip_q)
            after = self.waited()
            kept = (
                tried is not None
                and after is self
                and applied_all
                and blocked.value == guess
                and len(pick([(j.id, j.type, j.queue) for j in tried])) == len(tried)
            )
            if tried is not None and not kept:
                with driver_errors(db):
                    db.cursor().execute("ROLLBACK TO SAVEPOINT jobdeck_claim")
            if ahead is not None:  # after the rollback, which would undo the completions it runs
                ahead.land(completed)
            if kept:
                assert tried is not None
                claimed = _in_claim_order(tried)
            else:
                if not applied_all:  # the jobs those completions ended ran when the batch counted
                    running = self.counts(conn, names)
                full_t, skip_q, pick = decide(*running)  # a fresh pick: the tried one counted the rolled-back jobs
                claimed = after.picked(conn, full_t, skip_q, pick)
            blocked.took_limited = _limited(claimed, names)
            return claimed

    def counts(self, conn: Any, names: tuple[list[str], list[str]]) -> list[dict[str, int]]:
        """Running jobs of each limited type and of each limited queue (``names``), in ``conn``'s transaction."""
        return [self.count(conn, column, listed) for column, listed in zip(("type", "queue"), names)]

    def count(self, conn: Any, column: str, names: list[str]) -> dict[str, int]:
        """Running jobs of each of ``names`` (types or queues), in ``conn``'s transaction."""
        rows = self.store.driver_rows(conn, _running(column, len(names)), tuple(names)) if names else []
        return {name: int(n) for name, n in rows}

    def _send_plain(self, db: Any, full_types: tuple[str, ...], skip_queues: tuple[str, ...]) -> Any | None:
        """Queue a savepoint and the plain claim without ``full_types`` and
        ``skip_queues`` in the pipeline; its cursor. None where the claim's
        type list cannot leave the full types out (no list, or none left)."""
        types = None if self.types is None else [t for t in self.types if t not in full_types]
        if types == [] or (types is None and full_types):
            return None
        db.cursor().execute("SAVEPOINT jobdeck_claim")
        queues = self.queues
        plain = claim_statements.claim(None if types is None else len(types), None if queues is None else len(queues),
                                 len(skip_queues))  # fmt: skip
        values = (self.worker_id, self.store.stored_time(self.now), *(types or ()), *(queues or ()), *skip_queues,
                  self.limit)  # fmt: skip
        return send(db, plain, values)

    def _records(self, rows: list[Any]) -> list[JobRecord]:
        return claimed_records(rows, self.worker_id, self.now.astimezone(UTC), None)
