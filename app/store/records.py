"""The values that cross the store's boundary: a job and an attempt as read,
a job to enqueue, how an attempt ended, and a list filter. Plain data; the
SQL that produces and consumes them lives in ``jobdeck.store.statements``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from jobdeck.core.states import SCHEDULED, AttemptOutcome, State
from jobdeck.core.uniqueness import STATE_BITS
from jobdeck.store import sqlite

if TYPE_CHECKING:
    from jobdeck.core.uniqueness import UniqueClaim


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
    """The job's keys for the keyed flow limits (``jobdeck.jobs.flow``), set at enqueue."""
    unique_key: str | None = None
    """The unique key it was enqueued with (``jobdeck.jobs.unique``); it holds it
    while in its unique states and period (``holds_unique_key``)."""
    unique_until: datetime | None = None
    unique_states: int | None = None
    workflow_id: int | None = None
    batch_id: int | None = None
    step: str | None = None
    """Its name in its workflow (``jobdeck.jobs.workflows``)."""
    deps_left: int | None = None
    """Dependencies not completed yet, while blocked."""
    on_dependency_failure: str | None = None
    omitted: tuple[str, ...] = ()
    """Of ``payload``, ``result`` and ``error``, those a list bounded by
    bytes left out (``jobdeck.store.listing``): here ``{}`` or None, not the
    job's; the job read alone has them."""
    traceparent: str | None = None
    """The W3C trace context stored at enqueue with tracing on (``jobdeck.tracing``)."""

    @classmethod
    def from_row(cls, row: Any) -> JobRecord:
        m = row._mapping
        return cls(
            id=m["id"],
            type=m["type"],
            queue=m["queue"],
            payload={} if m["payload"] is None else json.loads(m["payload"]),  # None: left out of a list
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
            unique_key=m.get("unique_key"),
            unique_until=m.get("unique_until"),
            unique_states=m.get("unique_states"),
            workflow_id=m.get("workflow_id"),
            batch_id=m.get("batch_id"),
            step=m.get("step"),
            deps_left=m.get("deps_left"),
            on_dependency_failure=m.get("on_dependency_failure"),
            traceparent=m.get("traceparent"),
        )

    @classmethod
    def from_columns(cls, r: Sequence[Any]) -> JobRecord:
        """From a row of every jobs column in table order (the ``RETURNING``
        of the store's transitions), by position: reading a row's mapping by
        name cost a claim more than its statement."""
        return _job_of((
            r[0], r[1], r[2], sqlite.loads(r[3]), r[4], sqlite.STATE_OF[r[5]], *r[6:15],
            None if r[15] is None else json.loads(r[15]), *r[16:22], *r[23:33],
            *(((), r[34]) if len(r) > 34 else ()),
        ))  # fmt: skip

    @classmethod
    def from_sqlite(cls, r: Sequence[Any]) -> JobRecord:
        """From a raw SQLite row in column order (see ``jobdeck.store.sqlite``)."""
        t, req = sqlite.parse_time, sqlite.parse_time_required
        return _job_of((
            r[0], r[1], r[2], sqlite.loads(r[3]), r[4], sqlite.STATE_OF[r[5]], r[6], r[7], r[8], r[9],
            req(r[10]), t(r[11]), t(r[12]), r[13], r[14], None if r[15] is None else json.loads(r[15]),
            r[16], r[17], req(r[18]), req(r[19]), t(r[20]), t(r[21]),
            *((r[23], r[24], r[25], t(r[26]), r[27]) if len(r) > 27 else ()),
            *(r[28:33] if len(r) > 32 else ()),
            *(((), r[34]) if len(r) > 34 else ()),
        ))  # fmt: skip

    def is_scheduled(self, now: datetime) -> bool:
        return self.status is State.PENDING and self.available_at > now

    def holds_unique_key(self, now: datetime) -> bool:
        """The job still holds its unique key: in one of its unique states
        and inside its period. A key no longer held is freed by the next
        enqueue of it (``jobdeck.store.unique``), which then makes a new job."""
        if self.unique_key is None or self.unique_states is None:
            return False
        state = SCHEDULED if self.is_scheduled(now) else self.status.value
        in_states = bool(self.unique_states & STATE_BITS.get(state, 0))
        return in_states and (self.unique_until is None or self.unique_until > now)


_JOB_FIELDS = tuple(f.name for f in fields(JobRecord))
_JOB_DEFAULTS = tuple(None if f.default is MISSING else f.default for f in fields(JobRecord))


def _job_of(values: tuple[Any, ...]) -> JobRecord:
    """A ``JobRecord`` from its fields' values in order (the defaults for any
    left off the end), set in one dict update: a frozen dataclass's
    ``__init__`` sets each of its 32 fields through ``object.__setattr__``,
    half the cost of decoding a claimed row."""
    job = object.__new__(JobRecord)
    job.__dict__.update(zip(_JOB_FIELDS, values + _JOB_DEFAULTS[len(values) :]))
    return job


