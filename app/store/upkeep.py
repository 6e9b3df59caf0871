"""The maintenance loops' statements (after Oban's Lifeline and Pruner):
marking silent workers gone, pruning finished jobs and old rows, and rolling
finished attempts up into per-minute counters. ``jobdeck.maintenance.upkeep``
decides when and with which settings; this module is how.

Rescuing stalled jobs is a transition, so it stays on ``Store``
(``Store.rescue_stalled``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.core.states import AttemptOutcome, State
from jobdeck.store import durations
from jobdeck.store.models import (
    CANCELLED,
    INTERRUPTED,
    SNOOZED,
    attempts,
    batches,
    job_artifacts,
    job_dependencies,
    job_logs,
    jobs,
    maintenance_marks,
    stats_minutely,
    stats_totals,
    workers,
    workflows,
)
from jobdeck.store.statements import dialect_insert
from sqlalchemy import and_, case, delete, func, literal_column, or_, select, update

if TYPE_CHECKING:
    from jobdeck.store import Store

STATS_MARK = "stats_minutely"
"""The ``maintenance_marks`` key of the roll-up's watermark: minutes before
it are in ``stats_minutely`` (the overview's throughput chart reads both)."""
FIRST_ROLL_UP = timedelta(hours=1)
"""How far back the first roll-up of a new database starts."""
RUN_OUTCOMES = frozenset(o.value for o in (AttemptOutcome.COMPLETED, AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT))
"""The attempts whose duration is a run time and goes into the histogram: a
stalled attempt's is how long the sweep took to notice, an interrupted one's
how long until shutdown."""
_COUNTERS = ("completed", "failed", "dead", *durations.COLUMNS)
_WIDTH = len(_COUNTERS)


# -- workers --------------------------------------------------------------------


def mark_silent_workers(store: Store, now: datetime, cutoff: datetime) -> list[str]:
    """Mark running workers whose last heartbeat is before ``cutoff`` gone
    (and un-mark one that beat again since). Returns the ids newly marked.
    Both updates are conditional, so several sweepers may run at once."""
    with store.write() as conn:
        gone = (
            conn.execute(
                update(workers)
                .where(workers.c.stopped_at.is_(None), workers.c.gone_at.is_(None), workers.c.heartbeat_at < cutoff)
                .values(gone_at=now)
                .returning(workers.c.id)
            )
            .scalars()
            .all()
        )
        conn.execute(
            update(workers)
            .where(workers.c.gone_at.is_not(None), workers.c.heartbeat_at >= cutoff, workers.c.stopped_at.is_(None))
            .values(gone_at=None)
        )
    return list(gone)


# -- retention ------------------------------------------------------------------


def prune_finished(
    store: Store, states: Iterable[State], before: datetime, *, batch: int = 1000, max_batches: int = 20
) -> int:
    """Delete jobs in ``states`` that finished before ``before``, with their
    attempts, artifacts and log lines (explicitly: the foreign keys cascade only where
    the connection enforces them), ``batch`` jobs per transaction and at most ``max_batches``
    transactions per call, so one prune never holds the database for long.
    Returns how many jobs went.

    The ids are picked in a read transaction, and the delete checks them
    again: finding them reads every finished job when none is old enough
    (no index has ``finished_at`` for them), about 0.5 s at 1,000,000 jobs,
    and on SQLite every writer of every process waited that long for it."""
    values = [s.value for s in states]
    prunable = and_(jobs.c.status.in_(values), jobs.c.finished_at < before, jobs.c.workflow_id.is_(None), _not_held())
    total = 0
    for _ in range(max_batches):
        with store.read() as conn:
            ids = list(conn.execute(select(jobs.c.id).where(prunable).order_by(jobs.c.id).limit(batch)).scalars())
        if not ids:
            break
        with store.write() as conn:
            gone = list(conn.execute(delete(jobs).where(jobs.c.id.in_(ids), prunable).returning(jobs.c.id)).scalars())
            # Only the jobs really deleted (one retried meanwhile keeps its rows).
            _delete_job_rows(conn, gone)
            total += len(gone)
        if len(ids) < batch:
            break
    return total


def _delete_job_rows(conn: Any, gone: list[int]) -> None:
    """What goes with deleted jobs (explicitly: the foreign keys cascade only where enforced)."""
    conn.execute(delete(attempts).where(attempts.c.job_id.in_(gone)))
    conn.execute(delete(job_artifacts).where(job_artifacts.c.job_id.in_(gone)))
    conn.execute(delete(job_logs).where(job_logs.c.job_id.in_(gone)))


def _not_held() -> Any:
    """Not a job of a batch that has not fired yet: its callbacks will count
    it (and list its id), so it stays until they have."""
    unfired = select(batches.c.id).where(batches.c.fired_at.is_(None))
    return or_(jobs.c.batch_id.is_(None), jobs.c.batch_id.not_in(unfired))


def prune_workflows(
    store: Store, states: Iterable[State], before: datetime, *, batch: int = 100, max_batches: int = 20
) -> int:
    """Delete whole workflows whose every job is in ``states`` and finished
    before ``before``: their jobs (with attempts, artifacts, logs), edges
    and the workflow rows, ``batch`` workflows per transaction (never a part
    of one) and at most ``max_batches`` transactions per call. Returns how
    many jobs went. Then batches that fired before ``before`` and have no
    job left."""
    values = [s.value for s in states]
    unfinished = select(jobs.c.id).where(
        jobs.c.workflow_id == workflows.c.id, or_(~jobs.c.status.in_(values), ~(jobs.c.finished_at < before))
    )
    pick = select(workflows.c.id).where(~unfinished.exists()).order_by(workflows.c.id).limit(batch)
    total = 0
    for _ in range(max_batches):
        with store.write() as conn:
            picked = list(conn.execute(pick).scalars())
            if picked:
                gone = list(conn.execute(select(jobs.c.id).where(jobs.c.workflow_id.in_(picked))).scalars())
                conn.execute(delete(job_dependencies).where(job_dependencies.c.job_id.in_(gone)))
                _delete_job_rows(conn, gone)
                conn.execute(delete(jobs).where(jobs.c.id.in_(gone)))
                conn.execute(delete(workflows).where(workflows.c.id.in_(picked)))
                total += len(gone)
        if len(picked) < batch:
            break
    with store.write() as conn:
        has_jobs = select(jobs.c.id).where(jobs.c.batch_id == batches.c.id)
        conn.execute(delete(batches).where(batches.c.fired_at < before, ~has_jobs.exists()))
    return total


def prune_stats(store: Store, before: datetime) -> int:
    """Delete the per-minute counters of minutes before ``before``."""
    with store.write() as conn:
        return int(conn.execute(delete(stats_minutely).where(stats_minutely.c.minute < before)).rowcount)


def prune_workers(store: Store, before: datetime) -> int:
    """Delete the rows of workers last heard of before ``before``."""
    with store.write() as conn:
        return int(conn.execute(delete(workers).where(workers.c.heartbeat_at < before)).rowcount)


# -- per-minute counters --------------------------------------------------------


def roll_up_minutes(store: Store, until: datetime) -> int:
    """Add the minutes from the watermark up to ``until`` (a whole minute) to
    ``stats_minutely`` and move the watermark there; returns how many minutes
    were closed. A new database starts ``FIRST_ROLL_UP`` before ``until`` on
    the next call.

    The attempts are counted in a read transaction: at 14,000 jobs/s a
    minute is 840,000 attempts and about 0.5 s of counting, which on SQLite
    held every writer of every process while it ran. The watermark then
    moves by compare-and-set in the write that adds the counts, so two
    processes never count a minute twice: the one whose watermark moved
    first adds its counts, the other's write changes nothing. The minutes
    are ``STATS_SETTLE`` old, so an attempt that ends in them and commits
    after the count is as rare as one committing after the write was."""
    with store.read() as conn:
        mark = conn.execute(select(maintenance_marks.c.value).where(maintenance_marks.c.key == STATS_MARK)).scalar()
        if mark is not None and mark >= until:
            return 0
        counts = {} if mark is None else _count_minutes(conn, store, mark, until)
    with store.write() as conn:
        if mark is None:
            conn.execute(
                dialect_insert(store.dialect)(maintenance_marks)
                .values(key=STATS_MARK, value=until - FIRST_ROLL_UP)
                .on_conflict_do_nothing(index_elements=["key"])
            )
            return 0
        moved = conn.execute(
            update(maintenance_marks)
            .where(maintenance_marks.c.key == STATS_MARK, maintenance_marks.c.value == mark)
            .values(value=until)
        ).rowcount
        if not moved:
            return 0
        if counts:
            insert = dialect_insert(store.dialect)(stats_minutely)
            stmt = insert.on_conflict_do_update(
                index_elements=["minute", "type"],
                set_={name: stats_minutely.c[name] + insert.excluded[name] for name in _COUNTERS},
            )
            conn.execute(
                stmt, [{"minute": m, "type": t, **dict(zip(_COUNTERS, c, strict=True))} for (m, t), c in counts.items()]
            )
            _add_to_totals(conn, store.dialect, counts)
    return int((until - mark).total_seconds() // 60)


def _count_minutes(conn: Any, store: Store, mark: datetime, until: datetime) -> dict[tuple[datetime, str], list[int]]:
    """Per (minute, type): the attempts finished in ``[mark, until)`` by
    outcome and run-time bucket, and the jobs that died then."""
    counts: dict[tuple[datetime, str], list[int]] = {}
    minute = _minute_expr(store, attempts.c.finished_at)
    bucket = _bucket_expr(store)
    for m, job_type, outcome, b, n in conn.execute(
        select(minute, jobs.c.type, attempts.c.outcome, bucket, func.count())
        .select_from(attempts.join(jobs, jobs.c.id == attempts.c.job_id))
        .where(attempts.c.finished_at >= mark, attempts.c.finished_at < until)
        .group_by(minute, jobs.c.type, attempts.c.outcome, bucket)
    ):
        if outcome in (INTERRUPTED, CANCELLED, SNOOZED):
            continue  # cut short by shutdown or by a person, or put off by its handler: neither done nor a failure
        row = counts.setdefault((_parse_minute(m), job_type), [0] * _WIDTH)
        row[0 if outcome == State.COMPLETED.value else 1] += n
        if outcome in RUN_OUTCOMES and b is not None:
            row[3 + int(b)] += n
    dead_minute = _minute_expr(store, jobs.c.finished_at)
    for m, job_type, n in conn.execute(
        select(dead_minute, jobs.c.type, func.count())
        .where(and_(jobs.c.status == State.DEAD.value, jobs.c.finished_at >= mark, jobs.c.finished_at < until))
        .group_by(dead_minute, jobs.c.type)
    ):
        counts.setdefault((_parse_minute(m), job_type), [0] * _WIDTH)[2] += n
    return counts


def _add_to_totals(conn: Any, dialect: str, counts: dict[tuple[datetime, str], list[int]]) -> None:
    """Add the minutes just closed to ``stats_totals``, in the roll-up's own
    transaction: the all-time sums the Prometheus counters are read from,
    which pruning old minutes never lowers."""
    per_type: dict[str, list[int]] = {}
    for (_, job_type), row in counts.items():
        total = per_type.setdefault(job_type, [0] * _WIDTH)
        for i, n in enumerate(row):
            total[i] += n
    insert = dialect_insert(dialect)(stats_totals)
    stmt = insert.on_conflict_do_update(
        index_elements=["type"], set_={name: stats_totals.c[name] + insert.excluded[name] for name in _COUNTERS}
    )
    conn.execute(stmt, [{"type": t, **dict(zip(_COUNTERS, c, strict=True))} for t, c in sorted(per_type.items())])


def stats_since(store: Store, since: datetime, job_type: str | None = None) -> list[dict[str, Any]]:
    """The per-minute counters from ``since`` on, oldest first."""
    stmt = select(stats_minutely).where(stats_minutely.c.minute >= since)
    if job_type is not None:
        stmt = stmt.where(stats_minutely.c.type == job_type)
    with store.read() as conn:
        rows = conn.execute(stmt.order_by(stats_minutely.c.minute, stats_minutely.c.type)).all()
    return [dict(r._mapping) for r in rows]


@dataclass(frozen=True)
class TypeHealth:
    """One job type over a window, from the per-minute counters: attempts
    completed and failed (failed, timed out or stalled), jobs that went
    dead, and the run-time histogram (``jobdeck.store.durations``)."""

    type: str
    completed: int
    failed: int
    dead: int
    durations: tuple[int, ...]

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts over finished ones; None when none finished."""
        finished = self.completed + self.failed
        return self.failed / finished if finished else None

    @property
    def p50(self) -> float | None:
        return durations.percentile(self.durations, 0.50)

    @property
    def p95(self) -> float | None:
        return durations.percentile(self.durations, 0.95)

    def shown(self, q: float) -> str:
        return durations.shown(self.durations, q)


HEALTH_WINDOWS: tuple[tuple[str, timedelta], ...] = (("1 h", timedelta(hours=1)), ("24 h", timedelta(hours=24)))
"""The windows the Queues page and ``GET /api/stats/types`` show."""


def type_health(store: Store, now: datetime, window: timedelta) -> list[TypeHealth]:
    """Each job type's health over the ``window`` of whole minutes before
    ``now``, by name, read from ``stats_minutely`` alone: one grouped sum,
    however many attempts ran (minutes after the roll-up's watermark, the
    last one or two, are not in it yet)."""
    since = whole_minute(now) - window
    sums = [func.coalesce(func.sum(stats_minutely.c[name]), 0) for name in _COUNTERS]
    stmt = (
        select(stats_minutely.c.type, *sums)
        .where(stats_minutely.c.minute >= since)
        .group_by(stats_minutely.c.type)
        .order_by(stats_minutely.c.type)
    )
    with store.read() as conn:
        rows = conn.execute(stmt).all()
    return [
        TypeHealth(type=r[0], completed=int(r[1]), failed=int(r[2]), dead=int(r[3]), durations=tuple(map(int, r[4:])))
        for r in rows
    ]


def _bucket_expr(store: Store) -> Any:
    """An attempt's run-time bucket (``durations.bucket_of``) computed in
    SQL, so the roll-up still returns one row per group, not per attempt."""
    started, finished = attempts.c.started_at, attempts.c.finished_at
    if store.dialect == "postgresql":
        seconds: Any = func.extract("epoch", finished - started)
    else:
        seconds = (func.julianday(finished) - func.julianday(started)) * 86400.0
    edges = [(seconds < literal_column(repr(edge)), i) for i, edge in enumerate(durations.EDGES)]
    return case((started.is_(None), None), *edges, else_=durations.BUCKETS - 1)


def whole_minute(t: datetime) -> datetime:
    """``t`` in UTC, cut to the start of its minute."""
    return t.astimezone(UTC).replace(second=0, microsecond=0)


def _minute_expr(store: Store, column: Any) -> Any:
    if store.dialect == "postgresql":
        return func.date_trunc("minute", func.timezone("UTC", column))
    return func.strftime("%Y-%m-%d %H:%M:00", column)


def _parse_minute(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return whole_minute(value)
