"""The job's own tables: the jobs, their attempts, the effects ledger and the
workers that run them, with the partial indexes the claim and the lists use."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from jobdeck.core.states import (
    ALL_EFFECT_STATES,
    ALL_OUTCOMES,
    ALL_STATES,
    AttemptOutcome,
    EffectState,
    State,
)
from jobdeck.store.models.columns import (
    CLAIMABLE_STATES,
    ERROR_STATES,
    FLOW_KEY_COLUMNS,
    Base,
    BigID,
    UTCDateTime,
    status_in,
)
from sqlalchemy import (
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    column,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement

_state_list = ", ".join(f"'{s.value}'" for s in ALL_STATES)
_effect_state_list = ", ".join(f"'{s.value}'" for s in ALL_EFFECT_STATES)
_claim_index_where = status_in(column("status"), CLAIMABLE_STATES)
_error_index_where = status_in(column("status"), ERROR_STATES)
_dead_where = column("status") == State.DEAD.value
_in_workflow = column("workflow_id").is_not(None)
_keyed = column("idempotency_key").is_not(None)
_unique = column("unique_key").is_not(None)
_in_batch = column("batch_id").is_not(None)


def _keyed_where(name: str) -> ColumnElement[bool]:
    return and_(status_in(column("status"), CLAIMABLE_STATES), column(name).is_not(None))


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(200))
    queue: Mapped[str] = mapped_column(String(100), default="default")
    payload: Mapped[str] = mapped_column(Text, default="{}")
    """The payload as JSON text (an object)."""
    priority: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default=State.PENDING.value)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    """Attempts started; the fencing token of the current one while running."""
    retry_count: Mapped[int] = mapped_column(Integer, default=0)
    max_retries: Mapped[int] = mapped_column(Integer, default=3)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    """UNIQUE among the rows that have one (``ux_jobs_idempotency_key``, revision 0021)."""
    available_at: Mapped[datetime] = mapped_column(UTCDateTime)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[float | None] = mapped_column(Float)
    progress_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When a person or the API cancelled the job (revision 0009). A running
    job keeps running with it set: its attempt's end, however it ends, ends
    the job ``cancelled`` (``jobdeck.store.statements``)."""
    error_fingerprint: Mapped[str | None] = mapped_column(String(255))
    """The error's group (``jobdeck.core.fingerprint``), set by the fail statement;
    after cancel_requested_at (0009), last, so rows decoded by position keep their order (revision 0012)."""
    rate_key: Mapped[str | None] = mapped_column(String(255))
    """The job's key for a keyed rate limit (``jobdeck.jobs.flow``), computed at enqueue (revision 0014)."""
    concurrency_key: Mapped[str | None] = mapped_column(String(255))
    """The job's key for a keyed concurrency limit (``jobdeck.jobs.flow``), computed at enqueue (revision 0014)."""
    unique_key: Mapped[str | None] = mapped_column(String(255))
    """The unique key of a unique job (``jobdeck.jobs.unique``), UNIQUE among rows
    (``ux_jobs_unique_key``); freed by the next enqueue of the key once this
    job no longer holds it (revision 0015, after the columns before it)."""
    unique_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """The end of the key's period; NULL: no end."""
    unique_states: Mapped[int | None] = mapped_column(Integer)
    """The states the job holds its key in, a mask of ``jobdeck.core.uniqueness.STATE_BITS``."""
    workflow_id: Mapped[int | None] = mapped_column(BigID)
    """The workflow the job is a step of (``jobdeck.jobs.workflows``, revision 0020,
    after the columns before it, so rows decoded by position keep their order)."""
    batch_id: Mapped[int | None] = mapped_column(BigID)
    """The batch the job belongs to (``jobdeck.jobs.workflows.Batch``)."""
    step: Mapped[str | None] = mapped_column(String(200))
    """The job's name in its workflow, unique there (what ``depends_on`` names)."""
    deps_left: Mapped[int | None] = mapped_column(Integer)
    """Dependencies not completed yet; the completion that takes it to 0
    promotes the job from ``blocked`` to ``pending`` (``jobdeck.store.graph``)."""
    on_dependency_failure: Mapped[str | None] = mapped_column(String(8))
    """``cancel`` (the default) or ``hold``: what a dependency ending dead,
    cancelled or discarded does to this blocked job."""
    error_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When the job first failed with the error it holds (its
    ``error_fingerprint``), set by the fail statement and kept while its
    failures keep that fingerprint, across retries (a person's too): the
    Errors page's "First seen" of a group is the earliest of its jobs'
    (revision 0026, so rows decoded by position keep their order)."""
    traceparent: Mapped[str | None] = mapped_column(String(55))
    """The W3C trace context current when the job was enqueued, with tracing
    on (``jobdeck.tracing``): each attempt's span is its child (revision
    0027, last, so rows decoded by position keep their order)."""

    __table_args__ = (
        CheckConstraint(f"status IN ({_state_list})", name="ck_jobs_status"),
        CheckConstraint("retry_count >= 0 AND max_retries >= 0", name="ck_jobs_retries"),
        # Serves the claim: only due-able jobs are in it, in claim order.
        Index(
            "ix_jobs_claim",
            text("priority DESC"),
            "available_at",
            "id",
            sqlite_where=_claim_index_where,
            postgresql_where=_claim_index_where,
        ),
        # The claim of a pool restricted to some queues (revision 0002).
        Index(
            "ix_jobs_claim_queue",
            "queue",
            text("priority DESC"),
            "available_at",
            "id",
            sqlite_where=_claim_index_where,
            postgresql_where=_claim_index_where,
        ),
        Index("ix_jobs_status_id", "status", "id"),
        # The dashboard's type filter. Not (type, status, id): type and id
        # never change, so no transition touches this index (revision 0004
        # replaced that one, and dropped the running/worker index: running
        # jobs are few, so the status index finds them as fast).
        Index("ix_jobs_type_id", "type", "id"),
        # The errors view's GROUP BY, read from the index alone (revision 0012;
        # error_since since 0026). Partial: only failed and dead jobs are in
        # it, so the claim and the completion of a job that never failed never
        # touch it.
        Index(
            "ix_jobs_error_groups",
            "status",
            "type",
            "error_fingerprint",
            "updated_at",
            "error_since",
            sqlite_where=_error_index_where,
            postgresql_where=_error_index_where,
        ),
        # The overview's "died last" (revision 0013): dead jobs by when they
        # died, so its top few are read from the index, not sorted from all.
        Index("ix_jobs_dead_finished", "finished_at", "id", sqlite_where=_dead_where, postgresql_where=_dead_where),
        # The flow claim's walk key by key (revision 0014): only waiting jobs
        # with a key are in them, so a hot key's backlog is skipped in one seek.
        *(
            Index(
                f"ix_jobs_{name}",
                name,
                text("priority DESC"),
                "available_at",
                "id",
                sqlite_where=_keyed_where(name),
                postgresql_where=_keyed_where(name),
            )
            for name in FLOW_KEY_COLUMNS
        ),
        # Idempotency keys and unique jobs (revision 0015): the database decides
        # between racing enqueues. Partial (revision 0021): a job without a key
        # adds no entry, so a plain enqueue writes two index entries fewer; the
        # enqueue's ON CONFLICT names the same predicate (``jobdeck.store.statements``).
        Index("ux_jobs_idempotency_key", "idempotency_key", unique=True, sqlite_where=_keyed, postgresql_where=_keyed),
        Index("ux_jobs_unique_key", "unique_key", unique=True, sqlite_where=_unique, postgresql_where=_unique),
        # A workflow's jobs and a batch's (revision 0020): plain jobs are in neither.
        Index("ix_jobs_workflow", "workflow_id", "id", sqlite_where=_in_workflow, postgresql_where=_in_workflow),
        Index("ix_jobs_batch", "batch_id", "status", sqlite_where=_in_batch, postgresql_where=_in_batch),
        {"sqlite_autoincrement": True},
    )


INTERRUPTED = AttemptOutcome.INTERRUPTED.value
"""The outcome of an attempt that shutdown cut short (``jobdeck.core.states.AttemptOutcome``)."""
CANCELLED = AttemptOutcome.CANCELLED.value
"""The outcome of an attempt whose job a person cancelled while it ran."""
SNOOZED = AttemptOutcome.SNOOZED.value
"""The outcome of an attempt whose handler snoozed its job (``jobdeck.jobs.snooze``)."""

OUTCOMES = tuple(o.value for o in ALL_OUTCOMES)
"""How an attempt can end (``attempts.outcome``)."""


class Attempt(Base):
    """One row per finished attempt: the job's whole failure history."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(BigID, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(BigID, ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[str | None] = mapped_column(Text)
    """The payload this attempt ran with, kept only when it differs later
    (edit and retry); NULL means the job's current payload."""
    snooze_seconds: Mapped[float | None] = mapped_column(Float)
    """How long a ``snoozed`` attempt put its job off (revision 0016); NULL otherwise."""
    executor: Mapped[str | None] = mapped_column(String(16))
    """What ran it: "thread", "async" or "process" (revision 0030); NULL for an
    attempt the pool did not finish itself (released, rescued) or older ones."""

    __table_args__ = (
        CheckConstraint(f"outcome IN ({', '.join(repr(o) for o in OUTCOMES)})", name="ck_attempts_outcome"),
        Index("ix_attempts_job", "job_id", "attempt"),
    )


