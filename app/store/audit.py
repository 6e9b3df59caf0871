"""The audit log: every operator action, and how far each bulk action got.

A bulk action (retry, discard or cancel of ticked rows, of "all N matching",
of a workflow's jobs) moves its jobs in batches. Its entry is opened first
with the number it sets out to move (``total``); each batch then adds what it
moved to the entry's ``count`` in the batch's own transaction (``Tally``,
``count_moved``), so however the action ends, the count is exactly the jobs
it moved. The last batch marks it finished. An entry left unfinished names
the process that moved its last batch and when (``owner``, ``updated_at``):
``BulkProgress`` reads it as running, or as interrupted once that process is
known to be gone (``jobdeck.core.processes``) or the action made no progress for
``STALE_AFTER``. "interrupted after 5,500 of 20,000" is then what the audit
log and the page that started it say.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobdeck.core import processes
from jobdeck.store.models import audit_log
from jobdeck.store.transactions import Transactions
from sqlalchemy import Connection, and_, bindparam, case, insert, select, update

audit_logger = logging.getLogger("jobdeck.audit")

STALE_AFTER = timedelta(minutes=2)
"""An unfinished bulk action that moved nothing for this long reads as
interrupted, when its process cannot be checked (it ran on another host).
A batch takes well under a second; the dashboard asks for the next one as
soon as the last is shown."""

BULK_NOTICE_WINDOW = timedelta(hours=24)
"""How long a person's interrupted bulk action is pointed out on the job lists."""


@dataclass(frozen=True)
class BulkProgress:
    """How far a bulk action got, and whether it is done, still going, or
    was cut short (its process died, or its page was closed, mid-way)."""

    moved: int
    total: int
    state: str
    """``finished``, ``running`` or ``interrupted``."""

    @property
    def interrupted(self) -> bool:
        return self.state == "interrupted"

    def describe(self) -> str:
        """``interrupted after 5,500 of 20,000``, ``5,500 of 20,000 so far``,
        ``20,000 of 20,000`` (with how many had moved on, if any)."""
        if self.state == "interrupted":
            return f"interrupted after {self.moved:,} of {self.total:,}"
        if self.state == "running":
            return f"{self.moved:,} of {self.total:,} so far"
        skipped = self.total - self.moved
        return f"{self.moved:,} of {self.total:,}" + (f"; {skipped:,} had moved on" if skipped > 0 else "")


@dataclass(frozen=True)
class AuditRecord:
    id: int
    at: datetime
    actor: str
    action: str
    job_id: int | None
    count: int
    detail: str | None
    total: int | None = None
    """A bulk action's jobs to move, counted when it began; None for any other action."""
    finished_at: datetime | None = None
    owner: str | None = None
    updated_at: datetime | None = None

    def progress(self, now: datetime) -> BulkProgress | None:
        """A bulk action's progress as of ``now``; None for other actions."""
        if self.total is None:
            return None
        if self.finished_at is not None:
            return BulkProgress(self.count, self.total, "finished")
        owner_gone = processes.gone(self.owner) if self.owner else None
        last = self.updated_at or self.at
        if owner_gone or (owner_gone is None and now - last > STALE_AFTER):
            return BulkProgress(self.count, self.total, "interrupted")
        return BulkProgress(self.count, self.total, "running")


@dataclass(frozen=True)
class Tally:
    """Where a bulk action's batch counts what it moved: the audit entry,
    written in the batch's own transaction (``count_moved``); ``last``
    marks the action finished in it."""

    entry: int
    last: bool = False


def record_action(
    store: Transactions, actor: str, action: str, now: datetime, *, count: int, job_id: int | None = None,
    detail: str | None = None,
) -> int:  # fmt: skip
    """Append one operator action to the audit log, and log it (INFO,
    ``jobdeck.audit``); returns its id."""
    with store.write() as conn:
        entry = _insert(conn, {"at": now, "actor": actor, "action": action, "job_id": job_id, "count": count,
                               "detail": detail})  # fmt: skip
    target = f"job {job_id}" if job_id is not None else f"{count} job(s)"
    audit_logger.info("%s by %s: %s%s", action, actor, target, f" ({detail})" if detail else "",
                      extra={"event": "audit", "actor": actor, "action": action, "job_id": job_id, "count": count,
                             "audit_id": entry})  # fmt: skip
    return entry


