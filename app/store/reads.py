"""Read-side SQL for the dashboard, plus its small write (run now); the
audit log is ``jobdeck.store.audit``, the overview's numbers
``jobdeck.store.overview``. Store-like functions taking a ``Store``; views
never build queries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from jobdeck.core.states import State
from jobdeck.store.filters import filtered
from jobdeck.store.lifecycle import JobFilter, JobRecord, Store
from jobdeck.store.listing import list_within, summarized, without_texts
from jobdeck.store.models import (
    ERROR_STATES,
    jobs,
    status_in,
)
from sqlalchemy import Select, exists, func, literal_column, select

BATCH = 500
"""Jobs per transaction in a bulk action over a filter."""


# -- lists ---------------------------------------------------------------------


def _filtered(f: JobFilter, now: datetime, stmt: Select[Any]) -> Select[Any]:
    result: Select[Any] = filtered(stmt, f, now)
    return result


@dataclass(frozen=True)
class Page:
    jobs: list[JobRecord]
    older: int | None
    """``before_id`` for the next (older) page, None on the last."""
    newer: int | None
    """``after_id`` for the previous (newer) page, None on the first."""


def list_page(store: Store, f: JobFilter, now: datetime, max_bytes: int) -> Page:
    """One page, newest first, by keyset on id: never OFFSET. Its rows
    carry their errors (at most ``max_bytes`` of them), not their payloads
    or results: a list shows neither (``jobdeck.store.listing``)."""
    rows, cut = list_within(store, replace(f, limit=f.limit + 1), now, max_bytes, fields=("error",))
    if f.after_id is not None:
        # Paging newer: the extra row is beyond the newest end.
        more_newer = cut or len(rows) > f.limit
        rows = rows[-f.limit :] if more_newer else rows
        newer = rows[0].id if rows and more_newer else None
        older = rows[-1].id if rows and _exists(store, f, now, below=rows[-1].id) else None
        return Page(rows, older, newer)
    more_older = cut or len(rows) > f.limit
    rows = rows[: f.limit]
    older = rows[-1].id if more_older and rows else None
    newer = None
    if f.before_id is not None and rows and _exists(store, f, now, above=rows[0].id):
        newer = rows[0].id
    return Page(rows, older, newer)


def _exists(store: Store, f: JobFilter, now: datetime, *, above: int | None = None, below: int | None = None) -> bool:
    stmt = _filtered(f, now, select(jobs.c.id))
    if above is not None:
        stmt = stmt.where(jobs.c.id > above)
    if below is not None:
        stmt = stmt.where(jobs.c.id < below)
    with store.read() as conn:
        return bool(conn.execute(select(exists(stmt))).scalar())


def count_matching(store: Store, f: JobFilter, now: datetime, states: frozenset[State], up_to: int) -> int:
    """Exactly how many jobs a bulk action would act on: those the filter
    matches, in an allowed source state, with id <= ``up_to`` (the newest id
    when the operator asked, so jobs enqueued later are left alone)."""
    stmt = _filtered(f, now, select(func.count()).select_from(jobs)).where(
        jobs.c.status.in_([s.value for s in states]), jobs.c.id <= up_to
    )
    with store.read() as conn:
        return int(conn.execute(stmt).scalar_one())


BADGE_WINDOW = 10_000
"""Jobs of each state a tab's badge looks through, newest first. A state
holding more shows a lower bound ("10,000+"): at 1,000,000 jobs an exact
count of every state is a scan of them all on every list view and poll."""


@dataclass(frozen=True)
class Badge:
    """A tab's badge: ``n`` jobs, or at least ``n`` where not ``exact``."""

    n: int
    exact: bool


