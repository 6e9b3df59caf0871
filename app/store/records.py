"""The values that cross the store's boundary: a job and an attempt as read,
a job to enqueue, how an attempt ended, and a list filter. Plain data; the
SQL that produces and consumes them lives in ``app.store.statements``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.states import AttemptOutcome, State
from app.store import sqlite


@dataclass(frozen=True)
class JobRecord:
    id: int
    type: str
    queue: str
    payload: dict[str, Any]
    priority: int
    status: State
    attempt: int
    retry_count: int
    max_retries: int
    idempotency_key: str | None
    available_at: datetime
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    worker_id: str | None
    error: str | None
    result: Any
    progress: float | None
    progress_message: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cancel_requested_at: datetime | None = None
    """Set by a cancel; a running job with it set ends ``cancelled``."""
    rate_key: str | None = None
    concurrency_key: str | None = None
    """The job's keys for the keyed flow limits (``app.flow``), set at enqueue."""

    @classmethod
    def from_row(cls, row: Any) -> JobRecord:
        m = row._mapping
        return cls(
            id=m["id"],
            type=m["type"],
            queue=m["queue"],
            payload=json.loads(m["payload"]),
            priority=m["priority"],
            status=State(m["status"]),
            attempt=m["attempt"],
            retry_count=m["retry_count"],
            max_retries=m["max_retries"],
            idempotency_key=m["idempotency_key"],
            available_at=m["available_at"],
            claimed_at=m["claimed_at"],
            heartbeat_at=m["heartbeat_at"],
            worker_id=m["worker_id"],
            error=m["error"],
            result=None if m["result"] is None else json.loads(m["result"]),
            progress=m["progress"],
            progress_message=m["progress_message"],
            created_at=m["created_at"],
            updated_at=m["updated_at"],
            finished_at=m["finished_at"],
            cancel_requested_at=m["cancel_requested_at"],
            rate_key=m.get("rate_key"),
            concurrency_key=m.get("concurrency_key"),
        )

    @classmethod
    def from_sqlite(cls, r: Sequence[Any]) -> JobRecord:
        """From a raw SQLite row in column order (see ``app.store.sqlite``)."""
        t, req = sqlite.parse_time, sqlite.parse_time_required
        return cls(
            r[0], r[1], r[2], sqlite.loads(r[3]), r[4], sqlite.STATE_OF[r[5]], r[6], r[7], r[8], r[9],
            req(r[10]), t(r[11]), t(r[12]), r[13], r[14], None if r[15] is None else json.loads(r[15]),
            r[16], r[17], req(r[18]), req(r[19]), t(r[20]), t(r[21]),
            *((r[23], r[24]) if len(r) > 24 else ()),
        )  # fmt: skip

    def is_scheduled(self, now: datetime) -> bool:
        return self.status is State.PENDING and self.available_at > now


@dataclass(frozen=True)
class AttemptRecord:
    job_id: int
    attempt: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: AttemptOutcome
    error: str | None
    traceback: str | None
    payload: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: Any) -> AttemptRecord:
        m = row._mapping
        return cls(
            job_id=m["job_id"],
            attempt=m["attempt"],
            worker_id=m["worker_id"],
            started_at=m["started_at"],
            finished_at=m["finished_at"],
            outcome=AttemptOutcome(m["outcome"]),
            error=m["error"],
            traceback=m["traceback"],
            payload=None if m["payload"] is None else json.loads(m["payload"]),
        )

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass
class NewJob:
    """A validated job to enqueue (see ``app.deck.Jobdeck.new_job``)."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    max_retries: int = 3
    idempotency_key: str | None = None
    available_at: datetime | None = None
    payload_json: str | None = None
    """``payload`` already serialized (by validation), so it is not done twice."""
    rate_key: str | None = None
    concurrency_key: str | None = None
    """The job's keys for the keyed flow limits (``app.flow.Flow.keys``)."""


@dataclass
class Outcome:
    """How one attempt ended, as the worker reports it."""

    job_id: int
    worker_id: str
    attempt: int | None = None
    """The attempt the worker ran; None trusts the job's current attempt."""
    started_at: datetime | None = None
    error: str | None = None
    traceback: str | None = None
    result: Any = None
    retryable: bool = True
    kind: AttemptOutcome | str = AttemptOutcome.FAILED
    """For failures: failed, timed_out or stalled (the attempt's outcome)."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class JobFilter:
    status: State | None = None
    scheduled: bool | None = None
    """With status pending: True only future jobs, False only due ones."""
    type: str | None = None
    queue: str | None = None
    search: str | None = None
    before_id: int | None = None
    after_id: int | None = None
    limit: int = 50
    error_fingerprint: str | None = None
    """One error group (``app.fingerprint``): with ``type``, the errors view's group."""
