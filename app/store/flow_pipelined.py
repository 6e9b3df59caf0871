"""The flow claim on PostgreSQL (``jobdeck.store.flow.claim_flow``'s), in
two or three round trips instead of about ten.

The claim's statements mostly do not depend on one another, so psycopg's
pipeline mode sends them together. The first batch: the BEGIN, the
acker's completions when it claims in their transaction
(``Store.complete_and_claim``: ``Transactions.take_ahead``), the advisory
lock, the starts log's pruning and the reads of the running jobs, the
closed limits and the unkeyed rates' starts, then the head of the line
and, after a jammed head, the key walks, both as the last claim's reads
guessed them (``Guess``; read again when the guess was wrong). The lock
is taken before the reads: they see what the last limited claim
committed, and the completions before it free their keys for this claim.
Then the keyed starts, when a limit needs them, as on SQLite. The last
trip is one statement that claims the picked jobs and logs the starts of
those it claimed (``claim_ids_logging``), with the COMMIT behind it in
the same batch.

Measured with ``bench/flow_bench.py`` on the 2-core machine (a
concurrency of one per key over 100 keys): the pool's fetch thread spent
all its time in this claim, most of it waiting on round trips."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC
from functools import lru_cache
from typing import Any

from jobdeck.store import postgres
from jobdeck.store.claim import _in_claim_order
from jobdeck.store.claim_statements import claim_ids_logging, due_picks
from jobdeck.store.flow import (
    CANDIDATE_COLUMNS,
    MAX_PICK,
    Candidate,
    FlowReads,
    FlowRequest,
    Running,
    _closed_now,
    _Reads,
    _running_by_key,
    _starts_since,
    _walk,
    _walk_keys,
)
from jobdeck.store.lifecycle import Store
from jobdeck.store.models import flow_starts, jobs
from jobdeck.store.records import JobRecord, claimed_records
from jobdeck.store.sqlite import Prepared
from jobdeck.store.timekeeping import after_waiting
from jobdeck.store.transactions import Ahead
from sqlalchemy import bindparam, delete, select
from sqlalchemy.exc import DBAPIError


@lru_cache(maxsize=1)
def lock_statement() -> Prepared:
    """The limited claims' advisory lock (``postgres.lock_limited_claims``), prepared."""
    return Prepared(postgres.lock_limited_claims(), [])


@lru_cache(maxsize=1)
def _prune() -> Prepared:
    stmt = delete(flow_starts).where(
        flow_starts.c.limit_name == bindparam("limit"), flow_starts.c.started_at < bindparam("before")
    )
    return Prepared(stmt, ["limit", "before"])


@contextmanager
def driver_errors(db: Any) -> Iterator[None]:
    """The driver's errors as SQLAlchemy's, as every other statement raises
    them (the pool's retry tells an outage by them)."""
    error = type(db).__module__.split(".")[0]
    try:
        yield
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != error:
            raise
        raise DBAPIError.instance(None, None, exc, type(exc), connection_invalidated=db.closed) from exc


