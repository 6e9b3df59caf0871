"""The flow limits' SQL (``jobdeck.jobs.flow``): the claim that reads what the
limits need and claims what they allow in one serialized write
transaction, the starts log, and the limits a handler closed.

The claim reads its candidates two bounded ways, so a hot key's backlog
never costs a scan: the head of the line (``MAX_PICK`` + 16 rows of the
claim index at most, whatever their keys), and, when the head is jammed
(it yields less than half of what the claim could take) by keys at their
limit, for each key column a limit uses, a walk over the distinct keys of
waiting jobs (``ix_jobs_<column>``, one index seek per key, a recursive
CTE) taking each key's first due job. The walk starts after the key the
last one ended at, so over a few claims every key gets its turn however
many jobs one key holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from jobdeck.store import claim_statements, postgres, statements
from jobdeck.store.lifecycle import Store
from jobdeck.store.models import CLAIMABLE_STATES, UTCDateTime, flow_closed, flow_starts, jobs
from jobdeck.store.records import JobRecord
from jobdeck.store.sqlite import Prepared, parse_time_required
from jobdeck.store.timekeeping import after_waiting
from sqlalchemy import Connection, TextClause, bindparam, delete, func, insert, select, text

CANDIDATE_COLUMNS = (
    jobs.c.id, jobs.c.type, jobs.c.queue, jobs.c.priority, jobs.c.available_at, jobs.c.rate_key, jobs.c.concurrency_key,
)  # fmt: skip


@dataclass(frozen=True)
class Running:
    """Running jobs of one (type, queue, concurrency key)."""

    type: str
    queue: str
    key: str | None
    count: int


@dataclass
class FlowReads:
    """What a flow claim decides from, read in its transaction."""

    running: list[Running]
    closed: dict[tuple[str, str], datetime]
    """(limit, key) -> until, for the limits closed now."""
    starts: dict[tuple[str, str], int]
    """(limit, key) -> starts in the limit's window (only the keys asked about)."""


Pick = Callable[[FlowReads, list[Any]], list[tuple[int, list[tuple[str, str]]]]]
"""Given the reads and the candidates in claim order: the ids to claim,
each with the (limit, key) starts its claim records."""
RateWindow = tuple[str, datetime, bool]
"""(limit name, window start, keyed)."""


@dataclass(frozen=True)
class FlowRequest:
    """One flow claim's arguments, the same on both dialects
    (``claim_flow``, ``flow_pipelined.claim_flow``), built by
    ``jobdeck.jobs.flow_claim``."""

    worker_id: str
    now: datetime
    limit: int
    types: list[str] | None
    queues: list[str] | None
    skip_queues: list[str]
    walks: dict[str, str]
    """Key column -> the key its walk starts after."""
    rated: list[RateWindow]
    """The rate limits whose starts to count."""
    prune: list[tuple[str, datetime]]
    """(limit, before): the starts to delete."""
    blocked: Callable[[FlowReads], tuple[list[str], list[str]]]
    """From the running jobs, the closed limits and the unkeyed rates: the
    types and queues nothing of can start (left out of the reads in SQL, so
    a full type's backlog at the head does not hide the rest)."""
    pick: Pick


MAX_PICK = 128
"""The candidates a claim reads are bounded by this, not by its ``limit``
(a pool asks for up to ``claim_batch``): the head of the line reads as many
rows and each key walk as many keys, plus 16."""

_STATES = ", ".join(f"'{s}'" for s in CLAIMABLE_STATES)


