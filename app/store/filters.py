"""What a job list's filter means in SQL (``JobFilter``): state, due or
scheduled, type, queue, free text, error group. One definition shared by
the API's list, the dashboard's lists and counts, and the bulk actions, so
that "all N matching" acts on the jobs the list showed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobdeck.core.validation import fits_id, spellings
from jobdeck.store.models import ERROR_STATES, jobs, status_in
from jobdeck.store.records import JobFilter
from sqlalchemy import and_, or_


def filtered(stmt: Any, f: JobFilter, now: datetime) -> Any:
    """``stmt`` narrowed to the jobs ``f`` matches (paging aside); shared by
    the API's list and the dashboard's lists, counts and bulk actions."""
    if f.status is not None:
        stmt = stmt.where(jobs.c.status == f.status.value)
    if f.scheduled is True:
        stmt = stmt.where(jobs.c.available_at > now)
    elif f.scheduled is False:
        stmt = stmt.where(jobs.c.available_at <= now)
    if f.type:
        stmt = stmt.where(_named(jobs.c.type, f.type))
    if f.queue:
        stmt = stmt.where(_named(jobs.c.queue, f.queue))
    if f.search:
        stmt = stmt.where(_search(f.search))
    if f.error_fingerprint is not None:
        stmt = stmt.where(error_group(f.error_fingerprint))
    return stmt


def _named(column: Any, name: str) -> Any:
    """``column`` holds ``name`` as given or NFC-normalized (``spellings``):
    rows written before names were normalized are found either way."""
    forms = spellings(name)
    return column == forms[0] if len(forms) == 1 else column.in_(forms)


def error_group(fingerprint: str) -> Any:
    """Failed or dead with this fingerprint; the states written literally so
    SQLite sees that ``ix_jobs_error_groups`` (partial on them) serves it."""
    return and_(status_in(jobs.c.status, ERROR_STATES), jobs.c.error_fingerprint == fingerprint)


def _search(text: str) -> Any:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    like = f"%{escaped}%"
    clauses: list[Any] = [
        jobs.c.idempotency_key.like(like, escape="\\"),
        jobs.c.error.like(like, escape="\\"),
        jobs.c.payload.like(like, escape="\\"),
        jobs.c.type.like(like, escape="\\"),
    ]
    stripped = text.strip().lstrip("#")
    # ASCII digits only ("²".isdigit() is true) and within BIGINT, or it is no id.
    if stripped.isascii() and stripped.isdigit() and len(stripped) <= 19 and fits_id(int(stripped)):
        clauses.insert(0, jobs.c.id == int(stripped))
    return or_(*clauses)