class Effect(Base):
    """The effects ledger: one row per irreversible side effect, keyed by
    the handler's key, recorded ``started`` before the effect and ``done``
    with its result after it (``jobdeck.core.states.EffectState``)."""

    __tablename__ = "effects"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    job_id: Mapped[int | None] = mapped_column(BigID)
    attempt: Mapped[int | None] = mapped_column(Integer)
    """The attempt that started the effect (and, when done, performed it)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    """When the key was first recorded."""
    state: Mapped[str] = mapped_column(
        String(16), default=EffectState.DONE.value, server_default=EffectState.DONE.value
    )
    """Rows from before the two-phase ledger were recorded and then performed
    in one step: they read as done (revision 0005)."""
    worker_id: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When the current attempt started it (a replay or a retry after
    not-performed moves it)."""
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When it became done or not performed."""
    result: Mapped[str | None] = mapped_column(Text)
    """What the effect's function returned, as JSON text."""
    resolved_by: Mapped[str | None] = mapped_column(String(200))
    """The person who marked an unknown effect done or not performed."""

    __table_args__ = (
        CheckConstraint(f"state IN ({_effect_state_list})", name="ck_effects_state"),
        Index("ix_effects_job", "job_id"),
    )


class Worker(Base):
    """A live worker pool (one per process)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    threads: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    gone_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """Set by the sweeper when the worker stopped heart-beating without stopping."""
    abandoned_threads: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Handler threads the pool abandoned after a timeout that are still running."""
    unhealthy: Mapped[str | None] = mapped_column(Text)
    """Why the pool reports itself unhealthy (and claims nothing); None when healthy.
    Stored so that every process's dashboard shows every pool's health."""
    queues: Mapped[str | None] = mapped_column(Text)
    """The queues the pool claims from, as a JSON list; None for every queue
    (revision 0019: the "no live workers for a queue" threshold reads it)."""
    clock_offset: Mapped[float | None] = mapped_column(Float)
    """Seconds the database's clock was ahead of this process's host clock at
    its last measurement (``jobdeck.core.clock``); None on SQLite (revision 0024)."""
    late_beat_seconds: Mapped[float | None] = mapped_column(Float)
    """The last late heartbeat: seconds since the beat before it had landed
    (``jobdeck.worker.leasing``); None while none was late (revision 0025)."""
    late_beat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When that late heartbeat landed."""
    loop_held_seconds: Mapped[float | None] = mapped_column(Float)
    """The last time the pool's event loop of async handlers was held by a
    blocking call (``jobdeck.worker.async_loop``): for how long; None while
    never (revision 0028)."""
    loop_held_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    loop_held_job: Mapped[int | None] = mapped_column(Integer)
    """The job whose handler held it, and its type (None: no task's step held it)."""
    loop_held_type: Mapped[str | None] = mapped_column(String(200))
    executors: Mapped[str | None] = mapped_column(Text)
    """What each executor of the pool holds, as JSON (``jobdeck.worker.pool.WorkerPool.executors_now``):
    capacity and busy slots, the process pool's children and restarts; None before the first (revision 0029)."""


jobs = cast(Table, Job.__table__)
attempts = cast(Table, Attempt.__table__)
effects = cast(Table, Effect.__table__)
workers = cast(Table, Worker.__table__)

# The stats roll-up and the overview's throughput chart read attempts by finish time.
Index("ix_attempts_finished", attempts.c.finished_at)
