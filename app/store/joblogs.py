"""Job logs' SQL: the lines handlers log (``ctx.log``; rules in
``jobdeck.jobs.joblogs``), one row per line in ``job_logs``.

``append_lines`` writes a batch in one transaction and enforces the caps
there, where every attempt's lines of the job are seen: what goes past
``max_lines_per_attempt`` or the job's ``max_bytes_per_job`` is dropped and
the attempt keeps one ``truncated`` marker. On PostgreSQL the job's row is
locked first, so two batches for one job (two HTTP heartbeats at once)
number their lines one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jobdeck.core.loglines import TRUNCATED, LogLimits, LogLine
from jobdeck.store.models import job_logs, jobs
from sqlalchemy import func, insert, select

if TYPE_CHECKING:
    from jobdeck.store import Store


@dataclass(frozen=True)
class StoredLine:
    """A stored line, as the API and the page show it."""

    id: int
    attempt: int
    seq: int
    at: datetime
    level: str
    message: str

    @property
    def truncated(self) -> bool:
        return self.level == TRUNCATED

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "attempt": self.attempt,
            "seq": self.seq,
            "at": self.at,
            "level": self.level,
            "message": self.message,
        }


_COLUMNS = (job_logs.c.id, job_logs.c.attempt, job_logs.c.seq, job_logs.c.at, job_logs.c.level, job_logs.c.message)


def append_lines(
    store: Store, job_id: int, attempt: int, lines: Sequence[LogLine], dropped: int, limits: LogLimits
) -> int:
    """Store what fits of ``lines`` for ``job_id``'s ``attempt``; returns how
    many were stored. ``dropped`` says the caller already dropped lines
    past a cap: the attempt gets its marker even if all of ``lines`` fit.
    Once an attempt has its marker it stores nothing more, however small
    (the marker says later lines were dropped). A job that no longer exists
    stores nothing."""
    with store.write() as conn:
        return _append(store, conn, job_id, attempt, lines, dropped, limits)


def append_many(store: Store, items: Sequence[tuple[int, int, Sequence[LogLine], int, LogLimits]]) -> int:
    """``append_lines`` for several attempts (job id, attempt, lines,
    dropped, limits) in ONE write transaction: the acker's batch."""
    with store.write() as conn:
        return sum(_append(store, conn, *item) for item in sorted(items, key=lambda i: (i[0], i[1])))


def _append(
    store: Store, conn: Any, job_id: int, attempt: int, lines: Sequence[LogLine], dropped: int, limits: LogLimits
) -> int:
    """``append_lines``'s work, in the caller's write transaction."""
    exists = select(jobs.c.id).where(jobs.c.id == job_id)
    if not store.sqlite:
        exists = exists.with_for_update()
    if conn.execute(exists).first() is None:
        return 0
    mine = (job_logs.c.job_id == job_id) & (job_logs.c.attempt == attempt)
    last_seq, kept, marked = conn.execute(
        select(
            func.coalesce(func.max(job_logs.c.seq), 0),
            func.count().filter(job_logs.c.level != TRUNCATED),
            func.count().filter(job_logs.c.level == TRUNCATED),
        ).where(mine)
    ).one()
    if marked:  # the marker says the rest of this attempt was dropped: keep it true
        return 0
    used = conn.execute(
        select(func.coalesce(func.sum(job_logs.c.size), 0)).where(
            job_logs.c.job_id == job_id, job_logs.c.level != TRUNCATED
        )
    ).scalar_one()
    rows: list[dict[str, Any]] = []
    cut: str | None = "lines" if dropped else None
    for line in lines:
        size = len(line.message.encode("utf-8"))
        if kept + len(rows) >= limits.max_lines_per_attempt:
            cut = "lines"
            break
        if used + size > limits.max_bytes_per_job:
            cut = "bytes"
            break
        used += size
        rows.append(_row(job_id, attempt, last_seq + len(rows) + 1, line, size))
    if cut is not None and not marked:
        at = lines[len(rows)].at if len(rows) < len(lines) else (lines[-1].at if lines else None)
        rows.append(_row(job_id, attempt, last_seq + len(rows) + 1, _marker(cut, limits, at), 0))
    if rows:
        conn.execute(insert(job_logs), rows)
    return sum(1 for r in rows if r["level"] != TRUNCATED)


def _row(job_id: int, attempt: int, seq: int, line: LogLine, size: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": attempt,
        "seq": seq,
        "at": line.at,
        "level": line.level,
        "message": line.message,
        "size": size,
    }


def _marker(cut: str, limits: LogLimits, at: datetime | None) -> LogLine:
    if cut == "lines":
        why = f"this attempt logged more than {limits.max_lines_per_attempt} lines ([logs] max_lines_per_attempt)"
    else:
        why = f"the job's log reached {limits.max_bytes_per_job} bytes ([logs] max_bytes_per_job)"
    return LogLine(TRUNCATED, f"log truncated: {why}; later lines were dropped", at or datetime.now(UTC))


def lines_of(
    store: Store, job_id: int, *, attempt: int | None = None, after: int = 0, limit: int = 1000
) -> list[StoredLine]:
    """A job's lines in the order they were stored, after the line ``after``
    (an id; 0 for the first), at most ``limit``, of one attempt or all."""
    stmt = select(*_COLUMNS).where(job_logs.c.job_id == job_id, job_logs.c.id > after)
    if attempt is not None:
        stmt = stmt.where(job_logs.c.attempt == attempt)
    with store.read() as conn:
        rows = conn.execute(stmt.order_by(job_logs.c.id).limit(limit)).all()
    return [StoredLine(*r) for r in rows]


def count_lines(store: Store, job_id: int) -> dict[int, int]:
    """How many lines each attempt of the job has (markers included)."""
    with store.read() as conn:
        rows = conn.execute(
            select(job_logs.c.attempt, func.count())
            .where(job_logs.c.job_id == job_id)
            .group_by(job_logs.c.attempt)
            .order_by(job_logs.c.attempt)
        ).all()
    return {attempt: n for attempt, n in rows}