def badge_counts(
    store: Store, f: JobFilter, now: datetime, window: int = BADGE_WINDOW, page: Page | None = None
) -> dict[str, Badge]:
    """Each tab's badge under ``f`` (its state and paging set aside for the
    other tabs): the jobs ``f`` matches among the newest ``window`` of the
    tab's state. Exact where the state holds fewer than ``window`` jobs;
    otherwise a lower bound. Each state costs at most ``window`` entries of
    ``(status, id)``, and under a filter their rows (read through that
    index, whatever the filter).

    ``page``, the list read under ``f``, heads its own tab: a first page
    with nothing older is the whole list, so its rows are the exact count
    (and nothing more is read for it); any other page raises the lower bound
    to what it shows."""
    own = None if f.status is None else "scheduled" if f.scheduled else f.status.value
    whole = page is not None and f.before_id is None and f.after_id is None and page.older is None
    # Jobs the page proves exist: its rows, and one more if there is an older page.
    shown = 0 if page is None else len(page.jobs) + (page.older is not None)
    out: dict[str, Badge] = {}
    with store.read() as conn:
        for state in State:
            newest = (
                select(jobs.c.id)
                .where(jobs.c.status == state.value)
                .order_by(jobs.c.id.desc())
                .limit(window)
                .subquery()
            )
            held, lowest = conn.execute(select(func.count(), func.min(newest.c.id))).one()
            exact = held < window
            splits = [("scheduled", True), (state.value, False)] if state is State.PENDING else [(state.value, None)]
            for slug, scheduled in splits:
                if slug == own and whole:
                    out[slug] = Badge(shown, True)
                    continue
                n = held
                if held and (scheduled is not None or f.narrows):
                    mine = replace(f, status=state, scheduled=scheduled)
                    # SQLite, without statistics, may walk a filter's own index
                    # instead ((type, id) from the window's lowest id on: every
                    # newer job of the type, 45,000 rows at 1M jobs).
                    stmt = _filtered(mine, now, select(func.count()).select_from(jobs)).with_hint(
                        jobs, "INDEXED BY ix_jobs_status_id", "sqlite"
                    )
                    if not exact:
                        stmt = stmt.where(jobs.c.id >= lowest)
                    n = conn.execute(stmt).scalar_one()
                if slug == own and not exact:
                    n = max(n, shown)
                out[slug] = Badge(int(n), exact)
    return out


def next_batch(
    store: Store, f: JobFilter, now: datetime, states: frozenset[State], below: int, limit: int = BATCH
) -> list[int]:
    """The next ids (descending, < ``below``) a bulk action should move."""
    stmt = (
        _filtered(f, now, select(jobs.c.id))
        .where(jobs.c.status.in_([s.value for s in states]), jobs.c.id < below)
        .order_by(jobs.c.id.desc())
        .limit(limit)
    )
    with store.read() as conn:
        return list(conn.execute(stmt).scalars())


def newest_id(store: Store) -> int:
    with store.read() as conn:
        return int(conn.execute(select(func.max(jobs.c.id))).scalar() or 0)


def running_by_worker(store: Store, worker_ids: Sequence[str], limit: int = 50) -> dict[str, list[JobRecord]]:
    """The jobs each worker holds (served by the partial running index),
    without their payloads, results and errors (the Workers page shows none)."""
    held: dict[str, list[JobRecord]] = {w: [] for w in worker_ids}
    if not worker_ids:
        return held
    with store.read() as conn:
        for wid in worker_ids:
            rows = conn.execute(
                select(*without_texts())
                .where(jobs.c.worker_id == wid, jobs.c.status == State.RUNNING.value)
                .order_by(jobs.c.id)
                .limit(limit)
            ).all()
            held[wid] = summarized(rows)
    return held


def running_by_type(store: Store, types: Sequence[str]) -> dict[str, int]:
    """Running jobs of each given type (the per-type concurrency limits)."""
    if not types:
        return {}
    stmt = (
        select(jobs.c.type, func.count())
        .where(jobs.c.status == State.RUNNING.value, jobs.c.type.in_(list(types)))
        .group_by(jobs.c.type)
    )
    with store.read() as conn:
        return {t: int(n) for t, n in conn.execute(stmt)}


