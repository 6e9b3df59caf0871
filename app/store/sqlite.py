"""The SQLite hot path as driver-level SQL: the claim, batched completions
and plain enqueues.

Building a Core statement, computing its cache key and running the
``UTCDateTime`` processors costs more per call than SQLite needs to do the
work, so on SQLite these few statements are pre-rendered text with ``?``
parameters, and rows are decoded here. The semantics are the Core
versions' exactly (same conditions, same fencing); ``Store`` keeps the Core
statements for PostgreSQL.

Times are stored as SQLAlchemy's SQLite ``DATETIME`` writes them (naive UTC,
``YYYY-MM-DD HH:MM:SS.ffffff``), so text comparisons with rows written
through Core stay correct.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy.exc import DBAPIError

from app.states import State, Transition, sources
from app.store.models import jobs

_UTC = UTC
JOB_COLUMNS = ", ".join(c.name for c in jobs.c)
STATE_OF = {s.value: s for s in State}


def db_time(value: datetime) -> str:
    """An aware time as the text SQLAlchemy's SQLite DATETIME stores."""
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the database; use UTC-aware times")
    return value.astimezone(_UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def parse_time(text: Any) -> datetime | None:
    if text is None:
        return None
    return _parse_time(text)


@lru_cache(maxsize=4096)
def _parse_time(text: str) -> datetime:
    """Cached: the jobs of one claim share their claimed, heartbeat and
    updated times, and jobs enqueued together their created time, so most
    rows repeat a text parsed a moment ago (a tenth of the claiming
    thread's time went here). Aware datetimes are immutable: safe to share."""
    return datetime.fromisoformat(text).replace(tzinfo=_UTC)


def parse_time_required(text: str) -> datetime:
    return _parse_time(text)


def loads(text: str) -> Any:
    """json.loads with the common empty payload short-cut."""
    return {} if text == "{}" else json.loads(text)


@contextmanager
def translated_errors() -> Iterator[None]:
    """Raise sqlite3 errors from a raw cursor as SQLAlchemy's (IntegrityError,
    OperationalError, ...), which is what every caller catches."""
    try:
        yield
    except sqlite3.Error as exc:
        raise DBAPIError.instance(None, None, exc, sqlite3.Error) from exc


def _quoted(states: list[str]) -> str:
    return ", ".join(f"'{s}'" for s in states)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


@lru_cache(maxsize=64)
def claim_sql(n_types: int | None, n_queues: int | None, n_excluded: int = 0) -> str:
    """One UPDATE claiming up to ``?`` due jobs in claim order. The partial
    index is named because, without statistics, SQLite's planner prefers the
    type/status index and sorts every due job on every claim (milliseconds
    per claim at 20,000 due jobs; this way it reads only the rows it takes).
    Parameters: worker_id, now x3, now, *types, *queues, *excluded queues, limit."""
    where = [f"status IN ({_quoted(sources(Transition.CLAIM))})", "available_at <= ?"]
    if n_types is not None:
        where.append(f"type IN ({_marks(n_types)})")
    if n_queues is not None:
        where.append(f"queue IN ({_marks(n_queues)})")
    if n_excluded:
        where.append(f"queue NOT IN ({_marks(n_excluded)})")
    return (
        f"UPDATE jobs SET status = '{State.RUNNING.value}', attempt = attempt + 1, worker_id = ?, "
        "claimed_at = ?, heartbeat_at = ?, progress = NULL, progress_message = NULL, updated_at = ? "
        "WHERE id IN (SELECT id FROM jobs INDEXED BY ix_jobs_claim "
        f"WHERE {' AND '.join(where)} ORDER BY priority DESC, available_at, id LIMIT ?) "
        f"RETURNING {JOB_COLUMNS}"
    )


_CLAIM_SET = (
    f"UPDATE jobs SET status = '{State.RUNNING.value}', attempt = attempt + 1, worker_id = ?, "
    "claimed_at = ?, heartbeat_at = ?, progress = NULL, progress_message = NULL, updated_at = ? "
)


@lru_cache(maxsize=256)
def claim_ids_sql(n: int) -> str:
    """Claim the ``n`` given jobs, each only if still claimable (the claim
    of ``app.queues``' limit-aware policy, which picks the ids itself).
    Parameters: worker_id, now x3, *ids."""
    return (
        f"{_CLAIM_SET}WHERE id IN ({_marks(n)}) AND status IN ({_quoted(sources(Transition.CLAIM))}) "
        f"RETURNING {JOB_COLUMNS}"
    )


@lru_cache(maxsize=256)
def complete_sql(n: int) -> str:
    """Complete ``n`` jobs, each only if still running under the same
    (attempt, worker). Parameters: now x2, *ids, *(id, attempt), worker_id."""
    pairs = ", ".join(["(?, ?)"] * n)
    return (
        f"UPDATE jobs SET status = '{State.COMPLETED.value}', finished_at = ?, updated_at = ?, "
        "progress = CASE WHEN progress IS NULL THEN NULL ELSE 1.0 END "
        f"WHERE id IN ({_marks(n)}) AND (id, attempt) IN (VALUES {pairs}) AND worker_id = ? "
        f"AND status IN ({_quoted(sources(Transition.COMPLETE))}) RETURNING id, attempt"
    )


INSERT_ATTEMPT = (
    "INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, outcome) VALUES (?, ?, ?, ?, ?, ?)"
)


INSERT_JOB = (
    "INSERT INTO jobs (type, queue, payload, priority, status, attempt, retry_count, max_retries, "
    "idempotency_key, available_at, created_at, updated_at) "
    f"VALUES (?, ?, ?, ?, '{State.PENDING.value}', 0, 0, ?, ?, ?, ?, ?)"
)
"""Parameters: see ``job_params``."""

INSERT_JOB_RETURNING = f"{INSERT_JOB} RETURNING {JOB_COLUMNS}"


def job_params(new: Any, payload_json: str, now: datetime, now_text: str) -> tuple[Any, ...]:
    """INSERT_JOB's parameters for a ``NewJob`` (``now_text`` is ``now`` formatted)."""
    at = now_text if new.available_at is None or new.available_at is now else db_time(new.available_at)
    return (
        new.type, new.queue, payload_json, new.priority, new.max_retries, new.idempotency_key, at, now_text, now_text,
    )  # fmt: skip