@lru_cache(maxsize=64)
def _walk(dialect: str, column: str, types: bool, queues: bool, skip: bool) -> TextClause:
    """The distinct keys after ``:after`` (at most ``:keys``), each with its
    first due job in claim order (NULL when none of its jobs is due or
    served). Text, not Core: a recursive CTE of scalar subqueries, the same
    on both dialects; each step is one seek in ``ix_jobs_<column>`` (named
    on SQLite, whose planner otherwise takes the status index for ``min``
    and reads every waiting job: 2 s a claim with 100k of them)."""
    assert column in ("rate_key", "concurrency_key")
    hint = f" INDEXED BY ix_jobs_{column}" if dialect == "sqlite" else ""
    held = f"status IN ({_STATES})"
    served = [f"j.{column} = k.key", f"j.{held}", "j.available_at <= :now"]
    listed = dialect == "sqlite"  # PostgreSQL takes each list as one array: its text does not vary with them
    if types:
        served.append("j.type IN :types" if listed else "j.type = ANY(:types)")
    if queues:
        served.append("j.queue IN :queues" if listed else "j.queue = ANY(:queues)")
    if skip:
        served.append("j.queue NOT IN :skip" if listed else "j.queue <> ALL(:skip)")
    sql = f"""
        WITH RECURSIVE k(key, n) AS (
            SELECT (SELECT min({column}) FROM jobs{hint} WHERE {held} AND {column} > :after), 1
            UNION ALL
            SELECT (SELECT min({column}) FROM jobs{hint} WHERE {held} AND {column} > k.key), k.n + 1
            FROM k WHERE k.key IS NOT NULL AND k.n < :keys
        )
        SELECT k.key, (
            SELECT j.id FROM jobs j{hint} WHERE {" AND ".join(served)}
            ORDER BY j.priority DESC, j.available_at, j.id LIMIT 1
        ) AS head
        FROM k WHERE k.key IS NOT NULL
    """
    binds = [bindparam("now", type_=UTCDateTime()), bindparam("after"), bindparam("keys")]
    binds += [bindparam(n, expanding=listed) for n, on in (("types", types), ("queues", queues), ("skip", skip)) if on]
    return text(sql).bindparams(*binds)


def _walk_keys(
    conn: Connection, dialect: str, column: str, after: str, n: int, now: datetime, types: list[str] | None,
    queues: list[str] | None, skip: list[str], walked: dict[str, list[Any]] | None = None,
) -> tuple[list[int], str]:  # fmt: skip
    """The head job ids of up to ``n`` keys after ``after`` (wrapping around
    to the first key), and the key to start the next walk after.
    ``walked``: the walks already read (after -> rows, of ``n`` keys, with
    the same arguments: ``flow_pipelined``), for the ones read here."""
    stmt = _walk(dialect, column, types is not None, queues is not None, bool(skip))
    params: dict[str, Any] = {"now": now, "after": after, "keys": n}
    for name, value in (("types", types), ("queues", queues), ("skip", skip or None)):
        if value is not None:
            params[name] = value

    def walk(start: str, keys: int) -> list[Any]:
        if walked is not None:
            return walked[start][:keys]  # a walk of more keys from the same start begins with these
        return list(conn.execute(stmt, {**params, "after": start, "keys": keys}))

    rows = walk(after, n)
    if len(rows) < n and after:
        seen = {r[0] for r in rows}
        rows += [r for r in walk("", n - len(rows)) if r[0] not in seen]
    cursor = rows[-1][0] if len(rows) >= n else ""
    return [r[1] for r in rows if r[1] is not None], cursor