def dead_since(store: Store, since: datetime, cap: int = 1000) -> int:
    """Jobs that landed in dead letter after ``since`` (capped: a banner)."""
    inner = select(jobs.c.id).where(jobs.c.status == State.DEAD.value, jobs.c.finished_at > since).limit(cap).subquery()
    with store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(inner)).scalar_one())


def last_dead(store: Store, limit: int) -> list[JobRecord]:
    """The jobs that died last, by when they died (``finished_at``, then id):
    a job enqueued long ago that died just now comes first, not after every
    newer job. Read in that order from ``ix_jobs_dead_finished``, with their
    errors but not their payloads or results (the overview shows neither)."""
    with store.read() as conn:
        return summarized(conn.execute(last_dead_statement(limit)).all(), "error")


def last_dead_statement(limit: int) -> Select[Any]:
    return (
        select(*without_texts("error"))
        .with_hint(jobs, "INDEXED BY ix_jobs_dead_finished", "sqlite")  # unanalyzed, it would sort by status's
        .where(jobs.c.status == literal_column(f"'{State.DEAD.value}'"))  # literal: the partial index's own WHERE
        .order_by(jobs.c.finished_at.desc(), jobs.c.id.desc())
        .limit(limit)
    )


def iter_batches(ids: Sequence[int], size: int = BATCH) -> Iterator[list[int]]:
    for i in range(0, len(ids), size):
        yield list(ids[i : i + size])


# -- errors, grouped ------------------------------------------------------------------

MAX_ERROR_GROUPS = 100
"""The errors view lists at most this many groups, the largest first."""


@dataclass(frozen=True)
class ErrorGroup:
    """Failed (or dead) jobs of one type whose errors share a fingerprint."""

    type: str
    fingerprint: str | None
    """``jobdeck.core.fingerprint``; None for jobs that failed under a release that
    stored none (a rolling deploy), which form one group."""
    count: int
    first_seen: datetime
    """When a job of the group first failed with its error (the earliest
    ``error_since``), kept across retries: a retry of the group that fails
    the same way leaves it alone. A job failed before revision 0026 and not
    since counts from its last failure."""
    last_seen: datetime
    sample_id: int
    """The newest job in the group."""
    sample_error: str | None
    """That job's last error, as recorded."""


def error_groups(store: Store, state: State, limit: int = MAX_ERROR_GROUPS) -> list[ErrorGroup]:
    """The jobs in ``state`` (failed or dead) grouped by type and error
    fingerprint, the largest groups first: one GROUP BY that
    ``ix_jobs_error_groups`` serves from the index alone (named for SQLite,
    whose planner without statistics picks the status index and reads every
    row; it sees a partial index serves a WHERE only when the WHERE repeats
    the index's own condition), then one read of the groups' sample jobs by id. Never a pass over
    attempts or over the jobs in Python."""
    newest = func.max(jobs.c.id)
    stmt = (
        select(
            jobs.c.type,
            jobs.c.error_fingerprint,
            func.count(),
            func.min(func.coalesce(jobs.c.error_since, jobs.c.updated_at)),
            func.max(jobs.c.updated_at),
            newest,
        )  # fmt: skip
        .with_hint(jobs, "INDEXED BY ix_jobs_error_groups", "sqlite")
        .where(status_in(jobs.c.status, ERROR_STATES), status_in(jobs.c.status, [state.value]))
        .group_by(jobs.c.type, jobs.c.error_fingerprint)
        .order_by(func.count().desc(), newest.desc())
        .limit(limit)
    )
    with store.read() as conn:
        rows = conn.execute(stmt).all()
        ids = [row[5] for row in rows]
        errors = dict(conn.execute(select(jobs.c.id, jobs.c.error).where(jobs.c.id.in_(ids))).all()) if ids else {}
    return [
        ErrorGroup(job_type, fp, int(n), first, last, int(sample), errors.get(sample))
        for job_type, fp, n, first, last, sample in rows
    ]