def open_bulk(store: Transactions, actor: str, action: str, now: datetime, *, total: int, detail: str) -> int:
    """Open a bulk action's entry before its first batch: nothing moved yet
    of ``total``, owned by this process. Returns its id for the ``Tally``."""
    with store.write() as conn:
        entry = _insert(conn, {"at": now, "actor": actor, "action": action, "count": 0, "detail": detail,
                               "total": total, "owner": processes.identity(), "updated_at": now})  # fmt: skip
    audit_logger.info("%s by %s: %d job(s) to move (%s)", action, actor, total, detail,
                      extra={"event": "audit", "actor": actor, "action": action, "total": total,
                             "audit_id": entry})  # fmt: skip
    return entry


def _insert(conn: Connection, values: dict[str, Any]) -> int:
    return int(conn.execute(insert(audit_log).values(values).returning(audit_log.c.id)).scalar_one())


_COUNT_MOVED = (
    update(audit_log)
    .where(audit_log.c.id == bindparam("entry"))
    .values(
        count=audit_log.c.count + bindparam("moved"),
        owner=bindparam("owner"),
        updated_at=bindparam("now"),
        finished_at=case((bindparam("last"), bindparam("now")), else_=audit_log.c.finished_at),
    )
)


def count_moved(conn: Connection, tally: Tally, moved: int, now: datetime) -> None:
    """Inside a batch's transaction: add what it moved to its entry (and
    finish the entry with the last batch). Called by the store's bulk moves."""
    params = {"entry": tally.entry, "moved": moved, "owner": processes.identity(), "now": now, "last": tally.last}
    conn.execute(_COUNT_MOVED, params)


def finish_bulk(store: Transactions, entry: int, now: datetime) -> None:
    """Mark a bulk action finished when its last batch found nothing left to move."""
    with store.write() as conn:
        count_moved(conn, Tally(entry, last=True), 0, now)


def audit_entry(store: Transactions, entry: int) -> AuditRecord | None:
    with store.read() as conn:
        row = conn.execute(select(audit_log).where(audit_log.c.id == entry)).first()
    return AuditRecord(**row._mapping) if row is not None else None


def list_audit(
    store: Transactions, before_id: int | None = None, limit: int = 50
) -> tuple[list[AuditRecord], int | None]:
    """Newest first by keyset; returns (entries, before_id of the next page)."""
    stmt = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit + 1)
    if before_id is not None:
        stmt = stmt.where(audit_log.c.id < before_id)
    with store.read() as conn:
        rows = [AuditRecord(**r._mapping) for r in conn.execute(stmt)]
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, rows[-1].id if more and rows else None


def audit_of_job(store: Transactions, job_id: int, limit: int = 20) -> list[AuditRecord]:
    """Single-job actions taken on one job, for its detail page."""
    stmt = select(audit_log).where(and_(audit_log.c.job_id == job_id)).order_by(audit_log.c.id.desc()).limit(limit)
    with store.read() as conn:
        return [AuditRecord(**r._mapping) for r in conn.execute(stmt)]


def interrupted_bulk(store: Transactions, actor: str, now: datetime) -> AuditRecord | None:
    """``actor``'s latest bulk action when it was cut short within
    ``BULK_NOTICE_WINDOW``: the job lists point it out until the next one."""
    stmt = (
        select(audit_log)
        .where(audit_log.c.actor == actor, audit_log.c.total.is_not(None))
        .order_by(audit_log.c.id.desc())
        .limit(1)
    )
    with store.read() as conn:
        row = conn.execute(stmt).first()
    if row is None:
        return None
    entry = AuditRecord(**row._mapping)
    progress = entry.progress(now)
    if progress is None or not progress.interrupted or now - entry.at > BULK_NOTICE_WINDOW:
        return None
    return entry