def claim_flow(store: Store, request: FlowRequest) -> tuple[list[JobRecord], dict[str, str]]:
    """The flow claim, in one write transaction no other limited claim
    interleaves with (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: the queue
    policy's advisory lock, taken first). Returns the claimed jobs and
    where the next walks start."""
    now, type_list, queue_list, skip = request.now, request.types, request.queues, list(request.skip_queues)
    n_types = None if type_list is None else len(type_list)
    n_queues = None if queue_list is None else len(queue_list)
    with store.write() as conn:
        if store.dialect == "postgresql":
            conn.execute(postgres.lock_limited_claims())
        for name, before in request.prune:
            conn.execute(delete(flow_starts).where(flow_starts.c.limit_name == name, flow_starts.c.started_at < before))
        reads = _Reads(store, conn)
        running, closed = reads.running(), reads.closed(now)
        unkeyed = reads.starts([r for r in request.rated if not r[2]], [])
        full_types, full_queues = request.blocked(FlowReads(running, closed, unkeyed))
        skip += [q for q in full_queues if q not in skip]
        want = min(request.limit, MAX_PICK) + 16
        priorities = store.claimable_priorities(conn)
        values = (*(type_list or ()), *(queue_list or ()), *skip, *(priorities or ()), *full_types, want)
        n_priorities = None if priorities is None else len(priorities)
        head = claim_statements.due_picks(
            CANDIDATE_COLUMNS, n_types, n_queues, len(skip), len(full_types), n_priorities
        )
        rows = {r.id: r for r in reads.head(head, now, values)} if priorities != [] else {}
        keyed = [r for r in request.rated if r[2]]

        def decide() -> list[tuple[int, list[tuple[str, str]]]]:
            candidates = sorted(rows.values(), key=lambda r: (-r.priority, r.available_at, r.id))
            return request.pick(FlowReads(running, closed, {**unkeyed, **reads.starts(keyed, candidates)}), candidates)

        chosen = decide()
        cursors: dict[str, str] = {}
        if request.walks and len(rows) >= want and len(chosen) < min(request.limit, len(rows)) / 2:
            # The head is jammed by keys at their limit: walk the keys for the rest.
            extra: list[int] = []
            for column, after in request.walks.items():
                ids, cursors[column] = _walk_keys(
                    conn, store.dialect, column, after, want, now, type_list, queue_list, skip
                )
                extra += [i for i in ids if i not in rows]
            if extra:
                stmt = select(*CANDIDATE_COLUMNS).where(jobs.c.id.in_(bindparam("ids", expanding=True)))
                rows.update({r.id: r for r in conn.execute(stmt, {"ids": sorted(set(extra))})})
                chosen = decide()
        if not chosen:
            return [], cursors
        stamp = after_waiting(store, now)  # the reads keep ``now``: earlier, they count more starts, find fewer due
        claimed = store.claim_ids(conn, request.worker_id, stamp, [i for i, _ in chosen])
        got = {j.id for j in claimed}
        started = Counter(start for i, starts in chosen if i in got for start in starts)
        if started:
            log = [{"limit_name": n, "key": k, "started_at": stamp, "count": c} for (n, k), c in started.items()]
            conn.execute(insert(flow_starts), log)
        return claimed, cursors


class Candidate(NamedTuple):
    """A due job the flow claim may pick: ``CANDIDATE_COLUMNS``, the time decoded."""

    id: int
    type: str
    queue: str
    priority: int
    available_at: datetime
    rate_key: str | None
    concurrency_key: str | None


@lru_cache(maxsize=1)
def _running_by_key() -> Prepared:
    stmt = (
        select(jobs.c.type, jobs.c.queue, jobs.c.concurrency_key, func.count())
        .where(statements.running())
        .group_by(jobs.c.type, jobs.c.queue, jobs.c.concurrency_key)
    )
    return Prepared(stmt, [])


@lru_cache(maxsize=1)
def _closed_now() -> Prepared:
    now = bindparam("now", type_=UTCDateTime())
    stmt = select(flow_closed.c.limit_name, flow_closed.c.key, flow_closed.c.until).where(flow_closed.c.until > now)
    return Prepared(stmt, ["now"])


@lru_cache(maxsize=256)
def _starts_since(n_keys: int | None) -> Prepared:
    """Starts by key of one limit since a time; of ``n_keys`` keys only.
    Values: limit, since, *keys."""
    since = bindparam("since", type_=UTCDateTime())
    where = [flow_starts.c.limit_name == bindparam("limit"), flow_starts.c.started_at > since]
    if n_keys is not None:
        where.append(flow_starts.c.key.in_(statements.binds("key_", n_keys)))
    stmt = select(flow_starts.c.key, func.sum(flow_starts.c.count)).where(*where).group_by(flow_starts.c.key)
    return Prepared(stmt, ["limit", "since", *statements.names("key_", n_keys)])