def claim_flow(store: Store, request: FlowRequest, guess: Guess) -> tuple[list[JobRecord], dict[str, str], Guess]:
    """``jobdeck.store.flow.claim_flow`` on PostgreSQL: the same reads,
    the same pick and the same guarantees, in two or three round trips.
    ``guess``: what the last claim's reads answered, for the reads sent
    with the others (read again when the answer differs now). Returns also
    this claim's answer."""
    assert store.dialect == "postgresql"
    now, type_list, queue_list, skip = request.now, request.types, request.queues, list(request.skip_queues)
    n_types = None if type_list is None else len(type_list)
    n_queues = None if queue_list is None else len(queue_list)
    # Joined (``complete_and_claim``: the acker's completions come first), the
    # claim is still the transaction's last statement: its COMMIT goes with it.
    commits = not store._joining() or store.last_in_transaction()
    want = min(request.limit, MAX_PICK) + 16

    def head_values(full_types: list[str], full_queues: list[str]) -> tuple[Prepared, tuple[Any, ...]]:
        skipped = skip + [q for q in full_queues if q not in skip]
        values = (store.stored_time(now), *(type_list or ()), *(queue_list or ()), *skipped, *full_types, want)
        return due_picks(CANDIDATE_COLUMNS, n_types, n_queues, len(skipped), len(full_types)), values

    ahead = store.take_ahead()  # the acker's completions: before the lock, as when they ran apart
    with store.write() as conn:
        db = driver_connection(conn)
        with driver_errors(db):
            with db.pipeline():
                completing = send_first(db, ahead)
                for name, before in request.prune:
                    send(db, _prune(), (name, store.stored_time(before)))
                read_running = send(db, _running_by_key(), ())
                read_closed = send(db, _closed_now(), (store.stored_time(now),))
                read_starts = [
                    (name, send(db, _starts_since(None), (name, store.stored_time(since))))
                    for name, since, _ in request.rated if not _
                ]  # fmt: skip
                read_head = send(
                    db, *head_values(*guess.blocked)
                )  # what the last claim's reads blocked: mostly the same
                sent_walks = _send_walks(
                    db, store.stored_time(now), want, type_list, queue_list, skip, request.walks, guess
                )
            running = [Running(t, q, k, int(n)) for t, q, k, n in read_running.fetchall()]
            closed = {(n, k): u for n, k, u in read_closed.fetchall()}
            unkeyed = {(name, k): int(n) for name, cur in read_starts for k, n in cur.fetchall()}
            head_rows = read_head.fetchall()
            walked = {c: {start: cursor.fetchall() for start, cursor in sent} for c, sent in sent_walks.items()}
            landed_late = False
            if ahead is not None:
                completed = [r for cursor in completing for r in cursor.fetchall()]
                landed_late = not ahead.applied_all(completed)
                ahead.land(completed)
        if landed_late:  # those completions ended jobs the reads held running, and may have made others due
            running = [Running(t, q, k, int(n)) for t, q, k, n in store.driver_rows(conn, _running_by_key(), ())]
        full = request.blocked(FlowReads(running, closed, unkeyed))
        if full != guess.blocked or landed_late:  # the head and the walks read what is stale now: again
            head_rows = store.driver_rows(conn, *head_values(*full))
            walked = {}
        reads = _Reads(store, conn)
        rows: dict[int, Candidate] = {r[0]: Candidate(*r) for r in head_rows}
        skip += [q for q in full[1] if q not in skip]
        keyed = [r for r in request.rated if r[2]]

        def decide() -> list[tuple[int, list[tuple[str, str]]]]:
            candidates = sorted(rows.values(), key=lambda r: (-r.priority, r.available_at, r.id))
            starts = {**unkeyed, **reads.starts(keyed, candidates)} if keyed else unkeyed
            return request.pick(FlowReads(running, closed, starts), candidates)

        chosen = decide()
        cursors: dict[str, str] = {}
        jammed = bool(request.walks) and len(rows) >= want and len(chosen) < min(request.limit, len(rows)) / 2
        if jammed:
            # The head is jammed by keys at their limit: walk the keys for the rest.
            extra: list[int] = []
            for column, after in request.walks.items():
                ids, cursors[column] = _walk_keys(
                    conn, "postgresql", column, after, want, now, type_list, queue_list, skip, walked.get(column)
                )
                extra += [i for i in ids if i not in rows]
            if extra:
                stmt = select(*CANDIDATE_COLUMNS).where(jobs.c.id.in_(bindparam("ids", expanding=True)))
                rows.update({r.id: Candidate(*r) for r in conn.execute(stmt, {"ids": sorted(set(extra))})})
                chosen = decide()
        answered = Guess(full, jammed)
        if not chosen:
            return [], cursors, answered
        ids = [i for i, _ in chosen]
        logged = [(i, name, key) for i, starts in chosen for name, key in starts]
        prepared = claim_ids_logging(store.void_after is not None)
        # The claim and its starts: when they happen, after any wait for the
        # lock, and when the statement lands, should it land late (void_at).
        stamp = after_waiting(store, now)
        params = (
            request.worker_id,
            store.stored_time(stamp),
            ids,
            [s[0] for s in logged],
            [s[1] for s in logged],
            [s[2] for s in logged],
            *store.void_at(stamp),
        )
        with driver_errors(db):
            with db.pipeline():
                claimed = send(db, prepared, params)
                if commits:
                    db.commit()  # in the same batch: the claim's last round trip
            got = claimed.fetchall()
        return _in_claim_order(claimed_records(got, request.worker_id, stamp.astimezone(UTC), None)), cursors, answered


@dataclass(frozen=True)
class Guess:
    """What a flow claim's reads answered, for the next claim's reads sent
    with the others: the types and queues ``blocked`` named (the head read),
    and whether the head was jammed (the key walks: a jammed head mostly
    stays jammed, and a walk sent in the batch saves its round trip)."""

    blocked: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    jammed: bool = False


@lru_cache(maxsize=16)
def _walk_prepared(column: str, types: bool, queues: bool, skip: bool) -> Prepared:
    lists = [name for name, on in (("types", types), ("queues", queues), ("skip", skip)) if on]
    return Prepared(_walk("postgresql", column, types, queues, skip), ["now", "after", "keys", *lists])


def _send_walks(
    db: Any, now: Any, want: int, types: list[str] | None, queues: list[str] | None, skip: list[str],
    walks: dict[str, str], guess: Guess,
) -> dict[str, list[tuple[str, Any]]]:  # fmt: skip
    """After a jammed head: each key walk (``_walk_keys``) as the skipped
    queues ``guess`` names leave it, from where it stopped and, for its wrap
    around, from the first key (column -> [(start, cursor)])."""
    if not guess.jammed or not walks:
        return {}
    skipped = skip + [q for q in guess.blocked[1] if q not in skip]
    lists = [v for v in (types, queues, skipped or None) if v is not None]
    sent: dict[str, list[tuple[str, Any]]] = {}
    for column, after in walks.items():
        prepared = _walk_prepared(column, types is not None, queues is not None, bool(skipped))
        sent[column] = [(start, send(db, prepared, (now, start, want, *lists))) for start in dict.fromkeys([after, ""])]
    return sent


def driver_connection(conn: Any) -> Any:
    """The psycopg connection under a checked-out SQLAlchemy one."""
    db = conn.connection.driver_connection
    assert db is not None, "a checked-out connection has its driver connection"
    return db


def send_first(db: Any, ahead: Ahead | None) -> list[Any]:
    """Queue what a limited claim's first batch opens with: the acker's
    completions (``Ahead``), then the limited claims' advisory lock, so the
    reads queued after it see the last limited claim's commit and the room
    the completions free. The completions' cursors."""
    completing = [send(db, *sent) for sent in ahead.statements] if ahead is not None else []
    send(db, lock_statement(), ())
    return completing


def send(db: Any, prepared: Prepared, values: tuple[Any, ...]) -> Any:
    """Queue ``prepared`` in the pipeline on a cursor of its own; its rows are read after the batch."""
    cursor = db.cursor()
    compiled = prepared.postgres
    cursor.execute(compiled.text, compiled.params(prepared.encoded(values)))
    return cursor
