"""One page of jobs, bounded by bytes as well as by rows.

A job's payload, result and error are the only columns of unbounded size.
``GET /api/jobs?limit=500`` over 255 KB payloads read 128 MB from the
database, built a 131 MB answer, and 16 such requests took a serve process
to 4.1 GB. Here a page is read in two statements of one read transaction:
the ids of up to ``limit`` jobs with the byte sizes of those columns (the
values stay in the database), then the rows of the jobs that fit in
``max_bytes``, newest first, each column no larger than ``max_bytes`` by
itself (a larger one is left out and named in ``JobRecord.omitted``). The
page ends early, with more to come, where the next job would pass the
budget; it always holds at least one job, so paging moves on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobdeck.store.filters import filtered
from jobdeck.store.models import jobs
from jobdeck.store.records import JobFilter, JobRecord
from sqlalchemy import LargeBinary, case, cast, func, null, select

if TYPE_CHECKING:
    from jobdeck.store.lifecycle import Store

SIZED = ("payload", "result", "error")
"""The columns a page is bounded by."""


def list_within(
    store: Store, f: JobFilter, now: datetime, max_bytes: int, fields: Sequence[str] = SIZED
) -> tuple[list[JobRecord], bool]:
    """Up to ``f.limit`` jobs (newest first, keyset on id like
    ``Store.list_jobs``) whose ``fields`` (of ``SIZED``) hold at most
    ``max_bytes`` together; the others of ``SIZED`` are not read at all.
    Returns the jobs and whether the budget ended the page before the row
    limit or the last matching job."""
    sizes = [_bytes(store, jobs.c[name]).label(name) for name in fields]
    stmt = filtered(select(jobs.c.id, *sizes), f, now)
    if f.after_id is not None:
        stmt = stmt.where(jobs.c.id > f.after_id).order_by(jobs.c.id.asc())
    else:
        if f.before_id is not None:
            stmt = stmt.where(jobs.c.id < f.before_id)
        stmt = stmt.order_by(jobs.c.id.desc())
    with store.read() as conn:
        candidates = conn.execute(stmt.limit(f.limit)).all()
        kept: dict[int, tuple[str, ...]] = {}
        total = 0
        for row in candidates:
            too_large = tuple(name for name, size in zip(fields, row[1:], strict=True) if size > max_bytes)
            size = sum(s for s in row[1:] if s <= max_bytes)
            if kept and total + size > max_bytes:
                break
            kept[row.id] = too_large
            total += size
        if not kept:
            return [], False
        columns = [_bounded(store, c, fields, max_bytes) if c.name in SIZED else c for c in jobs.c]
        rows = conn.execute(select(*columns).where(jobs.c.id.in_(list(kept)))).all()
    left_out = tuple(name for name in SIZED if name not in fields)
    records = []
    for r in rows:
        job, omitted = JobRecord.from_row(r), left_out + kept[r.id]
        if r.payload is None and "payload" not in omitted:  # it grew past the budget in between
            omitted += ("payload",)
        records.append(replace(job, omitted=omitted) if omitted else job)
    records.sort(key=lambda j: -j.id)
    return records, len(kept) < len(candidates)


def without_texts(*keep: str) -> list[Any]:
    """Every column of ``jobs``, with ``SIZED`` ones other than ``keep``
    read as NULL: what a dashboard list that shows none of them selects
    (``summarized`` names them in each job's ``omitted``)."""
    return [null().label(c.name) if c.name in SIZED and c.name not in keep else c for c in jobs.c]


def summarized(rows: Sequence[Any], *keep: str) -> list[JobRecord]:
    """The jobs of rows selected with ``without_texts(*keep)``."""
    omitted = tuple(name for name in SIZED if name not in keep)
    return [replace(JobRecord.from_row(r), omitted=omitted) for r in rows]


def _bytes(store: Store, column: Any) -> Any:
    """The byte length of a text column (0 for NULL), computed by the database."""
    if store.sqlite:  # octet_length() is SQLite 3.43's; a text cast to a blob counts bytes
        return func.coalesce(func.length(cast(column, LargeBinary)), 0)
    return func.coalesce(func.octet_length(column), 0)


def _bounded(store: Store, column: Any, fields: Sequence[str], max_bytes: int) -> Any:
    """``column`` when it is one of ``fields`` and no larger than
    ``max_bytes`` (checked again: the job may have changed since its size
    was read), else NULL."""
    if column.name not in fields:
        return null().label(column.name)
    return case((_bytes(store, column) <= max_bytes, column), else_=null()).label(column.name)