class _Reads:
    """The flow claim's reads in its write transaction, at driver level
    (``Claiming.driver_rows``), compiled once per shape: built and run
    through Core they were most of the claim's own time. Times come back
    as the driver gives them (SQLite's text) and are decoded here."""

    def __init__(self, store: Store, conn: Connection) -> None:
        self.store, self.conn = store, conn
        self.time: Callable[[Any], datetime] = parse_time_required if store.sqlite else (lambda value: value)

    def _rows(self, prepared: Prepared, values: tuple[Any, ...]) -> list[Any]:
        return self.store.driver_rows(self.conn, prepared, values)

    def running(self) -> list[Running]:
        return [Running(t, q, k, int(n)) for t, q, k, n in self._rows(_running_by_key(), ())]

    def closed(self, now: datetime) -> dict[tuple[str, str], datetime]:
        rows = self._rows(_closed_now(), (self.store.stored_time(now),))
        return {(n, k): self.time(u) for n, k, u in rows}

    def starts(self, rated: Sequence[RateWindow], candidates: list[Any]) -> dict[tuple[str, str], int]:
        """Starts since each window's start: of the unkeyed limits, and of the
        candidates' keys of the keyed ones (a bounded set)."""
        found: dict[tuple[str, str], int] = {}
        keys = sorted({c.rate_key if c.rate_key is not None else "null" for c in candidates})
        for name, since, keyed in rated:
            if keyed and not keys:
                continue
            prepared = _starts_since(len(keys) if keyed else None)
            values = (name, self.store.stored_time(since), *(keys if keyed else ()))
            found.update({(name, k): int(n) for k, n in self._rows(prepared, values)})
        return found

    def head(self, prepared: Prepared, now: datetime, values: tuple[Any, ...]) -> list[Candidate]:
        rows, t = self._rows(prepared, (self.store.stored_time(now), *values)), self.time
        return [Candidate(i, ty, q, p, t(at), rk, ck) for i, ty, q, p, at, rk, ck in rows]


def _running(conn: Connection) -> list[Running]:
    return [Running(t, q, k, int(n)) for t, q, k, n in conn.execute(_running_by_key().stmt)]


def _closed(conn: Connection, now: datetime) -> dict[tuple[str, str], datetime]:
    return {(n, k): u for n, k, u in conn.execute(_closed_now().stmt, {"now": now})}


# -- reads for the queues page, and the handler's 429 ----------------------------


def window_use(store: Store, windows: Sequence[tuple[str, datetime, int]], now: datetime) -> dict[str, dict[str, Any]]:
    """Per (limit, window start, count): the starts in the window by key,
    how many keys are at the count, and until when the limit is closed."""
    out: dict[str, dict[str, Any]] = {}
    with store.read() as conn:
        closed = _closed(conn, now)
        for name, since, count in windows:
            by_key = dict(conn.execute(_starts_since(None).stmt, {"limit": name, "since": since}).all())
            shut = [u for (n, _), u in closed.items() if n == name]
            out[name] = {
                "starts": {k: int(v) for k, v in by_key.items()},
                "keys_at_limit": sum(1 for v in by_key.values() if v >= count),
                "closed_until": max(shut) if shut else None,
                "closed_keys": sum(1 for (n, k) in closed if n == name and k),
            }
    return out


def running_by_key(store: Store) -> list[Running]:
    with store.read() as conn:
        return _running(conn)


def closed_limits(store: Store, now: datetime) -> dict[tuple[str, str], datetime]:
    with store.read() as conn:
        return _closed(conn, now)


def close_limits(store: Store, closing: Sequence[tuple[str, str]], until: datetime, job_id: int | None) -> None:
    """Close each (limit, key) until ``until`` (a later close of the same one moves it)."""
    upsert = statements.dialect_insert(store.dialect)(flow_closed)
    with store.write() as conn:
        for name, key in closing:
            stmt = upsert.values(limit_name=name, key=key, until=until, job_id=job_id)
            conn.execute(stmt.on_conflict_do_update(index_elements=["limit_name", "key"], set_={"until": until}))


def job_flow_keys(store: Store, job_id: int) -> tuple[str, str, str | None, str | None] | None:
    """(type, queue, rate_key, concurrency_key) of a job."""
    stmt = select(jobs.c.type, jobs.c.queue, jobs.c.rate_key, jobs.c.concurrency_key).where(jobs.c.id == job_id)
    with store.read() as conn:
        row = conn.execute(stmt).first()
    return None if row is None else (row[0], row[1], row[2], row[3])