def claimed_records(
    rows: Sequence[Sequence[Any]], worker_id: str, now: datetime, parse_time: Callable[[Any], datetime] | None
) -> list[JobRecord]:
    """``JobRecord``s from a claim's rows of ``CLAIM_COLUMNS``, with what the
    claim set (running, held by ``worker_id``, claimed, heart-beaten and
    updated at ``now``, no progress) filled in. ``parse_time`` reads a
    stored time (SQLite's text); None where the driver decodes times
    (PostgreSQL). Each record's fields are one dict literal, set at once:
    the claiming thread is the drain's critical path, and this took a
    third less of it than a tuple of values zipped with the field names."""
    new, set_fields, running = object.__new__, object.__setattr__, State.RUNNING
    loads, json_loads = sqlite.loads, json.loads
    p = parse_time or _as_is
    out = []
    for r in rows:
        job = new(JobRecord)
        set_fields(job, "__dict__", {
            "id": r[0], "type": r[1], "queue": r[2], "payload": loads(r[3]), "priority": r[4],
            "status": running, "attempt": r[5], "retry_count": r[6], "max_retries": r[7],
            "idempotency_key": r[8], "available_at": p(r[9]), "claimed_at": now, "heartbeat_at": now,
            "worker_id": worker_id, "error": r[10], "result": None if r[11] is None else json_loads(r[11]),
            "progress": None, "progress_message": None, "created_at": p(r[12]), "updated_at": now,
            "finished_at": None if r[13] is None else p(r[13]),
            "cancel_requested_at": None if r[14] is None else p(r[14]),
            "rate_key": r[15], "concurrency_key": r[16], "unique_key": r[17],
            "unique_until": None if r[18] is None else p(r[18]), "unique_states": r[19],
            "workflow_id": r[20], "batch_id": r[21], "step": r[22], "deps_left": r[23],
            "on_dependency_failure": r[24], "omitted": (), "traceparent": r[25],
        })  # fmt: skip
        out.append(job)
    return out


def _as_is(value: Any) -> Any:
    return value


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
    snooze_seconds: float | None = None
    """How long a snoozed attempt put its job off."""
    executor: str | None = None
    """What ran it: "thread", "async" or "process"; None when the pool did not finish it (released, rescued)."""

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
            snooze_seconds=m.get("snooze_seconds"),
            executor=m.get("executor"),
        )

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class RunningGroup:
    """Running jobs of one (queue, type, worker), and their freshest heartbeat."""

    queue: str
    type: str
    worker_id: str | None
    count: int
    heartbeat_at: datetime | None


@dataclass(frozen=True)
class PoolRow:
    """A worker pool that has neither stopped nor been marked gone."""

    id: str
    threads: int
    heartbeat_at: datetime
    unhealthy: str | None


@dataclass(frozen=True)
class Holders:
    """What holds jobs back that one statement reads (``running_and_pools``):
    the running jobs by (queue, type, worker), and the pools."""

    running: list[RunningGroup]
    pools: list[PoolRow]


class Answered(NamedTuple):
    """One job of a bulk enqueue as ``POST /api/jobs/bulk`` answers it
    (``Jobdeck.enqueue_bulk``): what ``Enqueued`` says of it, by the job's id
    alone. ``replaced`` is ``Enqueued.changed``."""

    id: int
    created: bool
    duplicate: bool
    replaced: bool


class Enqueued(tuple[JobRecord, bool]):
    """What an enqueue returns: ``(job, created)`` as it always was (callers
    unpack it), and more by name. ``duplicate``: a unique job's key was held,
    ``job`` is the kept job (``jobdeck.jobs.unique``); ``changed``: that duplicate's
    replace or debounce was applied to it. An idempotency key's existing job
    is ``created`` False, not a duplicate: it is the same request again.
    ``holders``: what held jobs back right after the commit that stored this
    one, when the enqueue was asked to read it (``Enqueueing.enqueue``) and
    could read it with the commit; None otherwise."""

    duplicate: bool
    changed: bool
    holders: Holders | None

    def __new__(
        cls,
        job: JobRecord,
        created: bool,
        *,
        duplicate: bool = False,
        changed: bool = False,
        holders: Holders | None = None,
    ) -> Enqueued:
        self = super().__new__(cls, (job, created))
        self.duplicate = duplicate
        self.changed = changed
        self.holders = holders
        return self

    @property
    def job(self) -> JobRecord:
        return self[0]

    @property
    def created(self) -> bool:
        return self[1]


@dataclass
class NewJob:
    """A validated job to enqueue (see ``jobdeck.deck.Jobdeck.new_job``)."""

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
    """The job's keys for the keyed flow limits (``jobdeck.jobs.flow.Flow.keys``)."""
    unique: UniqueClaim | None = None
    """A unique job's key and what a duplicate does (``jobdeck.jobs.unique``)."""
    traceparent: str | None = None
    """The W3C trace context to store with it (``jobdeck.tracing``); None with tracing off."""


@dataclass(frozen=True)
class PoolBeat:
    """What a pool's heartbeat found (``Store.heartbeat_pool``)."""

    held: dict[int, int]
    """Every running job held by the pool's worker id that the beat reached: id -> attempt."""
    cancelled: list[int]
    """The ids among them that a cancel was requested for."""


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
    snooze: float | None = None
    """Seconds the handler snoozed the job for (``jobdeck.jobs.snooze``); None if it did not."""
    snooze_reason: str | None = None
    max_snoozes: int | None = None
    """Snoozes in a row allowed; past it the snooze fails the attempt. None: no cap."""
    executor: str | None = None
    """What ran the attempt: "thread", "async" or "process" (kept in its attempt row)."""
    log: Any = None
    """The attempt's log buffer with lines not yet written (``jobdeck.jobs.joblogs.AttemptLog``):
    the acker writes them, for its whole batch in one transaction, before the outcome."""

    @property
    def ok(self) -> bool:
        """Completed: neither failed nor snoozed."""
        return self.error is None and self.snooze is None


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
    """One error group (``jobdeck.core.fingerprint``): with ``type``, the errors view's group."""

    @property
    def narrows(self) -> bool:
        """Whether it picks jobs by more than their state (and paging)."""
        return bool(self.type or self.queue or self.search) or self.error_fingerprint is not None
